#include "rootfs-tools/layer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cinttypes>
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

namespace {
// The unpacked size of a layer, on its directory. trusted.* as root: a sandbox (whose /
// this directory is) can neither read nor set it, and a layer's own trusted.* xattrs are
// never applied. Rootless, trusted.* is out of reach: user.*, written after the layer's.
constexpr const char* kSizeXattrTrusted = "trusted.berth.unpacked";
constexpr const char* kSizeXattrUser = "user.berth.unpacked";
}  // namespace

std::optional<UnpackedSize> unpacked_size(const std::string& dir) {
    for (const char* name : {kSizeXattrTrusted, kSizeXattrUser}) {
        char buf[64];
        const ssize_t n = ::lgetxattr(dir.c_str(), name, buf, sizeof buf - 1);
        if (n < 0) {
            if (errno == ENODATA || errno == EPERM || errno == ENOTSUP) continue;
            throw_sys(std::string("getxattr ") + name, dir);
        }
        buf[n] = '\0';
        UnpackedSize s;
        if (std::sscanf(buf, "%" SCNu64 " %" SCNu64, &s.bytes, &s.entries) == 2) return s;
    }
    return std::nullopt;
}

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
    x.layer.opaque_xattr = options.rootless ? "user.overlay.opaque" : "trusted.overlay.opaque";
    // File capabilities become v3 with rootid = the sandboxes' root (in our own user
    // namespace's view: rootless, the kernel maps it to the host uid as it stores it), so
    // only a process in a sandbox's user namespace can ever gain them. With no shift the
    // sandboxes' root would be the host's root: then they are dropped.
    if (options.rootless || options.uid_shift != 0) x.layer.cap_rootid = options.uid_shift;
    // Setuid and setgid bits stay as the image has them: the owners are shifted (a
    // setuid-root file is setuid to the sandboxes' root uid, never the host's root), the
    // store is 0700 root's so no host user can reach the file to run it, and inside a
    // sandbox every command runs with no_new_privs.
    x.layer.max_bytes = options.max_bytes;
    x.layer.max_entries = options.max_entries;
    x.layer.limit_name =
        "layer " + (options.diff_id ? options.diff_id->str() : final_path.filename().string());
    DecompressResult decompressed;
    transfer::Summary summary;
    try {
        pipe_through([&](int out) { decompressed = decompress(blob_fd, compression, out, dest); },
                     [&](int in) {
                         summary = transfer::extract_archive(
                             in, transfer::Root::open(parent.string()), temp_name, x);
                     },
                     dest);
    } catch (const transfer::LimitExceeded& e) {
        throw LayerTooLarge(std::string(e.what()) + ": refused, over the limit" +
                            (options.limit_hint.empty() ? "" : " (" + options.limit_hint + ")"));
    }
    if (options.diff_id && decompressed.uncompressed_digest != *options.diff_id) {
        throw ManifestError(dest + ": the layer's tar hashes to " +
                            decompressed.uncompressed_digest.str() + ", its config says " +
                            options.diff_id->str());
    }
    // The temporary directory itself got the tar's "." mode (or 0700): a lower layer's
    // root is the sandbox's /, readable by all.
    if (::chmod(temp.c_str(), 0755) != 0) throw_sys("chmod", temp);
    const std::string size_text =
        std::to_string(summary.bytes) + " " + std::to_string(summary.entries);
    const char* size_xattr = options.rootless ? kSizeXattrUser : kSizeXattrTrusted;
    if (::lsetxattr(temp.c_str(), size_xattr, size_text.data(), size_text.size(), 0) != 0)
        throw_sys(std::string("setxattr ") + size_xattr, temp);
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
