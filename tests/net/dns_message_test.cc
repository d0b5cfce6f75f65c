// The DNS wire format of berth's forwarder: queries read (and refused when odd), responses
// checked against their question and their A records taken through CNAME chains and
// compression pointers, hostile pointers refused, and the forwarder's own answers.
#include "net/dns_message.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

namespace berth::net::dns {
namespace {

using Bytes = std::vector<uint8_t>;

void put16(Bytes& b, uint16_t v) {
    b.push_back(static_cast<uint8_t>(v >> 8));
    b.push_back(static_cast<uint8_t>(v));
}
void put32(Bytes& b, uint32_t v) {
    put16(b, static_cast<uint16_t>(v >> 16));
    put16(b, static_cast<uint16_t>(v));
}
Bytes name(const std::string& dotted) {
    Bytes b;
    size_t start = 0;
    while (start < dotted.size()) {
        size_t dot = dotted.find('.', start);
        if (dot == std::string::npos) dot = dotted.size();
        b.push_back(static_cast<uint8_t>(dot - start));
        b.insert(b.end(), dotted.begin() + start, dotted.begin() + dot);
        start = dot + 1;
    }
    b.push_back(0);
    return b;
}
Bytes pointer(uint16_t offset) {
    return {static_cast<uint8_t>(0xc0 | offset >> 8), static_cast<uint8_t>(offset)};
}
void header(Bytes& b, uint16_t id, uint8_t flags1, uint8_t flags2, uint16_t qd, uint16_t an,
            uint16_t ns, uint16_t ar) {
    put16(b, id);
    b.push_back(flags1);
    b.push_back(flags2);
    put16(b, qd);
    put16(b, an);
    put16(b, ns);
    put16(b, ar);
}
void append(Bytes& b, const Bytes& more) {
    b.insert(b.end(), more.begin(), more.end());
}
void rr(Bytes& b, const Bytes& owner, uint16_t type, uint32_t ttl, const Bytes& rdata) {
    append(b, owner);
    put16(b, type);
    put16(b, kClassIn);
    put32(b, ttl);
    put16(b, static_cast<uint16_t>(rdata.size()));
    append(b, rdata);
}
Bytes query_bytes(const std::string& qname, uint16_t qtype = kTypeA, uint16_t id = 0x1234) {
    Bytes b;
    header(b, id, 0x01, 0, 1, 0, 0, 0);
    append(b, name(qname));
    put16(b, qtype);
    put16(b, kClassIn);
    return b;
}
Question question_of(const std::string& qname) {
    const QueryParse p = parse_query(query_bytes(qname));
    EXPECT_TRUE(p.query) << p.error;
    return p.query->question;
}

TEST(DnsMessage, QueryIsReadAndLowercased) {
    const QueryParse p = parse_query(query_bytes("API.Example.COM", kTypeAaaa));
    ASSERT_TRUE(p.query) << p.error;
    EXPECT_EQ(p.query->header.id, 0x1234);
    EXPECT_TRUE(p.query->header.rd);
    EXPECT_EQ(p.query->question.name, "api.example.com");
    EXPECT_EQ(p.query->question.qtype, kTypeAaaa);
    EXPECT_EQ(p.query->question.qclass, kClassIn);
    EXPECT_FALSE(p.query->edns);
    EXPECT_EQ(p.query->udp_size, 512u);
    // The question echoed is the client's, case and all.
    EXPECT_EQ(p.query->question.wire.size(), name("API.Example.COM").size() + 4);
    EXPECT_EQ(p.query->question.wire[1], 'A');
}

TEST(DnsMessage, QueryWithEdns) {
    Bytes b;
    header(b, 7, 0x01, 0, 1, 0, 0, 1);
    append(b, name("a.example"));
    put16(b, kTypeA);
    put16(b, kClassIn);
    b.push_back(0);
    put16(b, kTypeOpt);
    put16(b, 4096);
    put32(b, 0);
    put16(b, 0);
    const QueryParse p = parse_query(b);
    ASSERT_TRUE(p.query) << p.error;
    EXPECT_TRUE(p.query->edns);
    EXPECT_EQ(p.query->udp_size, 4096u);
}

TEST(DnsMessage, OddQueriesAreRefusedWithAReason) {
    // Runt: no header, no answer.
    QueryParse p = parse_query(Bytes{1, 2, 3});
    EXPECT_FALSE(p.query);
    EXPECT_FALSE(p.header);
    // A response: never answered.
    Bytes b = query_bytes("a.example");
    b[2] |= 0x80;
    p = parse_query(b);
    EXPECT_FALSE(p.query);
    EXPECT_FALSE(p.header);
    EXPECT_EQ(p.error, "a response, not a query");
    // Two questions: FORMERR.
    b = query_bytes("a.example");
    b[5] = 2;
    p = parse_query(b);
    EXPECT_FALSE(p.query);
    ASSERT_TRUE(p.header);
    EXPECT_EQ(p.answer, Rcode::formerr);
    // Opcode UPDATE: NOTIMP.
    b = query_bytes("a.example");
    b[2] = 5 << 3;
    p = parse_query(b);
    EXPECT_FALSE(p.query);
    EXPECT_EQ(p.answer, Rcode::notimp);
    // Trailing bytes, a cut question, a pointer in the question.
    b = query_bytes("a.example");
    b.push_back(0);
    EXPECT_FALSE(parse_query(b).query);
    b = query_bytes("a.example");
    b.resize(b.size() - 1);
    EXPECT_FALSE(parse_query(b).query);
    b.clear();
    header(b, 1, 1, 0, 1, 0, 0, 0);
    append(b, pointer(0));
    put16(b, kTypeA);
    put16(b, kClassIn);
    p = parse_query(b);
    EXPECT_FALSE(p.query);
    EXPECT_EQ(p.error, "compression pointer in a query's question");
    // A label of 64 (the 0x40 type bits) and a name over 255 bytes.
    b = query_bytes("a.example");
    b[kHeaderSize] = 0x40;
    EXPECT_EQ(parse_query(b).error, "unknown label type");
    std::string longname;
    for (int i = 0; i < 5; ++i) longname += std::string(60, 'x') + ".";
    longname += "com";
    EXPECT_EQ(parse_query(query_bytes(longname)).error, "name longer than 255 bytes");
    // An additional record that is not OPT.
    b.clear();
    header(b, 1, 1, 0, 1, 0, 0, 1);
    append(b, name("a.example"));
    put16(b, kTypeA);
    put16(b, kClassIn);
    rr(b, name("a.example"), kTypeA, 1, {1, 2, 3, 4});
    EXPECT_EQ(parse_query(b).error, "an additional record that is not OPT");
}

TEST(DnsMessage, OddBytesInNamesCannotPassForDots) {
    Bytes b;
    header(b, 1, 1, 0, 1, 0, 0, 0);
    const Bytes label = {5, 'a', '.', 'b', 'C', 0xff, 7, 'e', 'x', 'a', 'm', 'p', 'l', 'e', 0};
    append(b, label);
    put16(b, kTypeA);
    put16(b, kClassIn);
    const QueryParse p = parse_query(b);
    ASSERT_TRUE(p.query) << p.error;
    EXPECT_EQ(p.query->question.name, "a\\046bc\\255.example");
}

// A response to "www.example.com" whose CNAME chain is compressed: www.example.com ->
// edge.cdn.example.net -> e1.cdn.example.net, with an A for the chain's end (and one for a
// name off the chain, which does not count).
Bytes chain_response(uint16_t id) {
    Bytes b;
    header(b, id, 0x81, 0x80, 1, 4, 0, 0);
    const uint16_t qname_at = static_cast<uint16_t>(b.size());
    append(b, name("www.example.com"));
    put16(b, kTypeA);
    put16(b, kClassIn);
    // www.example.com CNAME edge.cdn.example.net (ttl 300)
    Bytes target = {4,   'e', 'd', 'g', 'e', 3,   'c', 'd', 'n', 7,   'e',
                    'x', 'a', 'm', 'p', 'l', 'e', 3,   'n', 'e', 't', 0};
    const uint16_t first_rdata = static_cast<uint16_t>(b.size() + 12);
    rr(b, pointer(qname_at), kTypeCname, 300, target);
    // edge.cdn.example.net CNAME e1.<cdn.example.net> (ttl 60)
    Bytes e1 = {2, 'e', '1'};
    append(e1, pointer(static_cast<uint16_t>(first_rdata + 5)));
    rr(b, pointer(first_rdata), kTypeCname, 60, e1);
    const uint16_t e1_at = static_cast<uint16_t>(b.size() - e1.size());
    rr(b, pointer(e1_at), kTypeA, 120, {198, 18, 0, 7});
    rr(b, pointer(first_rdata), kTypeA, 999, {198, 18, 0, 99});
    return b;
}

TEST(DnsMessage, ResponseFollowsACompressedCnameChain) {
    const Question q = question_of("www.example.com");
    const Bytes b = chain_response(42);
    const ResponseParse r = parse_response(b, 42, q);
    ASSERT_TRUE(r.response) << r.error;
    ASSERT_EQ(r.response->addresses.size(), 1u);
    EXPECT_EQ(r.response->addresses[0].ipv4, 0xc6120007u);
    EXPECT_EQ(r.response->addresses[0].ttl, 60u);  // the least along the chain
    EXPECT_EQ(r.response->additional_offset, b.size());
}

TEST(DnsMessage, ResponseMustMatchIdAndQuestion) {
    const Bytes b = chain_response(42);
    ResponseParse r = parse_response(b, 43, question_of("www.example.com"));
    EXPECT_FALSE(r.response);
    EXPECT_FALSE(r.ours);
    r = parse_response(b, 42, question_of("www.example.org"));
    EXPECT_FALSE(r.response);
    EXPECT_FALSE(r.ours);
    // The name compares case-insensitively.
    r = parse_response(b, 42, question_of("WWW.example.com"));
    EXPECT_TRUE(r.response) << r.error;
    // A query is not a response.
    Bytes q = query_bytes("www.example.com", kTypeA, 42);
    EXPECT_FALSE(parse_response(q, 42, question_of("www.example.com")).response);
}

TEST(DnsMessage, PointerLoopsAndStrayPointersAreRefused) {
    const Question q = question_of("a.example");
    // An answer whose owner is a pointer to itself.
    Bytes b;
    header(b, 1, 0x81, 0x80, 1, 1, 0, 0);
    append(b, name("a.example"));
    put16(b, kTypeA);
    put16(b, kClassIn);
    const uint16_t here = static_cast<uint16_t>(b.size());
    rr(b, pointer(here), kTypeA, 1, {1, 2, 3, 4});
    ResponseParse r = parse_response(b, 1, q);
    EXPECT_FALSE(r.response);
    EXPECT_TRUE(r.ours);
    EXPECT_EQ(r.error, "compression pointer does not point back");
    // Into the header (found by the fuzzer: the name would change when the id is rewritten).
    b.resize(here);
    rr(b, pointer(0), kTypeA, 1, {1, 2, 3, 4});
    EXPECT_EQ(parse_response(b, 1, q).error, "compression pointer into the header");
    // To labels that run on up to the pointer itself (a name must lie wholly before its
    // pointer: found by the fuzzer, as a name that ran on into the section a reply cuts).
    b.resize(here);
    b[7] = 2;
    const uint16_t labels_at = static_cast<uint16_t>(here + name("x").size() + 10);
    rr(b, name("x"), 16, 1, {3, 'a', 'b', 'c'});
    rr(b, pointer(labels_at), kTypeA, 1, {1, 2, 3, 4});
    EXPECT_EQ(parse_response(b, 1, q).error, "compressed name runs past its pointer");
    b[7] = 1;
    // Forward and out-of-bounds pointers.
    b.resize(here);
    rr(b, pointer(0x3fff), kTypeA, 1, {1, 2, 3, 4});
    EXPECT_FALSE(parse_response(b, 1, q).response);
    // A chain of pointers each pointing one back (kept in a TXT record's data, where no
    // parser looks): bounded by kMaxPointers.
    b.clear();
    header(b, 1, 0x81, 0x80, 1, 2, 0, 0);
    append(b, name("a.example"));
    put16(b, kTypeA);
    put16(b, kClassIn);
    const uint16_t chain_start = static_cast<uint16_t>(b.size() + name("x").size() + 10);
    Bytes chain = {0};
    for (int i = 0; i < 40; ++i)
        append(chain, pointer(static_cast<uint16_t>(chain_start + (i ? 2 * i - 1 : 0))));
    rr(b, name("x"), 16, 1, chain);
    const uint16_t last = static_cast<uint16_t>(b.size() - 2);
    rr(b, pointer(last), kTypeA, 1, {1, 2, 3, 4});
    r = parse_response(b, 1, q);
    EXPECT_FALSE(r.response);
    EXPECT_EQ(r.error, "too many compression pointers");
}

TEST(DnsMessage, CnameLoopGivesNoAddresses) {
    const Question q = question_of("a.example");
    Bytes b;
    header(b, 1, 0x81, 0x80, 1, 3, 0, 0);
    append(b, name("a.example"));
    put16(b, kTypeA);
    put16(b, kClassIn);
    rr(b, name("a.example"), kTypeCname, 10, name("b.example"));
    rr(b, name("b.example"), kTypeCname, 10, name("a.example"));
    rr(b, name("a.example"), kTypeA, 10, {1, 2, 3, 4});
    const ResponseParse r = parse_response(b, 1, q);
    EXPECT_FALSE(r.response);
    EXPECT_EQ(r.error, "a CNAME loop");
}

TEST(DnsMessage, BadRecordsAreRefused) {
    const Question q = question_of("a.example");
    Bytes base;
    header(base, 1, 0x81, 0x80, 1, 1, 0, 0);
    append(base, name("a.example"));
    put16(base, kTypeA);
    put16(base, kClassIn);
    Bytes b = base;
    rr(b, name("a.example"), kTypeA, 10, {1, 2, 3});
    EXPECT_EQ(parse_response(b, 1, q).error, "an A record's data is not 4 bytes");
    b = base;
    rr(b, name("a.example"), kTypeA, 10, {1, 2, 3, 4});
    b.resize(b.size() - 1);
    EXPECT_EQ(parse_response(b, 1, q).error, "record data runs past the message");
    // More answers counted than there are.
    b = base;
    b[7] = 200;
    EXPECT_FALSE(parse_response(b, 1, q).response);
    // A TTL with the top bit set reads as 0.
    b = base;
    rr(b, name("a.example"), kTypeA, 0x80000001u, {1, 2, 3, 4});
    const ResponseParse r = parse_response(b, 1, q);
    ASSERT_TRUE(r.response) << r.error;
    EXPECT_EQ(r.response->addresses.at(0).ttl, 0u);
}

TEST(DnsMessage, AnswersEchoTheQuestion) {
    const Query q = *parse_query(query_bytes("Api.Example.com")).query;
    const Bytes a = make_answer(q, Rcode::nxdomain);
    ASSERT_GE(a.size(), kHeaderSize);
    EXPECT_EQ(a[0], 0x12);
    EXPECT_EQ(a[1], 0x34);
    EXPECT_EQ(a[2], 0x81);  // QR, RD as asked
    EXPECT_EQ(a[3], 0x83);  // RA, NXDOMAIN
    // It reads as the response to that query.
    const ResponseParse r = parse_response(a, 0x1234, q.question);
    ASSERT_TRUE(r.response) << r.error;
    EXPECT_EQ(r.response->header.rcode, 3);
    EXPECT_TRUE(r.response->addresses.empty());
    // FORMERR from a header alone.
    const Bytes f = make_answer(q.header, Rcode::formerr);
    EXPECT_EQ(f.size(), kHeaderSize);
    EXPECT_EQ(f[3] & 0x0f, 1);
}

TEST(DnsMessage, QueryUpstreamAndReplyToClient) {
    const Query q = *parse_query(query_bytes("www.example.com")).query;
    const Bytes up = make_query(0xbeef, q.question, false, 1232);
    const QueryParse back = parse_query(up);
    ASSERT_TRUE(back.query) << back.error;
    EXPECT_EQ(back.query->header.id, 0xbeef);
    EXPECT_TRUE(back.query->edns);
    EXPECT_EQ(back.query->question.name, "www.example.com");

    // The reply gets the client's id, loses the additional section (the client had no
    // EDNS), and is cut to TC when over the client's size.
    Bytes resp = chain_response(0xbeef);
    const size_t whole = resp.size();
    resp[11] = 1;  // an OPT in the additional section
    resp.push_back(0);
    put16(resp, kTypeOpt);
    put16(resp, 1232);
    put32(resp, 0);
    put16(resp, 0);
    const ResponseParse r = parse_response(resp, 0xbeef, q.question);
    ASSERT_TRUE(r.response) << r.error;
    Bytes reply = make_reply(resp, *r.response, q, 512);
    EXPECT_EQ(reply.size(), whole);
    EXPECT_EQ(reply[0], 0x12);
    EXPECT_EQ(reply[11], 0);
    EXPECT_TRUE(parse_response(reply, 0x1234, q.question).response);
    reply = make_reply(resp, *r.response, q, 40);
    EXPECT_TRUE(reply[2] & 0x02);
    const ResponseParse cut = parse_response(reply, 0x1234, q.question);
    ASSERT_TRUE(cut.response) << cut.error;
    EXPECT_TRUE(cut.response->header.tc);
    EXPECT_TRUE(cut.response->addresses.empty());
}

}  // namespace
}  // namespace berth::net::dns
