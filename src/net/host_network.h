// A sandbox's network, host side, behind one interface: the root implementation (a bridge
// of berth's, a veth per sandbox, berth's own nftables table) now; a rootless one (pasta)
// can stand behind the same calls. The helper reserves before it clones (the sandbox's
// /etc files name its address), attaches once the sandbox's network namespace exists and
// before anything of the sandbox runs, and releases on delete.
#pragma once

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "net/etc_files.h"

namespace berth::net {

enum class Mode { none, public_egress };

const char* mode_name(Mode mode);

struct Attachment {
    std::string sandbox_id;
    Mode mode = Mode::none;
    std::string address;  // IPv4 on berth's bridge; empty for none
};

class HostNetwork {
  public:
    virtual ~HostNetwork() = default;
    // What a new sandbox gets (an address, for public): nothing is made yet.
    virtual Attachment reserve(const std::string& sandbox_id, Mode mode) = 0;
    // Makes it: for public, a veth whose sandbox end (eth0, with the address and a default
    // route) is created inside `netns_fd`, and the rules that let it out.
    virtual void attach(const Attachment& a, int netns_fd) = 0;
    // Undoes reserve and attach: rules and address go (the veth goes with its namespace,
    // and is deleted here too if it outlived it). Never throws: logs what it could not do.
    virtual void release(const Attachment& a) noexcept = 0;
    // A running sandbox of an earlier helper: its address is taken, its rules put back.
    virtual void adopt(const Attachment& a) = 0;
    // Deletes the links on berth's bridge that belong to no sandbox of `live` (left by a
    // helper killed mid-create). Returns how many.
    virtual int sweep(const std::set<std::string>& live) = 0;
    // What its /etc/hosts and /etc/resolv.conf say.
    virtual NameSettings names(const Attachment& a, const std::string& hostname) const = 0;
    // For doctor: the bridge, subnet, table and DNS.
    virtual std::string describe() = 0;
};

struct RootNetworkConfig {
    std::string bridge;                    // its name; the nftables table is `inet <bridge>`
    std::string subnet;                    // IPv4 CIDR, e.g. 10.89.0.0/16; the gateway is .1
    std::vector<std::string> nameservers;  // what public sandboxes' resolv.conf names
};

// Validates the config (the subnet must not overlap a route of the host's: throws
// Error(invalid_argument) naming it). The bridge and table are made at the first attach.
std::unique_ptr<HostNetwork> make_root_network(const RootNetworkConfig& config);

// The IPv4 nameservers of a resolv.conf's text that a sandbox can reach through NAT (not
// loopback stubs such as 127.0.0.53: those would be the sandbox's own loopback).
std::vector<std::string> reachable_nameservers(const std::string& resolv_conf_text);

}  // namespace berth::net
