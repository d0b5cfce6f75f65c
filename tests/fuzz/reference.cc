// Image references as a user, an image's annotations or an imported archive's tags give
// them. A parsed reference must print to forms that parse back to itself (the store keys
// images by str(); the CLI shows familiar()), within the distribution grammar's limits.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string_view>

#include "rootfs-tools/digest.h"
#include "rootfs-tools/reference.h"

namespace images = berth::images;

namespace {

void check(bool ok) {
    if (!ok) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string_view text(reinterpret_cast<const char*>(data), size);
    try {
        const images::Reference r = images::parse_reference(text);
        check(!r.registry.empty() && !r.repository.empty() && (r.tag || r.digest));
        check(r.name().size() <= 255);
        check(images::parse_reference(r.str()) == r);
        check(images::parse_reference(r.familiar()) == r);
    } catch (const std::invalid_argument&) {
    }
    try {
        const images::Digest d = images::Digest::parse(text);
        check(d.str() == text && d.hex().size() == 64);
    } catch (const std::invalid_argument&) {
    }
    return 0;
}
