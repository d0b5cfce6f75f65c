// The upload path: a tar stream from a client (or a sandbox, for a download) extracted
// with fixed owners, as berthd's file transfer does. Every header kind, pax record, GNU
// long name and sparse map the reader knows is reachable from here, with the real
// filesystem calls under a scratch tmpfs.
#include <cstddef>
#include <cstdint>

#include "extract_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    berth::transfer::ExtractOptions options;  // Owners::fixed, no owner: the process's own
    berth::fuzz::extract(data, size, options);
    return 0;
}
