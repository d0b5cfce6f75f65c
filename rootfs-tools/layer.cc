#include "rootfs-tools/layer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <random>

#include "base/error.h"
#include "base/unique_fd.h"
#include "rootfs-tools/decompress.h"
#include "rootfs-tools/pipe_through.h"
#include "transfer/archive.h"
#include "transfer/root.h"

namespace berth::images {

UnpackResult unpack_layer(int blob_fd, Compression compression, const std::string& dest,
                          const UnpackOptions& options) {
    namespace fs = std::filesystem;
    const fs::path final_path(dest);
    if (fs::exists(fs::symlink_status(final_path))) throw_sys("unpack layer", dest, EEXIST);
    const fs::path parent = final_path.parent_path();
    const std::string temp_name = "." + final_path.filename().string() + ".unpacking-" +
                                  std::to_string(std::random_device{}());
    const std::string temp = (parent / temp_name).string();
    if (::mkdir(temp.c_str(), 0700) != 0) throw_sys("mkdir", temp);
    struct Cleanup {
        std::string path;
        bool keep = false;
        ~Cleanup() {
            if (!keep) {
                std::error_code ec;
                fs::remove_all(path, ec);
            }
        }
    } cleanup{temp};

    transfer::ExtractOptions x;
    x.owners = transfer::ExtractOptions::Owners::from_archive;
    x.layer.enabled = true;
    x.layer.uid_shift = options.uid_shift;
    x.layer.gid_shift = options.gid_shift;
    x.layer.devices = !options.rootless;
    x.layer.opaque_xattr = options.rootless ? "user.overlay.opaque" : "trusted.overlay.opaque";
    DecompressResult decompressed;
    transfer::Summary summary;
    pipe_through([&](int out) { decompressed = decompress(blob_fd, compression, out, dest); },
                 [&](int in) {
                     summary = transfer::extract_archive(in, transfer::Root::open(parent.string()),
                                                         temp_name, x);
                 },
                 dest);
    if (options.diff_id && decompressed.uncompressed_digest != *options.diff_id) {
        throw ManifestError(dest + ": the layer's tar hashes to " +
                            decompressed.uncompressed_digest.str() + ", its config says " +
                            options.diff_id->str());
    }
    // The temporary directory itself got the tar's "." mode (or 0700): a lower layer's
    // root is the sandbox's /, readable by all.
    if (::chmod(temp.c_str(), 0755) != 0) throw_sys("chmod", temp);
    // Never over a directory another unpack of the same layer put there first (a plain
    // rename would replace an empty one under a sandbox that uses it): EEXIST tells the
    // caller, and the cleanup removes this copy.
    int rc = ::renameat2(AT_FDCWD, temp.c_str(), AT_FDCWD, dest.c_str(), RENAME_NOREPLACE);
    if (rc != 0 && errno == EINVAL)  // a filesystem without it: rename fails over a full dir
        rc = ::rename(temp.c_str(), dest.c_str());
    if (rc != 0) throw_sys("rename", dest);
    cleanup.keep = true;
    return {decompressed.uncompressed_digest, summary.entries, summary.bytes,
            std::move(summary.warnings)};
}

}  // namespace berth::images
