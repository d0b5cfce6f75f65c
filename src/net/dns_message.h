// DNS wire format, as much as berth's DNS forwarder needs: a sandbox's query read, an
// upstream's response checked against the question it was asked and its A records taken
// (through the CNAME chain), and the few answers the forwarder makes itself.
//
// Every byte here is untrusted: a query comes from a sandbox, a response from whoever can
// reach the upstream socket. Parsing never reads past the span, follows only compression
// pointers that point backwards (so a name cannot loop), past the header, and at most
// kMaxPointers of them,
// and bounds every count by what the message's size can hold, so the work on a message is
// linear in its size. Nothing throws: what is refused says why.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace berth::net::dns {

inline constexpr uint16_t kTypeA = 1;
inline constexpr uint16_t kTypeCname = 5;
inline constexpr uint16_t kTypeOpt = 41;
inline constexpr uint16_t kTypeAaaa = 28;
inline constexpr uint16_t kClassIn = 1;
inline constexpr size_t kHeaderSize = 12;
// The payload a plain (non-EDNS) UDP DNS message may have (RFC 1035 4.2.1).
inline constexpr size_t kPlainUdpSize = 512;
inline constexpr int kMaxPointers = 32;

enum class Rcode : uint8_t {
    noerror = 0,
    formerr = 1,
    servfail = 2,
    nxdomain = 3,
    notimp = 4,
    refused = 5,
};

// The header fields berth looks at.
struct Header {
    uint16_t id = 0;
    bool qr = false;  // a response
    uint8_t opcode = 0;
    bool tc = false;
    bool rd = false;
    bool cd = false;
    uint8_t rcode = 0;
    uint16_t qdcount = 0, ancount = 0, nscount = 0, arcount = 0;
};

struct Question {
    // Presentation form, lowercased, without the final dot ("" is the root): a byte that is
    // not a letter, digit, '-', '_' or '*' is written \DDD, so that a label holding a '.'
    // can never read as two labels.
    std::string name;
    uint16_t qtype = 0;
    uint16_t qclass = 0;
    // The question as it came (name, type, class: the name uncompressed), echoed in answers
    // and sent upstream.
    std::vector<uint8_t> wire;
};

struct Query {
    Header header;
    Question question;
    // The UDP payload the client accepts: its EDNS OPT record's (at least 512), or 512.
    size_t udp_size = kPlainUdpSize;
    bool edns = false;
};

struct QueryParse {
    std::optional<Query> query;
    // Set when the message had a whole header that says "query": the id and flags a FORMERR
    // or NOTIMP answer goes back with. A response or a runt gets no answer at all (answering
    // a response is how two resolvers ping-pong forever).
    std::optional<Header> header;
    Rcode answer = Rcode::formerr;  // what to answer when query is empty and header set
    std::string error;              // why query is empty
};

// A client's query: QR clear, opcode QUERY, exactly one question, no answer or authority
// records, and at most one additional record, an OPT (EDNS). No compression pointer in the
// question (there is nothing before it to point to).
QueryParse parse_query(std::span<const uint8_t> msg);

struct Address {
    uint32_t ipv4 = 0;  // host byte order
    uint32_t ttl = 0;   // seconds: the least TTL along the CNAME chain to it
};

struct Response {
    Header header;
    // The A records of the name the CNAME chain from the question ends at.
    std::vector<Address> addresses;
    // Where the additional section starts: the response without it (arcount 0) is still
    // whole.
    size_t additional_offset = 0;
};

struct ResponseParse {
    std::optional<Response> response;
    // The id and the question matched: a response that is empty after that is a broken
    // answer to this query, not someone else's (or a spoofer's) datagram.
    bool ours = false;
    std::string error;
};

// An upstream's response to the query `id` asking `question`: refused unless it is a
// response with that id and that one question (the name compared case-insensitively).
ResponseParse parse_response(std::span<const uint8_t> msg, uint16_t id, const Question& question);

// A query for `question` with `id`, recursion desired, `cd` as the client set it, and an OPT
// record offering `udp_size`.
std::vector<uint8_t> make_query(uint16_t id, const Question& question, bool cd, uint16_t udp_size);

// The forwarder's own answer to `query`: same id, RD as asked, RA set, `rcode`, the question
// echoed, no records (an OPT when the query had one).
std::vector<uint8_t> make_answer(const Query& query, Rcode rcode);
// An answer to a query that could not be read beyond its header (FORMERR, NOTIMP): no
// question.
std::vector<uint8_t> make_answer(const Header& header, Rcode rcode);
// `response` (an upstream's, already checked) as the client gets it: its id set to `id`,
// without the additional section when the client did not speak EDNS (an OPT there would be
// a record it never asked for), and cut to header and question with TC set when it is
// larger than `max_size` (the client then asks again over TCP).
std::vector<uint8_t> make_reply(std::span<const uint8_t> response, const Response& parsed,
                                const Query& query, size_t max_size);

}  // namespace berth::net::dns
