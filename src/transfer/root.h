// Paths inside a directory tree that must not be escaped: a sandbox's root, or the host
// directory a download lands in. Every lookup is relative to the root's fd and treats the
// root as "/": absolute symlinks, ".." and absolute paths all stay inside it. The kernel's
// openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS) does it where it exists (Linux 5.6+); a
// component-by-component O_PATH walk with a symlink budget does the same elsewhere.
// No path is ever built by joining strings and opened from "/".
#pragma once

#include <fcntl.h>
#include <sys/types.h>

#include <string>
#include <string_view>

#include "base/unique_fd.h"

namespace berth::transfer {

enum class Resolver {
    automatic,  // openat2 when the kernel has it, else walk
    openat2,
    walk,
};

// Whether this kernel (and seccomp filter) lets openat2 through.
bool openat2_available();

// Rejects what no path may be: empty, containing NUL, longer than PATH_MAX - 1, or with a
// component longer than NAME_MAX. Throws SysError("path", path, EINVAL/ENAMETOOLONG).
void check_path(std::string_view path);

class Root {
  public:
    // `dir` is an open directory (O_PATH is enough); the root owns it.
    explicit Root(UniqueFd dir, Resolver resolver = Resolver::automatic);
    // Opens the directory at `path` (host view) as the root.
    static Root open(const std::string& path, Resolver resolver = Resolver::automatic);

    // Opens `path` inside the root: open(2) flags and mode as usual. Intermediate symlinks
    // are followed inside the root (budget 40, then ELOOP); the last component is followed
    // unless `flags` has O_NOFOLLOW (with O_PATH|O_NOFOLLOW a symlink itself is opened).
    // Magic links (/proc/self/root, /proc/N/cwd, /proc/N/fd/M) are never followed: ELOOP/
    // EXDEV. Relative paths are relative to the root. Throws SysError(open, path, errno).
    UniqueFd open_at(std::string_view path, int flags, mode_t mode = 0) const;

    // The directory that holds the last component of `path`, opened O_PATH|O_DIRECTORY,
    // and that component's name. "/" and "" have no parent: EINVAL. A trailing slash is
    // dropped; a last component of "." or ".." is refused (EINVAL).
    struct Parent {
        UniqueFd dir;
        std::string name;
    };
    Parent open_parent(std::string_view path) const;

    int fd() const { return dir_.get(); }
    Resolver resolver() const { return resolver_; }

  private:
    UniqueFd dir_;
    Resolver resolver_;
};

}  // namespace berth::transfer
