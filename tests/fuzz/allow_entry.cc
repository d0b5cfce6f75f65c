// Allowlist entries as task files write them (`--allow`, Harbor's allowed_hosts). What parses
// must be canonical (its text() parses back to the same entry) and within the limits the
// nftables rules and the DNS patterns built from it rely on.
#include "net/allow_entry.h"

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "base/error.h"

namespace net = berth::net;

namespace {

void check(bool ok) {
    if (!ok) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string_view text(reinterpret_cast<const char*>(data), size);
    try {
        const net::AllowEntry e = net::parse_allow_entry(text);
        check(!e.value.empty() && e.value.size() <= 253 && e.port_from <= e.port_to);
        for (char c : e.value)
            check((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '-' ||
                  c == '_' || c == '/');
        const net::AllowEntry again = net::parse_allow_entry(e.text());
        check(again.kind == e.kind && again.value == e.value && again.port_from == e.port_from &&
              again.port_to == e.port_to && again.text() == e.text());
        if (e.kind != net::AllowEntry::Kind::cidr)
            check(e.matches(e.value) == (e.kind == net::AllowEntry::Kind::hostname));
    } catch (const berth::Error& err) {
        check(err.kind() == berth::Error::Kind::invalid_argument);
    }
    return 0;
}
