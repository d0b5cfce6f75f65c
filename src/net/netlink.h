// A small rtnetlink client (over libmnl): the links, addresses and routes berth-helper sets up
// to give a sandbox a veth on a bridge, asked of the kernel directly rather than by running
// ip(8), so that a failure comes back as an errno and the kernel's own words, not as text.
//
// Every request asks for an acknowledgement and waits for it, so each call has either taken
// effect or thrown when it returns. Kernel refusals are berth::Errors whose message names the
// request, its subject and the network namespace ("RTM_NEWLINK bridge berth0 in
// net:[4026531840]: File exists (errno 17)"); their kind: EEXIST -> already_exists, ENODEV
// and ENOENT -> not_found, EPERM -> permission_denied (SysErrors all, except ENODEV's: a
// SysError's kind follows kind_for_errno, which calls ENODEV internal). Any other errno is a
// SysError of kind_for_errno's kind. Names are checked (check_ifname) before anything is sent.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

struct mnl_socket;
struct nlmsghdr;

namespace berth::net {

// What the kernel accepts as an interface name (dev_valid_name): 1 to 15 bytes, not "." or
// "..", no '/', ':', NUL or whitespace. Throws Error(invalid_argument) otherwise.
void check_ifname(std::string_view name);

// One NETLINK_ROUTE socket. A netlink socket acts in the network namespace it was created in,
// whatever namespace its user later moves to, so each Netlink stands for one namespace.
// Not for use by two threads at once.
class Netlink {
  public:
    // In the calling thread's network namespace.
    Netlink();
    // In the network namespace `netns_fd` names: the calling thread enters it to open the
    // socket and returns to its own before this returns, error or not. (Were the return to
    // fail, the process would abort rather than go on in the wrong namespace.)
    static Netlink in_netns(int netns_fd);

    Netlink(Netlink&&) noexcept;
    Netlink& operator=(Netlink&&) noexcept;
    ~Netlink();

    // Links. `link` and the like are interface names in this socket's namespace.
    void add_bridge(const std::string& name);
    // A veth pair whose peer end is created directly in `peer_netns_fd`'s namespace (so it
    // never appears in this one, not even briefly under its name here).
    void add_veth(const std::string& host_name, const std::string& peer_name, int peer_netns_fd);
    void set_master(const std::string& link, const std::string& bridge);
    void set_up(const std::string& link);
    // Sets the link's hardware address. On a bridge this also fixes it: otherwise a bridge
    // takes the lowest address of its ports, and changes it as ports come and go.
    void set_mac(const std::string& link, const std::array<uint8_t, 6>& mac);
    // Makes bridge port `link` isolated: it forwards to no other isolated port (sandboxes
    // on one bridge do not reach each other), only to the bridge itself and others.
    void set_isolated(const std::string& link, bool isolated = true);
    // Older kernels refuse to rename a link that is up (EBUSY: kind invalid_argument).
    void rename(const std::string& from, const std::string& to);
    // Deleting either end of a veth pair deletes both.
    void delete_link(const std::string& name);
    // The names of this namespace's links that start with `prefix` (a dump: for the start-up
    // sweep of what an earlier run left behind), in ifindex order.
    std::vector<std::string> links_with_prefix(const std::string& prefix);
    int ifindex(const std::string& name);

    // Addresses and routes: IPv4 ("10.89.0.5") or IPv6 ("fd00::5"); IPv6 addresses skip
    // duplicate address detection (the caller allocated them; DAD would only delay them).
    void add_address(const std::string& link, const std::string& address, int prefix_len);
    // The main table's default route. The gateway must be on a subnet of a link that is up
    // (an address's prefix route), else the kernel answers ENETUNREACH.
    void add_default_route(const std::string& via);

    // Bridge settings that are sysctls are not here: the caller writes /proc/sys.

  private:
    struct SocketCloser {
        void operator()(mnl_socket* s) const;
    };
    class Request;

    // Sends `req`, then reads replies until its acknowledgement (or a dump's end), passing
    // every data message to `on_reply`; throws for a refusal or a broken exchange. True if
    // the kernel flagged a dump as interrupted (links changed under it: start again).
    bool transact(Request& req, const std::function<void(const nlmsghdr*)>& on_reply = {});

    std::unique_ptr<mnl_socket, SocketCloser> socket_;
    std::uint32_t portid_ = 0;
    std::uint32_t seq_ = 0;
    std::string netns_;  // "net:[inode]", for messages
};

}  // namespace berth::net
