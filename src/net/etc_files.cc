#include "net/etc_files.h"

namespace berth::net {

std::string hosts_file(const NameSettings& s) {
    std::string out =
        "127.0.0.1\tlocalhost\n"
        "::1\tlocalhost ip6-localhost ip6-loopback\n"
        "fe00::0\tip6-localnet\n"
        "ff00::0\tip6-mcastprefix\n"
        "ff02::1\tip6-allnodes\n"
        "ff02::2\tip6-allrouters\n";
    out += (s.address.empty() ? std::string("127.0.1.1") : s.address) + "\t" + s.hostname + "\n";
    if (!s.host_address.empty()) out += s.host_address + "\t" + kHostAlias + "\n";
    return out;
}

std::string hostname_file(const NameSettings& s) {
    return s.hostname + "\n";
}

std::string resolv_conf(const NameSettings& s) {
    if (s.nameservers.empty()) {
        // glibc asks 127.0.0.1 when no server is named: nothing listens there unless the
        // sandbox starts a server of its own, so a lookup is refused at once.
        return "# berth: this sandbox has no network, so no DNS server.\n";
    }
    std::string out = "# berth: DNS through berth's resolver.\n";
    for (const std::string& server : s.nameservers) out += "nameserver " + server + "\n";
    out += "options ndots:0\n";
    return out;
}

}  // namespace berth::net
