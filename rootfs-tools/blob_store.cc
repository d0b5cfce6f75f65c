#include "rootfs-tools/blob_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <random>

#include "base/error.h"
#include "base/files.h"

namespace berth::images {

namespace {

void make_dir(const std::string& path) {
    if (::mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) throw_sys("mkdir", path);
}

// "ingest-<purpose>-<16 hex>": what the sweep on open removes.
std::string ingest_name(std::string_view purpose) {
    std::random_device rd;
    static constexpr char kHex[] = "0123456789abcdef";
    std::string s = "ingest-" + std::string(purpose) + "-";
    for (int i = 0; i < 16; ++i) s += kHex[rd() & 15];
    return s;
}

}  // namespace

BlobStore::BlobStore(std::string root)
    : root_(std::move(root)), blobs_(root_ + "/blobs/sha256"), ingest_(root_ + "/ingest") {
    make_dir(root_);
    make_dir(root_ + "/blobs");
    make_dir(blobs_);
    make_dir(ingest_);
    blobs_dir_.reset(check_sys("open", blobs_, [&] {
        return ::open(blobs_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    }));
    // Named temporaries (filesystems without O_TMPFILE) and scratch directories of work
    // that never finished: nothing in there is trusted, so nothing survives a restart.
    std::vector<std::string> leftovers;
    if (DIR* d = ::opendir(ingest_.c_str())) {
        while (dirent* e = ::readdir(d)) {
            if (std::string_view(e->d_name).substr(0, 7) == "ingest-")
                leftovers.push_back(ingest_ + "/" + e->d_name);
        }
        ::closedir(d);
    }
    for (const auto& path : leftovers) remove_tree(path);
}

std::string BlobStore::make_scratch_dir(std::string_view purpose) const {
    const std::string path = ingest_ + "/" + ingest_name(purpose);
    if (::mkdir(path.c_str(), 0700) != 0) throw_sys("mkdir", path);
    return path;
}

std::string BlobStore::path(const Digest& d) const {
    return blobs_ + "/" + std::string(d.hex());
}

bool BlobStore::has(const Digest& d) const {
    struct stat st;
    return ::fstatat(blobs_dir_.get(), std::string(d.hex()).c_str(), &st, AT_SYMLINK_NOFOLLOW) ==
               0 &&
           S_ISREG(st.st_mode);
}

UniqueFd BlobStore::open(const Digest& d) const {
    int fd =
        ::openat(blobs_dir_.get(), std::string(d.hex()).c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) throw_sys("open blob", d.str());
    return UniqueFd(fd);
}

std::optional<uint64_t> BlobStore::size(const Digest& d) const {
    struct stat st;
    if (::fstatat(blobs_dir_.get(), std::string(d.hex()).c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0)
        return std::nullopt;
    return static_cast<uint64_t>(st.st_size);
}

BlobWriter BlobStore::writer(const Digest& expected, std::optional<uint64_t> expected_size) {
    return BlobWriter(*this, expected, expected_size);
}

BlobWriter BlobStore::writer_for_new() {
    return BlobWriter(*this, std::nullopt, std::nullopt);
}

void BlobStore::put(const Digest& expected, int fd, std::optional<uint64_t> expected_size) {
    if (has(expected)) return;
    BlobWriter w = writer(expected, expected_size);
    std::vector<char> buf(1 << 20);
    for (;;) {
        ssize_t n = ::read(fd, buf.data(), buf.size());
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) throw_sys("read", "blob " + expected.str());
        if (n == 0) break;
        w.write(buf.data(), static_cast<size_t>(n));
    }
    w.commit();
}

Digest BlobStore::put_bytes(std::string_view bytes) {
    Digest d = sha256_of(bytes);
    if (!has(d)) {
        BlobWriter w = writer(d, bytes.size());
        w.write(bytes.data(), bytes.size());
        w.commit();
    }
    return d;
}

void BlobStore::remove(const Digest& d) {
    if (::unlinkat(blobs_dir_.get(), std::string(d.hex()).c_str(), 0) != 0 && errno != ENOENT)
        throw_sys("unlink blob", d.str());
}

std::vector<Digest> BlobStore::list() const {
    std::vector<Digest> out;
    DIR* dir = ::opendir(blobs_.c_str());
    if (!dir) throw_sys("opendir", blobs_);
    while (dirent* e = ::readdir(dir)) {
        try {
            out.push_back(Digest::from_hex(e->d_name));
        } catch (const std::invalid_argument&) {
            // ".", ".." and anything that is not ours
        }
    }
    ::closedir(dir);
    return out;
}

BlobWriter::BlobWriter(const BlobStore& store, std::optional<Digest> expected,
                       std::optional<uint64_t> size)
    : store_(&store), expected_(std::move(expected)), expected_size_(size) {
    // Unnamed until committed: a crash cannot leave a half blob under any name.
    int fd = ::openat(store.blobs_dir_.get(), ".", O_TMPFILE | O_WRONLY | O_CLOEXEC, 0644);
    if (fd < 0 && (errno == EOPNOTSUPP || errno == EISDIR || errno == EINVAL)) {
        named_temp_ = store.ingest_ + "/" + ingest_name("blob");
        fd = ::open(named_temp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (fd < 0) throw_sys("create", named_temp_);
    } else if (fd < 0) {
        throw_sys("open O_TMPFILE", store.blobs_);
    }
    fd_.reset(fd);
}

BlobWriter::~BlobWriter() {
    if (!done_ && !named_temp_.empty()) ::unlink(named_temp_.c_str());
}

namespace {
std::string label(const std::optional<Digest>& d) {
    return d ? "blob " + d->str() : "new blob";
}
}  // namespace

void BlobWriter::write(const void* data, size_t len) {
    if (done_) throw std::logic_error("BlobWriter::write after commit");
    if (expected_size_ && written_ + len > *expected_size_) {
        throw BlobMismatch(label(expected_) + ": more than the " + std::to_string(*expected_size_) +
                           " bytes expected");
    }
    hash_.update(data, len);
    write_all(fd_.get(), {static_cast<const char*>(data), len}, label(expected_));
    written_ += len;
}

Digest BlobWriter::commit() {
    if (done_) throw std::logic_error("BlobWriter::commit twice");
    done_ = true;  // whatever happens below, this writer is finished
    auto discard = [&] {
        if (!named_temp_.empty()) ::unlink(named_temp_.c_str());
    };
    if (expected_size_ && written_ != *expected_size_) {
        discard();
        throw BlobMismatch(label(expected_) + ": " + std::to_string(written_) +
                           " bytes, expected " + std::to_string(*expected_size_));
    }
    const Digest got = hash_.finish();
    if (expected_ && got != *expected_) {
        discard();
        throw BlobMismatch(label(expected_) + ": its " + std::to_string(written_) +
                           " bytes hash to " + got.str());
    }
    try {
        check_sys("fsync", "blob " + got.str(), [&] { return ::fsync(fd_.get()); });
    } catch (...) {
        discard();
        throw;
    }
    const std::string name(got.hex());
    int rc;
    if (named_temp_.empty()) {
        // linkat(fd, "", AT_EMPTY_PATH) would need CAP_DAC_READ_SEARCH; /proc does not.
        const std::string proc = "/proc/self/fd/" + std::to_string(fd_.get());
        rc = ::linkat(AT_FDCWD, proc.c_str(), store_->blobs_dir_.get(), name.c_str(),
                      AT_SYMLINK_FOLLOW);
    } else {
        rc = ::renameat(AT_FDCWD, named_temp_.c_str(), store_->blobs_dir_.get(), name.c_str());
    }
    if (rc != 0 && errno != EEXIST) {
        const int err = errno;
        discard();
        throw_sys("link blob into place", got.str(), err);
    }
    discard();  // (the named temporary of a writer that lost the race)
    ::fsync(store_->blobs_dir_.get());
    return got;
}

}  // namespace berth::images
