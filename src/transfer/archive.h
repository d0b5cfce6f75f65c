// Trees as a tar stream (POSIX pax): what moves between a client and a sandbox. The writer
// walks a tree by fds, never following a symlink; the reader recreates it under a directory
// of a Root. File data moves with splice/copy_file_range where the fds allow, not through a
// userspace buffer; a stream is never held in memory whole.
//
// What the writer emits: a pax 'x' header before every entry (mtime to the nanosecond,
// long path/linkpath, big uid/gid/size), then a ustar header, then data padded to 512.
// Regular files, directories, symlinks, hardlinks (type '1', to the first name of that
// inode in this stream); sparse files as GNU sparse 1.0 (GNU.sparse.major=1/minor=0/name/
// realsize, a map in the data) when they have holes. Devices, fifos and sockets are
// skipped with a warning. The stream ends with two zero blocks.
//
// What the reader accepts: ustar and pax ('x', 'g' ignored except as noted), GNU long
// names ('L', 'K'), base-256 numbers, types '0' '\0' '7' '1' '2' '5'; '3' '4' '6' are
// skipped with a warning; anything else is an error. Headers with a bad checksum, names
// that are absolute or contain "..", hardlinks to anything but a regular file written
// earlier in the same stream: errors naming the entry.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/cancel.h"
#include "base/error.h"
#include "transfer/file_ops.h"
#include "transfer/root.h"

namespace berth::transfer {

struct Summary {
    uint64_t entries = 0;  // entries written or extracted (skipped ones not counted)
    uint64_t bytes = 0;    // file data bytes (logical sizes)
    std::vector<std::string> warnings;
};

// While a transfer runs, `cancel` (when set) is watched whenever the stream would block and
// between the chunks of a copy in the kernel: cancelled means stop (SysError with ECANCELED).
struct WriteOptions {
    // The top entry's name in the stream (e.g. the destination's basename). Empty = the
    // basename of the source path.
    std::string name;
    // A directory source: write a "." entry for the directory itself, then its contents
    // named relative to it, instead of one entry named `name` with its subtree.
    bool contents_only = false;
    const CancelToken* cancel = nullptr;
    // Large files outside the stream. When the top entry is a regular file without holes,
    // its header says so (type 'B', pax BERTH.side_file=1, BERTH.side_size=N, size 0) and
    // its data does not follow in the stream: with `side_data_out` >= 0 the writer copies it
    // there in the kernel first (a download into an O_TMPFILE the client made); with
    // `side_data_passed` the caller hands the same file to the reader (an upload). The
    // header is written after the data, so a reader that sees it can use the file.
    int side_data_out = -1;
    bool side_data_passed = false;
};

// Writes the entry at `path` inside `root` (not following a symlink at `path` itself) to
// `out` (a pipe, socket or file). Throws SysError naming the path on failure.
Summary write_archive(const Root& root, std::string_view path, int out,
                      const WriteOptions& options);

struct ExtractOptions {
    // Ownership of what is created. from_archive = the uid/gid recorded in each entry.
    enum class Owners { fixed, from_archive } owners = Owners::fixed;
    // An image layer (rootfs-tools), recreated in overlayfs's on-disk form: an entry
    // ".wh.NAME" becomes a 0/0 character device NAME (a whiteout), ".wh..wh..opq" sets
    // `opaque_xattr` to "y" on its directory; pax SCHILY.xattr.* records are applied
    // (user.* but overlay's; security.capability rewritten in the namespaced form with
    // rootid `cap_rootid`, dropped without one; all others skipped with a warning);
    // fifos and 0/0 character devices are made, no other device ever (skipped with a
    // warning); owners (with Owners::from_archive) are shifted by
    // `uid_shift` and `gid_shift` (the sandboxes' uid and gid ranges on the host need not
    // start at the same id); and the layer is refused (SysError EFBIG naming the limit)
    // as soon as its file data would pass `max_bytes` or its entries `max_entries`.
    struct Layer {
        bool enabled = false;
        uint32_t uid_shift = 0;
        uint32_t gid_shift = 0;
        std::string opaque_xattr = "trusted.overlay.opaque";
        std::optional<uint32_t> cap_rootid;
        uint64_t max_bytes = UINT64_MAX;
        uint64_t max_entries = UINT64_MAX;
        std::string limit_name = "the layer";  // how LimitExceeded names what was bounded
    } layer;
    Ownership owner;  // for Owners::fixed; nullopt fields = leave as the process creates
    // Created parent directories of `dest` (mkdir -p) get this mode and `owner`.
    mode_t parent_mode = 0755;
    const CancelToken* cancel = nullptr;
    // Entries whose data is outside the stream (BERTH.side_file=k, see WriteOptions): the
    // data is copied from side_data[k-1] (an upload: the client's file, read-only)...
    std::vector<int> side_data;
    // ...or, for k = 1 when `prefilled` >= 0, it is already in `prefilled`, an O_TMPFILE
    // made by the caller on the destination's filesystem, which becomes the entry's file
    // (a download). A side entry with neither is an error.
    int prefilled = -1;
};

// An image layer over ExtractOptions::Layer's max_bytes or max_entries (nothing of it is
// left: the extraction rolled back).
class LimitExceeded : public Error {
  public:
    LimitExceeded(const std::string& message, bool entries, uint64_t limit)
        : Error(Kind::resource_exhausted, message), entries(entries), limit(limit) {}
    bool entries;    // the entry count (else the bytes of file data)
    uint64_t limit;  // the one passed
};

// Reads a tar stream from `in` (a pipe, socket or file) and recreates its entries under
// the directory `dest` inside `root` (created with parents). A "." entry applies its mode,
// mtime (and owner) to `dest` itself. Regular files are written to a temporary in the
// target directory and renamed over the final name once complete, with mode, owner and
// mtime set; directory modes and mtimes are set after their contents. Existing files and
// symlinks are replaced; an existing directory is merged into; a directory where a file
// is (or the reverse) is an error naming the path. Symlinks are created as they are and
// never followed while extracting (a later entry under a symlinked directory is ELOOP).
// On any error, everything this call created is removed (files it replaced stay replaced:
// each replacement is atomic) and SysError names the entry and the failing call.
Summary extract_archive(int in, const Root& root, std::string_view dest,
                        const ExtractOptions& options);

// Makes a pipe's buffer 1 MiB (F_SETPIPE_SZ; failure ignored, e.g. over pipe-max-size).
// Whoever creates the pipe a stream goes through should call it on one end.
void enlarge_pipe(int fd);

}  // namespace berth::transfer
