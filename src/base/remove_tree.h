// Removing a tree that a sandbox made: any depth (a 50,000-level chain) with a bounded
// number of fds (directories past the top 64 levels are found again through "..", checked
// by device and inode), never following a link, and messages that stay short at any depth
// (the top, how deep, the entry). remove_tree (files.h) and transfer's `rm -r` use it.
#pragma once

#include <string>

namespace berth {

// Removes everything below the directory open at `dirfd` (the directory itself stays).
// `same_mount`: a directory that is another mount's root is refused (EXDEV) rather than
// entered. `where` names the top in messages. Throws SysError.
void remove_contents(int dirfd, const std::string& where, bool same_mount);

}  // namespace berth
