// docker's config.json as berth reads it for registry credentials (a user's file, read by
// the CLI; the operator's, read by the daemon), and the base64 under its "auth" fields.
// Refusals are ConfigError. base64 is checked both ways: what decodes re-encodes to the
// same text (padding aside), and what is encoded decodes back.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "rootfs-tools/base64.h"
#include "rootfs-tools/registry_config.h"

namespace images = berth::images;

namespace {

void check(bool ok) {
    if (!ok) std::abort();
}

std::string_view unpadded(std::string_view s) {
    while (!s.empty() && s.back() == '=') s.remove_suffix(1);
    return s;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string_view text(reinterpret_cast<const char*>(data), size);
    try {
        const auto conf = images::AuthConfig::parse(text, "config.json");
        for (const char* host : {"docker.io", "registry-1.docker.io", "localhost:5000",
                                 "quay.io", "127.0.0.1:5000"})
            conf.find(host);
    } catch (const images::ConfigError&) {
    }
    for (auto alphabet : {images::Base64Alphabet::standard, images::Base64Alphabet::url}) {
        if (auto decoded = images::base64_decode(text, alphabet))
            check(unpadded(images::base64_encode(*decoded, alphabet)) == unpadded(text));
        auto back = images::base64_decode(images::base64_encode(text, alphabet), alphabet);
        check(back && *back == text);
    }
    return 0;
}
