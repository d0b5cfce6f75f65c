// A layer blob unpacked once into a directory in overlayfs's on-disk form, ready to be a
// lower layer: decompressed on one thread, extracted on this one (transfer's strict
// extractor in layer mode: whiteouts, opaque dirs, xattrs, devices, owners shifted into
// the sandboxes' id range), checked against the config's diff_id, and only then renamed
// to its final name. A failure leaves no directory under that name.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "rootfs-tools/digest.h"
#include "rootfs-tools/manifest.h"

namespace berth::images {

struct UnpackOptions {
    uint32_t uid_shift = 0;         // the sandboxes' root uid outside (200000 here)
    uint32_t gid_shift = 0;         // and root gid (its own range: /etc/subgid)
    bool rootless = false;          // opaque dirs marked with user.overlay.opaque, no devices
    std::optional<Digest> diff_id;  // the uncompressed tar must hash to this
};

struct UnpackResult {
    Digest diff_id = Digest::from_hex(std::string(64, '0'));
    uint64_t entries = 0, bytes = 0;
    std::vector<std::string> warnings;
};

// Unpacks the layer read from `blob_fd` into `dest` (which must not exist; its parent
// must). Throws DecompressError, ManifestError (diff_id mismatch) or SysError naming the
// entry.
UnpackResult unpack_layer(int blob_fd, Compression compression, const std::string& dest,
                          const UnpackOptions& options);

}  // namespace berth::images
