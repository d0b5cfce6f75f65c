// berth's sandbox DNS (net/dns_message, net/dns_forwarder's name matching): any datagram a
// sandbox sends as a query, and any datagram on an upstream socket as the response to one
// of a few questions. Parsing must refuse or accept without reading out of bounds or
// looping, and what it accepts must hold up: the forwarder's answers to a query read back
// as responses to it, and a response passed on to a client (id rewritten, additional
// section cut, or truncated to TC) still parses as the answer to the client's question.
//
// Input: byte 0 picks the question a response is checked against (and the client's size
// limit); the rest is the message.
#include "net/dns_message.h"

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <string>
#include <vector>

#include "base/error.h"
#include "net/dns_forwarder.h"

using namespace berth::net;

namespace {

std::vector<uint8_t> query_for(const std::string& name) {
    std::vector<uint8_t> b = {0x12, 0x34, 0x01, 0, 0, 1, 0, 0, 0, 0, 0, 0};
    size_t start = 0;
    while (start < name.size()) {
        size_t dot = name.find('.', start);
        if (dot == std::string::npos) dot = name.size();
        b.push_back(static_cast<uint8_t>(dot - start));
        b.insert(b.end(), name.begin() + static_cast<ptrdiff_t>(start),
                 name.begin() + static_cast<ptrdiff_t>(dot));
        start = dot + 1;
    }
    b.insert(b.end(), {0, 0, 1, 0, 1});
    return b;
}

void check_answer(const dns::Query& q, const std::vector<uint8_t>& a) {
    const dns::ResponseParse r = dns::parse_response(a, q.header.id, q.question);
    if (!r.response) {  // an answer of ours that does not read back
        std::fprintf(stderr, "answer does not parse: %s\n", r.error.c_str());
        std::abort();
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size < 1) return 0;
    const uint8_t pick = data[0];
    const std::span<const uint8_t> msg(data + 1, size - 1);

    // As a query from a sandbox.
    const dns::QueryParse qp = dns::parse_query(msg);
    if (qp.query) {
        const dns::Query& q = *qp.query;
        check_answer(q, dns::make_answer(q, dns::Rcode::nxdomain));
        const std::vector<uint8_t> up = dns::make_query(0xabcd, q.question, q.header.cd, 1232);
        const dns::QueryParse back = dns::parse_query(up);
        if (!back.query || back.query->question.name != q.question.name) std::abort();
        static const std::vector<DnsNamePattern> names = {
            {"api.example.com", {}}, {"*.example.com", {}}, {"*.a", {}}};
        const DnsNamePattern* m = match_dns_name(names, q.question.name);
        if (m == &names[1] && !q.question.name.ends_with(".example.com")) std::abort();
        try {
            check_dns_pattern(q.question.name);
        } catch (const berth::Error&) {
        }
    } else if (qp.header && dns::make_answer(*qp.header, qp.answer).size() != dns::kHeaderSize) {
        std::abort();
    }

    // As a response to one of a few questions.
    static const char* const questions[] = {"a.example", "www.example.com", "", "x"};
    const dns::Query q = *dns::parse_query(query_for(questions[pick & 3])).query;
    const uint16_t id = msg.size() >= 2 ? static_cast<uint16_t>(msg[0] << 8 | msg[1]) : 0;
    const dns::ResponseParse rp = dns::parse_response(msg, id, q.question);
    if (rp.response) {
        if (!rp.ours || rp.response->additional_offset > msg.size()) std::abort();
        const size_t limit = (pick & 4) ? 65535 : size_t{12} + (pick >> 3) * 16;
        check_answer(q, dns::make_reply(msg, *rp.response, q, limit));
    }
    return 0;
}
