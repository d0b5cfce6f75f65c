// A registry's WWW-Authenticate header (any registry a pull is pointed at, or a proxy in
// front of it, writes it). Refusals are std::invalid_argument; the challenges parsed must
// be well formed (a non-empty lowercase scheme, lowercase parameter names).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string_view>

#include "rootfs-tools/auth_challenge.h"

namespace {

void check(bool ok) {
    if (!ok) std::abort();
}

bool lowercase(std::string_view s) {
    for (char c : s)
        if (c >= 'A' && c <= 'Z') return false;
    return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string_view text(reinterpret_cast<const char*>(data), size);
    try {
        const auto challenges = berth::images::parse_www_authenticate(text);
        check(!challenges.empty());
        for (const auto& c : challenges) {
            check(!c.scheme.empty() && lowercase(c.scheme));
            for (const auto& [name, value] : c.params) check(!name.empty() && lowercase(name));
            c.param("realm");
        }
    } catch (const std::invalid_argument&) {
    }
    return 0;
}
