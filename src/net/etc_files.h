// What a sandbox's /etc/hosts, /etc/hostname and /etc/resolv.conf say, in every network mode
// (Docker's three files). Pure: the helper mounts them over the image's (ns::ProvidedFile).
#pragma once

#include <string>
#include <vector>

namespace berth::net {

struct NameSettings {
    std::string hostname;
    // The sandbox's own address, where its name resolves; empty: it has none but loopback,
    // and its name resolves to 127.0.1.1 (Debian's convention for a host without one).
    std::string address;
    // host.berth.internal (the host's loopback ports the sandbox was given); empty: none.
    std::string host_address;
    // The DNS servers it may ask; empty: none, and a lookup fails at once (no server
    // listens on the sandbox's own loopback) instead of retrying for seconds.
    std::vector<std::string> nameservers;
};

inline constexpr const char* kHostAlias = "host.berth.internal";

std::string hosts_file(const NameSettings& s);
std::string hostname_file(const NameSettings& s);
std::string resolv_conf(const NameSettings& s);

}  // namespace berth::net
