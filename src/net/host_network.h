// A sandbox's network, host side, behind one interface: the root implementation (a bridge
// of berth's, a veth per sandbox, berth's own nftables table) now; a rootless one (pasta)
// can stand behind the same calls. The helper reserves before it clones (the sandbox's
// /etc files name its address), attaches once the sandbox's network namespace exists and
// before anything of the sandbox runs, changes the policy of a running sandbox when asked
// (set_policy), and releases on delete.
#pragma once

#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "net/allow_entry.h"
#include "net/etc_files.h"
#include "net/nft_table.h"

namespace berth::net {

// none: loopback only (and the host ports it was given); public_egress: anywhere but the
// host and other sandboxes; allowlist: only the entries' addresses and ports (hostnames
// through berth's DNS).
enum class Mode { none, public_egress, allowlist };

const char* mode_name(Mode mode);
// "none", "public", "allowlist"; throws Error(invalid_argument) for anything else.
Mode parse_mode(const std::string& name);

struct Policy {
    Mode mode = Mode::none;
    std::vector<AllowEntry> allow;  // allowlist only
};

struct Attachment {
    std::string sandbox_id;
    Policy policy;
    // The host's loopback TCP ports the sandbox reaches at host.berth.internal, in every
    // mode; fixed at create.
    std::vector<uint16_t> host_ports;
    // Host address:port pairs whose TCP connections go to the sandbox (-p); fixed at create.
    std::vector<PublishedPort> published;
    // IPv4 on berth's bridge. A sandbox made in `none` without host ports has none (and no
    // link) until a policy with a network is set.
    std::string address;
    bool linked = false;  // its veth exists
    // Sandboxes of one peer group reach each other while both are public (the helper's
    // key: the owner's uid, ':', the group's name, so that no other user's sandbox joins).
    // Empty: none; fixed at create.
    std::string peer_group = {};
};

class HostNetwork {
  public:
    virtual ~HostNetwork() = default;
    // What a new sandbox gets (an address, unless it is `none` without host ports): nothing
    // is made yet. Throws Error(invalid_argument / failed_precondition) for a policy this
    // network cannot enforce.
    // Published ports are taken on the host here (bound, so that no host service or other
    // sandbox has them): one in use is refused with Error(already_exists).
    virtual Attachment reserve(const std::string& sandbox_id, const Policy& policy,
                               const std::vector<uint16_t>& host_ports,
                               const std::vector<PublishedPort>& published) = 0;
    // Ahead of any sandbox (a pooled shell, runtime/helper/shell.h): a veth whose sandbox end
    // (eth0, down, no address) is made inside `netns_fd` and whose host end, named for
    // `shell_name`, is on nothing and down, so that attach has only to rename and configure
    // it. Returns the host end's name ("": this network prepares nothing). The pair goes
    // with the namespace if the shell dies unassigned.
    virtual std::string prepare_link(const std::string& shell_name, int netns_fd) = 0;
    // A prepared link the sandbox has no use for (`none` without host ports): deleted.
    // Never throws.
    virtual void discard_link(const std::string& link) noexcept = 0;
    // Makes it, if it has an address: a veth whose sandbox end (eth0, with the address and a
    // default route) is inside `netns_fd` -- the `prepared` link (prepare_link), or one made
    // now when that is empty -- and the rules of its policy.
    virtual void attach(Attachment& a, int netns_fd, const std::string& prepared = {}) {
        begin_attach(a, netns_fd, prepared)();
    }
    // attach in two parts: what needs the caller's own thread is done here (the bridge and
    // table made at the first use, berth's DNS told the policy: these may fork); the rest
    // (the link, its addresses and table entries) is returned, to run on another thread
    // while the caller does work that touches neither `a` nor this network -- the helper
    // builds the sandbox's root meanwhile -- and to be done before anything of the sandbox
    // runs. Nothing to do (no address): returns an empty function's equivalent, a no-op.
    virtual std::function<void()> begin_attach(Attachment& a, int netns_fd,
                                               const std::string& prepared = {}) = 0;
    // A running sandbox's new policy, in force for new connections when this returns;
    // `none` also cuts the established ones. A sandbox without a link gets one first
    // (inside `netns_fd`). On failure the old policy stays in force.
    virtual void set_policy(Attachment& a, const Policy& policy, int netns_fd) = 0;
    // Undoes reserve and attach: rules and address go (the veth goes with its namespace,
    // and is deleted here too if it outlived it). Never throws: logs what it could not do.
    virtual void release(const Attachment& a) noexcept = 0;
    // A running sandbox of an earlier helper: its address is taken, its rules put back.
    virtual void adopt(Attachment& a) = 0;
    // Deletes the links on berth's bridge that belong to no sandbox of `live` (left by a
    // helper killed mid-create). Returns how many.
    virtual int sweep(const std::set<std::string>& live) = 0;
    // What its /etc/hosts and /etc/resolv.conf say.
    virtual NameSettings names(const Attachment& a, const std::string& hostname) const = 0;
    // For doctor: the bridge, subnet, table and DNS.
    virtual std::string describe() = 0;
};

// The sandboxes' DNS server on the gateway (berth-helper's DNS child, net/dns_service.h):
// told each sandbox's policy, which decides what it answers (public: everything, forwarded;
// allowlist: only the allowed names, whose addresses it opens as it hands them out; none:
// refused) before the sandbox may run or its new policy is reported in force.
class SandboxDns {
  public:
    virtual ~SandboxDns() = default;
    virtual void set_policy(const std::string& sandbox_ip, const Policy& policy) = 0;
    virtual void forget(const std::string& sandbox_ip) noexcept = 0;
};

struct RootNetworkConfig {
    std::string bridge;  // its name; the nftables tables are `inet <bridge>`, `bridge <bridge>`
    std::string subnet;  // IPv4 CIDR, e.g. 10.89.0.0/16; the gateway is .1
    // The servers berth's DNS asks (loopback stubs such as 127.0.0.53 included: it runs on
    // the host); without a DNS (start_dns unset), what public sandboxes ask themselves.
    std::vector<std::string> nameservers;
    // Starts berth's DNS for the table (made by then) and the gateway's address; called at
    // the first sandbox with a network. Unset: sandboxes ask `nameservers` directly, and
    // allowlists may only name addresses.
    std::function<std::unique_ptr<SandboxDns>(const TableConfig& table, const std::string& gateway)>
        start_dns;
};

// Validates the config (the subnet must not overlap a route of the host's: throws
// Error(invalid_argument) naming it). The bridge and table are made at the first attach.
std::unique_ptr<HostNetwork> make_root_network(const RootNetworkConfig& config);

// The IPv4 nameservers of a resolv.conf's text; with `reachable_only`, only those a sandbox
// can reach through NAT (not loopback stubs such as 127.0.0.53: those would be the
// sandbox's own loopback).
std::vector<std::string> resolv_conf_nameservers(const std::string& resolv_conf_text,
                                                 bool reachable_only);

}  // namespace berth::net
