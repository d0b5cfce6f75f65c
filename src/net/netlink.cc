#include "net/netlink.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <libmnl/libmnl.h>
#include <linux/if.h>
#include <linux/if_addr.h>
#include <linux/if_link.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <linux/veth.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <utility>

#include "base/error.h"
#include "base/undo.h"
#include "base/unique_fd.h"

namespace berth::net {

namespace {

using Kind = Error::Kind;

// Room for a dump's replies: the kernel fills a dump's buffer up to what the reader offers,
// and one link's message with its attributes runs to a few kilobytes.
constexpr size_t kReceiveSize = 32768;
// Far more than the largest request here (two names, a few integers).
constexpr size_t kRequestSize = 1024;

// How /proc names a namespace ("net:[4026531840]"), for messages: readable next to `ip netns
// identify`, `lsns` or a /proc/PID/ns/net link.
std::string netns_name(const std::string& link_path) {
    std::array<char, 64> buf{};
    const ssize_t n = ::readlink(link_path.c_str(), buf.data(), buf.size() - 1);
    if (n <= 0) return link_path;  // only for messages: the path still says which one
    return std::string(buf.data(), static_cast<size_t>(n));
}

// (An fd that is no namespace is shown as what it is: setns or the kernel will refuse it.)
std::string fd_netns_name(int fd) {
    std::string name = netns_name("/proc/self/fd/" + std::to_string(fd));
    if (name.starts_with("net:[")) return name;
    return "fd " + std::to_string(fd) + " (" + name + ")";
}

// An address as one of the two families and its bytes.
struct IpAddress {
    int family = AF_UNSPEC;
    std::array<unsigned char, 16> bytes{};
    size_t size() const { return family == AF_INET ? 4 : 16; }
    int max_prefix() const { return family == AF_INET ? 32 : 128; }
};

IpAddress parse_ip(const std::string& text) {
    IpAddress a;
    if (::inet_pton(AF_INET, text.c_str(), a.bytes.data()) == 1) {
        a.family = AF_INET;
    } else if (::inet_pton(AF_INET6, text.c_str(), a.bytes.data()) == 1) {
        a.family = AF_INET6;
    } else {
        throw Error(Kind::invalid_argument, "\"" + text + "\" is not an IPv4 or IPv6 address");
    }
    return a;
}

// The error for a refused request. The kernel's extended ack, when it sent one, says which
// attribute it disliked, which the errno alone (EINVAL, ERANGE) rarely does.
[[noreturn]] void throw_refusal(const std::string& request, const std::string& subject, int err,
                                const std::string& kernel_says) {
    std::string what = request + " " + subject + ": " + std::strerror(err) + " (errno " +
                       std::to_string(err) + ")";
    if (!kernel_says.empty()) what += ": the kernel says \"" + kernel_says + "\"";
    // ENODEV is how rtnetlink says "no such link"; kind_for_errno, for files, calls it
    // internal, so this one is a plain Error of the kind a caller tests for.
    if (err == ENODEV) throw Error(Kind::not_found, what, err);
    // The rest (EEXIST, ENOENT, EPERM among them) mean for links what they mean for files.
    throw SysError::relayed(what, err);
}

// The NUL-terminated string attribute `type` among those after `offset` bytes of payload.
std::optional<std::string> string_attr(const nlmsghdr* h, size_t offset, std::uint16_t type) {
    struct Search {
        std::uint16_t type;
        std::optional<std::string> found;
    } search{type, std::nullopt};
    mnl_attr_parse(
        h, static_cast<unsigned>(offset),
        [](const nlattr* attr, void* data) {
            auto* s = static_cast<Search*>(data);
            if (mnl_attr_get_type(attr) == s->type &&
                mnl_attr_validate(attr, MNL_TYPE_NUL_STRING) == 0) {
                s->found = mnl_attr_get_str(attr);
            }
            return MNL_CB_OK;
        },
        &search);
    return search.found;
}

// The text of an NLMSG_ERROR's or NLMSG_DONE's NLMSGERR_ATTR_MSG, if it carries one.
std::string extended_ack_message(const nlmsghdr* h, size_t payload_offset) {
    if (!(h->nlmsg_flags & NLM_F_ACK_TLVS)) return {};
    if (h->nlmsg_len < mnl_nlmsg_size(payload_offset)) return {};
    return string_attr(h, payload_offset, NLMSGERR_ATTR_MSG).value_or("");
}

}  // namespace

void check_ifname(std::string_view name) {
    auto refuse = [&](const char* why) {
        std::string shown;
        for (char c : name) shown += std::isprint(static_cast<unsigned char>(c)) ? c : '?';
        throw Error(Kind::invalid_argument,
                    "interface name \"" + shown + "\" is not one the kernel accepts: " + why);
    };
    if (name.empty()) refuse("empty");
    if (name.size() >= IFNAMSIZ) refuse("longer than 15 bytes");
    if (name == "." || name == "..") refuse("\".\" and \"..\" are reserved");
    for (char c : name) {
        if (c == '/' || c == ':' || c == '\0' || std::isspace(static_cast<unsigned char>(c)))
            refuse("no '/', ':', NUL or whitespace");
    }
}

// One request message being built: its header, then a fixed header of its family, then
// attributes. It also carries what to call it in errors.
class Netlink::Request {
  public:
    Request(std::uint16_t type, std::uint16_t flags, std::string name, std::string subject)
        : name(std::move(name)), subject(std::move(subject)) {
        nlh = mnl_nlmsg_put_header(buf_.data());
        nlh->nlmsg_type = type;
        nlh->nlmsg_flags = NLM_F_REQUEST | NLM_F_ACK | flags;
    }
    Request(const Request&) = delete;
    Request& operator=(const Request&) = delete;

    template <typename T>
    T* put_header() {
        return static_cast<T*>(mnl_nlmsg_put_extra_header(nlh, sizeof(T)));
    }
    // The _check variants: an overflow, impossible with the sizes here, fails the request
    // rather than write past the buffer.
    void put_str(std::uint16_t type, const std::string& s) {
        if (!mnl_attr_put_strz_check(nlh, buf_.size(), type, s.c_str())) overflow();
    }
    void put_u32(std::uint16_t type, std::uint32_t v) {
        if (!mnl_attr_put_u32_check(nlh, buf_.size(), type, v)) overflow();
    }
    void put(std::uint16_t type, const void* data, size_t len) {
        if (!mnl_attr_put_check(nlh, buf_.size(), type, len, data)) overflow();
    }
    nlattr* nest_start(std::uint16_t type) {
        nlattr* nest = mnl_attr_nest_start_check(nlh, buf_.size(), type);
        if (!nest) overflow();
        return nest;
    }
    void nest_end(nlattr* nest) { mnl_attr_nest_end(nlh, nest); }

    nlmsghdr* nlh;
    const std::string name;     // "RTM_NEWLINK"
    const std::string subject;  // "bridge berth0 in net:[4026531840]"

  private:
    [[noreturn]] void overflow() const {
        throw Error(Kind::internal, name + " " + subject + ": request larger than its buffer");
    }
    alignas(nlmsghdr) std::array<char, kRequestSize> buf_{};
};

void Netlink::SocketCloser::operator()(mnl_socket* s) const {
    mnl_socket_close(s);
}

Netlink::Netlink() : netns_(netns_name("/proc/thread-self/ns/net")) {
    const std::string subject = "NETLINK_ROUTE in " + netns_;
    socket_.reset(mnl_socket_open2(NETLINK_ROUTE, SOCK_CLOEXEC));
    if (!socket_) throw_sys("socket", subject);
    if (mnl_socket_bind(socket_.get(), 0, MNL_SOCKET_AUTOPID) < 0) throw_sys("bind", subject);
    portid_ = mnl_socket_get_portid(socket_.get());
    // Extended acks carry the kernel's reason for a refusal (see throw_refusal); capped ones
    // leave out the echo of our request. Both are conveniences: a kernel without them (before
    // 4.12) still answers with the errno.
    const int on = 1;
    const int fd = mnl_socket_get_fd(socket_.get());
    (void)::setsockopt(fd, SOL_NETLINK, NETLINK_EXT_ACK, &on, sizeof on);
    (void)::setsockopt(fd, SOL_NETLINK, NETLINK_CAP_ACK, &on, sizeof on);
}

Netlink Netlink::in_netns(int netns_fd) {
    const std::string there = fd_netns_name(netns_fd);
    UniqueFd home(check_sys("open", "/proc/thread-self/ns/net", [] {
        return ::open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
    }));
    check_sys("setns", there, [&] { return ::setns(netns_fd, CLONE_NEWNET); });
    // Back to our own namespace however this scope is left. Cannot fail for a namespace we
    // were in a moment ago and hold open; if it did, the helper would go on creating host
    // links inside a sandbox: better to stop here.
    ScopeGuard back([&home] {
        if (::setns(home.get(), CLONE_NEWNET) != 0) {
            std::perror("berth: setns back to the original network namespace");
            std::abort();
        }
    });
    return Netlink();
}

Netlink::Netlink(Netlink&&) noexcept = default;
Netlink& Netlink::operator=(Netlink&&) noexcept = default;
Netlink::~Netlink() = default;

bool Netlink::transact(Request& req, const std::function<void(const nlmsghdr*)>& on_reply) {
    const std::uint32_t seq = ++seq_;
    req.nlh->nlmsg_seq = seq;
    mnl_socket* s = socket_.get();
    const ssize_t sent = check_sys("send " + req.name, req.subject, [&] {
        return mnl_socket_sendto(s, req.nlh, req.nlh->nlmsg_len);
    });
    if (static_cast<size_t>(sent) != req.nlh->nlmsg_len)
        throw Error(Kind::internal, "send " + req.name + " " + req.subject + ": short write");

    auto broken = [&](const std::string& why) {
        return Error(Kind::internal, req.name + " " + req.subject + ": " + why);
    };
    std::vector<char> buf(kReceiveSize);
    bool interrupted = false;
    for (;;) {
        // (ENOSPC: a reply larger than the buffer, which the kernel truncated.)
        ssize_t n = check_sys("recv " + req.name, req.subject,
                              [&] { return mnl_socket_recvfrom(s, buf.data(), buf.size()); });
        int left = static_cast<int>(n);
        for (auto* h = reinterpret_cast<const nlmsghdr*>(buf.data()); mnl_nlmsg_ok(h, left);
             h = mnl_nlmsg_next(h, &left)) {
            if (h->nlmsg_pid != portid_) throw broken("reply for another port");
            // An earlier request's leftovers (one that threw before it read all its replies)
            // are skipped; anything newer than ours cannot be an answer to anything.
            if (h->nlmsg_seq < seq) continue;
            if (h->nlmsg_seq != seq) throw broken("reply with an unknown sequence number");
            if (h->nlmsg_flags & NLM_F_DUMP_INTR) interrupted = true;
            switch (h->nlmsg_type) {
                case NLMSG_NOOP:
                    continue;
                case NLMSG_OVERRUN:
                    throw broken("the kernel reports an overrun");
                case NLMSG_ERROR: {
                    if (mnl_nlmsg_get_payload_len(h) < sizeof(nlmsgerr))
                        throw broken("truncated NLMSG_ERROR");
                    const auto* e = static_cast<const nlmsgerr*>(mnl_nlmsg_get_payload(h));
                    if (e->error == 0) return interrupted;  // the acknowledgement
                    // The TLVs follow the echoed request unless the kernel capped it.
                    size_t offset = sizeof(nlmsgerr);
                    if (!(h->nlmsg_flags & NLM_F_CAPPED) && e->msg.nlmsg_len > sizeof(nlmsghdr))
                        offset += e->msg.nlmsg_len - sizeof(nlmsghdr);
                    throw_refusal(req.name, req.subject, -e->error,
                                  extended_ack_message(h, offset));
                }
                case NLMSG_DONE: {
                    // A dump's end; it carries the dump's error, if it failed part way.
                    if (mnl_nlmsg_get_payload_len(h) >= sizeof(int)) {
                        int err;
                        std::memcpy(&err, mnl_nlmsg_get_payload(h), sizeof err);
                        if (err < 0)
                            throw_refusal(req.name, req.subject, -err,
                                          extended_ack_message(h, sizeof(int)));
                    }
                    return interrupted;
                }
                default:
                    if (on_reply) on_reply(h);
            }
        }
        if (left != 0) throw broken("truncated reply");
    }
}

void Netlink::add_bridge(const std::string& name) {
    check_ifname(name);
    Request req(RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL, "RTM_NEWLINK",
                "bridge " + name + " in " + netns_);
    req.put_header<ifinfomsg>()->ifi_family = AF_UNSPEC;
    req.put_str(IFLA_IFNAME, name);
    nlattr* linkinfo = req.nest_start(IFLA_LINKINFO);
    req.put_str(IFLA_INFO_KIND, "bridge");
    req.nest_end(linkinfo);
    transact(req);
}

void Netlink::add_veth(const std::string& host_name, const std::string& peer_name,
                       int peer_netns_fd) {
    check_ifname(host_name);
    check_ifname(peer_name);
    if (peer_netns_fd < 0)
        throw Error(Kind::invalid_argument, "veth " + host_name + ": no peer network namespace");
    // EEXIST can be either name: the host's here or the peer's there.
    Request req(RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL, "RTM_NEWLINK",
                "veth " + host_name + " in " + netns_ + " (peer " + peer_name + " in " +
                    fd_netns_name(peer_netns_fd) + ")");
    req.put_header<ifinfomsg>()->ifi_family = AF_UNSPEC;
    req.put_str(IFLA_IFNAME, host_name);
    nlattr* linkinfo = req.nest_start(IFLA_LINKINFO);
    req.put_str(IFLA_INFO_KIND, "veth");
    nlattr* data = req.nest_start(IFLA_INFO_DATA);
    // The peer's attributes are a link message of their own: an ifinfomsg, then attributes.
    nlattr* peer = req.nest_start(VETH_INFO_PEER);
    req.put_header<ifinfomsg>()->ifi_family = AF_UNSPEC;
    req.put_str(IFLA_IFNAME, peer_name);
    req.put_u32(IFLA_NET_NS_FD, static_cast<std::uint32_t>(peer_netns_fd));
    req.nest_end(peer);
    req.nest_end(data);
    req.nest_end(linkinfo);
    transact(req);
}

void Netlink::set_master(const std::string& link, const std::string& bridge) {
    check_ifname(link);
    check_ifname(bridge);
    const int master = with_context("master of " + link, [&] { return ifindex(bridge); });
    Request req(RTM_SETLINK, 0, "RTM_SETLINK", link + " master " + bridge + " in " + netns_);
    req.put_header<ifinfomsg>()->ifi_family = AF_UNSPEC;
    // (ifi_index 0: the kernel finds the link by IFLA_IFNAME.)
    req.put_str(IFLA_IFNAME, link);
    req.put_u32(IFLA_MASTER, static_cast<std::uint32_t>(master));
    transact(req);
}

void Netlink::set_up(const std::string& link) {
    check_ifname(link);
    Request req(RTM_SETLINK, 0, "RTM_SETLINK", link + " up in " + netns_);
    auto* ifi = req.put_header<ifinfomsg>();
    ifi->ifi_family = AF_UNSPEC;
    ifi->ifi_flags = IFF_UP;
    ifi->ifi_change = IFF_UP;  // only this flag changes
    req.put_str(IFLA_IFNAME, link);
    transact(req);
}

void Netlink::set_mac(const std::string& link, const std::array<uint8_t, 6>& mac) {
    check_ifname(link);
    Request req(RTM_SETLINK, 0, "RTM_SETLINK", link + " address in " + netns_);
    req.put_header<ifinfomsg>()->ifi_family = AF_UNSPEC;
    req.put_str(IFLA_IFNAME, link);
    req.put(IFLA_ADDRESS, mac.data(), mac.size());
    transact(req);
}

void Netlink::set_isolated(const std::string& link, bool isolated) {
    check_ifname(link);
    // IFLA_BRPORT_ISOLATED: an isolated port forwards to non-isolated ports only (the
    // bridge's own address is not a port), so sandboxes on one bridge cannot reach each
    // other at layer 2, where the forward chain of nftables never sees their packets.
    const int index = ifindex(link);
    Request req(RTM_SETLINK, 0, "RTM_SETLINK",
                link + (isolated ? " isolated in " : " not isolated in ") + netns_);
    auto* ifi = req.put_header<ifinfomsg>();
    ifi->ifi_family = AF_BRIDGE;
    ifi->ifi_index = index;
    nlattr* port = req.nest_start(IFLA_PROTINFO | NLA_F_NESTED);
    const std::uint8_t on = isolated ? 1 : 0;
    req.put(IFLA_BRPORT_ISOLATED, &on, sizeof on);
    req.nest_end(port);
    transact(req);
}

void Netlink::rename(const std::string& from, const std::string& to) {
    check_ifname(from);
    check_ifname(to);
    // IFLA_IFNAME is the new name here, so the link is named by its index.
    const int index = ifindex(from);
    Request req(RTM_SETLINK, 0, "RTM_SETLINK", from + " name " + to + " in " + netns_);
    auto* ifi = req.put_header<ifinfomsg>();
    ifi->ifi_family = AF_UNSPEC;
    ifi->ifi_index = index;
    req.put_str(IFLA_IFNAME, to);
    transact(req);
}

void Netlink::delete_link(const std::string& name) {
    check_ifname(name);
    Request req(RTM_DELLINK, 0, "RTM_DELLINK", name + " in " + netns_);
    req.put_header<ifinfomsg>()->ifi_family = AF_UNSPEC;
    req.put_str(IFLA_IFNAME, name);
    transact(req);
}

namespace {

// A link message's IFLA_IFNAME, or nullopt.
std::optional<std::string> link_name(const nlmsghdr* h) {
    if (h->nlmsg_type != RTM_NEWLINK || mnl_nlmsg_get_payload_len(h) < sizeof(ifinfomsg))
        return std::nullopt;
    return string_attr(h, sizeof(ifinfomsg), IFLA_IFNAME);
}

}  // namespace

std::vector<std::string> Netlink::links_with_prefix(const std::string& prefix) {
    if (!prefix.empty()) {
        // A prefix is a name's start: the same characters, at most as long.
        with_context("link prefix", [&] { check_ifname(prefix); });
    }
    // A dump the kernel flags as interrupted (links came or went during it) may have missed
    // some: the sweep wants all, so it asks again; links do not change that fast for long.
    for (int attempt = 0; attempt < 5; ++attempt) {
        Request req(RTM_GETLINK, NLM_F_DUMP, "RTM_GETLINK",
                    "dump (prefix \"" + prefix + "\") in " + netns_);
        req.put_header<ifinfomsg>()->ifi_family = AF_UNSPEC;
        // Only names are wanted: the statistics are most of each reply's size.
        req.put_u32(IFLA_EXT_MASK, RTEXT_FILTER_SKIP_STATS);
        std::vector<std::string> names;
        const bool interrupted = transact(req, [&](const nlmsghdr* h) {
            auto name = link_name(h);
            if (name && name->starts_with(prefix)) names.push_back(std::move(*name));
        });
        if (!interrupted) return names;
    }
    throw Error(Kind::unavailable,
                "RTM_GETLINK dump in " + netns_ + ": interrupted by link changes 5 times over");
}

int Netlink::ifindex(const std::string& name) {
    check_ifname(name);
    Request req(RTM_GETLINK, 0, "RTM_GETLINK", name + " in " + netns_);
    req.put_header<ifinfomsg>()->ifi_family = AF_UNSPEC;
    req.put_str(IFLA_IFNAME, name);
    req.put_u32(IFLA_EXT_MASK, RTEXT_FILTER_SKIP_STATS);
    int index = 0;
    transact(req, [&](const nlmsghdr* h) {
        if (h->nlmsg_type == RTM_NEWLINK && mnl_nlmsg_get_payload_len(h) >= sizeof(ifinfomsg))
            index = static_cast<const ifinfomsg*>(mnl_nlmsg_get_payload(h))->ifi_index;
    });
    // (A missing link is ENODEV, thrown above; an ack without the link would be a kernel bug.)
    if (index <= 0)
        throw Error(Kind::internal,
                    "RTM_GETLINK " + name + " in " + netns_ + ": no link in the reply");
    return index;
}

void Netlink::add_address(const std::string& link, const std::string& address, int prefix_len) {
    check_ifname(link);
    const IpAddress a = parse_ip(address);
    if (prefix_len < 0 || prefix_len > a.max_prefix())
        throw Error(Kind::invalid_argument,
                    address + "/" + std::to_string(prefix_len) + ": prefix length out of range");
    const std::string subject =
        address + "/" + std::to_string(prefix_len) + " on " + link + " in " + netns_;
    const int index = with_context("RTM_NEWADDR " + subject, [&] { return ifindex(link); });
    Request req(RTM_NEWADDR, NLM_F_CREATE | NLM_F_EXCL, "RTM_NEWADDR", subject);
    auto* ifa = req.put_header<ifaddrmsg>();
    ifa->ifa_family = static_cast<unsigned char>(a.family);
    ifa->ifa_prefixlen = static_cast<unsigned char>(prefix_len);
    ifa->ifa_scope = RT_SCOPE_UNIVERSE;
    ifa->ifa_index = static_cast<unsigned>(index);
    // Unique by allocation; DAD would hold the address tentative (unusable) for a second.
    if (a.family == AF_INET6) ifa->ifa_flags = IFA_F_NODAD;
    // IFA_LOCAL is the interface's address, IFA_ADDRESS the peer's on a point-to-point link
    // and the same otherwise; ip(8) sends both.
    req.put(IFA_LOCAL, a.bytes.data(), a.size());
    req.put(IFA_ADDRESS, a.bytes.data(), a.size());
    transact(req);
}

void Netlink::add_default_route(const std::string& via) {
    const IpAddress gw = parse_ip(via);
    Request req(RTM_NEWROUTE, NLM_F_CREATE | NLM_F_EXCL, "RTM_NEWROUTE",
                "default via " + via + " in " + netns_);
    auto* rtm = req.put_header<rtmsg>();
    rtm->rtm_family = static_cast<unsigned char>(gw.family);
    rtm->rtm_dst_len = 0;  // default
    rtm->rtm_table = RT_TABLE_MAIN;
    rtm->rtm_protocol = RTPROT_STATIC;  // set by an administrator, not a daemon or the kernel
    rtm->rtm_scope = RT_SCOPE_UNIVERSE;
    rtm->rtm_type = RTN_UNICAST;
    req.put(RTA_GATEWAY, gw.bytes.data(), gw.size());
    transact(req);
}

}  // namespace berth::net
