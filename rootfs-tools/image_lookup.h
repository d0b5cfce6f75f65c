// Finding an image in the store by what a user types: a reference ("debian:bookworm",
// "ghcr.io/org/app:1.0", "name@sha256:..."), a manifest digest ("sha256:<64 hex>") or a
// unique prefix of one (at least 4 hex digits, "sha256:" optional). A short name (no
// registry typed) is looked up as docker.io's, then under localhost/ (where local builds
// and bootstraps are recorded, as podman does), so a bootstrapped debian:bookworm is found
// offline and a pulled one, when there is one, wins.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "base/error.h"
#include "rootfs-tools/image_store.h"

namespace berth::images {

// Nothing in the store by that name or digest; what() says what was looked for.
class ImageNotFound : public Error {
  public:
    explicit ImageNotFound(const std::string& what) : Error(Kind::not_found, what) {}
};

// The names `text` may mean, in the order they are tried (reference form, full).
// Throws std::invalid_argument when `text` is no reference at all.
std::vector<Reference> candidate_names(std::string_view text);

// Throws ImageNotFound, or std::invalid_argument (not a reference; an ambiguous prefix).
Image lookup_image(const ImageStore& store, std::string_view text);

}  // namespace berth::images
