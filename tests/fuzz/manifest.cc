// An image's JSON documents as a registry or an imported archive hands them over: the
// input is parsed as a manifest or index (with no Content-Type, and with each one a
// registry may send), a platform is picked from an index, and the same bytes are parsed
// as an image config. ManifestError is how these refuse a document; anything else that
// escapes (a json type_error, out_of_range) is a bug libFuzzer reports as a crash.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>
#include <variant>

#include "rootfs-tools/manifest.h"

namespace images = berth::images;

namespace {

void check(bool ok) {
    if (!ok) std::abort();
}

void manifest_or_index(std::string_view text, std::string_view content_type) {
    try {
        auto doc = images::parse_manifest_or_index(text, content_type);
        if (auto* m = std::get_if<images::Manifest>(&doc)) {
            check(m->media_type == images::media::kOciManifest ||
                  m->media_type == images::media::kDockerManifest);
            for (const auto& l : m->layers) check(l.blob.digest.str().size() == 71);
        } else {
            auto& index = std::get<images::Index>(doc);
            check(index.media_type == images::media::kOciIndex ||
                  index.media_type == images::media::kDockerList);
            for (const images::Platform& p :
                 {images::host_platform(), images::Platform{"linux", "arm64", ""},
                  images::Platform{"linux", "arm", "v7"}}) {
                try {
                    const images::Descriptor& d = images::select_manifest(index, p);
                    check(d.platform && d.platform->os == p.os &&
                          d.platform->architecture == p.architecture);
                } catch (const images::ManifestError&) {
                }
            }
        }
    } catch (const images::ManifestError&) {
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string_view text(reinterpret_cast<const char*>(data), size);
    manifest_or_index(text, {});
    manifest_or_index(text, images::media::kOciIndex);
    manifest_or_index(text, images::media::kDockerManifest);
    try {
        const images::ImageConfig c = images::parse_config(text);
        for (const auto& d : c.diff_ids) check(d.str().rfind("sha256:", 0) == 0);
    } catch (const images::ManifestError&) {
    }
    return 0;
}
