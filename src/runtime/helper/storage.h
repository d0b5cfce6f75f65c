// Runs as root, in berth-helper. The bound on a sandbox's writable layer (--storage): the
// kernel enforces it, so a sandbox that fills its layer gets ENOSPC (or EDQUOT) and the
// state filesystem keeps room for every other sandbox, upload and image import.
//
// Two ways, chosen once per helper from the state filesystem:
// - project quota, where that filesystem enforces one (ext4 mounted with prjquota, xfs with
//   pquota): the upper and work dirs get a project id of their own with the inherit flag,
//   and the project a block and inode hard limit. Costs two ioctls and two quotactls.
// - otherwise a tmpfs of the limit's size (nr_inodes bounded too), made detached, holding
//   both the upper and the work dir. Costs one mount (~0.1 ms); its pages are memory,
//   charged to the memory cgroup of whoever writes them (the sandbox), and freed when the
//   sandbox's mount namespace goes away (nothing of it is on the state filesystem).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "base/unique_fd.h"

namespace berth::helper {

enum class StorageBackend { project_quota, tmpfs };

// The inode bound that goes with a byte bound: one inode per 16 KiB (ext4's default
// ratio), at least 4096. A layer of small files runs out of one or the other, never holds
// an unbounded number of inodes (kernel memory a byte bound does not see).
uint64_t storage_inode_limit(uint64_t bytes);

class Storage {
  public:
    // `dir`: where the sandboxes' writable layers live (STATE/sandboxes).
    explicit Storage(std::string dir);

    StorageBackend backend() const { return backend_; }

    // Throws HelperError(INVALID_ARGUMENT), naming `storage`, for a bound the backend can
    // never give: more than the state filesystem holds (project quota) or more than the
    // host's memory and swap (tmpfs).
    void check(uint64_t bytes) const;

    // project_quota: gives `dirs` (the upper and work dirs, new and empty) a project id no
    // other directory under quota has, inherited by all made below them, limited to `bytes`
    // and storage_inode_limit(bytes). Returns the id.
    uint32_t limit_project(const std::vector<std::string>& dirs, uint64_t bytes);
    // Removes the limit of a project (at delete; what it holds is removed later).
    void release_project(uint32_t project_id);

    // tmpfs: a detached tmpfs of `bytes` (nodev, nosuid, mode 0755, owned by root).
    UniqueFd make_tmpfs(uint64_t bytes) const;

  private:
    std::string dir_;
    UniqueFd dir_fd_;
    StorageBackend backend_ = StorageBackend::tmpfs;
};

struct StorageCount {
    uint64_t used_bytes = 0;
    uint64_t total_bytes = 0;
};
// statfs of the filesystem `fd` is on, in bytes. For a sandbox's overlay root that is its
// upper dir's count: the tmpfs's, or, under a project quota, the project's.
StorageCount storage_count(int fd, const std::string& what);

}  // namespace berth::helper
