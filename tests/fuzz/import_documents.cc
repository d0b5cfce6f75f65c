// The JSON an import brings besides manifests and configs (rootfs-tools/document_parser.h):
// an OCI layout's oci-layout and index.json (with the names in its annotations) and a
// docker-archive's manifest.json, each parsed from the same bytes. ManifestError is how they
// refuse; anything else that escapes is a bug libFuzzer reports as a crash.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "rootfs-tools/document_parser.h"

namespace images = berth::images;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string text(reinterpret_cast<const char*>(data), size);
    try {
        images::parse_oci_layout(text, "oci-layout");
    } catch (const images::ManifestError&) {
    }
    try {
        const images::LayoutIndex x = images::parse_layout_index(text, "index.json");
        if (x.names.size() != x.index.manifests.size()) std::abort();
    } catch (const images::ManifestError&) {
    }
    try {
        const auto entries = images::parse_docker_manifest(text, "manifest.json");
        if (entries.empty()) std::abort();
    } catch (const images::ManifestError&) {
    }
    return 0;
}
