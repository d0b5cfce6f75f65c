#include "net/dns_service.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <map>
#include <string_view>

#include "base/child_process.h"
#include "base/error.h"
#include "dns.pb.h"

namespace berth::net {
namespace {

namespace pb = berth::v1::dns;
using Kind = Error::Kind;

// The control channel's frames are runtime/wire's (a 4-byte big-endian length, then the
// message), written here again in a few lines: src/net is built before src/runtime, whose
// wire library depends on the whole protocol. Policies are small; a frame this large is a
// broken peer.
constexpr uint32_t kMaxFrame = 1u << 20;

std::string encode(const google::protobuf::MessageLite& msg) {
    const std::string body = msg.SerializeAsString();
    const uint32_t n = static_cast<uint32_t>(body.size());
    std::string out = {static_cast<char>(n >> 24), static_cast<char>(n >> 16),
                       static_cast<char>(n >> 8), static_cast<char>(n)};
    return out + body;
}

void write_all(int fd, std::string_view bytes, const char* what) {
    while (!bytes.empty()) {
        // (send: the peer's going must be EPIPE here, not a SIGPIPE that kills us.)
        const ssize_t n = check_sys(
            "send", what, [&] { return ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL); });
        bytes.remove_prefix(static_cast<size_t>(n));
    }
}

// Takes one whole frame off the front of `buffer` into `msg`: false while it is not all
// there. Throws Error for a frame too large or not a message.
bool take_frame(std::string& buffer, google::protobuf::MessageLite& msg, const char* what) {
    if (buffer.size() < 4) return false;
    const auto* h = reinterpret_cast<const unsigned char*>(buffer.data());
    const uint32_t n = uint32_t{h[0]} << 24 | uint32_t{h[1]} << 16 | uint32_t{h[2]} << 8 | h[3];
    if (n > kMaxFrame)
        throw Error(Kind::invalid_argument,
                    std::string(what) + ": a frame of " + std::to_string(n) + " bytes");
    if (buffer.size() < 4 + size_t{n}) return false;
    if (!msg.ParseFromArray(buffer.data() + 4, static_cast<int>(n)))
        throw Error(Kind::invalid_argument, std::string(what) + ": a frame that does not parse");
    buffer.erase(0, 4 + size_t{n});
    return true;
}

std::string proto_name(pb::Protocol p) {
    switch (p) {
        case pb::TCP:
            return "tcp";
        case pb::UDP:
            return "udp";
        default:
            return "";
    }
}

DnsPolicy from_proto(const pb::SetPolicy& m) {
    DnsPolicy policy;
    switch (m.kind()) {
        case pb::REFUSE:
            policy.kind = DnsPolicy::Kind::refuse;
            break;
        case pb::FORWARD:
            policy.kind = DnsPolicy::Kind::forward;
            break;
        case pb::ALLOWLIST:
            policy.kind = DnsPolicy::Kind::allowlist;
            break;
        default:
            throw Error(Kind::invalid_argument, "DNS policy of " + m.source_ip() + ": no kind (" +
                                                    std::to_string(static_cast<int>(m.kind())) +
                                                    ")");
    }
    for (const pb::NamePattern& n : m.names()) {
        DnsNamePattern pattern{n.pattern(), {}};
        for (const pb::PortRange& r : n.ports()) {
            if (r.protocol() != pb::PROTOCOL_ANY && r.protocol() != pb::TCP &&
                r.protocol() != pb::UDP)
                throw Error(Kind::invalid_argument,
                            "DNS policy: an unknown protocol for " + n.pattern());
            if (r.port_to() > 65535 || r.port_from() > r.port_to())
                throw Error(Kind::invalid_argument,
                            "DNS policy: port range " + std::to_string(r.port_from()) + "-" +
                                std::to_string(r.port_to()) + " for " + n.pattern());
            pattern.ports.push_back({proto_name(r.protocol()), static_cast<uint16_t>(r.port_from()),
                                     static_cast<uint16_t>(r.port_to())});
        }
        policy.names.push_back(std::move(pattern));
    }
    return policy;
}

void to_proto(const DnsPolicy& policy, pb::SetPolicy* m) {
    switch (policy.kind) {
        case DnsPolicy::Kind::refuse:
            m->set_kind(pb::REFUSE);
            break;
        case DnsPolicy::Kind::forward:
            m->set_kind(pb::FORWARD);
            break;
        case DnsPolicy::Kind::allowlist:
            m->set_kind(pb::ALLOWLIST);
            break;
    }
    for (const DnsNamePattern& n : policy.names) {
        pb::NamePattern* p = m->add_names();
        p->set_pattern(n.pattern);
        for (const DnsPortRule& r : n.ports) {
            pb::PortRange* range = p->add_ports();
            range->set_protocol(r.proto == "tcp"   ? pb::TCP
                                : r.proto == "udp" ? pb::UDP
                                                   : pb::PROTOCOL_ANY);
            range->set_port_from(r.port_from);
            range->set_port_to(r.port_to);
        }
    }
}

// Adds what `learned` found, all in one transaction when it can. An entry that overlaps
// one this sandbox has already (another pattern's ports for the same address) is refused
// by the kernel and fails the whole transaction: then each goes alone, and what still
// fails is logged, not fatal: the address it was for stays closed, which is the safe side.
void add_learned(NftTable& table, const std::string& source, const std::vector<AllowRule>& rules) {
    try {
        table.add_allowed(source, rules);
        return;
    } catch (const Error&) {
    }
    for (const AllowRule& r : rules) {
        try {
            table.add_allowed(source, {r});
        } catch (const Error& e) {
            std::fprintf(stderr, "berth dns: allowing %s to reach %s: %s\n", source.c_str(),
                         r.cidr.c_str(), e.what());
        }
    }
}

}  // namespace

bool learnable_address(const std::string& address, const std::string& subnet_cidr) {
    in_addr a{};
    if (::inet_pton(AF_INET, address.c_str(), &a) != 1) return false;
    const uint32_t ip = ntohl(a.s_addr);
    const auto in = [&](uint32_t net, int len) {
        const uint32_t mask = len == 0 ? 0 : ~uint32_t{0} << (32 - len);
        return (ip & mask) == net;
    };
    if (in(0x00000000, 8) || in(0x7f000000, 8) || in(0xa9fe0000, 16) || in(0xe0000000, 4) ||
        in(0xf0000000, 4))
        return false;
    const size_t slash = subnet_cidr.find('/');
    in_addr net{};
    if (slash != std::string::npos &&
        ::inet_pton(AF_INET, subnet_cidr.substr(0, slash).c_str(), &net) == 1) {
        const int len = std::atoi(subnet_cidr.c_str() + slash + 1);
        if (len >= 0 && len <= 32 && in(ntohl(net.s_addr), len)) return false;
    }
    return true;
}

std::vector<AllowRule> learned_rules(const std::string& address, std::chrono::seconds ttl,
                                     const std::vector<DnsPortRule>& ports,
                                     const DnsServiceConfig& config) {
    if (!learnable_address(address, config.table.subnet_cidr)) return {};
    const std::chrono::seconds timeout =
        std::clamp(ttl, config.min_entry_ttl, config.max_entry_ttl);
    std::vector<AllowRule> rules;
    if (ports.empty()) rules.push_back({.cidr = address, .timeout = timeout});
    for (const DnsPortRule& p : ports)
        rules.push_back({.cidr = address,
                         .proto = p.proto,
                         .port_from = p.port_from,
                         .port_to = p.port_to,
                         .timeout = timeout});
    return rules;
}

int run_dns_service(UniqueFd control, const DnsServiceConfig& config) {
    try {
        NftTable table(config.table);
        DnsForwarder forwarder(
            config.forwarder, [&](const std::string& source, const std::string& address,
                                  std::chrono::seconds ttl, const std::vector<DnsPortRule>& ports) {
                const std::vector<AllowRule> rules = learned_rules(address, ttl, ports, config);
                if (rules.empty()) {
                    std::fprintf(stderr, "berth dns: %s: not opening %s (not a global address)\n",
                                 source.c_str(), address.c_str());
                    return;
                }
                add_learned(table, source, rules);
            });
        std::string buffer;
        for (;;) {
            pollfd fds[2] = {{control.get(), POLLIN, 0}, {forwarder.fd(), POLLIN, 0}};
            if (::poll(fds, 2, forwarder.next_timeout_ms()) < 0 && errno != EINTR)
                throw_sys("poll", "dns service");
            if (fds[0].revents) {
                char chunk[4096];
                const ssize_t n = check_sys("read", "dns control", [&] {
                    return ::read(control.get(), chunk, sizeof chunk);
                });
                if (n == 0) return 0;  // the helper is done with us
                buffer.append(chunk, static_cast<size_t>(n));
                pb::Request request;
                while (take_frame(buffer, request, "dns control")) {
                    pb::Reply reply;
                    reply.set_id(request.id());
                    try {
                        if (request.has_set_policy()) {
                            forwarder.set_policy(request.set_policy().source_ip(),
                                                 from_proto(request.set_policy()));
                        } else if (request.has_forget()) {
                            forwarder.forget(request.forget().source_ip());
                        } else {
                            throw Error(Kind::invalid_argument, "DNS control: an empty request");
                        }
                    } catch (const Error& e) {
                        reply.set_error(e.what());
                        reply.set_error_code(static_cast<v1::ErrorCode>(e.kind()));
                    }
                    write_all(control.get(), encode(reply), "dns control");
                    request.Clear();
                }
            }
            forwarder.service();
        }
    } catch (const std::exception& e) {
        std::fprintf(stderr, "berth dns: %s\n", e.what());
        return 1;
    }
}

void DnsControl::set_policy(const std::string& source_ip, const DnsPolicy& policy) {
    pb::Request request;
    request.mutable_set_policy()->set_source_ip(source_ip);
    to_proto(policy, request.mutable_set_policy());
    call(request);
}

void DnsControl::forget(const std::string& source_ip) {
    pb::Request request;
    request.mutable_forget()->set_source_ip(source_ip);
    call(request);
}

void DnsControl::call(pb::Request& request) {
    request.set_id(next_id_++);
    write_all(channel_.get(), encode(request), "dns control");
    std::string buffer;
    pb::Reply reply;
    const auto until = std::chrono::steady_clock::now() + timeout_;
    while (!take_frame(buffer, reply, "dns control reply")) {
        const auto left =
            std::chrono::ceil<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
        pollfd p{channel_.get(), POLLIN, 0};
        const int ready = left.count() > 0 ? ::poll(&p, 1, static_cast<int>(left.count())) : 0;
        if (ready < 0 && errno == EINTR) continue;
        if (ready < 0) throw_sys("poll", "dns control");
        if (ready == 0)
            throw Error(Kind::deadline_exceeded, "dns control: the DNS service did not answer in " +
                                                     std::to_string(timeout_.count()) + " ms");
        char chunk[4096];
        const ssize_t n = check_sys("read", "dns control",
                                    [&] { return ::read(channel_.get(), chunk, sizeof chunk); });
        if (n == 0) throw_sys("read", "dns control (the DNS service is gone)", EPIPE);
        buffer.append(chunk, static_cast<size_t>(n));
    }
    if (reply.id() != request.id())
        throw Error(Kind::internal, "dns control: the reply to " + std::to_string(reply.id()) +
                                        ", not " + std::to_string(request.id()));
    if (!reply.error().empty()) throw Error(static_cast<Kind>(reply.error_code()), reply.error());
}

DnsPolicy dns_policy(const Policy& policy) {
    DnsPolicy out;
    switch (policy.mode) {
        case Mode::none:
            out.kind = DnsPolicy::Kind::refuse;
            break;
        case Mode::public_egress:
            out.kind = DnsPolicy::Kind::forward;
            break;
        case Mode::allowlist:
            out.kind = DnsPolicy::Kind::allowlist;
            for (const AllowEntry& e : policy.allow) {
                if (e.kind == AllowEntry::Kind::cidr) continue;
                DnsNamePattern pattern{
                    .pattern = e.kind == AllowEntry::Kind::wildcard ? "*." + e.value : e.value,
                    .ports = {}};
                if (e.port_from != 0 || e.port_to != 65535)
                    pattern.ports.push_back(
                        DnsPortRule{.proto = {}, .port_from = e.port_from, .port_to = e.port_to});
                out.names.push_back(std::move(pattern));
            }
            break;
    }
    return out;
}

namespace {

class DnsChild final : public SandboxDns {
  public:
    explicit DnsChild(DnsServiceConfig config) : config_(std::move(config)) { start(); }

    void set_policy(const std::string& sandbox_ip, const Policy& policy) override {
        DnsPolicy p = dns_policy(policy);
        call([&] { control_->set_policy(sandbox_ip, p); });
        policies_[sandbox_ip] = std::move(p);
    }

    void forget(const std::string& sandbox_ip) noexcept override {
        policies_.erase(sandbox_ip);
        try {
            call([&] { control_->forget(sandbox_ip); });
        } catch (const std::exception& e) {
            std::fprintf(stderr, "berth-helper: DNS: forgetting %s: %s\n", sandbox_ip.c_str(),
                         e.what());
        }
    }

  private:
    void start() {
        int sv[2];
        check_sys("socketpair", "DNS control",
                  [&] { return ::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv); });
        UniqueFd ours(sv[0]), theirs(sv[1]);
        const DnsServiceConfig& config = config_;
        const int theirs_fd = theirs.get();
        child_ = ChildProcess::fork("berth-helper: DNS", {theirs_fd}, [&config, theirs_fd] {
            ::prctl(PR_SET_NAME, "berth-dns");
            return run_dns_service(UniqueFd(theirs_fd), config);
        });
        theirs.reset();
        control_ = std::make_unique<DnsControl>(std::move(ours));
    }

    // Runs `request`; a child that is gone or out of step is started again, told every
    // policy, and asked once more. What it refuses is the caller's to hear.
    template <typename Request>
    void call(Request request) {
        try {
            request();
            return;
        } catch (const SysError& e) {
            std::fprintf(stderr, "berth-helper: DNS: %s; starting it again\n", e.what());
        } catch (const Error& e) {
            if (e.kind() != Error::Kind::deadline_exceeded && e.kind() != Error::Kind::internal)
                throw;
            std::fprintf(stderr, "berth-helper: DNS: %s; starting it again\n", e.what());
        }
        child_.kill_and_wait(std::chrono::seconds(5));
        start();
        for (const auto& [ip, policy] : policies_) control_->set_policy(ip, policy);
        request();
    }

    DnsServiceConfig config_;
    ChildProcess child_;
    std::unique_ptr<DnsControl> control_;
    std::map<std::string, DnsPolicy> policies_;
};

}  // namespace

std::unique_ptr<SandboxDns> start_dns_child(const DnsServiceConfig& config) {
    return std::make_unique<DnsChild>(config);
}

}  // namespace berth::net
