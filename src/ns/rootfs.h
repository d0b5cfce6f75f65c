// The sandbox's filesystem view: an overlay over a read-only, id-mapped lower layer,
// pivoted into, with a fresh /proc, a minimal /dev, a read-only /sys and Docker's masked
// and read-only /proc paths.
#pragma once

#include <string>
#include <vector>

#include "base/unique_fd.h"
#include "ns/idmap.h"

namespace berth::ns {

// --- Host side (privileged: the helper, root in the initial user namespace) ---

// A user namespace that holds `mapping` and nothing else, kept by fd. Id-mapped mounts
// take their mapping from a user namespace; all sandboxes of one service user share the
// mapping, so one template namespace serves every mount.
UniqueFd make_userns_fd(const IdMapping& mapping);

// A detached copy of the tree at `dir` whose file owners appear shifted by the mapping
// of `userns_fd`: host root's files look owned by root inside the sandbox, without
// chowning the rootfs.
// `dir_fd` is the directory, opened (O_PATH is enough) by the caller once it has checked
// what it is; `dir` names it in errors.
UniqueFd make_idmapped_tree(int dir_fd, const std::string& dir, int userns_fd);

// A detached overlay mount: lower = the (detached) tree `lower_fd`, upper/work = dirs.
// `staging_dir` is an empty directory where the lower tree is attached while the overlay
// is made (then detached again).
UniqueFd make_overlay(int lower_fd, const std::string& upper, const std::string& work,
                      const std::string& staging_dir);

// A detached overlay over several plain directories (an image's unpacked layers), `lowers`
// top first. Their owners are already those of the sandbox's id range, so no id mapping is
// needed. Mounted with `userxattr`: opaque dirs are marked user.overlay.opaque (the image
// store's format 2). `staging_dir` is used only on kernels before 6.8 (see the .cc).
UniqueFd make_layered_overlay(const std::vector<std::string>& lowers, const std::string& upper,
                              const std::string& work, const std::string& staging_dir);

// --- Sandbox side (root of the sandbox's user namespace, in its new mount namespace) ---

// A file the sandbox gets in place of the image's own, as Docker's /etc/hosts, /etc/hostname
// and /etc/resolv.conf: bind-mounted over `path` (absolute, inside the sandbox), so the
// image's file is untouched and the sandbox's root may still edit its copy.
struct ProvidedFile {
    std::string path;
    std::string content;
};

// Attaches `overlay_fd` at `mountpoint` (a directory this mount namespace can reach as the
// sandbox's root), builds /proc, /dev and /sys in it, pivots into it and detaches the old
// root; then puts `files` in place. Throws SysError naming the step and path, and
// berth::Error (InvalidArgument) when the image holds something other than a regular file
// where a provided file goes.
void enter_rootfs(int overlay_fd, const std::string& mountpoint,
                  const std::vector<ProvidedFile>& files = {});

}  // namespace berth::ns
