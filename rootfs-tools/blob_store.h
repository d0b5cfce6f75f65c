// The content-addressed blob store: ROOT/blobs/sha256/<hex>. A blob gets its name only
// once all of its bytes have been written, hashed to that name and made durable, so any
// file the store holds can be trusted without reading it again; an interrupted or wrong
// download leaves nothing (its data lives in an unnamed file until then).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/error.h"
#include "base/unique_fd.h"
#include "rootfs-tools/digest.h"

namespace berth::images {

// The bytes were not the ones asked for: wrong digest, or too many / too few of them.
class BlobMismatch : public Error {
  public:
    explicit BlobMismatch(const std::string& what) : Error(Kind::invalid_argument, what) {}
};

class BlobWriter;

class BlobStore {
  public:
    // Opens the store under `root`, making its directories (0755) when missing, and
    // clears what interrupted writes left in its ingest directory.
    explicit BlobStore(std::string root);

    const std::string& root() const { return root_; }
    // A fresh private directory for work on its way in (an archive being unpacked): the
    // caller removes it; a crash leaves it to the sweep of the next open.
    std::string make_scratch_dir(std::string_view purpose) const;
    std::string path(const Digest& d) const;
    bool has(const Digest& d) const;
    // Read-only fd of a present blob; SysError (ENOENT) naming the digest otherwise.
    UniqueFd open(const Digest& d) const;
    std::optional<uint64_t> size(const Digest& d) const;

    // A writer for a blob that must hash to `expected` (and have `expected_size` bytes,
    // when known). See BlobWriter.
    BlobWriter writer(const Digest& expected, std::optional<uint64_t> expected_size = {});
    // A writer for bytes made here, named by whatever they hash to.
    BlobWriter writer_for_new();
    // Reads `fd` to its end into a verified blob (a no-op read when it is present).
    void put(const Digest& expected, int fd, std::optional<uint64_t> expected_size = {});
    // Stores bytes made here (a manifest, a config) under their own digest.
    Digest put_bytes(std::string_view bytes);

    // Removes a blob (absent: nothing to do). Whoever calls it knows nothing uses it.
    void remove(const Digest& d);
    std::vector<Digest> list() const;

  private:
    friend class BlobWriter;
    std::string root_, blobs_, ingest_;
    UniqueFd blobs_dir_;
};

// Bytes on their way into the store. Not copyable; destroying it uncommitted discards
// what was written.
class BlobWriter {
  public:
    BlobWriter(BlobWriter&&) noexcept = default;
    BlobWriter& operator=(BlobWriter&&) noexcept = default;
    ~BlobWriter();

    // Appends; BlobMismatch once more bytes than the expected size arrive.
    void write(const void* data, size_t len);
    uint64_t written() const { return written_; }
    const std::optional<Digest>& expected() const { return expected_; }
    // Checks the size and the digest, syncs the data and names it; returns the digest.
    // BlobMismatch (and nothing stored) when they differ. Another writer having stored
    // the same blob first is fine: the content is the same by definition.
    Digest commit();

  private:
    friend class BlobStore;
    BlobWriter(const BlobStore& store, std::optional<Digest> expected,
               std::optional<uint64_t> size);

    const BlobStore* store_;
    std::optional<Digest> expected_;  // none: bytes made here, named by their hash
    std::optional<uint64_t> expected_size_;
    UniqueFd fd_;
    std::string named_temp_;  // set only where O_TMPFILE is not supported
    Sha256 hash_;
    uint64_t written_ = 0;
    bool done_ = false;
};

}  // namespace berth::images
