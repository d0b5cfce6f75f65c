// The root implementation of HostNetwork: one bridge of berth's with the subnet's first
// address, a veth per public sandbox (its host end a port of the bridge, isolated from the
// other sandboxes' ports), and berth's nftables table: masquerade out, forward only for
// sandboxes in the `public4` set, reject the rest at once.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <map>
#include <sstream>

#include "base/error.h"
#include "base/files.h"
#include "base/unique_fd.h"
#include "net/host_network.h"
#include "net/netlink.h"
#include "net/nft_table.h"

namespace berth::net {

const char* mode_name(Mode mode) {
    switch (mode) {
        case Mode::none:
            return "none";
        case Mode::public_egress:
            return "public";
        case Mode::allowlist:
            return "allowlist";
    }
    return "?";
}

Mode parse_mode(const std::string& name) {
    if (name == "none") return Mode::none;
    if (name == "public") return Mode::public_egress;
    if (name == "allowlist") return Mode::allowlist;
    throw Error(Error::Kind::invalid_argument,
                "unknown network mode '" + name.substr(0, 40) + "' (none, public or allowlist)");
}

namespace {

struct Subnet {
    uint32_t network = 0;  // host order
    int prefix = 0;
    uint32_t mask() const { return prefix == 0 ? 0 : ~uint32_t{0} << (32 - prefix); }
    uint32_t gateway() const { return network + 1; }
    uint32_t broadcast() const { return network | ~mask(); }
};

std::string ip_text(uint32_t host_order) {
    in_addr a{htonl(host_order)};
    char buf[INET_ADDRSTRLEN];
    ::inet_ntop(AF_INET, &a, buf, sizeof buf);
    return buf;
}

uint32_t parse_ip(const std::string& text, const std::string& what) {
    in_addr a{};
    if (::inet_pton(AF_INET, text.c_str(), &a) != 1)
        throw Error(Error::Kind::invalid_argument,
                    what + ": '" + text + "' is not an IPv4 address");
    return ntohl(a.s_addr);
}

Subnet parse_subnet(const std::string& cidr) {
    const auto slash = cidr.find('/');
    if (slash == std::string::npos)
        throw Error(Error::Kind::invalid_argument,
                    "--subnet '" + cidr + "': give an IPv4 network as ADDRESS/PREFIX");
    Subnet s;
    s.network = parse_ip(cidr.substr(0, slash), "--subnet");
    const std::string len = cidr.substr(slash + 1);
    if (len.empty() || len.size() > 2 || len.find_first_not_of("0123456789") != std::string::npos)
        throw Error(Error::Kind::invalid_argument, "--subnet '" + cidr + "': bad prefix length");
    s.prefix = std::stoi(len);
    // At most /8 (16M sandboxes is plenty), at least /28 (13 sandboxes).
    if (s.prefix < 8 || s.prefix > 28)
        throw Error(Error::Kind::invalid_argument,
                    "--subnet '" + cidr + "': the prefix length must be 8 to 28");
    if ((s.network & ~s.mask()) != 0)
        throw Error(Error::Kind::invalid_argument,
                    "--subnet '" + cidr + "': host bits are set (did you mean " +
                        ip_text(s.network & s.mask()) + "/" + len + "?)");
    return s;
}

// Refuses a subnet that overlaps a route of the host's (other than the default route and
// the bridge's own): sandboxes' traffic to those addresses would go to the bridge.
void check_no_clash(const Subnet& subnet, const std::string& bridge) {
    std::istringstream routes(read_file("/proc/net/route"));
    std::string line;
    std::getline(routes, line);  // the header
    while (std::getline(routes, line)) {
        std::istringstream f(line);
        std::string iface, dest_hex, gw_hex, flags, refcnt, use, metric, mask_hex;
        if (!(f >> iface >> dest_hex >> gw_hex >> flags >> refcnt >> use >> metric >> mask_hex))
            continue;
        if (iface == bridge) continue;
        const uint32_t dest = ntohl(static_cast<uint32_t>(std::stoul(dest_hex, nullptr, 16)));
        const uint32_t mask = ntohl(static_cast<uint32_t>(std::stoul(mask_hex, nullptr, 16)));
        if (mask == 0) continue;  // the default route overlaps everything by design
        const uint32_t common = mask & subnet.mask();
        if ((dest & common) == (subnet.network & common)) {
            int len = 0;
            for (uint32_t m = mask; m; m <<= 1) ++len;
            throw Error(Error::Kind::invalid_argument,
                        "--subnet " + ip_text(subnet.network) + "/" +
                            std::to_string(subnet.prefix) + " overlaps the host's route to " +
                            ip_text(dest) + "/" + std::to_string(len) + " on " + iface +
                            ": choose another");
        }
    }
}

// 02:62 (locally administered, unicast; 0x62 is 'b') and four bytes of a hash of the name.
std::array<uint8_t, 6> bridge_mac(const std::string& name) {
    uint32_t h = 2166136261u;  // FNV-1a
    for (unsigned char c : name) h = (h ^ c) * 16777619u;
    return {0x02,
            0x62,
            static_cast<uint8_t>(h >> 24),
            static_cast<uint8_t>(h >> 16),
            static_cast<uint8_t>(h >> 8),
            static_cast<uint8_t>(h)};
}

// The host end of a sandbox's veth: "bh" and the first 12 hex digits of its id (15 bytes
// at most). The sandbox end is eth0, inside its namespace.
std::string host_link(const std::string& sandbox_id) {
    return "bh" + sandbox_id.substr(0, 12);
}

// The host end of a pooled shell's veth before it is a sandbox's: "bs" and 12 hex digits
// of the shell's name.
std::string prepared_link(const std::string& shell_name) {
    const size_t dash = shell_name.rfind('-');
    return "bs" + shell_name.substr(dash == std::string::npos ? 0 : dash + 1, 12);
}

class RootNetwork final : public HostNetwork {
  public:
    explicit RootNetwork(const RootNetworkConfig& config)
        : config_(config), subnet_(parse_subnet(config.subnet)) {
        check_ifname(config.bridge);
        check_no_clash(subnet_, config.bridge);
        for (const auto& server : config.nameservers) parse_ip(server, "--dns");
        table_config_ = TableConfig{.table = config.bridge,
                                    .bridge = config.bridge,
                                    .subnet_cidr = config.subnet,
                                    .gateway = ip_text(subnet_.gateway()),
                                    .host_address = {}};
        table_ = std::make_unique<NftTable>(table_config_);
    }

    Attachment reserve(const std::string& sandbox_id, const Policy& policy,
                       const std::vector<uint16_t>& host_ports,
                       const std::vector<PublishedPort>& published) override {
        for (uint16_t port : host_ports)
            if (port == 0)
                throw Error(Error::Kind::invalid_argument, "host port 0: no program listens there");
        check_enforceable(policy);
        Attachment a{sandbox_id, policy, host_ports, published, {}, false};
        holds_[sandbox_id] = hold_ports(published);
        try {
            if (policy.mode != Mode::none || !host_ports.empty() || !published.empty())
                a.address = take_address();
        } catch (...) {
            holds_.erase(sandbox_id);
            throw;
        }
        return a;
    }

    std::string prepare_link(const std::string& shell_name, int netns_fd) override {
        const std::string host = prepared_link(shell_name);
        host_nl_.add_veth(host, "eth0", netns_fd);
        return host;
    }

    void discard_link(const std::string& link) noexcept override {
        try {
            host_nl_.delete_link(link);
        } catch (const Error& e) {
            if (e.kind() != Error::Kind::not_found)
                std::fprintf(stderr, "berth-helper: %s\n", e.what());
        } catch (const std::exception& e) {
            std::fprintf(stderr, "berth-helper: %s\n", e.what());
        }
    }

    std::function<void()> begin_attach(Attachment& a, int netns_fd,
                                       const std::string& prepared) override {
        if (a.address.empty()) return [] {};
        ensure_ready();
        // The DNS first (as in apply), then everything of the table in one transaction with
        // no listing: an address is handed out only when the table holds nothing of it.
        if (dns_) dns_->set_policy(a.address, a.policy);
        return [this, &a, netns_fd, prepared] {
            make_link(a, netns_fd, prepared, [&](const std::string& host) {
                table_->add_sandbox(a.address, host, a.host_ports, a.published,
                                    a.policy.mode == Mode::public_egress,
                                    a.policy.mode == Mode::allowlist, address_rules(a.policy));
            });
            join_peers(a);
        };
    }

    void set_policy(Attachment& a, const Policy& policy, int netns_fd) override {
        check_enforceable(policy);
        // Out of its peer group first, so that leaving `public` cuts its peers at once too.
        const bool was_peer = is_peer(a);
        if (policy.mode != Mode::public_egress) leave_peers(a);
        try {
            set_policy_rules(a, policy, netns_fd);
        } catch (...) {
            if (was_peer) {
                try {
                    join_peers(a);
                } catch (const std::exception& e) {
                    std::fprintf(stderr, "berth-helper: rejoining the peers of %s: %s\n",
                                 a.sandbox_id.c_str(), e.what());
                }
            }
            throw;
        }
        join_peers(a);
    }

    void set_policy_rules(Attachment& a, const Policy& policy, int netns_fd) {
        const bool had_address = !a.address.empty(), had_link = a.linked;
        if (!had_address) {
            if (policy.mode == Mode::none) {
                a.policy = policy;  // loopback only, as it was
                return;
            }
            a.address = take_address();
        }
        try {
            if (!a.linked) {
                ensure_ready();
                make_link(a, netns_fd);
            }
            apply(a.address, policy);
        } catch (...) {
            // As it was: a link made here goes (a retry makes it whole), and the DNS, told
            // first, hears the old policy again (the table's transaction left the old rules).
            if (!had_link && a.linked) {
                try {
                    host_nl_.delete_link(host_link(a.sandbox_id));
                } catch (const std::exception& e) {
                    std::fprintf(stderr, "berth-helper: %s\n", e.what());
                }
                a.linked = false;
            }
            if (!had_address) {
                used_.erase(parse_ip(a.address, "address"));
                a.address.clear();
            } else if (dns_) {
                try {
                    dns_->set_policy(a.address, a.policy);
                } catch (const std::exception& e) {
                    std::fprintf(stderr, "berth-helper: DNS: restoring %s: %s\n", a.address.c_str(),
                                 e.what());
                }
            }
            throw;
        }
        a.policy = policy;
    }

    void release(const Attachment& a) noexcept override {
        leave_peers(a);
        holds_.erase(a.sandbox_id);
        if (a.address.empty()) return;
        if (dns_) dns_->forget(a.address);
        try {
            if (ready_) table_->forget(a.address);
        } catch (const std::exception& e) {
            // Not handed out again (a create adds to the table without looking first): the
            // address stays taken until the next start, which makes the table anew.
            std::fprintf(stderr,
                         "berth-helper: forgetting %s in nftables: %s (the address is not used "
                         "again until berthd restarts)\n",
                         a.address.c_str(), e.what());
            return;
        }
        try {
            host_nl_.delete_link(host_link(a.sandbox_id));
        } catch (const Error& e) {
            if (e.kind() != Error::Kind::not_found)
                std::fprintf(stderr, "berth-helper: %s\n", e.what());
        } catch (const std::exception& e) {
            std::fprintf(stderr, "berth-helper: %s\n", e.what());
        }
        try {
            used_.erase(parse_ip(a.address, "address"));
        } catch (const std::exception&) {
        }
    }

    void adopt(Attachment& a) override {
        if (a.address.empty()) return;
        const uint32_t ip = parse_ip(a.address, "the address of sandbox " + a.sandbox_id);
        if ((ip & subnet_.mask()) != subnet_.network) return;  // an old --subnet: no rules
        ensure_ready();
        used_.insert(ip);
        a.linked = true;
        table_->set_port(a.address, host_link(a.sandbox_id));
        table_->set_host_ports(a.address, a.host_ports);
        try {
            holds_[a.sandbox_id] = hold_ports(a.published);
        } catch (const std::exception& e) {
            // Taken meanwhile by something else on the host: the DNAT still sends new
            // connections to the sandbox (the rule comes first), but say so.
            std::fprintf(stderr, "berth-helper: sandbox %s: %s\n", a.sandbox_id.c_str(), e.what());
        }
        table_->set_published(a.address, a.published);
        apply(a.address, a.policy);
        join_peers(a);
    }

    int sweep(const std::set<std::string>& live) override {
        int removed = 0;
        if (!bridge_exists()) return 0;
        // A table of an earlier helper with no running sandbox adopted (those replace it at
        // their adopt): replaced by an empty one, so that no element of a sandbox that is
        // gone (a helper killed mid-create) outlives it.
        if (!ready_ && table_->exists()) ensure_ready();
        std::set<std::string> kept;
        for (const auto& id : live) kept.insert(host_link(id));
        for (const std::string& link : host_nl_.links_with_prefix("bh")) {
            if (kept.count(link) || !on_our_bridge(link)) continue;
            try {
                host_nl_.delete_link(link);
                ++removed;
            } catch (const Error& e) {
                if (e.kind() != Error::Kind::not_found) throw;
            }
        }
        return removed;
    }

    NameSettings names(const Attachment& a, const std::string& hostname) const override {
        NameSettings s{
            .hostname = hostname, .address = a.address, .host_address = {}, .nameservers = {}};
        // Berth's DNS on the gateway, in every mode with an address: it answers by the
        // sandbox's policy at the time of each query (a sandbox switched to none is refused
        // at once, one switched to public gets answers), so the file never changes. Without
        // an address the gateway is unreachable, and a lookup fails at once all the same.
        if (config_.start_dns)
            s.nameservers = {ip_text(subnet_.gateway())};
        else if (a.policy.mode == Mode::public_egress)
            s.nameservers = config_.nameservers;
        if (!a.host_ports.empty()) s.host_address = ip_text(subnet_.gateway());
        return s;
    }

    std::string describe() override {
        std::string dns;
        for (const auto& server : config_.nameservers) dns += (dns.empty() ? "" : " ") + server;
        // Facts of the configuration only: this is read once, at the helper's start.
        return "public: bridge " + config_.bridge + " (made at the first public sandbox), subnet " +
               config_.subnet + ", gateway " + ip_text(subnet_.gateway()) +
               ", nftables table inet " + config_.bridge + ", DNS " + (dns.empty() ? "none" : dns);
    }

  private:
    void check_enforceable(const Policy& policy) const {
        if (config_.start_dns) return;
        for (const AllowEntry& e : policy.allow)
            if (e.kind != AllowEntry::Kind::cidr)
                throw Error(Error::Kind::failed_precondition,
                            "allowlist entry " + e.text() +
                                ": this berthd has no DNS of its own, so hostnames cannot be "
                                "allowed (give addresses)");
    }

    // Binds each published host address:port (without listening: connections to it are
    // DNAT'd to the sandbox before any socket sees them), so that a host service that has
    // the port refuses the publish -- a sandbox must not capture a port the host's own
    // programs (or another user's) connect to -- and none can take it while it is published.
    static std::vector<UniqueFd> hold_ports(const std::vector<PublishedPort>& published) {
        std::vector<UniqueFd> holds;
        for (const PublishedPort& p : published) {
            UniqueFd fd(check_sys("socket", "AF_INET SOCK_STREAM",
                                  [] { return ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0); }));
            sockaddr_in sa{};
            sa.sin_family = AF_INET;
            sa.sin_port = htons(p.host_port);
            sa.sin_addr.s_addr = htonl(parse_ip(p.host_ip, "published host address"));
            const std::string where = p.host_ip + ":" + std::to_string(p.host_port);
            if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
                const int err = errno;
                if (err == EADDRINUSE)
                    throw Error(Error::Kind::already_exists,
                                "publishing " + where + ": the port is in use on the host");
                if (err == EADDRNOTAVAIL)
                    throw Error(Error::Kind::invalid_argument,
                                "publishing " + where + ": " + p.host_ip +
                                    " is not an address of this host");
                throw SysError("bind", where, err);
            }
            holds.push_back(std::move(fd));
        }
        return holds;
    }

    std::string take_address() {
        for (uint32_t ip = subnet_.gateway() + 1; ip < subnet_.broadcast(); ++ip)
            if (used_.insert(ip).second) return ip_text(ip);
        throw Error(Error::Kind::resource_exhausted,
                    "every address of --subnet " + config_.subnet + " is in use");
    }

    // The veth: its host end a port of the bridge, isolated from the other sandboxes'
    // ports; its sandbox end eth0 with the address and a default route via the gateway.
    // `add_rules(host end)` puts its table entries in place before the port forwards
    // anything (default: only its anti-spoofing entry).
    void make_link(Attachment& a, int netns_fd, const std::string& prepared = {},
                   const std::function<void(const std::string&)>& add_rules = {}) {
        const std::string host = host_link(a.sandbox_id);
        if (prepared.empty())
            host_nl_.add_veth(host, "eth0", netns_fd);
        else
            host_nl_.rename(prepared, host);  // (down: any kernel renames it)
        a.linked = true;
        host_nl_.set_master(host, config_.bridge);
        host_nl_.set_isolated(host);
        if (add_rules)
            add_rules(host);
        else
            table_->set_port(a.address, host);
        host_nl_.set_up(host);
        Netlink inside = Netlink::in_netns(netns_fd);
        inside.add_address("eth0", a.address, subnet_.prefix);
        inside.set_up("eth0");
        inside.add_default_route(ip_text(subnet_.gateway()));
    }

    bool is_peer(const Attachment& a) const {
        auto it = groups_.find(a.peer_group);
        return it != groups_.end() && it->second.count(a.sandbox_id) > 0;
    }

    // A public, linked sandbox of a peer group: a pair with each other such member, and its
    // port no longer isolated (the bridge table decides between sandbox ports). All or none.
    void join_peers(const Attachment& a) {
        if (a.peer_group.empty() || a.policy.mode != Mode::public_egress || !a.linked || is_peer(a))
            return;
        const std::string link = host_link(a.sandbox_id);
        std::set<std::string>& members = groups_[a.peer_group];
        std::vector<std::string> paired;
        try {
            for (const std::string& other : members) {
                const Member& m = members_.at(other);
                table_->set_peers(link, a.address, m.link, m.address, true);
                paired.push_back(other);
            }
            host_nl_.set_isolated(link, false);
        } catch (...) {
            for (const std::string& other : paired) {
                try {
                    const Member& m = members_.at(other);
                    table_->set_peers(link, a.address, m.link, m.address, false);
                } catch (const std::exception&) {
                }
            }
            if (members.empty()) groups_.erase(a.peer_group);
            throw;
        }
        members.insert(a.sandbox_id);
        members_[a.sandbox_id] = Member{link, a.address};
    }

    // Out of its peer group (switched away from public, or released). Never throws.
    void leave_peers(const Attachment& a) noexcept {
        auto it = groups_.find(a.peer_group);
        if (it == groups_.end() || it->second.erase(a.sandbox_id) == 0) return;
        const Member self = members_[a.sandbox_id];
        members_.erase(a.sandbox_id);
        for (const std::string& other : it->second) {
            try {
                const Member& m = members_.at(other);
                table_->set_peers(self.link, self.address, m.link, m.address, false);
            } catch (const std::exception& e) {
                std::fprintf(stderr, "berth-helper: unpairing %s: %s\n", a.sandbox_id.c_str(),
                             e.what());
            }
        }
        if (it->second.empty()) groups_.erase(it);
        try {
            host_nl_.set_isolated(self.link, true);
        } catch (const std::exception&) {
            // Its link is gone already (a delete): nothing to isolate.
        }
    }

    static std::vector<AllowRule> address_rules(const Policy& policy) {
        std::vector<AllowRule> rules;
        if (policy.mode != Mode::allowlist) return rules;
        for (const AllowEntry& e : policy.allow) {
            if (e.kind != AllowEntry::Kind::cidr) continue;
            rules.push_back(AllowRule{.cidr = e.value,
                                      .proto = {},
                                      .port_from = e.port_from,
                                      .port_to = e.port_to,
                                      .timeout = {}});
        }
        return rules;
    }

    // The policy's rules: the sets the sandbox is in and its allowed destinations. (Its
    // hostnames are the DNS resolver's to let through, address by address.)
    void apply(const std::string& address, const Policy& policy) {
        const std::vector<AllowRule> rules = address_rules(policy);
        // The DNS first: a sandbox switched away from allowlist or public must not get one
        // more answer opening an address after its rules changed.
        if (dns_) dns_->set_policy(address, policy);
        table_->apply(address, policy.mode == Mode::public_egress, policy.mode == Mode::allowlist,
                      rules);
    }

    bool bridge_exists() {
        try {
            host_nl_.ifindex(config_.bridge);
            return true;
        } catch (const Error& e) {
            if (e.kind() == Error::Kind::not_found) return false;
            throw;
        }
    }

    // The link's master is our bridge: /sys/class/net/LINK/master names it.
    bool on_our_bridge(const std::string& link) {
        char target[256];
        const std::string path = "/sys/class/net/" + link + "/master";
        ssize_t n = ::readlink(path.c_str(), target, sizeof target - 1);
        if (n <= 0) return false;
        std::string t(target, static_cast<size_t>(n));
        return t.substr(t.rfind('/') + 1) == config_.bridge;
    }

    // The bridge with the gateway address, forwarding on, and the table: once, at the first
    // sandbox that needs them (a host that never runs a public sandbox gets none of it).
    void ensure_ready() {
        if (ready_) return;
        try {
            host_nl_.add_bridge(config_.bridge);
        } catch (const Error& e) {
            if (e.kind() != Error::Kind::already_exists) throw;
        }
        try {
            host_nl_.add_address(config_.bridge, ip_text(subnet_.gateway()), subnet_.prefix);
        } catch (const Error& e) {
            if (e.kind() != Error::Kind::already_exists) throw;
        }
        // A fixed address of its own, the same at every start (made from its name): were it
        // the lowest of its ports' (a bridge's default), it would change as sandboxes come
        // and go, and a running sandbox's ARP entry for the gateway would then point at an
        // address the bridge no longer answers to -- its packets silently lost.
        host_nl_.set_mac(config_.bridge, bridge_mac(config_.bridge));
        host_nl_.set_up(config_.bridge);
        // Routing between the bridge and the host's uplinks (Docker sets it too).
        write_file("/proc/sys/net/ipv4/ip_forward", "1");
        // Host ports: what a sandbox sends to host.berth.internal:PORT is DNAT'd to
        // 127.0.0.1:PORT, which the kernel drops as a martian unless the bridge may route to
        // loopback. Packets to 127.0.0.1 that were not DNAT'd (a sandbox's raw socket could
        // send them) are refused by the table's input chain.
        write_file("/proc/sys/net/ipv4/conf/" + config_.bridge + "/route_localnet", "1");
        table_->create();
        if (config_.start_dns && !dns_)
            dns_ = config_.start_dns(table_config_, ip_text(subnet_.gateway()));
        ready_ = true;
    }

    RootNetworkConfig config_;
    Subnet subnet_;
    Netlink host_nl_;
    TableConfig table_config_;
    std::unique_ptr<NftTable> table_;
    std::unique_ptr<SandboxDns> dns_;  // berth's DNS on the gateway, once ready
    std::set<uint32_t> used_;
    std::map<std::string, std::vector<UniqueFd>> holds_;  // published ports, by sandbox id
    // Peer groups: the ids of their members that are peers now (public, linked), and each
    // such member's host link and address.
    struct Member {
        std::string link, address;
    };
    std::map<std::string, std::set<std::string>> groups_;
    std::map<std::string, Member> members_;
    bool ready_ = false;
};

}  // namespace

std::unique_ptr<HostNetwork> make_root_network(const RootNetworkConfig& config) {
    return std::make_unique<RootNetwork>(config);
}

std::vector<std::string> resolv_conf_nameservers(const std::string& text, bool reachable_only) {
    std::vector<std::string> out;
    std::istringstream in(text);
    std::string line;
    while (std::getline(in, line)) {
        std::istringstream f(line);
        std::string key, value;
        if (!(f >> key >> value) || key != "nameserver") continue;
        in_addr a{};
        if (::inet_pton(AF_INET, value.c_str(), &a) != 1) continue;      // IPv6: not routed yet
        if (reachable_only && (ntohl(a.s_addr) >> 24) == 127) continue;  // a loopback stub
        out.push_back(value);
    }
    return out;
}

}  // namespace berth::net
