// Image references as docker and podman users write them ("debian:bookworm",
// "ghcr.io/org/app@sha256:…", "localhost:5000/x/y:1.0"), parsed to the distribution
// grammar and normalized: docker.io is the default registry, its one-word names live
// under "library/", and a reference with neither tag nor digest means ":latest".
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "rootfs-tools/digest.h"

namespace berth::images {

struct Reference {
    std::string registry;    // "docker.io", "localhost:5000", "[::1]:5000"
    std::string repository;  // "library/debian", "org/app"
    std::optional<std::string> tag;
    std::optional<Digest> digest;

    // The full form: "docker.io/library/debian:bookworm", with "@sha256:…" when pinned.
    std::string str() const;
    // The short form people type: "debian:bookworm", "org/app@sha256:…".
    std::string familiar() const;
    // registry/repository without tag or digest.
    std::string name() const { return registry + "/" + repository; }
    bool operator==(const Reference&) const = default;
};

inline constexpr std::string_view kDefaultRegistry = "docker.io";

// Throws std::invalid_argument saying which part of `text` is wrong.
Reference parse_reference(std::string_view text);

}  // namespace berth::images
