#include "net/nft_table.h"

#include <arpa/inet.h>
#include <linux/netlink.h>
#include <nftables/libnftables.h>
#include <sys/socket.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>
#include <string_view>
#include <utility>

#include "base/error.h"
#include "base/unique_fd.h"

namespace berth::net {
namespace {

using Kind = Error::Kind;
using nlohmann::json;

[[noreturn]] void invalid(const std::string& message) {
    throw Error(Kind::invalid_argument, message);
}

// For messages: what the caller passed, bounded and quoted (it may be anything).
std::string shown(std::string_view s) {
    std::string out = "\"";
    for (char c : s.substr(0, 64)) out += (c >= 0x20 && c < 0x7f) ? c : '?';
    return out + (s.size() > 64 ? "...\"" : "\"");
}

bool is_name(std::string_view s) {
    return !s.empty() && s.size() <= 15 && std::all_of(s.begin(), s.end(), [](char c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
               c == '_' || c == '-';
    });
}

// An IPv4 address in host byte order. inet_pton takes the dotted quad only (no "1.2.3",
// no hex, no leading zeros), so what passes prints back as the same canonical text.
std::optional<uint32_t> parse_ipv4(std::string_view s) {
    if (s.empty() || s.size() >= INET_ADDRSTRLEN) return std::nullopt;
    const std::string text(s);  // NUL-terminated, and an embedded NUL cannot end it early:
    if (text.find('\0') != std::string::npos) return std::nullopt;  // inet_pton sees it all
    in_addr addr{};
    if (::inet_pton(AF_INET, text.c_str(), &addr) != 1) return std::nullopt;
    return ntohl(addr.s_addr);
}

std::string print_ipv4(uint32_t host_order) {
    in_addr addr{htonl(host_order)};
    char buf[INET_ADDRSTRLEN];
    ::inet_ntop(AF_INET, &addr, buf, sizeof buf);
    return buf;
}

uint32_t prefix_mask(int len) {
    return len == 0 ? 0 : ~uint32_t{0} << (32 - len);
}

struct Cidr {
    uint32_t net;
    int len;
    bool contains(uint32_t addr) const { return (addr & prefix_mask(len)) == net; }
    // As nft prints it: a /32 is the bare address.
    std::string text() const {
        return len == 32 ? print_ipv4(net) : print_ipv4(net) + "/" + std::to_string(len);
    }
};

std::string checked_ipv4(std::string_view s, std::string_view what) {
    const auto addr = parse_ipv4(s);
    if (!addr) invalid(std::string(what) + ": not an IPv4 address: " + shown(s));
    return print_ipv4(*addr);
}

Cidr checked_cidr(std::string_view s, std::string_view what) {
    const size_t slash = s.find('/');
    const auto addr = parse_ipv4(s.substr(0, slash));
    int len = 32;
    bool ok = addr.has_value();
    if (ok && slash != std::string_view::npos) {
        const std::string_view digits = s.substr(slash + 1);
        ok = !digits.empty() && digits.size() <= 2 &&
             std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; });
        if (ok) len = std::stoi(std::string(digits));
        ok = ok && len <= 32;
    }
    if (!ok) invalid(std::string(what) + ": not an IPv4 address or CIDR: " + shown(s));
    // A host part is refused rather than masked off: 1.2.3.4/24 may as well mean 1.2.3.4 as
    // 1.2.3.0/24, and a firewall should not guess which.
    if ((*addr & ~prefix_mask(len)) != 0)
        invalid(std::string(what) + ": " + shown(s) + " has host bits set (the network is " +
                Cidr{*addr & prefix_mask(len), len}.text() + ")");
    return Cidr{*addr, len};
}

std::string ports_text(uint16_t from, uint16_t to) {
    return from == to ? std::to_string(from) : std::to_string(from) + "-" + std::to_string(to);
}

// --- Elements as libnftables lists them (JSON), printed back as element text. ---
//
// The values come from the kernel, but they are parsed and printed with the same checks as
// a caller's before they go into a command: a set this table does not expect to hold
// something (another root process wrote to it) fails here instead of becoming nft syntax.

[[noreturn]] void unexpected(const char* set, const json& value) {
    throw Error(Kind::internal, std::string("nft: unexpected element in set ") + set + ": " +
                                    value.dump().substr(0, 200));
}

std::string json_ipv4(const char* set, const json& v) {
    const auto addr = v.is_string() ? parse_ipv4(v.get<std::string>()) : std::nullopt;
    if (!addr) unexpected(set, v);
    return print_ipv4(*addr);
}

// An address field of an interval set: an address, {"prefix": ...} or {"range": [a, b]}.
std::string json_ipv4_interval(const char* set, const json& v) {
    if (v.is_string()) return json_ipv4(set, v);
    if (v.is_object() && v.contains("prefix")) {
        const json& p = v["prefix"];
        const json& len = p.value("len", json());
        if (!len.is_number_unsigned() || len.get<unsigned>() > 32) unexpected(set, v);
        return json_ipv4(set, p.value("addr", json())) + "/" + std::to_string(len.get<unsigned>());
    }
    if (v.is_object() && v.contains("range") && v["range"].is_array() && v["range"].size() == 2)
        return json_ipv4(set, v["range"][0]) + "-" + json_ipv4(set, v["range"][1]);
    unexpected(set, v);
}

std::string json_port(const char* set, const json& v) {
    if (!v.is_number_unsigned() || v.get<unsigned>() > 65535) unexpected(set, v);
    return std::to_string(v.get<unsigned>());
}

std::string json_port_interval(const char* set, const json& v) {
    if (v.is_object() && v.contains("range") && v["range"].is_array() && v["range"].size() == 2)
        return json_port(set, v["range"][0]) + "-" + json_port(set, v["range"][1]);
    return json_port(set, v);
}

std::string json_proto(const char* set, const json& v) {
    if (v != "tcp" && v != "udp") unexpected(set, v);
    return v.get<std::string>();
}

// An element's key as element text, and its first field (the sandbox) canonically.
std::pair<std::string, std::string> element_text(const char* set, const json& element) {
    // With a timeout an element is {"elem": {"val": KEY, "timeout": ..., "expires": ...}}.
    const json& key = element.is_object() && element.contains("elem")
                          ? element["elem"].value("val", json())
                          : element;
    const std::string_view name = set;
    if (name == "public4") {
        std::string addr = json_ipv4(set, key);
        return {addr, addr};
    }
    const json& fields = key.is_object() ? key.value("concat", json()) : json();
    if (name == "allow4" && fields.is_array() && fields.size() == 4) {
        std::string src = json_ipv4(set, fields[0]);
        return {src + " . " + json_ipv4_interval(set, fields[1]) + " . " +
                    json_proto(set, fields[2]) + " . " + json_port_interval(set, fields[3]),
                src};
    }
    if (name == "published4" && element.is_array() && element.size() == 2) {
        const json& k = element[0].is_object() ? element[0].value("concat", json()) : json();
        const json& v = element[1].is_object() ? element[1].value("concat", json()) : json();
        if (k.is_array() && k.size() == 2 && v.is_array() && v.size() == 2) {
            std::string src = json_ipv4(set, v[0]);
            return {json_ipv4(set, k[0]) + " . " + json_port(set, k[1]), src};
        }
    }
    if (name == "ports4" && fields.is_array() && fields.size() == 2 && fields[0].is_string() &&
        is_name(fields[0].get<std::string>())) {
        std::string src = json_ipv4(set, fields[1]);
        return {"\"" + fields[0].get<std::string>() + "\" . " + src, src};
    }
    if (name == "hostports4" && fields.is_array() && fields.size() == 2) {
        std::string src = json_ipv4(set, fields[0]);
        return {src + " . " + json_port(set, fields[1]), src};
    }
    unexpected(set, element);
}

// libnftables reports strerror() text, not errno: the common ones are told apart for the
// error's kind, anything else is internal.
Kind kind_of(std::string_view error_text) {
    if (error_text.find("Operation not permitted") != std::string_view::npos)
        return Kind::permission_denied;
    if (error_text.find("No such file or directory") != std::string_view::npos)
        return Kind::not_found;
    return Kind::internal;
}

std::string trimmed(std::string s) {
    while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
    return s;
}

}  // namespace

void NftTable::CtxDeleter::operator()(nft_ctx* ctx) const {
    ::nft_ctx_free(ctx);
}

NftTable::NftTable(TableConfig config) : config_(std::move(config)) {
    // A leading digit reads as a number to nft's lexer, so the table's name starts with a
    // letter (nft still refuses a keyword such as "tcp" when the table is created).
    const char first = config_.table.empty() ? '\0' : config_.table[0];
    if (!is_name(config_.table) ||
        !((first >= 'a' && first <= 'z') || (first >= 'A' && first <= 'Z')))
        invalid("nft table name: a letter, then [A-Za-z0-9_-], 15 at most: " +
                shown(config_.table));
    if (!is_name(config_.bridge))
        invalid("bridge name: [A-Za-z0-9_-], 15 at most: " + shown(config_.bridge));
    const Cidr subnet = checked_cidr(config_.subnet_cidr, "sandbox subnet");
    config_.subnet_cidr = subnet.text();
    config_.gateway = checked_ipv4(config_.gateway, "gateway");
    if (!subnet.contains(*parse_ipv4(config_.gateway)))
        invalid("gateway " + config_.gateway + " is outside the subnet " + config_.subnet_cidr);
    config_.host_address = config_.host_address.empty()
                               ? config_.gateway
                               : checked_ipv4(config_.host_address, "host address");

    // libnftables exit()s the process when it cannot open its netlink socket (nfnetlink
    // missing, no descriptors left): open one first, so that those fail here, as an error.
    {
        UniqueFd probe(check_sys("socket", "AF_NETLINK NETLINK_NETFILTER", [] {
            return ::socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_NETFILTER);
        }));
    }
    ctx_.reset(::nft_ctx_new(NFT_CTX_DEFAULT));
    if (!ctx_) throw Error(Kind::resource_exhausted, "nft_ctx_new failed");
    // Both into buffers: the output is what list() and the JSON listings return, the errors
    // go into the exception instead of berthd's stderr.
    if (::nft_ctx_buffer_output(ctx_.get()) != 0 || ::nft_ctx_buffer_error(ctx_.get()) != 0)
        throw Error(Kind::resource_exhausted, "nft: cannot buffer libnftables output");
}

std::string NftTable::run(const std::string& commands, const char* what, bool json) {
    // (With JSON output on, libnftables first tries to read the commands as JSON; ours are
    // never JSON, so they fall through to the ordinary parser.)
    ::nft_ctx_output_set_flags(ctx_.get(), json ? NFT_CTX_OUTPUT_JSON : 0);
    const int rc = ::nft_run_cmd_from_buffer(ctx_.get(), commands.c_str());
    // Reading a buffer is what empties it: both are read every time, so nothing of this
    // command is reported with the next.
    std::string output = ::nft_ctx_get_output_buffer(ctx_.get());
    std::string errors = trimmed(::nft_ctx_get_error_buffer(ctx_.get()));
    if (rc != 0) {
        if (errors.empty()) errors = "failed (no message)";
        throw Error(kind_of(errors),
                    std::string("nft ") + what + " (table inet " + config_.table + "): " + errors);
    }
    return output;
}

std::string NftTable::checked_sandbox(const std::string& ip) const {
    std::string addr = checked_ipv4(ip, "sandbox address");
    if (!checked_cidr(config_.subnet_cidr, "subnet").contains(*parse_ipv4(addr)))
        invalid("sandbox address " + addr + " is outside the subnet " + config_.subnet_cidr);
    return addr;
}

namespace {

// The table, with @TABLE@, @BRIDGE@, @GATEWAY@, @HOST@ and @SUBNET@ standing for the
// validated configuration. "table X" comes first so that "delete table X" cannot fail on a
// table that is absent; the three are one transaction, so the kernel swaps the old table for
// the new at once (or keeps the old). The lines starting with # are nft comments: they say
// why, here beside the rules, and nft drops them.
constexpr const char* kTable = R"(table inet @TABLE@
delete table inet @TABLE@
table inet @TABLE@ {
  comment "berth sandboxes: written by berth, replaced when it starts"

  set public4 { type ipv4_addr; }
  set listed4 { type ipv4_addr; }
  set allow4 {
    type ipv4_addr . ipv4_addr . inet_proto . inet_service
    flags interval,timeout
  }
  set hostports4 { type ipv4_addr . inet_service; }
  # Published ports: host address . host port : sandbox address . its port (TCP).
  map published4 { type ipv4_addr . inet_service : ipv4_addr . inet_service; }
  # Pairs of public sandboxes of one peer group (both directions): they reach each other.
  set peers4 { type ipv4_addr . ipv4_addr; }

  # The filter chains run at filter - 10, before the usual priority-0 chains (iptables-nft's,
  # firewalld's, Docker's). In nftables an accept ends only its own chain and any other chain
  # may still drop, so the order cannot loosen anything; going first means that what berth
  # forbids is refused by berth (a reset or an ICMP error, at once) before another table's
  # policy could drop it silently. Policy accept: traffic that is not the bridge's is left to
  # the rest of the ruleset as if this table were absent.
  #
  # Sandbox to sandbox on the bridge is bridged, not routed, and never reaches these hooks
  # (the caller sets the bridge ports' isolation flag). Were br_netfilter loaded, such a
  # packet would come here with the bridge as both interfaces: to_sandbox is checked first,
  # so it is dropped rather than accepted as the sender's outbound traffic.
  chain forward {
    type filter hook forward priority filter - 10; policy accept;
    # Peers, where br_netfilter hands bridged frames to these hooks (the bridge table's
    # forward chain decides them at layer 2 in any case).
    iifname "@BRIDGE@" oifname "@BRIDGE@" ip saddr . ip daddr @peers4 accept
    oifname "@BRIDGE@" jump to_sandbox
    iifname "@BRIDGE@" jump from_sandbox
  }

  # Into a sandbox: replies, and connections to its published ports (DNAT'd by whoever
  # publishes them). Nothing else reaches a sandbox, from outside or from another sandbox.
  chain to_sandbox {
    ct state established,related accept
    ct status dnat accept
    drop
  }

  # Out of a sandbox, checked on every packet and not for new connections only: taking a
  # sandbox out of a set also cuts what it has open. The replies of its published ports (the
  # reply direction of a DNAT'd connection) pass; its own connections pass by a set or are
  # refused at once, TCP with a reset and the rest with an ICMP error, so that a program
  # sees ECONNREFUSED or EHOSTUNREACH instead of waiting out a timeout. IPv6, which
  # sandboxes are not given, matches no set and is refused the same way.
  chain from_sandbox {
    ct direction reply ct status dnat accept
    ip saddr @public4 accept
    ip saddr . ip daddr . meta l4proto . th dport @allow4 accept
    # An allowlisted sandbox keeps the connections it opened while their destination was
    # allowed: an address learned from DNS lapses with its TTL, and a download that outlives
    # it must not be cut. (Out of listed4, in `none`, they are cut like any other.)
    ip saddr @listed4 ct state established,related accept
    meta l4proto tcp reject with tcp reset
    reject with icmpx admin-prohibited
  }

  chain input {
    type filter hook input priority filter - 10; policy accept;
    iifname "@BRIDGE@" jump sandbox_to_host
  }

  # A sandbox reaching the host itself: berth's DNS on the gateway, and the loopback ports
  # it was given (DNAT'd to 127.0.0.1 in prerouting, and still in its set on each packet:
  # host_ports resets the connections of a port taken away). Replies to connections the
  # host opened into the sandbox pass (reply direction). Anything else the sandbox opens is
  # refused: the host's other services and addresses stay out of its reach.
  chain sandbox_to_host {
    ip daddr @GATEWAY@ udp dport 53 accept
    ip daddr @GATEWAY@ tcp dport 53 accept
    ct status dnat ip daddr 127.0.0.1 ip saddr . tcp dport @hostports4 accept
    ct state established,related ct direction reply accept
    meta l4proto tcp reject with tcp reset
    reject with icmpx admin-prohibited
  }

  # Host ports: the sandbox connects to @HOST@:PORT and reaches 127.0.0.1:PORT. (The
  # caller sets route_localnet on the bridge, without which the kernel drops a packet from
  # outside that is routed to loopback.)
  chain prerouting {
    type nat hook prerouting priority dstnat; policy accept;
    iifname "@BRIDGE@" ip daddr @HOST@ ip saddr . tcp dport @hostports4 dnat ip to 127.0.0.1
    # A published port, from outside the host (never from a sandbox: sandboxes do not
    # reach each other, published or not; theirs goes on to input and is refused).
    iifname != "@BRIDGE@" meta l4proto tcp dnat ip to ip daddr . tcp dport map @published4
  }

  # A published port, from the host itself (127.0.0.1:PORT, the default).
  chain output {
    type nat hook output priority -100; policy accept;
    meta l4proto tcp dnat ip to ip daddr . tcp dport map @published4
  }

  # A host port taken away: its open connections are reset here, before DNAT, while their
  # packets still read @HOST@. (After DNAT, in input, the reset would come from 127.0.0.1,
  # and that one never reaches the sandbox: the connection would hang instead.)
  chain host_ports {
    type filter hook prerouting priority dstnat - 10; policy accept;
    iifname "@BRIDGE@" ct direction original ct status dnat ip daddr @HOST@ ip saddr . tcp dport != @hostports4 reject with tcp reset
  }

  # What leaves by another interface leaves with the host's address; only what the filter
  # chains let through gets this far.
  chain postrouting {
    type nat hook postrouting priority srcnat; policy accept;
    ip saddr @SUBNET@ oifname != "@BRIDGE@" masquerade
    # A published port reached from the host's loopback: the sandbox would answer 127.0.0.1
    # to its own loopback, so such a connection comes from the gateway instead. (The bridge's
    # route_localnet lets the loopback-sourced packet be routed there first.)
    oifname "@BRIDGE@" ct status dnat ip saddr 127.0.0.0/8 masquerade
  }
}
table bridge @TABLE@
delete table bridge @TABLE@
table bridge @TABLE@ {
  comment "berth sandboxes: each veth speaks only with its own address"

  # Every rule above tells sandboxes apart by their source address, which a sandbox's root
  # could forge (CAP_NET_RAW inside, packet sockets): a frame that enters the bridge from a
  # sandbox's port must carry that port's own address, in IPv4 and in ARP. Anything else
  # from a sandbox port (IPv6, which sandboxes are not given, another ethertype, a forged
  # address) is dropped here, before routing and the inet table see it.
  set ports4 { type ifname . ipv4_addr; }
  # Only frames from this berth's sandbox ports (another berth on the host, with a bridge
  # of its own, has its own table). A port is in `links` before its link is up.
  set links { type ifname; }
  # Pairs of sandbox ports (both directions) whose sandboxes are peers: public, of one peer
  # group. Other ports are isolated bridge ports (they never forward to one another); a
  # peer's port is not, so every frame from one sandbox port to another is decided here.
  set peers { type ifname . ifname; }

  chain prerouting {
    type filter hook prerouting priority -300; policy accept;
    iifname @links jump from_sandbox_port
  }

  chain forward {
    type filter hook forward priority -300; policy accept;
    iifname @links oifname @links jump between_sandboxes
  }

  chain between_sandboxes {
    iifname . oifname @peers accept
    drop
  }

  chain from_sandbox_port {
    ether type ip iifname . ip saddr @ports4 accept
    ether type arp iifname . arp saddr ip @ports4 accept
    drop
  }
}
)";

void replace_all(std::string& s, std::string_view token, const std::string& value) {
    for (size_t at = s.find(token); at != std::string::npos; at = s.find(token, at + value.size()))
        s.replace(at, token.size(), value);
}

}  // namespace

void NftTable::create() {
    std::string s = kTable;
    replace_all(s, "@TABLE@", config_.table);
    replace_all(s, "@BRIDGE@", config_.bridge);
    replace_all(s, "@GATEWAY@", config_.gateway);
    replace_all(s, "@HOST@", config_.host_address);
    replace_all(s, "@SUBNET@", config_.subnet_cidr);
    run(s, "create");
}

void NftTable::destroy() {
    const std::string& t = config_.table;
    run("table inet " + t + "\ndelete table inet " + t + "\ntable bridge " + t +
            "\ndelete table bridge " + t + "\n",
        "destroy");
}

bool NftTable::exists() {
    // Lists the names of the inet tables only (nothing of their contents), so that "absent"
    // is a fact read from the listing rather than guessed from an error message.
    const std::string out = run("list tables inet", "list tables", true);
    try {
        // (Parsed into a variable of its own: a range-for over a member of a temporary would
        // outlive the temporary.)
        const json listing = json::parse(out);
        for (const json& item : listing.at("nftables")) {
            if (!item.contains("table")) continue;
            const json& table = item["table"];
            if (table.value("family", "") == "inet" && table.value("name", "") == config_.table)
                return true;
        }
    } catch (const json::exception& e) {
        throw Error(Kind::internal, std::string("nft list tables: unreadable JSON: ") + e.what());
    }
    return false;
}

void NftTable::set_public(const std::string& sandbox_ip, bool on) {
    const std::string ip = checked_sandbox(sandbox_ip);
    const std::string element = "element inet " + config_.table + " public4 { " + ip + " }\n";
    // Adding an element that is there is a no-op, so "add; delete" removes it whether or not
    // it was there, in one transaction.
    run(on ? "add " + element : "add " + element + "delete " + element, "set_public");
}

void NftTable::set_listed(const std::string& sandbox_ip, bool on) {
    const std::string ip = checked_sandbox(sandbox_ip);
    const std::string element = "element inet " + config_.table + " listed4 { " + ip + " }\n";
    run(on ? "add " + element : "add " + element + "delete " + element, "set_listed");
}

std::vector<std::string> NftTable::allowed_elements(const std::string& ip,
                                                    const std::vector<AllowRule>& rules) const {
    std::vector<std::string> elements;
    for (const AllowRule& rule : rules) {
        const std::string dst = checked_cidr(rule.cidr, "allowed destination").text();
        if (rule.proto != "tcp" && rule.proto != "udp" && !rule.proto.empty())
            invalid("allowed protocol: tcp, udp or empty (both): " + shown(rule.proto));
        if (rule.port_from > rule.port_to)
            invalid("allowed ports " + ports_text(rule.port_from, rule.port_to) +
                    ": the range is reversed");
        std::string suffix = " . " + ports_text(rule.port_from, rule.port_to);
        if (rule.timeout) {
            if (rule.timeout->count() <= 0)
                invalid("allowed entry timeout: positive, not " +
                        std::to_string(rule.timeout->count()) + "s");
            suffix += " timeout " + std::to_string(rule.timeout->count()) + "s";
        }
        for (const char* proto : {"tcp", "udp"})
            if (rule.proto.empty() || rule.proto == proto)
                elements.push_back(ip + " . " + dst + " . " + proto + suffix);
    }
    return elements;
}

namespace {

std::string add_command(const std::string& table, const char* set,
                        const std::vector<std::string>& elements) {
    if (elements.empty()) return {};
    std::string s = "add element inet " + table + " " + set + " { ";
    for (size_t i = 0; i < elements.size(); ++i) s += (i ? ", " : "") + elements[i];
    return s + " }\n";
}

}  // namespace

void NftTable::add_allowed(const std::string& sandbox_ip, const std::vector<AllowRule>& rules) {
    const std::string ip = checked_sandbox(sandbox_ip);
    const std::string add = add_command(config_.table, "allow4", allowed_elements(ip, rules));
    if (!add.empty()) run(add, "add_allowed");
}

std::vector<std::string> NftTable::elements_of(const char* set, const std::string& sandbox_ip) {
    const char* family = std::string_view(set) == "ports4" ? "bridge " : "inet ";
    const char* kind = std::string_view(set) == "published4" ? "map " : "set ";
    const std::string out =
        run(std::string("list ") + kind + family + config_.table + " " + set, "list set",
            /*json=*/true);
    std::vector<std::string> found;
    try {
        const json listing = json::parse(out);
        for (const json& item : listing.at("nftables")) {
            const char* key = item.contains("map") ? "map" : "set";
            if (!item.contains(key) || !item[key].contains("elem")) continue;
            for (const json& element : item[key]["elem"]) {
                auto [text, src] = element_text(set, element);
                if (src == sandbox_ip) found.push_back(std::move(text));
            }
        }
    } catch (const json::exception& e) {
        throw Error(Kind::internal,
                    std::string("nft list set ") + set + ": unreadable JSON: " + e.what());
    }
    return found;
}

template <typename Build>
void NftTable::run_listing(Build build, const char* what) {
    for (int attempt = 1;; ++attempt) {
        try {
            const std::string commands = build();
            if (!commands.empty()) run(commands, what);
            return;
        } catch (const Error& e) {
            // Invalid input is not retried; a set that changed under us (an entry that timed
            // out between listing and delete) is, with a fresh listing.
            if (e.kind() == Kind::invalid_argument || attempt == 3) throw;
        }
    }
}

namespace {

std::string delete_command(const std::string& table, const char* set,
                           const std::vector<std::string>& elements) {
    if (elements.empty()) return {};
    std::string s = "delete element inet " + table + " " + set + " { ";
    for (size_t i = 0; i < elements.size(); ++i) s += (i ? ", " : "") + elements[i];
    return s + " }\n";
}

}  // namespace

namespace {

// Deletes ports4 elements (`"LINK" . IP`, as element_text prints them) and their links.
std::string delete_bridge_command(const std::string& table,
                                  const std::vector<std::string>& elements) {
    if (elements.empty()) return {};
    std::string ports = "delete element bridge " + table + " ports4 { ";
    std::string links;
    for (size_t i = 0; i < elements.size(); ++i) {
        ports += (i ? ", " : "") + elements[i];
        // Added first, so that the delete cannot fail on a link already gone.
        const std::string link = "element bridge " + table + " links { " +
                                 elements[i].substr(0, elements[i].find(" . ")) + " }\n";
        links += "add " + link + "delete " + link;
    }
    return ports + " }\n" + links;
}

}  // namespace

void NftTable::set_port(const std::string& sandbox_ip, const std::string& link) {
    const std::string ip = checked_sandbox(sandbox_ip);
    if (!is_name(link)) invalid("link name: [A-Za-z0-9_-], 15 at most: " + shown(link));
    // The port's address is its only one: an earlier element of this address (a link of a
    // sandbox whose address was handed out again) goes in the same transaction.
    run_listing(
        [&] {
            return delete_bridge_command(config_.table, elements_of("ports4", ip)) +
                   "add element bridge " + config_.table + " ports4 { \"" + link + "\" . " + ip +
                   " }\nadd element bridge " + config_.table + " links { \"" + link + "\" }\n";
        },
        "set_port");
}

void NftTable::clear_allowed(const std::string& sandbox_ip) {
    const std::string ip = checked_sandbox(sandbox_ip);
    run_listing([&] { return delete_command(config_.table, "allow4", elements_of("allow4", ip)); },
                "clear_allowed");
}

void NftTable::apply(const std::string& sandbox_ip, bool is_public, bool is_listed,
                     const std::vector<AllowRule>& rules) {
    const std::string ip = checked_sandbox(sandbox_ip);
    const std::string add = add_command(config_.table, "allow4", allowed_elements(ip, rules));
    auto membership = [&](const char* set, bool on) {
        const std::string element =
            "element inet " + config_.table + " " + set + " { " + ip + " }\n";
        return on ? "add " + element : "add " + element + "delete " + element;
    };
    // One transaction: the old entries go and the new come with the memberships, so no
    // packet sees the sandbox between two policies, and a failure leaves the old one.
    run_listing(
        [&] {
            return delete_command(config_.table, "allow4", elements_of("allow4", ip)) +
                   membership("public4", is_public) + membership("listed4", is_listed) + add;
        },
        "apply");
}

namespace {

// hostports4 elements of checked sandbox address `ip`.
std::vector<std::string> host_port_elements(const std::string& ip,
                                            const std::vector<uint16_t>& ports) {
    // Sorted and once each: nft refuses a duplicate within one command.
    const std::set<uint16_t> wanted(ports.begin(), ports.end());
    if (wanted.count(0)) invalid("host port 0: no program listens there");
    std::vector<std::string> elements;
    for (uint16_t port : wanted) elements.push_back(ip + " . " + std::to_string(port));
    return elements;
}

// published4 elements of checked sandbox address `ip`.
std::vector<std::string> published_elements(const std::string& ip,
                                            const std::vector<PublishedPort>& ports) {
    std::vector<std::string> elements;
    for (const PublishedPort& p : ports) {
        if (p.host_port == 0 || p.port == 0) invalid("published port 0: not a port");
        elements.push_back(checked_ipv4(p.host_ip, "published host address") + " . " +
                           std::to_string(p.host_port) + " : " + ip + " . " +
                           std::to_string(p.port));
    }
    return elements;
}

// Adds `ip` to `set`.
std::string membership_command(const std::string& table, const char* set, const std::string& ip) {
    return "add element inet " + table + " " + set + " { " + ip + " }\n";
}

}  // namespace

void NftTable::add_sandbox(const std::string& sandbox_ip, const std::string& link,
                           const std::vector<uint16_t>& host_ports,
                           const std::vector<PublishedPort>& published, bool is_public,
                           bool is_listed, const std::vector<AllowRule>& rules) {
    const std::string ip = checked_sandbox(sandbox_ip);
    if (!is_name(link)) invalid("link name: [A-Za-z0-9_-], 15 at most: " + shown(link));
    run("add element bridge " + config_.table + " ports4 { \"" + link + "\" . " + ip +
            " }\nadd element bridge " + config_.table + " links { \"" + link + "\" }\n" +
            add_command(config_.table, "hostports4", host_port_elements(ip, host_ports)) +
            add_command(config_.table, "published4", published_elements(ip, published)) +
            (is_public ? membership_command(config_.table, "public4", ip) : "") +
            (is_listed ? membership_command(config_.table, "listed4", ip) : "") +
            add_command(config_.table, "allow4", allowed_elements(ip, rules)),
        "add_sandbox");
}

void NftTable::set_peers(const std::string& link_a, const std::string& ip_a,
                         const std::string& link_b, const std::string& ip_b, bool on) {
    const std::string a = checked_sandbox(ip_a), b = checked_sandbox(ip_b);
    for (const std::string* link : {&link_a, &link_b})
        if (!is_name(*link)) invalid("link name: [A-Za-z0-9_-], 15 at most: " + shown(*link));
    if (link_a == link_b || a == b) invalid("a sandbox is not its own peer");
    const std::string& t = config_.table;
    const std::string ports = "element bridge " + t + " peers { \"" + link_a + "\" . \"" + link_b +
                              "\", \"" + link_b + "\" . \"" + link_a + "\" }\n";
    const std::string addresses =
        "element inet " + t + " peers4 { " + a + " . " + b + ", " + b + " . " + a + " }\n";
    // (Adding what is there is a no-op: "add; delete" removes whether or not it was.)
    const std::string add = "add " + ports + "add " + addresses;
    run(on ? add : add + "delete " + ports + "delete " + addresses, "set_peers");
}

void NftTable::set_host_ports(const std::string& sandbox_ip, const std::vector<uint16_t>& ports) {
    const std::string ip = checked_sandbox(sandbox_ip);
    const std::string add = add_command(config_.table, "hostports4", host_port_elements(ip, ports));
    // Delete-then-add in one transaction: a port in both stays, and no packet sees the
    // sandbox with neither set of ports.
    run_listing(
        [&] {
            return delete_command(config_.table, "hostports4", elements_of("hostports4", ip)) + add;
        },
        "set_host_ports");
}

void NftTable::set_published(const std::string& sandbox_ip,
                             const std::vector<PublishedPort>& ports) {
    const std::string ip = checked_sandbox(sandbox_ip);
    const std::vector<std::string> elements = published_elements(ip, ports);
    run_listing(
        [&] {
            return delete_command(config_.table, "published4", elements_of("published4", ip)) +
                   add_command(config_.table, "published4", elements);
        },
        "set_published");
}

void NftTable::forget(const std::string& sandbox_ip) {
    const std::string ip = checked_sandbox(sandbox_ip);
    const std::string element = "element inet " + config_.table + " public4 { " + ip + " }\n";
    const std::string listed = "element inet " + config_.table + " listed4 { " + ip + " }\n";
    run_listing(
        [&] {
            return "add " + element + "delete " + element + "add " + listed + "delete " + listed +
                   delete_command(config_.table, "allow4", elements_of("allow4", ip)) +
                   delete_command(config_.table, "hostports4", elements_of("hostports4", ip)) +
                   delete_command(config_.table, "published4", elements_of("published4", ip)) +
                   delete_bridge_command(config_.table, elements_of("ports4", ip));
        },
        "forget");
}

std::string NftTable::list() {
    return run("list table inet " + config_.table, "list");
}

}  // namespace berth::net
