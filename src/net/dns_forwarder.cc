#include "net/dns_forwarder.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/random.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <exception>
#include <optional>

#include "base/error.h"
#include "net/dns_message.h"

namespace berth::net {
namespace {

using Kind = Error::Kind;

// Queries are small (a name is at most 255 bytes); anything longer over TCP is not one, and
// the connection goes rather than a buffer growing for it.
constexpr size_t kMaxTcpQuery = 4096;
// What a connection may have queued for a client that does not read before it is closed.
constexpr size_t kMaxTcpOutput = 256 * 1024;
// The payload offered upstream: the size DNS flag day 2020 settled on, which no path
// fragments.
constexpr uint16_t kUpstreamUdpSize = 1232;
// How much one service() call takes from each source of work, so that one flood cannot
// keep it from the rest.
constexpr int kDatagramsPerService = 64;
constexpr int kAcceptsPerService = 16;

std::string lower_pattern(std::string_view p) {
    if (!p.empty() && p.back() == '.') p.remove_suffix(1);
    std::string out(p);
    for (char& c : out)
        if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    return out;
}

bool matches(std::string_view name, const std::string& pattern) {
    if (pattern.size() >= 2 && pattern[0] == '*' && pattern[1] == '.') {
        const std::string_view suffix = std::string_view(pattern).substr(1);  // ".example.com"
        return name.size() > suffix.size() && name.ends_with(suffix);
    }
    return name == pattern;
}

std::string shown(std::string_view s) {
    std::string out = "\"";
    for (char c : s.substr(0, 64)) out += (c >= 0x20 && c < 0x7f) ? c : '?';
    return out + (s.size() > 64 ? "...\"" : "\"");
}

in_addr_t parse_ipv4(const std::string& s, std::string_view what) {
    in_addr addr{};
    if (s.find('\0') != std::string::npos || ::inet_pton(AF_INET, s.c_str(), &addr) != 1)
        throw Error(Kind::invalid_argument,
                    std::string(what) + ": not an IPv4 address: " + shown(s));
    return addr.s_addr;
}

std::string print_ipv4(in_addr_t network_order) {
    in_addr addr{network_order};
    char buf[INET_ADDRSTRLEN];
    ::inet_ntop(AF_INET, &addr, buf, sizeof buf);
    return buf;
}

sockaddr_in make_addr(in_addr_t address, uint16_t port) {
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = address;
    sa.sin_port = htons(port);
    return sa;
}

UniqueFd make_socket(int type) {
    return UniqueFd(check_sys("socket", "dns", [&] {
        return ::socket(AF_INET, type | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    }));
}

void bind_to(int fd, const sockaddr_in& sa, const std::string& what) {
    check_sys("bind", what,
              [&] { return ::bind(fd, reinterpret_cast<const sockaddr*>(&sa), sizeof sa); });
}

}  // namespace

void check_dns_pattern(std::string_view pattern) {
    std::string p = lower_pattern(pattern);
    const auto bad = [&](const char* why) {
        throw Error(Kind::invalid_argument,
                    "DNS name pattern " + shown(pattern) + ": " + std::string(why));
    };
    if (p.starts_with("*.")) p.erase(0, 2);
    if (p.empty()) bad("no name");
    if (p.size() > 253) bad("longer than 253 characters");
    size_t label = 0;
    for (size_t i = 0; i <= p.size(); ++i) {
        if (i == p.size() || p[i] == '.') {
            if (label == 0) bad("an empty label");
            if (label > 63) bad("a label longer than 63 characters");
            label = 0;
            continue;
        }
        const char c = p[i];
        if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_'))
            bad("labels are letters, digits, '-' and '_' (a wildcard is a leading \"*.\")");
        ++label;
    }
}

const DnsNamePattern* match_dns_name(const std::vector<DnsNamePattern>& names,
                                     std::string_view name) {
    for (const DnsNamePattern& n : names)
        if (matches(name, lower_pattern(n.pattern))) return &n;
    return nullptr;
}

struct DnsForwarder::Pending {
    UniqueFd sock;
    in_addr_t source = 0;
    sockaddr_in client{};
    uint64_t conn = 0;  // 0: the query came over UDP
    dns::Query query;
    uint16_t upstream_id = 0;
    size_t upstream = 0;  // index into upstreams_
    Clock::time_point deadline;
};

struct DnsForwarder::Connection {
    UniqueFd fd;
    sockaddr_in peer{};
    std::vector<uint8_t> in;
    std::vector<uint8_t> out;
    size_t pending = 0;  // its queries in flight
    bool eof = false;    // the client sent all it will: close once answered
    Clock::time_point idle_deadline;
};

DnsForwarder::DnsForwarder(DnsForwarderConfig config, Learned learned)
    : config_(std::move(config)), learned_(std::move(learned)), buffer_(65536) {
    const in_addr_t listen = parse_ipv4(config_.listen_address, "DNS listen address");
    for (const DnsUpstream& u : config_.upstreams)
        upstreams_.push_back(make_addr(parse_ipv4(u.address, "DNS upstream"), u.port));
    epoll_ =
        UniqueFd(check_sys("epoll_create1", "dns", [] { return ::epoll_create1(EPOLL_CLOEXEC); }));

    // Port 0: the kernel picks UDP's, and TCP takes the same one (retried, in the rare case
    // that some TCP socket holds it already).
    const std::string what = config_.listen_address + ":" + std::to_string(config_.port);
    for (int attempt = 0;; ++attempt) {
        udp_ = make_socket(SOCK_DGRAM);
        tcp_ = make_socket(SOCK_STREAM);
        if (config_.free_bind) {
            const int on = 1;
            for (int fd : {udp_.get(), tcp_.get()})
                check_sys("setsockopt", "dns IP_FREEBIND", [&] {
                    return ::setsockopt(fd, IPPROTO_IP, IP_FREEBIND, &on, sizeof on);
                });
        }
        bind_to(udp_.get(), make_addr(listen, config_.port), "dns udp " + what);
        sockaddr_in bound{};
        socklen_t len = sizeof bound;
        check_sys("getsockname", "dns udp", [&] {
            return ::getsockname(udp_.get(), reinterpret_cast<sockaddr*>(&bound), &len);
        });
        port_ = ntohs(bound.sin_port);
        const int one = 1;
        check_sys("setsockopt", "dns tcp SO_REUSEADDR", [&] {
            return ::setsockopt(tcp_.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        });
        const sockaddr_in sa = make_addr(listen, port_);
        if (::bind(tcp_.get(), reinterpret_cast<const sockaddr*>(&sa), sizeof sa) == 0) break;
        if (errno != EADDRINUSE || config_.port != 0 || attempt == 16)
            throw_sys("bind", "dns tcp " + config_.listen_address + ":" + std::to_string(port_));
    }
    check_sys("listen", "dns tcp", [&] { return ::listen(tcp_.get(), 64); });
    // Every sandbox's queries share the one UDP socket: a larger buffer than the default
    // (~200 KiB) lets a burst from one wait its turn rather than push out the others'.
    // Best effort: the kernel caps it at net.core.rmem_max.
    const int rcvbuf = 4 << 20;
    ::setsockopt(udp_.get(), SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
    for (int fd : {udp_.get(), tcp_.get()}) {
        epoll_event ev{};
        ev.events = EPOLLIN;
        ev.data.fd = fd;
        check_sys("epoll_ctl", "dns listener",
                  [&] { return ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &ev); });
    }
}

DnsForwarder::~DnsForwarder() = default;

void DnsForwarder::set_policy(const std::string& source_ip, DnsPolicy policy) {
    const in_addr_t source = parse_ipv4(source_ip, "DNS policy source");
    for (DnsNamePattern& n : policy.names) {
        check_dns_pattern(n.pattern);
        n.pattern = lower_pattern(n.pattern);
    }
    policies_[source] = std::move(policy);
}

void DnsForwarder::forget(const std::string& source_ip) {
    const in_addr_t source = parse_ipv4(source_ip, "DNS policy source");
    policies_.erase(source);
    std::vector<int> fds;
    for (const auto& [fd, p] : pending_)
        if (p->source == source) fds.push_back(fd);
    for (int fd : fds) take(fd);
    std::vector<uint64_t> ids;
    for (const auto& [id, c] : connections_)
        if (c->peer.sin_addr.s_addr == source) ids.push_back(id);
    for (uint64_t id : ids) close_connection(id);
}

const DnsPolicy* DnsForwarder::policy_of(uint32_t source) const {
    const auto it = policies_.find(source);
    return it == policies_.end() ? nullptr : &it->second;
}

uint16_t DnsForwarder::random16() {
    if (random_.size() < 2) {
        random_.resize(512);
        size_t got = 0;
        while (got < random_.size()) {
            got += static_cast<size_t>(check_sys("getrandom", "dns query id", [&] {
                return ::getrandom(random_.data() + got, random_.size() - got, 0);
            }));
        }
    }
    const uint16_t v =
        static_cast<uint16_t>(random_[random_.size() - 1] << 8 | random_[random_.size() - 2]);
    random_.resize(random_.size() - 2);
    return v;
}

void DnsForwarder::service() {
    epoll_event events[64];
    const int n = ::epoll_wait(epoll_.get(), events, 64, 0);
    if (n < 0 && errno != EINTR) throw_sys("epoll_wait", "dns");
    for (int i = 0; i < n; ++i) {
        const int fd = events[i].data.fd;
        // An earlier event of this batch may have closed it (and the number may even be
        // another socket's by now: each lookup below finds what it is now).
        if (fd == udp_.get()) {
            on_udp();
        } else if (fd == tcp_.get()) {
            on_accept();
        } else if (pending_.count(fd)) {
            on_upstream(fd);
        } else if (connection_by_fd_.count(fd)) {
            on_connection(fd, events[i].events);
        }
    }
    expire();
}

int DnsForwarder::next_timeout_ms() const {
    std::optional<Clock::time_point> next;
    const auto consider = [&](Clock::time_point t) {
        if (!next || t < *next) next = t;
    };
    for (const auto& [fd, p] : pending_) consider(p->deadline);
    // (A connection waiting on its queries is not idle: its deadline is moved on when it is
    // answered.)
    for (const auto& [id, c] : connections_)
        if (c->pending == 0) consider(c->idle_deadline);
    if (!next) return -1;
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(*next - Clock::now()).count();
    return static_cast<int>(std::clamp<long long>(left, 0, 60'000));
}

void DnsForwarder::on_udp() {
    for (int i = 0; i < kDatagramsPerService; ++i) {
        sockaddr_in from{};
        socklen_t len = sizeof from;
        const ssize_t n = ::recvfrom(udp_.get(), buffer_.data(), buffer_.size(), MSG_TRUNC,
                                     reinterpret_cast<sockaddr*>(&from), &len);
        if (n < 0) {
            if (errno == EAGAIN || errno == EINTR) return;
            continue;  // (an ICMP error of an earlier reply: nothing to do about it)
        }
        if (static_cast<size_t>(n) > buffer_.size() || from.sin_family != AF_INET) {
            ++stats_.malformed;
            continue;
        }
        handle_query(std::span<const uint8_t>(buffer_.data(), static_cast<size_t>(n)), from, 0);
    }
}

void DnsForwarder::on_accept() {
    for (int i = 0; i < kAcceptsPerService; ++i) {
        sockaddr_in peer{};
        socklen_t len = sizeof peer;
        UniqueFd fd(::accept4(tcp_.get(), reinterpret_cast<sockaddr*>(&peer), &len,
                              SOCK_NONBLOCK | SOCK_CLOEXEC));
        if (!fd) {
            if (errno == EAGAIN || errno == EINTR) return;
            if (errno == EMFILE || errno == ENFILE) {
                ++stats_.dropped;
                return;
            }
            continue;  // ECONNABORTED and the like: that client is gone
        }
        const in_addr_t source = peer.sin_addr.s_addr;
        if (connections_.size() >= config_.max_tcp_connections &&
            connections_per_source_[source] < config_.max_tcp_per_source)
            evict_for(source);
        if (connections_.size() >= config_.max_tcp_connections ||
            connections_per_source_[source] >= config_.max_tcp_per_source) {
            if (connections_per_source_[source] == 0) connections_per_source_.erase(source);
            ++stats_.dropped;
            continue;  // closed at once
        }
        epoll_event ev{};
        ev.events = EPOLLIN;
        ev.data.fd = fd.get();
        if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd.get(), &ev) != 0) continue;
        auto c = std::make_unique<Connection>();
        const uint64_t id = next_connection_++;
        connection_by_fd_[fd.get()] = id;
        c->fd = std::move(fd);
        c->peer = peer;
        c->idle_deadline = Clock::now() + config_.tcp_idle_timeout;
        connections_[id] = std::move(c);
        ++connections_per_source_[source];
    }
}

void DnsForwarder::evict_for(uint32_t newcomer) {
    // The source holding the most connections gives up its longest idle one (RFC 7766 6.2.3
    // lets a server close idle connections under pressure): a few sandboxes holding every
    // slot open do not shut the others out.
    const Connection* victim = nullptr;
    uint64_t victim_id = 0;
    size_t most = 0;
    for (const auto& [id, c] : connections_) {
        const in_addr_t s = c->peer.sin_addr.s_addr;
        if (c->pending != 0 || s == newcomer) continue;
        const size_t n = connections_per_source_[s];
        if (!victim || n > most || (n == most && c->idle_deadline < victim->idle_deadline)) {
            victim = c.get();
            victim_id = id;
            most = n;
        }
    }
    if (victim && most > 1) close_connection(victim_id);
}

void DnsForwarder::on_connection(int fd, uint32_t events) {
    const uint64_t id = connection_by_fd_.at(fd);
    Connection& c = *connections_.at(id);
    if (events & (EPOLLERR | EPOLLHUP)) return close_connection(id);
    if (events & EPOLLOUT) {
        write_connection(c);
        if (!connections_.count(id)) return;
    }
    if (!(events & EPOLLIN) || c.eof) return;
    // One read per event: epoll is level-triggered, so what is left comes back next time.
    uint8_t chunk[4096];
    const size_t room = 2 + kMaxTcpQuery - c.in.size();
    const ssize_t n = ::read(fd, chunk, std::min(room, sizeof chunk));
    if (n < 0) {
        if (errno == EAGAIN || errno == EINTR) return;
        return close_connection(id);
    }
    if (n == 0) {
        c.eof = true;
        if (c.pending == 0 && c.out.empty()) return close_connection(id);
        epoll_event ev{};
        ev.events = c.out.empty() ? 0u : uint32_t{EPOLLOUT};
        ev.data.fd = fd;
        ::epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, fd, &ev);
        return;
    }
    c.in.insert(c.in.end(), chunk, chunk + n);
    size_t used = 0;
    while (c.in.size() - used >= 2) {
        const size_t len = size_t{c.in[used]} << 8 | c.in[used + 1];
        if (len < dns::kHeaderSize || len > kMaxTcpQuery) {
            ++stats_.malformed;
            return close_connection(id);
        }
        if (c.in.size() - used < 2 + len) break;
        c.idle_deadline = Clock::now() + config_.tcp_idle_timeout;
        const std::vector<uint8_t> msg(c.in.begin() + static_cast<ptrdiff_t>(used + 2),
                                       c.in.begin() + static_cast<ptrdiff_t>(used + 2 + len));
        used += 2 + len;
        handle_query(msg, c.peer, id);
        if (!connections_.count(id)) return;  // (the answer overflowed its output)
    }
    c.in.erase(c.in.begin(), c.in.begin() + static_cast<ptrdiff_t>(used));
}

void DnsForwarder::handle_query(std::span<const uint8_t> msg, const sockaddr_in& from,
                                uint64_t conn) {
    dns::QueryParse parse = dns::parse_query(msg);
    if (!parse.query) {
        ++stats_.malformed;
        if (parse.header) send_to_client(from, conn, dns::make_answer(*parse.header, parse.answer));
        return;
    }
    ++stats_.queries;
    const dns::Query& q = *parse.query;
    const DnsPolicy* policy = policy_of(from.sin_addr.s_addr);
    if (!policy || policy->kind == DnsPolicy::Kind::refuse ||
        (policy->kind == DnsPolicy::Kind::allowlist && q.question.qclass != dns::kClassIn)) {
        ++stats_.refused;
        return send_to_client(from, conn, dns::make_answer(q, dns::Rcode::refused));
    }
    if (policy->kind == DnsPolicy::Kind::allowlist &&
        !match_dns_name(policy->names, q.question.name)) {
        ++stats_.nxdomain;
        return send_to_client(from, conn, dns::make_answer(q, dns::Rcode::nxdomain));
    }
    size_t& mine = pending_per_source_[from.sin_addr.s_addr];
    if (pending_.size() >= config_.max_in_flight || mine >= config_.max_in_flight_per_source) {
        // Over UDP dropped, not answered: the flood costs nothing more, and a real client
        // retries. Over TCP a client does not ask again: SERVFAIL.
        if (mine == 0) pending_per_source_.erase(from.sin_addr.s_addr);
        ++stats_.dropped;
        if (conn) send_to_client(from, conn, dns::make_answer(q, dns::Rcode::servfail));
        return;
    }
    ++mine;
    if (conn) ++connections_.at(conn)->pending;
    auto p = std::make_unique<Pending>();
    p->source = from.sin_addr.s_addr;
    p->client = from;
    p->conn = conn;
    p->query = std::move(*parse.query);
    launch(std::move(p));
}

void DnsForwarder::launch(std::unique_ptr<Pending> p) {
    for (; p->upstream < upstreams_.size(); ++p->upstream) {
        UniqueFd sock(::socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
        if (!sock) break;  // EMFILE: no upstream would fare better
        // connect() picks a random source port and makes the kernel drop datagrams from
        // anyone but this upstream.
        const sockaddr_in& up = upstreams_[p->upstream];
        if (::connect(sock.get(), reinterpret_cast<const sockaddr*>(&up), sizeof up) != 0) continue;
        p->upstream_id = random16();
        const std::vector<uint8_t> q = dns::make_query(p->upstream_id, p->query.question,
                                                       p->query.header.cd, kUpstreamUdpSize);
        if (::send(sock.get(), q.data(), q.size(), 0) != static_cast<ssize_t>(q.size())) continue;
        epoll_event ev{};
        ev.events = EPOLLIN;
        ev.data.fd = sock.get();
        if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, sock.get(), &ev) != 0) continue;
        p->deadline = Clock::now() + config_.upstream_timeout;
        p->sock = std::move(sock);
        ++stats_.forwarded;
        const int fd = p->sock.get();
        pending_[fd] = std::move(p);
        return;
    }
    ++stats_.servfail;
    unbook(*p);
    answer(*p, dns::make_answer(p->query, dns::Rcode::servfail));
}

std::unique_ptr<DnsForwarder::Pending> DnsForwarder::take(int fd) {
    const auto it = pending_.find(fd);
    std::unique_ptr<Pending> p = std::move(it->second);
    pending_.erase(it);
    unbook(*p);
    return p;
}

void DnsForwarder::unbook(const Pending& pending) {
    const Pending* p = &pending;
    const auto per = pending_per_source_.find(p->source);
    if (per != pending_per_source_.end() && --per->second == 0) pending_per_source_.erase(per);
    if (p->conn) {
        const auto c = connections_.find(p->conn);
        // (A connection the client has half-closed goes once its last answer is written:
        // write_connection sees to that, and every query that leaves the books is answered
        // next, or its connection closed.)
        if (c != connections_.end()) --c->second->pending;
    }
}

void DnsForwarder::next_upstream(int fd) {
    std::unique_ptr<Pending> p = std::move(pending_.at(fd));
    pending_.erase(fd);
    p->sock.reset();
    ++p->upstream;
    launch(std::move(p));
}

void DnsForwarder::on_upstream(int fd) {
    for (int i = 0; i < 8; ++i) {
        const ssize_t n = ::recv(fd, buffer_.data(), buffer_.size(), 0);
        if (n < 0) {
            if (errno == EAGAIN || errno == EINTR) return;
            return next_upstream(fd);  // ECONNREFUSED: nothing listens there
        }
        Pending& p = *pending_.at(fd);
        const std::span<const uint8_t> msg(buffer_.data(), static_cast<size_t>(n));
        dns::ResponseParse parse = dns::parse_response(msg, p.upstream_id, p.query.question);
        if (!parse.ours) {
            ++stats_.spoofed;
            continue;
        }
        if (!parse.response) return next_upstream(fd);
        const uint8_t rcode = parse.response->header.rcode;
        if ((rcode == static_cast<uint8_t>(dns::Rcode::servfail) ||
             rcode == static_cast<uint8_t>(dns::Rcode::refused)) &&
            p.upstream + 1 < upstreams_.size())
            return next_upstream(fd);
        finish(take(fd), msg, *parse.response);
        return;
    }
}

void DnsForwarder::finish(std::unique_ptr<Pending> p, std::span<const uint8_t> response,
                          const dns::Response& parsed) {
    // Judged again now: the policy may have changed while the query was out.
    const DnsPolicy* policy = policy_of(p->source);
    if (!policy || policy->kind == DnsPolicy::Kind::refuse) {
        ++stats_.refused;
        return answer(*p, dns::make_answer(p->query, dns::Rcode::refused));
    }
    if (policy->kind == DnsPolicy::Kind::allowlist) {
        const DnsNamePattern* pattern = match_dns_name(policy->names, p->query.question.name);
        if (!pattern) {
            ++stats_.nxdomain;
            return answer(*p, dns::make_answer(p->query, dns::Rcode::nxdomain));
        }
        // Copied: `learned` may not call back into the forwarder, but the policy's storage
        // is not ours to lean on while foreign code runs.
        const std::vector<DnsPortRule> ports = pattern->ports;
        const std::string source = print_ipv4(p->source);
        try {
            for (const dns::Address& a : parsed.addresses)
                learned_(source, print_ipv4(htonl(a.ipv4)), std::chrono::seconds(a.ttl), ports);
        } catch (const std::exception& e) {
            std::fprintf(stderr, "berth dns: %s for %s: %s\n", source.c_str(),
                         p->query.question.name.c_str(), e.what());
            ++stats_.servfail;
            return answer(*p, dns::make_answer(p->query, dns::Rcode::servfail));
        }
    }
    const size_t max_size = p->conn ? 65535 : p->query.udp_size;
    answer(*p, dns::make_reply(response, parsed, p->query, max_size));
}

void DnsForwarder::answer(const Pending& p, const std::vector<uint8_t>& msg) {
    send_to_client(p.client, p.conn, msg);
}

void DnsForwarder::send_to_client(const sockaddr_in& to, uint64_t conn,
                                  const std::vector<uint8_t>& msg) {
    if (!conn) {
        // Never waits: a reply the socket has no room for is dropped (the client retries).
        ::sendto(udp_.get(), msg.data(), msg.size(), MSG_DONTWAIT,
                 reinterpret_cast<const sockaddr*>(&to), sizeof to);
        return;
    }
    const auto it = connections_.find(conn);
    if (it == connections_.end() || msg.size() > 65535) return;
    Connection& c = *it->second;
    c.out.push_back(static_cast<uint8_t>(msg.size() >> 8));
    c.out.push_back(static_cast<uint8_t>(msg.size()));
    c.out.insert(c.out.end(), msg.begin(), msg.end());
    if (c.out.size() > kMaxTcpOutput) return close_connection(conn);
    c.idle_deadline = Clock::now() + config_.tcp_idle_timeout;
    write_connection(c);
}

void DnsForwarder::write_connection(Connection& c) {
    const uint64_t id = connection_by_fd_.at(c.fd.get());
    while (!c.out.empty()) {
        const ssize_t n =
            ::send(c.fd.get(), c.out.data(), c.out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN) break;
            return close_connection(id);
        }
        c.out.erase(c.out.begin(), c.out.begin() + n);
    }
    if (c.eof && c.out.empty() && c.pending == 0) return close_connection(id);
    epoll_event ev{};
    ev.events = (c.eof ? 0u : uint32_t{EPOLLIN}) | (c.out.empty() ? 0u : uint32_t{EPOLLOUT});
    ev.data.fd = c.fd.get();
    ::epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, c.fd.get(), &ev);
}

void DnsForwarder::close_connection(uint64_t id) {
    const auto it = connections_.find(id);
    if (it == connections_.end()) return;
    const in_addr_t source = it->second->peer.sin_addr.s_addr;
    connection_by_fd_.erase(it->second->fd.get());
    connections_.erase(it);  // closing the fd takes it out of the epoll set
    const auto per = connections_per_source_.find(source);
    if (per != connections_per_source_.end() && --per->second == 0)
        connections_per_source_.erase(per);
    // Its queries in flight stay (their answers are dropped): they still count against the
    // source, which is what bounds a client that opens, asks and closes in a loop.
}

void DnsForwarder::expire() {
    const auto now = Clock::now();
    std::vector<int> late;
    for (const auto& [fd, p] : pending_)
        if (p->deadline <= now) late.push_back(fd);
    for (int fd : late)
        if (pending_.count(fd)) next_upstream(fd);
    std::vector<uint64_t> idle;
    for (const auto& [id, c] : connections_)
        if (c->idle_deadline <= now && c->pending == 0) idle.push_back(id);
    for (uint64_t id : idle) close_connection(id);
}

}  // namespace berth::net
