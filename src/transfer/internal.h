// Helpers shared by the transfer library's files; not part of its interface.
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "base/unique_fd.h"
#include "transfer/file_ops.h"
#include "transfer/root.h"

namespace berth::transfer::internal {

// The non-empty components of `path` ("a//b/" -> {"a", "b"}).
std::vector<std::string_view> split_path(std::string_view path);

// Opens `rel` (relative, no ".." components) below the directory `dirfd` without following
// any symlink on the way or in the last component (ELOOP), nor leaving `dirfd`. Uses openat2
// (RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS) when `resolver` is openat2, else a walk. Errors
// are SysError("open", subject, errno). An empty `rel` opens `dirfd` itself.
UniqueFd open_beneath(int dirfd, std::string_view rel, int flags, Resolver resolver,
                      std::string_view subject);

// make_dirs that also records the paths (as given, joined) of the directories it created,
// in creation order.
bool make_dirs_tracked(const Root& root, std::string_view path, mode_t mode, const Ownership& owner,
                       std::vector<std::string>* created);

// fchown when `owner` says so; errors name `subject`.
void apply_owner(int fd, const Ownership& owner, std::string_view subject);

// Calls `f(name, d_type)` for each entry of the directory `dir_fd` but "." and "..", in
// readdir order; the fd's own offset is left alone (it reads through a duplicate).
void for_each_dir_entry(int dir_fd, std::string_view display,
                        const std::function<void(const char* name, unsigned char type)>& f);

// readlinkat, any length; errors are SysError("readlink", subject).
std::string read_link(int dirfd, const char* name, std::string_view subject);

// st_mtim in nanoseconds since the epoch.
int64_t mtime_ns(const struct stat& st);

// "a" + "b" = "a/b"; "." + "b" = "b"; "" + "b" = "b".
std::string join(std::string_view a, std::string_view b);

}  // namespace berth::transfer::internal
