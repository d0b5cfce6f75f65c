// A directory an import reads from but does not trust: an OCI image layout a client named
// (passed to the root image service as an fd), or an archive unpacked into a scratch
// directory. Entries are opened one component at a time beneath it (openat2 with
// RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV), only
// regular files and directories, never blocking on a fifo; and, for a client's directory,
// only what that client could read itself: a root process must not become the way to read
// files their owner kept from the client.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/unique_fd.h"

namespace berth::images {

// The user on whose behalf a directory is read.
struct Caller {
    uid_t uid = 0;
    gid_t gid = 0;
    std::vector<gid_t> groups;  // supplementary
};

class SourceDir {
  public:
    // `dir`: an open directory (not O_PATH). `label`: how messages name it. `caller`: when
    // set, every directory on the way must be searchable and every file readable by them
    // (by the permission bits; ACLs are not consulted).
    SourceDir(UniqueFd dir, std::string label, std::optional<Caller> caller = {});

    // A regular file at `rel` ("a/b", no "." or ".." components), open read-only.
    // SysError naming label/rel: ENOENT, ELOOP (a symlink), EXDEV (a mount), EACCES (the
    // caller may not read it), EINVAL (not a regular file, or a bad path).
    UniqueFd open_file(const std::string& rel) const;
    // Its whole content, when it has at most `max_bytes` (else EFBIG).
    std::string read_file(const std::string& rel, uint64_t max_bytes = 16u << 20) const;
    bool has(const std::string& rel) const;
    std::string where(const std::string& rel) const { return label_ + "/" + rel; }
    const std::string& label() const { return label_; }

  private:
    // Opens one component `name` beneath `at` with `flags`; checks it against the caller.
    UniqueFd open_component(int at, const std::string& name, bool directory,
                            const std::string& rel) const;

    UniqueFd dir_;
    dev_t dev_ = 0;
    std::string label_;
    std::optional<Caller> caller_;
};

}  // namespace berth::images
