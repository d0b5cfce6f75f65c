// One layer unpack, timed, for bench/run-unpack: prints {"ms": ..., "entries": ...}.
// Usage: unpack_bench BLOB gzip|zstd|none DEST [ID_SHIFT]
#include <fcntl.h>

#include <chrono>
#include <cstdio>
#include <string>

#include "base/unique_fd.h"
#include "rootfs-tools/layer.h"

using namespace berth;

int main(int argc, char** argv) {
    if (argc < 4) {
        std::fprintf(stderr, "usage: unpack_bench BLOB gzip|zstd|none DEST [ID_SHIFT]\n");
        return 2;
    }
    const std::string c = argv[2];
    const images::Compression compression = c == "gzip"   ? images::Compression::gzip
                                            : c == "zstd" ? images::Compression::zstd
                                                          : images::Compression::none;
    images::UnpackOptions options;
    if (argc > 4)
        options.uid_shift = options.gid_shift = static_cast<uint32_t>(std::stoul(argv[4]));
    try {
        const auto t0 = std::chrono::steady_clock::now();
        UniqueFd blob(::open(argv[1], O_RDONLY | O_CLOEXEC));
        if (!blob) {
            std::perror(argv[1]);
            return 1;
        }
        images::UnpackResult r = images::unpack_layer(blob.get(), compression, argv[3], options);
        const double ms =
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                .count();
        std::printf("{\"ms\": %.3f, \"entries\": %llu, \"bytes\": %llu, \"warnings\": %zu}\n", ms,
                    static_cast<unsigned long long>(r.entries),
                    static_cast<unsigned long long>(r.bytes), r.warnings.size());
    } catch (const std::exception& e) {
        std::fprintf(stderr, "unpack_bench: %s\n", e.what());
        return 1;
    }
    return 0;
}
