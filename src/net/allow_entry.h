// One entry of a sandbox's allowlist (`berth create --network allowlist --allow ENTRY`), as
// a user or a task file writes it: a hostname, a wildcard hostname or an IPv4 address or
// CIDR, each with an optional port or port range:
//
//   api.example.com   *.example.com:443   93.184.216.34   10.0.0.0/8:5432   1.2.3.4:8000-8100
//
// The text comes from task files written by strangers, so it is parsed strictly here, once,
// and only the parsed form goes further (into nftables rules and the DNS resolver's
// patterns). IPv6 entries are refused with a message saying why: sandboxes are given no
// IPv6 route, so such an entry could never be reached.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace berth::net {

struct AllowEntry {
    enum class Kind { hostname, wildcard, cidr };
    Kind kind = Kind::hostname;
    // hostname: the name, lowercased, without a trailing dot; wildcard: the suffix it stands
    // under ("example.com" for "*.example.com", which matches any name strictly below it);
    // cidr: the network, canonical ("10.0.0.0/8", or a bare address for a /32).
    std::string value;
    uint16_t port_from = 0;  // 0-65535: every port
    uint16_t port_to = 65535;

    // Back as a user writes it (canonical): what inspect shows and state files keep.
    std::string text() const;
    // A name matches: exact for a hostname, strictly below for a wildcard (cidr: never).
    bool matches(std::string_view lowercase_name) const;
};

// The most entries one sandbox may have: each is a set element (two, one per protocol) that
// the kernel checks, and a task naming thousands is a mistake or an attack.
inline constexpr size_t kMaxAllowEntries = 1024;

// Throws berth::Error (invalid_argument) naming the entry and what is wrong with it.
AllowEntry parse_allow_entry(std::string_view text);
// Every entry, deduplicated in order; refuses more than kMaxAllowEntries.
std::vector<AllowEntry> parse_allow_entries(const std::vector<std::string>& texts);

}  // namespace berth::net
