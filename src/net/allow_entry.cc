#include "net/allow_entry.h"

#include <arpa/inet.h>

#include <algorithm>
#include <set>

#include "base/error.h"

namespace berth::net {
namespace {

[[noreturn]] void bad(std::string_view entry, const std::string& why) {
    // The entry is shown bounded and with anything unprintable replaced: it may be anything.
    std::string shown;
    for (char c : entry.substr(0, 80)) shown += (c >= 0x20 && c < 0x7f) ? c : '?';
    if (entry.size() > 80) shown += "...";
    throw Error(Error::Kind::invalid_argument, "allowlist entry '" + shown + "': " + why);
}

bool is_digits(std::string_view s) {
    return !s.empty() &&
           std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

uint16_t parse_port(std::string_view entry, std::string_view s) {
    if (!is_digits(s) || s.size() > 5) bad(entry, "the port must be a number from 1 to 65535");
    const unsigned long v = std::stoul(std::string(s));
    if (v < 1 || v > 65535) bad(entry, "the port must be a number from 1 to 65535");
    return static_cast<uint16_t>(v);
}

// A DNS name as resolvers accept it for a host: labels of letters, digits and inner hyphens
// (underscores too, which real zones use for service names), 63 bytes each, 253 in all.
bool valid_hostname(std::string_view name) {
    if (name.empty() || name.size() > 253) return false;
    size_t start = 0;
    while (start <= name.size()) {
        size_t dot = name.find('.', start);
        if (dot == std::string_view::npos) dot = name.size();
        const std::string_view label = name.substr(start, dot - start);
        if (label.empty() || label.size() > 63 || label.front() == '-' || label.back() == '-')
            return false;
        for (char c : label)
            if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_'))
                return false;
        start = dot + 1;
    }
    return true;
}

std::string ipv4_text(uint32_t host_order) {
    in_addr a{htonl(host_order)};
    char buf[INET_ADDRSTRLEN];
    ::inet_ntop(AF_INET, &a, buf, sizeof buf);
    return buf;
}

}  // namespace

std::string AllowEntry::text() const {
    std::string s = kind == Kind::wildcard ? "*." + value : value;
    if (port_from == 0 && port_to == 65535) return s;
    s += ":" + std::to_string(port_from);
    if (port_to != port_from) s += "-" + std::to_string(port_to);
    return s;
}

bool AllowEntry::matches(std::string_view name) const {
    switch (kind) {
        case Kind::hostname:
            return name == value;
        case Kind::wildcard:
            return name.size() > value.size() + 1 && name.ends_with(value) &&
                   name[name.size() - value.size() - 1] == '.';
        case Kind::cidr:
            return false;
    }
    return false;
}

AllowEntry parse_allow_entry(std::string_view entry) {
    if (entry.empty()) bad(entry, "empty");
    if (entry.size() > 300) bad(entry, "longer than any hostname and port");
    if (entry.front() == '[' || std::count(entry.begin(), entry.end(), ':') > 1)
        bad(entry,
            "IPv6 is not offered to sandboxes (they have no IPv6 route): give IPv4 "
            "addresses, networks or hostnames");
    AllowEntry out;
    std::string_view host = entry;
    if (const size_t colon = entry.find(':'); colon != std::string_view::npos) {
        host = entry.substr(0, colon);
        const std::string_view ports = entry.substr(colon + 1);
        const size_t dash = ports.find('-');
        out.port_from = parse_port(entry, ports.substr(0, dash));
        out.port_to = dash == std::string_view::npos ? out.port_from
                                                     : parse_port(entry, ports.substr(dash + 1));
        if (out.port_to < out.port_from) bad(entry, "the port range is reversed");
    }
    if (host.empty()) bad(entry, "no host or network before the port");

    // An IPv4 address or network: digits, dots and one slash, nothing else.
    if (host.find_first_not_of("0123456789./") == std::string_view::npos) {
        const size_t slash = host.find('/');
        const std::string addr_text(host.substr(0, slash));
        in_addr a{};
        if (::inet_pton(AF_INET, addr_text.c_str(), &a) != 1)
            bad(entry, "not an IPv4 address (four numbers 0-255, no leading zeros)");
        int len = 32;
        if (slash != std::string_view::npos) {
            const std::string_view digits = host.substr(slash + 1);
            if (!is_digits(digits) || digits.size() > 2 || std::stoi(std::string(digits)) > 32)
                bad(entry, "the prefix length must be 0 to 32");
            len = std::stoi(std::string(digits));
        }
        const uint32_t ip = ntohl(a.s_addr);
        const uint32_t mask = len == 0 ? 0 : ~uint32_t{0} << (32 - len);
        // As nft_table does: a network with host bits is refused, not guessed at.
        if ((ip & ~mask) != 0)
            bad(entry, "host bits are set (the network is " + ipv4_text(ip & mask) + "/" +
                           std::to_string(len) + ")");
        if (len == 0) bad(entry, "0.0.0.0/0 is everything: use --network public");
        out.kind = AllowEntry::Kind::cidr;
        out.value = len == 32 ? ipv4_text(ip) : ipv4_text(ip) + "/" + std::to_string(len);
        return out;
    }

    std::string name;
    for (char c : host) name += (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
    if (name.size() > 1 && name.back() == '.') name.pop_back();  // a fully qualified name
    if (name.starts_with("*.")) {
        out.kind = AllowEntry::Kind::wildcard;
        name.erase(0, 2);
        // "*.com" would open a whole top-level domain: a wildcard needs two labels below it.
        if (name.find('.') == std::string::npos)
            bad(entry,
                "a wildcard must stand under a domain of two labels or more "
                "(*.example.com, not *.com)");
    } else if (name.find('*') != std::string::npos) {
        bad(entry, "a wildcard is only allowed as the whole first label (*.example.com)");
    }
    if (!valid_hostname(name))
        bad(entry,
            "not a hostname (letters, digits, '-' and '_' in dot-separated labels of "
            "63 bytes at most)");
    out.value = std::move(name);
    return out;
}

std::vector<AllowEntry> parse_allow_entries(const std::vector<std::string>& texts) {
    if (texts.size() > kMaxAllowEntries)
        throw Error(Error::Kind::invalid_argument,
                    "the allowlist has " + std::to_string(texts.size()) + " entries; at most " +
                        std::to_string(kMaxAllowEntries) + " are allowed");
    std::vector<AllowEntry> out;
    std::set<std::string> seen;
    for (const auto& text : texts) {
        AllowEntry e = parse_allow_entry(text);
        if (seen.insert(e.text()).second) out.push_back(std::move(e));
    }
    return out;
}

}  // namespace berth::net
