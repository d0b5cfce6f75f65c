// The image layer path: the same reader in layer mode, as rootfs-tools/layer.cc runs it
// (owners from the archive shifted into the sandboxes' range, whiteouts, opaque
// directories, SCHILY.xattr records, device nodes), minus the decompressor and the
// diff_id check in front of it (those see bytes, not structure).
#include <cstddef>
#include <cstdint>

#include "extract_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    berth::transfer::ExtractOptions options;
    options.owners = berth::transfer::ExtractOptions::Owners::from_archive;
    options.layer.enabled = true;
    options.layer.uid_shift = 200000;
    options.layer.gid_shift = 300000;
    options.layer.opaque_xattr = "trusted.overlay.opaque";
    berth::fuzz::extract(data, size, options);
    return 0;
}
