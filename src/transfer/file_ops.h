// Small operations on paths inside a Root: stat, mkdir -p, remove. None follows a symlink in
// the last component unless asked; all errors are SysError naming the path as given.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "transfer/root.h"

namespace berth::transfer {

struct Ownership {
    // Who new entries belong to; nullopt = leave as created (the caller's fsuid/fsgid).
    std::optional<uid_t> uid;
    std::optional<gid_t> gid;
};

struct EntryStat {
    enum class Type { missing, regular, directory, symlink, other };
    Type type = Type::missing;
    mode_t mode = 0;  // permission bits incl. setuid/setgid/sticky
    uint64_t size = 0;
    uid_t uid = 0;
    gid_t gid = 0;
    int64_t mtime_ns = 0;     // since the epoch
    std::string link_target;  // for symlinks
};

// Stats `path` inside the root; Type::missing (not an error) when it does not exist. A
// symlink in the last component is reported as such unless `follow` (then its target, still
// inside the root). Other errors (ENOTDIR in the middle, EACCES, ELOOP...) throw.
EntryStat stat_path(const Root& root, std::string_view path, bool follow = false);

// mkdir -p: creates `path` and missing parents with `mode` (exactly, umask ignored), owned
// per `owner`. Existing directories are left as they are; an existing non-directory in the
// way is ENOTDIR naming it. Returns true if it created the last component.
bool make_dirs(const Root& root, std::string_view path, mode_t mode, const Ownership& owner);

// Removes `path`: a file, a symlink (the link, never its target) or, when `recursive`, a
// directory and everything in it (without following any symlink, not crossing into other
// mounts: EXDEV naming the mount point). A missing path is ENOENT. "/" is refused (EBUSY).
void remove_path(const Root& root, std::string_view path, bool recursive);

}  // namespace berth::transfer
