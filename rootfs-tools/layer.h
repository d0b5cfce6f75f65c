// A layer blob unpacked once into a directory in overlayfs's on-disk form, ready to be a
// lower layer: decompressed on one thread, extracted on this one (transfer's strict
// extractor in layer mode: whiteouts, opaque dirs, xattrs, devices, owners shifted into
// the sandboxes' id range), checked against the config's diff_id, and only then renamed
// to its final name. A failure leaves no directory under that name.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/error.h"
#include "rootfs-tools/digest.h"
#include "rootfs-tools/manifest.h"

namespace berth::images {

struct UnpackOptions {
    uint32_t uid_shift = 0;         // the sandboxes' root uid outside (200000 here)
    uint32_t gid_shift = 0;         // and root gid (its own range: /etc/subgid)
    bool rootless = false;          // opaque dirs marked with user.overlay.opaque, no devices
    std::optional<Digest> diff_id;  // the uncompressed tar must hash to this
    // Bounds checked while extracting (a refusal comes before the disk fills): bytes of
    // file data (sparse files at their apparent size) and entries. Exceeding one throws
    // LayerTooLarge; `limit_hint` ends its message (which setting raises the bound).
    uint64_t max_bytes = UINT64_MAX;
    uint64_t max_entries = UINT64_MAX;
    std::string limit_hint;
};

struct UnpackResult {
    Digest diff_id = Digest::from_hex(std::string(64, '0'));
    uint64_t entries = 0, bytes = 0;
    std::vector<std::string> warnings;
};

// A layer past UnpackOptions' bounds; what() names the layer, the limit and the entry.
class LayerTooLarge : public Error {
  public:
    explicit LayerTooLarge(const std::string& what) : Error(Kind::resource_exhausted, what) {}
};

// Unpacks the layer read from `blob_fd` into `dest` (which must not exist; its parent
// must). Throws DecompressError, ManifestError (diff_id mismatch), LayerTooLarge or
// SysError naming the entry. Devices other than whiteouts are never made; file
// capabilities are namespaced to the sandboxes' root (see transfer/file_caps.h). The
// unpacked size is recorded on `dest` (unpacked_size reads it back).
UnpackResult unpack_layer(int blob_fd, Compression compression, const std::string& dest,
                          const UnpackOptions& options);

// What unpack_layer recorded of the layer at `dir`: bytes of file data and entries as it
// counted them. nullopt for a layer unpacked before berth recorded it.
struct UnpackedSize {
    uint64_t bytes = 0, entries = 0;
};
std::optional<UnpackedSize> unpacked_size(const std::string& dir);

}  // namespace berth::images
