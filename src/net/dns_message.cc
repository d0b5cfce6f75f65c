#include "net/dns_message.h"

#include <algorithm>
#include <string_view>

namespace berth::net::dns {
namespace {

uint16_t get16(std::span<const uint8_t> m, size_t at) {
    return static_cast<uint16_t>(m[at] << 8 | m[at + 1]);
}
uint32_t get32(std::span<const uint8_t> m, size_t at) {
    return uint32_t{m[at]} << 24 | uint32_t{m[at + 1]} << 16 | uint32_t{m[at + 2]} << 8 |
           uint32_t{m[at + 3]};
}
void put16(std::vector<uint8_t>& out, uint16_t v) {
    out.push_back(static_cast<uint8_t>(v >> 8));
    out.push_back(static_cast<uint8_t>(v));
}
void set16(std::vector<uint8_t>& out, size_t at, uint16_t v) {
    out[at] = static_cast<uint8_t>(v >> 8);
    out[at + 1] = static_cast<uint8_t>(v);
}

Header read_header(std::span<const uint8_t> m) {
    Header h;
    h.id = get16(m, 0);
    h.qr = m[2] & 0x80;
    h.opcode = (m[2] >> 3) & 0x0f;
    h.tc = m[2] & 0x02;
    h.rd = m[2] & 0x01;
    h.cd = m[3] & 0x10;
    h.rcode = m[3] & 0x0f;
    h.qdcount = get16(m, 4);
    h.ancount = get16(m, 6);
    h.nscount = get16(m, 8);
    h.arcount = get16(m, 10);
    return h;
}

// The header of an answer to `h`: QR, RD as asked, RA (berth recurses, through upstream),
// CD as asked.
void write_answer_header(std::vector<uint8_t>& out, const Header& h, Rcode rcode, uint16_t qd,
                         uint16_t ar) {
    put16(out, h.id);
    out.push_back(static_cast<uint8_t>(0x80 | (h.opcode & 0x0f) << 3 | (h.rd ? 0x01 : 0)));
    out.push_back(static_cast<uint8_t>(0x80 | (h.cd ? 0x10 : 0) | static_cast<uint8_t>(rcode)));
    put16(out, qd);
    put16(out, 0);
    put16(out, 0);
    put16(out, ar);
}

void put_opt(std::vector<uint8_t>& out, uint16_t udp_size) {
    out.push_back(0);  // root name
    put16(out, kTypeOpt);
    put16(out, udp_size);
    put16(out, 0);  // extended rcode, version
    put16(out, 0);  // flags
    put16(out, 0);  // no options
}

bool fail(std::string* error, const char* why) {
    *error = why;
    return false;
}

template <typename Parse>
Parse& failed(Parse& out, std::string why) {
    out.error = std::move(why);
    return out;
}

bool plain_char(uint8_t c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '*';
}

// Reads the (possibly compressed) name at `at`. On success `*end` is where the record goes
// on after the name (after its first pointer, if any) and `*text` is its presentation form
// (see Question::name). A pointer must point to a name that lies wholly before it (a prior
// occurrence, as RFC 1035 4.1.4 has it): what follows a jump must end before the pointer
// that made it. Each jump then goes strictly backwards, so no name loops (kMaxPointers
// bounds the jumps anyway), and a message cut after any record still holds every name of
// the records before the cut (the fuzzer found a name that ran on into later records).
bool read_name(std::span<const uint8_t> m, size_t at, std::string* text, size_t* end,
               std::string* error, bool allow_pointers = true) {
    text->clear();
    size_t pos = at;
    size_t wire_length = 1;  // the root label
    int jumps = 0;
    std::optional<size_t> after;
    size_t limit = m.size();  // where the name must end: the last pointer followed
    for (;;) {
        if (pos >= limit) {
            return fail(error, limit == m.size() ? "name runs past the message"
                                                 : "compressed name runs past its pointer");
        }
        const uint8_t len = m[pos];
        if ((len & 0xc0) == 0xc0) {
            if (!allow_pointers) return fail(error, "compression pointer in a query's question");
            if (pos + 1 >= limit) return fail(error, "compression pointer cut short");
            const size_t target = static_cast<size_t>(len & 0x3f) << 8 | m[pos + 1];
            if (target >= pos) return fail(error, "compression pointer does not point back");
            // (No name starts in the header: one that "does" changes when the id is rewritten.)
            if (target < kHeaderSize) return fail(error, "compression pointer into the header");
            if (++jumps > kMaxPointers) return fail(error, "too many compression pointers");
            if (!after) after = pos + 2;
            limit = pos;
            pos = target;
            continue;
        }
        if (len & 0xc0) return fail(error, "unknown label type");
        if (len == 0) break;
        if (pos + 1 + len > limit) return fail(error, "label runs past the message");
        wire_length += 1 + len;
        if (wire_length > 255) return fail(error, "name longer than 255 bytes");
        if (!text->empty()) text->push_back('.');
        for (size_t i = pos + 1; i <= pos + len; ++i) {
            uint8_t c = m[i];
            if (c >= 'A' && c <= 'Z') c = static_cast<uint8_t>(c - 'A' + 'a');
            if (plain_char(c)) {
                text->push_back(static_cast<char>(c));
            } else {
                text->push_back('\\');
                text->push_back(static_cast<char>('0' + c / 100));
                text->push_back(static_cast<char>('0' + c / 10 % 10));
                text->push_back(static_cast<char>('0' + c % 10));
            }
        }
        pos += 1 + len;
    }
    *end = after ? *after : pos + 1;
    return true;
}

struct Record {
    std::string name;
    uint16_t type, rclass;
    uint32_t ttl;
    size_t rdata, rdlength;
};

// The record at `*pos`, its rdata's place checked to lie in the message.
bool read_record(std::span<const uint8_t> m, size_t* pos, Record* r, std::string* error) {
    size_t p;
    if (!read_name(m, *pos, &r->name, &p, error)) return false;
    if (p + 10 > m.size()) return fail(error, "record cut short");
    r->type = get16(m, p);
    r->rclass = get16(m, p + 2);
    r->ttl = get32(m, p + 4);
    // RFC 2181 8: a TTL with the top bit set is to be read as 0.
    if (r->ttl & 0x80000000u) r->ttl = 0;
    r->rdlength = get16(m, p + 8);
    r->rdata = p + 10;
    if (r->rdata + r->rdlength > m.size()) return fail(error, "record data runs past the message");
    *pos = r->rdata + r->rdlength;
    return true;
}

}  // namespace

QueryParse parse_query(std::span<const uint8_t> m) {
    QueryParse out;
    if (m.size() < kHeaderSize) return failed(out, "shorter than a DNS header");
    const Header h = read_header(m);
    if (h.qr) return failed(out, "a response, not a query");
    out.header = h;
    if (h.opcode != 0) {
        out.answer = Rcode::notimp;
        return failed(out, "opcode " + std::to_string(h.opcode) + " is not QUERY");
    }
    if (h.qdcount != 1) return failed(out, "not exactly one question");
    if (h.ancount != 0 || h.nscount != 0) return failed(out, "a query with answer records");
    if (h.arcount > 1) return failed(out, "more than one additional record");
    Query q;
    q.header = h;
    size_t pos;
    if (!read_name(m, kHeaderSize, &q.question.name, &pos, &out.error, false)) return out;
    if (pos + 4 > m.size()) return failed(out, "question cut short");
    q.question.qtype = get16(m, pos);
    q.question.qclass = get16(m, pos + 2);
    pos += 4;
    q.question.wire.assign(m.begin() + kHeaderSize, m.begin() + static_cast<ptrdiff_t>(pos));
    if (h.arcount == 1) {
        Record r;
        if (!read_record(m, &pos, &r, &out.error)) return out;
        if (r.type != kTypeOpt || !r.name.empty())
            return failed(out, "an additional record that is not OPT");
        q.edns = true;
        // The OPT's class is the payload size it accepts; below 512 means 512 (RFC 6891 6.2.5).
        q.udp_size = std::max<size_t>(r.rclass, kPlainUdpSize);
    }
    if (pos != m.size()) return failed(out, "bytes after the query");
    out.query = std::move(q);
    return out;
}

ResponseParse parse_response(std::span<const uint8_t> m, uint16_t id, const Question& question) {
    ResponseParse out;
    if (m.size() < kHeaderSize) return failed(out, "shorter than a DNS header");
    Response r;
    r.header = read_header(m);
    const Header& h = r.header;
    if (!h.qr) return failed(out, "not a response");
    if (h.id != id) return failed(out, "another id");
    if (h.qdcount != 1) return failed(out, "not exactly one question");
    std::string name;
    size_t pos;
    if (!read_name(m, kHeaderSize, &name, &pos, &out.error)) return out;
    if (pos + 4 > m.size()) return failed(out, "question cut short");
    if (name != question.name || get16(m, pos) != question.qtype ||
        get16(m, pos + 2) != question.qclass)
        return failed(out, "another question");
    pos += 4;
    out.ours = true;

    // Each record takes at least 11 bytes, so the counts cannot make the loops run longer
    // than the message's size allows.
    std::vector<Record> answers;
    for (unsigned i = 0; i < h.ancount; ++i) {
        Record rec;
        if (!read_record(m, &pos, &rec, &out.error)) return out;
        answers.push_back(std::move(rec));
    }
    for (unsigned i = 0; i < h.nscount; ++i) {
        Record rec;
        if (!read_record(m, &pos, &rec, &out.error)) return out;
    }
    r.additional_offset = pos;
    for (unsigned i = 0; i < h.arcount; ++i) {
        Record rec;
        if (!read_record(m, &pos, &rec, &out.error)) return out;
    }

    // Follow the chain from the question's name: each step takes a CNAME of the current
    // name. A chain may be at most as long as the answer section; a loop (a -> b -> a) thus
    // ends the walk too, and then no name has addresses.
    std::string current = question.name;
    uint32_t chain_ttl = UINT32_MAX;
    size_t steps = 0;
    for (;;) {
        const auto cname = std::find_if(answers.begin(), answers.end(), [&](const Record& rec) {
            return rec.type == kTypeCname && rec.rclass == kClassIn && rec.name == current;
        });
        if (cname == answers.end()) break;
        if (++steps > answers.size()) return failed(out, "a CNAME loop");
        size_t end;
        std::string target;
        if (!read_name(m, cname->rdata, &target, &end, &out.error)) return out;
        if (end != cname->rdata + cname->rdlength)
            return failed(out, "a CNAME's data is not a name");
        chain_ttl = std::min(chain_ttl, cname->ttl);
        current = std::move(target);
    }
    for (const Record& rec : answers) {
        if (rec.type != kTypeA || rec.rclass != kClassIn || rec.name != current) continue;
        if (rec.rdlength != 4) return failed(out, "an A record's data is not 4 bytes");
        r.addresses.push_back({get32(m, rec.rdata), std::min(chain_ttl, rec.ttl)});
    }
    out.response = std::move(r);
    return out;
}

std::vector<uint8_t> make_query(uint16_t id, const Question& question, bool cd, uint16_t udp_size) {
    std::vector<uint8_t> out;
    out.reserve(kHeaderSize + question.wire.size() + 11);
    put16(out, id);
    out.push_back(0x01);  // RD
    out.push_back(cd ? 0x10 : 0);
    put16(out, 1);
    put16(out, 0);
    put16(out, 0);
    put16(out, 1);
    out.insert(out.end(), question.wire.begin(), question.wire.end());
    put_opt(out, udp_size);
    return out;
}

std::vector<uint8_t> make_answer(const Query& query, Rcode rcode) {
    std::vector<uint8_t> out;
    write_answer_header(out, query.header, rcode, 1, query.edns ? 1 : 0);
    out.insert(out.end(), query.question.wire.begin(), query.question.wire.end());
    if (query.edns) put_opt(out, static_cast<uint16_t>(std::min<size_t>(query.udp_size, 1232)));
    return out;
}

std::vector<uint8_t> make_answer(const Header& header, Rcode rcode) {
    std::vector<uint8_t> out;
    write_answer_header(out, header, rcode, 0, 0);
    return out;
}

std::vector<uint8_t> make_reply(std::span<const uint8_t> response, const Response& parsed,
                                const Query& query, size_t max_size) {
    std::vector<uint8_t> out;
    const size_t keep = query.edns ? response.size() : parsed.additional_offset;
    if (keep > max_size) {
        // Header and question only, TC set; the upstream's rcode stays.
        write_answer_header(out, query.header, static_cast<Rcode>(parsed.header.rcode), 1, 0);
        out[2] |= 0x02;
        out.insert(out.end(), query.question.wire.begin(), query.question.wire.end());
        return out;
    }
    out.assign(response.begin(), response.begin() + static_cast<ptrdiff_t>(keep));
    set16(out, 0, query.header.id);
    if (!query.edns) set16(out, 10, 0);
    return out;
}

}  // namespace berth::net::dns
