// A layer blob's bytes turned back into its tar stream: gzip (several members allowed, as
// pigz and some registries write them) or zstd (several frames allowed), read from one fd
// and written to another, hashing the uncompressed bytes as they pass (the image config's
// diff_id is that hash). Streaming: memory stays at a few buffers whatever the size.
#pragma once

#include <cstdint>

#include "base/error.h"
#include "rootfs-tools/digest.h"
#include "rootfs-tools/manifest.h"

namespace berth::images {

// Corrupt, truncated or trailing-garbage input; what() names the format and the offset.
// (Kind internal: what berth-images has always answered for a corrupt layer.)
class DecompressError : public Error {
  public:
    explicit DecompressError(const std::string& what) : Error(Kind::internal, what) {}
};

struct DecompressResult {
    uint64_t compressed_bytes = 0, uncompressed_bytes = 0;
    Digest uncompressed_digest = Digest::from_hex(std::string(64, '0'));
};

// Reads `in` to its end. Throws DecompressError for bad data and SysError for I/O (EPIPE
// included, when the reader of `out` stopped first). `what` names the blob in messages.
DecompressResult decompress(int in, Compression compression, int out, const std::string& what);

}  // namespace berth::images
