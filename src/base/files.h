// Small, exact file helpers: whole-file reads and writes with errors that name the path.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace berth {

std::string read_file(const std::string& path);
// The file's contents, or nullopt when it does not exist (any other failure throws).
std::optional<std::string> read_file_if_exists(const std::string& path);
// Writes `data` with one write(2) to an existing file (cgroup and /proc files want this).
void write_file(const std::string& path, std::string_view data);
// write(2) until all of `data` is written (EINTR retried); SysError naming `what`.
void write_all(int fd, std::string_view data, std::string_view what);
// Writes to `path` atomically: a temporary beside it, fsync-free rename over the target.
void write_file_atomic(const std::string& path, std::string_view data, unsigned mode = 0644);
// mkdir -p; existing directories are fine.
void make_dirs(const std::string& path, unsigned mode = 0755);
// Where an open fd's file is, as the kernel names it (readlink of /proc/self/fd/N).
std::string fd_path(int fd);
// rm -rf without following symlinks; a missing path is not an error.
void remove_tree(const std::string& path);

}  // namespace berth
