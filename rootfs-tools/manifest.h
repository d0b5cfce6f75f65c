// The JSON documents of an image: an index (OCI index or Docker manifest list) that points
// at one manifest per platform, a manifest (OCI or Docker schema 2) that points at a
// config and layers, and the config with the run settings. Parsed strictly: every digest
// checked for form, sizes required, unknown layer types and schema 1 refused by name.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "base/error.h"
#include "rootfs-tools/digest.h"

namespace berth::images {

namespace media {
inline constexpr std::string_view kOciIndex = "application/vnd.oci.image.index.v1+json";
inline constexpr std::string_view kOciManifest = "application/vnd.oci.image.manifest.v1+json";
inline constexpr std::string_view kOciConfig = "application/vnd.oci.image.config.v1+json";
inline constexpr std::string_view kDockerList =
    "application/vnd.docker.distribution.manifest.list.v2+json";
inline constexpr std::string_view kDockerManifest =
    "application/vnd.docker.distribution.manifest.v2+json";
inline constexpr std::string_view kDockerConfig = "application/vnd.docker.container.image.v1+json";
}  // namespace media

// A document that is not what an image may contain; what() says which field and why.
class ManifestError : public Error {
  public:
    explicit ManifestError(const std::string& what) : Error(Kind::invalid_argument, what) {}
};

struct Platform {
    std::string os, architecture, variant;
    std::string str() const;  // "linux/arm64/v8"
};

// The machine this runs on, in OCI's words (linux/amd64, linux/arm64/v8, ...).
Platform host_platform();

struct Descriptor {
    std::string media_type;
    Digest digest;
    uint64_t size = 0;
    std::optional<Platform> platform;
};

enum class Compression { none, gzip, zstd };

struct Layer {
    Descriptor blob;
    Compression compression = Compression::none;
};

struct Manifest {
    std::string media_type;
    Descriptor config;
    std::vector<Layer> layers;
};

struct Index {
    std::string media_type;
    std::vector<Descriptor> manifests;
};

// Parses a manifest or an index. `content_type` is the registry's Content-Type header,
// when there is one (a document may omit its own mediaType).
std::variant<Manifest, Index> parse_manifest_or_index(std::string_view json,
                                                      std::string_view content_type = {});

// The manifest in `index` for `want` (default: this host): os and architecture must
// match, and the variant when both say one (arm64's is v8 when unsaid). ManifestError
// lists the platforms the image has when none fits.
const Descriptor& select_manifest(const Index& index, const Platform& want = host_platform());

struct ImageConfig {
    Platform platform;
    std::vector<std::string> env, entrypoint, cmd;
    std::string working_dir, user;
    std::vector<Digest> diff_ids;  // one per layer: the digests of the uncompressed tars
    std::string created;
};

ImageConfig parse_config(std::string_view json);

}  // namespace berth::images
