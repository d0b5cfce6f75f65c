// berth's DNS for sandboxes: the forwarder behind the gateway address their resolv.conf
// names. Runs on the host, in the host's network namespace (so loopback stubs such as
// 127.0.0.53 are reachable as upstreams), and serves sandboxes it does not trust.
//
// A sandbox is known by its IPv4 source address on the bridge, and its Policy says what it
// gets: REFUSED (none mode, or no sandbox at all), every query forwarded (public), or only
// the names of its allowlist forwarded and any other answered NXDOMAIN without asking
// upstream. For an allowlisted name the A records of the answer are handed to `learned`
// first and the answer is sent only once it has returned: the caller opens the sandbox's
// firewall to those addresses there, so the connect that follows a lookup finds them open.
//
// Single-threaded and non-blocking: poll fd() for reading, call service() when it is
// readable or next_timeout_ms() has passed. Each forwarded query leaves from a fresh
// connect()ed UDP socket (a random source port) with a random id, and a reply counts only
// if it comes from that upstream with that id and that question. What a hostile sandbox can
// make it hold is bounded: queries in flight (in total and per source), TCP connections (in
// total and per source, each with an idle timeout), a TCP message's length; what is not a
// query it can answer is dropped, and a query it cannot read is answered FORMERR.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/unique_fd.h"

namespace berth::net {
namespace dns {
struct Response;
}

// Which destinations an allowlisted name opens: opaque to the forwarder, handed back to
// `learned` with each address. (Every member has an initializer, so callers name only the
// ones they set.)
struct DnsPortRule {
    std::string proto{};  // "tcp", "udp", or "" for both
    uint16_t port_from = 0;
    uint16_t port_to = 65535;
};

struct DnsNamePattern {
    // An exact name ("api.example.com": case and a final dot do not matter) or a wildcard
    // ("*.example.com": any name strictly below example.com, at any depth, not example.com
    // itself). Labels are letters, digits, '-' and '_'.
    std::string pattern{};
    std::vector<DnsPortRule> ports{};
};

struct DnsPolicy {
    enum class Kind { refuse, forward, allowlist };
    Kind kind = Kind::refuse;
    std::vector<DnsNamePattern> names{};  // allowlist only
};

// Throws Error(invalid_argument) naming the pattern that is not one (see DnsNamePattern).
void check_dns_pattern(std::string_view pattern);
// The first pattern of `names` that `name` (a query's, lowercased, no final dot) matches.
const DnsNamePattern* match_dns_name(const std::vector<DnsNamePattern>& names,
                                     std::string_view name);

struct DnsUpstream {
    std::string address;  // IPv4
    uint16_t port = 53;
};

struct DnsForwarderConfig {
    std::string listen_address;  // IPv4: the bridge's gateway (tests: 127.0.0.1)
    uint16_t port = 53;          // 0: any free port, the same for UDP and TCP
    // IP_FREEBIND on the listeners: they bind before the address exists (the helper makes
    // the bridge and its gateway address at the first attach) and serve once it does.
    bool free_bind = false;
    std::vector<DnsUpstream> upstreams{};
    std::chrono::milliseconds upstream_timeout{2000};  // per upstream, then the next
    // Each query in flight holds a socket: the totals stay well below RLIMIT_NOFILE's usual
    // 1024.
    size_t max_in_flight = 256;
    size_t max_in_flight_per_source = 32;
    size_t max_tcp_connections = 64;
    size_t max_tcp_per_source = 8;
    // A connection that has not completed a query for this long is closed (a partial
    // message does not count: a client trickling bytes is closed all the same).
    std::chrono::milliseconds tcp_idle_timeout{10000};
};

struct DnsStats {
    uint64_t queries = 0;    // read and parsed
    uint64_t forwarded = 0;  // sent upstream
    uint64_t refused = 0;    // REFUSED answered by policy
    uint64_t nxdomain = 0;   // NXDOMAIN answered by policy (not on the allowlist)
    uint64_t malformed = 0;  // dropped or answered FORMERR/NOTIMP
    uint64_t dropped = 0;    // over a limit
    uint64_t servfail = 0;   // every upstream failed, or `learned` threw
    uint64_t spoofed = 0;    // datagrams on an upstream socket that did not match
};

class DnsForwarder {
  public:
    // Called for each A record of an allowlisted name's answer before the answer is sent.
    // Addresses are dotted quads. What it throws turns the answer into SERVFAIL.
    using Learned =
        std::function<void(const std::string& source, const std::string& address,
                           std::chrono::seconds ttl, const std::vector<DnsPortRule>& ports)>;

    // Binds the UDP and TCP listeners: throws SysError (or Error, invalid_argument, for an
    // address that is not IPv4).
    DnsForwarder(DnsForwarderConfig config, Learned learned);
    ~DnsForwarder();
    DnsForwarder(const DnsForwarder&) = delete;
    DnsForwarder& operator=(const DnsForwarder&) = delete;

    uint16_t port() const { return port_; }

    // Replaces the source's policy (patterns are checked first: throws Error,
    // invalid_argument). Queries in flight are judged by the policy in force when their
    // answer comes.
    void set_policy(const std::string& source_ip, DnsPolicy policy);
    // The source is no sandbox any more: its policy goes (it is refused), its queries in
    // flight are dropped and its TCP connections closed.
    void forget(const std::string& source_ip);

    // An epoll fd: readable when service() has work.
    int fd() const { return epoll_.get(); }
    // Does what is ready without blocking (a bounded amount: call again when fd() is still
    // readable), and what has timed out.
    void service();
    // How long until service() must run even if fd() stays quiet; -1: no deadline.
    int next_timeout_ms() const;

    const DnsStats& stats() const { return stats_; }

  private:
    struct Pending;
    struct Connection;
    using Clock = std::chrono::steady_clock;

    void on_udp();
    void on_accept();
    void on_connection(int fd, uint32_t events);
    // When every TCP slot is taken: frees one for `newcomer` if a source holding several has
    // one idle.
    void evict_for(uint32_t newcomer);
    void on_upstream(int fd);
    void expire();

    // A query from `source` (network byte order): answered at once or sent upstream.
    // `conn` is the TCP connection's id, 0 for UDP.
    void handle_query(std::span<const uint8_t> msg, const sockaddr_in& from, uint64_t conn);
    void send_to_client(const sockaddr_in& to, uint64_t conn, const std::vector<uint8_t>& msg);
    // Sends `p` to its upstream, or the next one that takes it; SERVFAIL when none does.
    void launch(std::unique_ptr<Pending> p);
    // Removes the query on upstream socket `fd` from the books (its socket still open).
    std::unique_ptr<Pending> take(int fd);
    // Its counts (per source, per connection) released.
    void unbook(const Pending& p);
    void next_upstream(int fd);
    void finish(std::unique_ptr<Pending> p, std::span<const uint8_t> response,
                const dns::Response& parsed);
    void answer(const Pending& p, const std::vector<uint8_t>& msg);
    void write_connection(Connection& c);
    void close_connection(uint64_t id);
    const DnsPolicy* policy_of(uint32_t source) const;
    uint16_t random16();

    DnsForwarderConfig config_;
    Learned learned_;
    std::vector<sockaddr_in> upstreams_;
    uint16_t port_ = 0;
    UniqueFd epoll_, udp_, tcp_;
    std::map<uint32_t, DnsPolicy> policies_;           // by source, network byte order
    std::map<int, std::unique_ptr<Pending>> pending_;  // by upstream socket
    std::map<uint32_t, size_t> pending_per_source_;
    std::map<uint64_t, std::unique_ptr<Connection>> connections_;  // by id
    std::map<int, uint64_t> connection_by_fd_;
    std::map<uint32_t, size_t> connections_per_source_;
    uint64_t next_connection_ = 1;
    std::vector<uint8_t> random_;  // getrandom's bytes, used two at a time
    std::vector<uint8_t> buffer_;  // for one datagram
    DnsStats stats_;
};

}  // namespace berth::net
