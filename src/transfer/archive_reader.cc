// extract_archive: a tar stream recreated under a directory, strictly (the stream may come
// from an untrusted sandbox) and all-or-nothing (what this call created goes on any error).
#include <fcntl.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/vfs.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cstring>
#include <functional>
#include <optional>
#include <random>
#include <unordered_set>

#include "base/error.h"
#include "transfer/archive.h"
#include "transfer/file_caps.h"
#include "transfer/internal.h"
#include "transfer/stream.h"
#include "transfer/tar_format.h"

namespace berth::transfer {

namespace {

using internal::split_path;

constexpr uint64_t kSmallData = 64 << 10;  // read whole, together with the next header
constexpr uint64_t kMaxSparseMapText = 64 << 20;

[[noreturn]] void bad(std::string_view what, std::string_view subject, int err = EBADMSG) {
    throw_sys(what, subject, err);
}

timespec to_timespec(int64_t ns) {
    timespec ts;
    ts.tv_sec = static_cast<time_t>(ns / 1000000000);
    ts.tv_nsec = static_cast<long>(ns % 1000000000);
    if (ts.tv_nsec < 0) {
        ts.tv_nsec += 1000000000;
        ts.tv_sec -= 1;
    }
    return ts;
}

// Metadata that 'x' (pax) and 'L'/'K' (GNU) headers give the entry after them.
struct PendingMeta {
    std::optional<std::string> path, linkpath, longname, longlink, sparse_name, sparse_map;
    std::optional<uint64_t> size, realsize, sparse_major, side_file, side_size;
    std::optional<int64_t> uid, gid, mtime_ns;
    std::vector<uint64_t> sparse_pairs;  // GNU sparse 0.0: offset, numbytes, ...
    std::vector<std::pair<std::string, std::string>> xattrs;  // SCHILY.xattr.NAME = value
};

struct Entry {
    std::string name;   // as in the stream
    std::string rel;    // normalized, relative to dest; "" is dest itself
    std::string where;  // for messages: dest/rel
    bool trailing_slash = false;
    char type = '0';
    uint32_t mode = 0;
    int64_t uid = 0, gid = 0;
    uint64_t size = 0;  // bytes in the stream
    int64_t mtime_ns = 0;
    std::string linkname;
    enum class Sparse { none, v0, v1 } sparse = Sparse::none;
    uint64_t realsize = 0;
    std::vector<tar::SparseSegment> segments;  // v0: from the pax header
    uint64_t side_file = 0, side_size = 0;     // data outside the stream (BERTH.side_file)
    uint32_t devmajor = 0, devminor = 0;
    std::vector<std::pair<std::string, std::string>> xattrs;
};

struct Created {
    bool dir;
    std::string rel;
};

struct PendingDir {
    std::string rel;
    mode_t mode;
    std::optional<int64_t> mtime_ns;
    Ownership owner;
};

// A temporary file in the target directory: O_TMPFILE (no name) or a named one that is
// unlinked unless renamed.
struct Temp {
    int dirfd = -1;
    UniqueFd fd;
    std::string name;
    mode_t created_mode = static_cast<mode_t>(-1);  // as created (umask applied); -1: unknown
    Temp() = default;
    Temp(const Temp&) = delete;
    Temp& operator=(const Temp&) = delete;
    ~Temp() {
        if (!name.empty()) ::unlinkat(dirfd, name.c_str(), 0);
    }
};

class Extractor {
  public:
    Extractor(int in, const Root& root, std::string_view dest, const ExtractOptions& options)
        : root_(root),
          options_(options),
          in_(in, options.cancel),
          dest_display_(dest),
          rng_(std::random_device{}()) {}

    Summary run();

  private:
    void setup();
    void loop();
    void drain_trailer();
    void finish_dirs();
    void rollback() noexcept;

    bool next_block(char* block);
    void read_and_peek(char* dst, uint64_t n, std::string_view subject);
    void consume(uint64_t n, std::string_view subject);
    std::string read_meta(const tar::Header& h);
    void apply_pax(std::string_view data, std::string_view subject);
    void entry(const tar::Header& h);

    void normalize(Entry& e);
    int dir_fd(const std::string& rel, const std::string& where);
    int create_parents(const std::string& rel, const std::string& where);
    std::pair<int, std::string> parent_of(const Entry& e);
    Ownership owner_for(const Entry& e) const;
    bool layer_entry(Entry& e);
    void extract_node(Entry& e);
    void apply_xattrs(int fd, const Entry& e);
    std::string temp_name();
    void make_temp(Temp& t, int dirfd, const std::string& where, mode_t mode = 0600);
    // Whether a file we create in the directory `parent_rel` (below dest; "" = dest) is
    // owned by `owner` already: it is who we are, and the directory does not hand down
    // its group (setgid).
    bool owned_already(const Ownership& owner, int dirfd, const std::string& parent_rel);
    // Moves the finished temp to `base`; records it as created when nothing was there.
    void commit_temp(Temp& t, int dirfd, const std::string& base, const Entry& e);
    void replace_via_temp(int dirfd, const std::string& base, const Entry& e,
                          const std::function<int(const char*)>& make);

    void extract_dir(Entry& e);
    void extract_file(Entry& e);
    void side_data(const Entry& e, Temp& t, int dirfd);
    void extract_symlink(Entry& e);
    void extract_hardlink(Entry& e);
    void read_sparse_map(Entry& e, uint64_t* map_bytes);
    // Counts an entry's file data against the layer's bound before any of it is written.
    void charge_bytes(uint64_t n, const Entry& e);

    const Root& root_;
    const ExtractOptions& options_;
    internal::InputStream in_;
    std::string dest_display_;
    UniqueFd dest_;
    std::vector<std::string> created_parents_;  // dest and its parents, made by this call
    std::vector<Created> created_;
    std::vector<PendingDir> dirs_;
    std::unordered_set<std::string> files_;  // regular files extracted (hardlink targets)
    PendingMeta meta_;
    char peek_[tar::kBlock];
    bool have_peek_ = false;
    std::string cache_rel_;
    UniqueFd cache_fd_;
    bool tmpfile_ok_ = true;
    bool prefilled_used_ = false;
    mode_t umask_ = 022;
    std::optional<std::string> setgid_rel_;  // the directory setgid_ was read for
    bool setgid_ = false;
    std::mt19937_64 rng_;
    Summary summary_;
    uint64_t seen_entries_ = 0, charged_bytes_ = 0;  // against the layer's bounds
};

Summary Extractor::run() {
    try {
        setup();
        loop();
        drain_trailer();
        finish_dirs();
    } catch (...) {
        rollback();
        throw;
    }
    return std::move(summary_);
}

void Extractor::setup() {
    internal::make_dirs_tracked(root_, dest_display_, options_.parent_mode, options_.owner,
                                &created_parents_);
    dest_ = root_.open_at(dest_display_, O_PATH | O_DIRECTORY);
    umask_ = ::umask(0);
    ::umask(umask_);
    // O_TMPFILE files are linked in through /proc/self/fd; without a procfs there, use
    // named temporaries.
    struct statfs fs;
    if (::statfs("/proc/self/fd", &fs) != 0 || fs.f_type != PROC_SUPER_MAGIC) tmpfile_ok_ = false;
}

bool Extractor::next_block(char* block) {
    if (have_peek_) {
        std::memcpy(block, peek_, tar::kBlock);
        have_peek_ = false;
        return true;
    }
    size_t n = in_.read_upto(block, tar::kBlock);
    if (n == 0) return false;
    if (n < tar::kBlock) internal::throw_truncated(dest_display_);
    return true;
}

// Reads `n` bytes and, in the same read, the next header block when it is there.
void Extractor::read_and_peek(char* dst, uint64_t n, std::string_view subject) {
    size_t got = in_.read_upto(dst, n + tar::kBlock);
    if (got < n) internal::throw_truncated(subject);
    if (got == n) return;
    if (got < n + tar::kBlock) internal::throw_truncated(subject);
    std::memcpy(peek_, dst + n, tar::kBlock);
    have_peek_ = true;
}

// Consumes `n` data bytes and their padding.
void Extractor::consume(uint64_t n, std::string_view subject) {
    uint64_t total = tar::padded(n);
    if (total + tar::kBlock <= internal::InputStream::kCapacity) {
        read_and_peek(in_.scratch(), total, subject);
        return;
    }
    in_.skip(n, subject);
    read_and_peek(in_.scratch(), tar::padding(n), subject);
}

std::string Extractor::read_meta(const tar::Header& h) {
    if (static_cast<uint64_t>(h.size) > tar::kMaxMetaSize)
        bad("tar header (extended header over 1 MiB)", h.name);
    std::string data(tar::padded(static_cast<uint64_t>(h.size)) + tar::kBlock, '\0');
    read_and_peek(data.data(), tar::padded(static_cast<uint64_t>(h.size)), h.name);
    data.resize(static_cast<size_t>(h.size));
    return data;
}

void Extractor::apply_pax(std::string_view data, std::string_view subject) {
    std::vector<tar::PaxRecord> recs;
    if (!tar::parse_pax(data, &recs)) bad("pax header", subject);
    for (auto& r : recs) {
        std::string_view k = r.key, v = r.value;
        auto number = [&](std::optional<uint64_t>& out) {
            uint64_t n;
            if (!tar::parse_decimal(v, &n)) bad("pax header (bad " + std::string(k) + ")", subject);
            out = n;
        };
        auto id = [&](std::optional<int64_t>& out) {
            std::optional<uint64_t> n;
            number(n);
            if (*n > UINT32_MAX - 1) bad("pax header (bad " + std::string(k) + ")", subject);
            out = static_cast<int64_t>(*n);
        };
        if (k.substr(0, 13) == "SCHILY.xattr.") {
            if (meta_.xattrs.size() >= 128) bad("pax header (too many xattrs)", subject);
            meta_.xattrs.emplace_back(std::string(k.substr(13)), std::string(v));
            continue;
        }
        if (v.empty()) continue;  // an empty value unsets; we have nothing global to unset to
        if (k == "path") {
            meta_.path = std::string(v);
        } else if (k == "linkpath") {
            meta_.linkpath = std::string(v);
        } else if (k == "size") {
            number(meta_.size);
        } else if (k == "uid") {
            id(meta_.uid);
        } else if (k == "gid") {
            id(meta_.gid);
        } else if (k == "mtime") {
            int64_t ns;
            if (!tar::parse_pax_time(v, &ns)) bad("pax header (bad mtime)", subject);
            meta_.mtime_ns = ns;
        } else if (k == "BERTH.side_file") {
            number(meta_.side_file);
        } else if (k == "BERTH.side_size") {
            number(meta_.side_size);
        } else if (k == "GNU.sparse.major") {
            number(meta_.sparse_major);
        } else if (k == "GNU.sparse.name") {
            meta_.sparse_name = std::string(v);
        } else if (k == "GNU.sparse.realsize" || k == "GNU.sparse.size") {
            number(meta_.realsize);
        } else if (k == "GNU.sparse.map") {
            meta_.sparse_map = std::string(v);
        } else if (k == "GNU.sparse.offset" || k == "GNU.sparse.numbytes") {
            std::optional<uint64_t> n;
            number(n);
            if (meta_.sparse_pairs.size() >= 2 * tar::kMaxSparseSegments)
                bad("pax header (sparse map too long)", subject);
            meta_.sparse_pairs.push_back(*n);
        }
    }
}

// tar(1) pads its output to whole records (10 KiB by default) after the end marker; a
// producer piping into us would get EPIPE if we stopped reading there. Zero padding is read
// and dropped (up to a bound: a stream is not a place to hide megabytes); anything else
// after the end is an error.
void Extractor::drain_trailer() {
    constexpr uint64_t kMaxTrailer = 16u << 20;
    char block[tar::kBlock];
    for (uint64_t seen = 0; seen < kMaxTrailer; seen += tar::kBlock) {
        size_t n = in_.read_upto(block, tar::kBlock);
        if (n == 0) return;
        if (n < tar::kBlock) {
            if (std::all_of(block, block + n, [](char c) { return c == 0; })) return;
            bad("tar stream (data after the end-of-archive marker)", dest_display_);
        }
        if (!tar::is_zero_block(block))
            bad("tar stream (data after the end-of-archive marker)", dest_display_);
    }
}

void Extractor::loop() {
    char block[tar::kBlock];
    // Only whole entries have been read (no pax or long-name header waits for its entry).
    bool between_entries = false;
    for (;;) {
        if (!next_block(block)) {
            // An image layer may end after its last entry without the end-of-archive blocks
            // (umoci 0.4.7's `insert` writes such layers; Go's and GNU tar accept them). Its
            // bytes are checked against the diff_id, so nothing can be missing unnoticed.
            if (options_.layer.enabled && between_entries) return;
            internal::throw_truncated(dest_display_);
        }
        if (tar::is_zero_block(block)) {
            if (!next_block(block) || tar::is_zero_block(block)) return;
            bad("tar header (data after an end-of-archive block)", dest_display_);
        }
        tar::Header h;
        switch (tar::decode_header(block, &h)) {
            case tar::DecodeResult::ok:
                break;
            case tar::DecodeResult::bad_checksum:
                bad("tar header (bad checksum)", h.name.empty() ? dest_display_ : h.name);
            case tar::DecodeResult::bad_number:
                bad("tar header (bad number)", h.name.empty() ? dest_display_ : h.name);
        }
        switch (h.type) {
            case 'x':
                apply_pax(read_meta(h), h.name);
                break;
            case 'g':
                read_meta(h);  // global headers: nothing we use
                break;
            case 'L':
            case 'K': {
                std::string v = read_meta(h);
                v.resize(strnlen(v.data(), v.size()));
                (h.type == 'L' ? meta_.longname : meta_.longlink) = std::move(v);
                break;
            }
            default:
                entry(h);
                meta_ = PendingMeta{};
                between_entries = true;
                continue;
        }
        between_entries = false;
    }
}

void Extractor::normalize(Entry& e) {
    const std::string& n = e.name;
    if (n.empty() || n.find('\0') != std::string::npos) bad("entry name", n, EINVAL);
    if (n[0] == '/') bad("entry name (absolute)", n, EINVAL);
    std::string rel;
    for (auto c : split_path(n)) {
        if (c == ".") continue;
        if (c == "..") bad("entry name (contains \"..\")", n, EINVAL);
        if (!rel.empty()) rel += '/';
        rel += c;
    }
    if (rel.size() > PATH_MAX - 1) bad("entry name", n.substr(0, 64), ENAMETOOLONG);
    e.trailing_slash = n.back() == '/';
    e.rel = std::move(rel);
    e.where = e.rel.empty() ? dest_display_ : internal::join(dest_display_, e.rel);
}

void Extractor::entry(const tar::Header& h) {
    Entry e;
    e.name = meta_.sparse_name ? *meta_.sparse_name
             : meta_.path      ? *meta_.path
             : meta_.longname  ? *meta_.longname
                               : h.name;
    e.linkname = meta_.linkpath ? *meta_.linkpath : meta_.longlink ? *meta_.longlink : h.linkname;
    e.type = h.type;
    e.mode = h.mode;
    e.uid = meta_.uid ? *meta_.uid : h.uid;
    e.gid = meta_.gid ? *meta_.gid : h.gid;
    e.size = meta_.size ? *meta_.size : static_cast<uint64_t>(h.size);
    e.mtime_ns = meta_.mtime_ns ? *meta_.mtime_ns : h.mtime * 1000000000;
    e.devmajor = h.devmajor;
    e.devminor = h.devminor;
    e.xattrs = std::move(meta_.xattrs);
    normalize(e);
    // Every entry counts (skipped ones too: what bounds the count bounds the work).
    if (options_.layer.enabled && ++seen_entries_ > options_.layer.max_entries) {
        throw LimitExceeded(options_.layer.limit_name + ": more than " +
                                std::to_string(options_.layer.max_entries) +
                                " entries (refused at " + e.rel + ")",
                            true, options_.layer.max_entries);
    }

    bool regular = e.type == '0' || e.type == '\0' || e.type == '7';
    // A side entry ('B', a vendor type: readers that do not know it refuse it rather than
    // make an empty file) is a regular file whose data is outside the stream.
    if (e.type == tar::kSideFileType || meta_.side_file) {
        if (e.type != tar::kSideFileType || e.size != 0 || !meta_.side_file || !meta_.side_size ||
            *meta_.side_file == 0 || meta_.sparse_major || meta_.sparse_map)
            bad("side file entry (type B, BERTH.side_file)", e.where);
        e.side_file = *meta_.side_file;
        e.side_size = *meta_.side_size;
    }
    if (regular && meta_.sparse_major) {
        if (*meta_.sparse_major != 1 || !meta_.realsize) bad("pax header (GNU sparse)", e.where);
        e.sparse = Entry::Sparse::v1;
        e.realsize = *meta_.realsize;
    } else if (regular && (meta_.sparse_map || !meta_.sparse_pairs.empty())) {
        if (!meta_.realsize) bad("pax header (GNU sparse)", e.where);
        std::vector<uint64_t> nums = meta_.sparse_pairs;
        if (meta_.sparse_map) {
            std::string_view m = *meta_.sparse_map;
            size_t i = 0;
            while (i <= m.size()) {
                size_t j = m.find(',', i);
                if (j == std::string_view::npos) j = m.size();
                uint64_t v;
                if (!tar::parse_decimal(m.substr(i, j - i), &v))
                    bad("pax header (GNU sparse map)", e.where);
                nums.push_back(v);
                if (nums.size() > 2 * tar::kMaxSparseSegments)
                    bad("pax header (GNU sparse map)", e.where);
                i = j + 1;
            }
        }
        if (nums.size() % 2) bad("pax header (GNU sparse map)", e.where);
        for (size_t i = 0; i < nums.size(); i += 2) e.segments.push_back({nums[i], nums[i + 1]});
        e.sparse = Entry::Sparse::v0;
        e.realsize = *meta_.realsize;
    }

    if (options_.layer.enabled && layer_entry(e)) return;
    switch (e.type) {
        case '0':
        case '\0':
        case '7':
            if (e.trailing_slash) return extract_dir(e);
            return extract_file(e);
        case tar::kSideFileType:
            return extract_file(e);
        case '5':
            return extract_dir(e);
        case '2':
            return extract_symlink(e);
        case '1':
            return extract_hardlink(e);
        case '3':
        case '4':
        case '6':
            // Of a layer's device nodes only whiteouts (0/0 character devices) are made:
            // any other node would be a door from the sandbox (or from whoever reaches the
            // store) to a host device, whatever nodev and device cgroups say elsewhere. A
            // fifo opens no device and is made. (Both are made in a user namespace too: the
            // kernel lets anyone make a whiteout, as it must for the layer's .wh. entries.)
            if (options_.layer.enabled &&
                (e.type == '6' || (e.type == '3' && e.devmajor == 0 && e.devminor == 0)))
                return extract_node(e);
            summary_.warnings.push_back(e.where + ": " +
                                        (e.type == '6'
                                             ? std::string("fifo")
                                             : std::string(e.type == '3' ? "character" : "block") +
                                                   " device " + std::to_string(e.devmajor) + ":" +
                                                   std::to_string(e.devminor)) +
                                        " skipped");
            return consume(e.size, e.where);
        default:
            bad(std::string("entry type '") +
                    (std::isprint(static_cast<unsigned char>(e.type))
                         ? std::string(1, e.type)
                         : std::to_string(static_cast<unsigned char>(e.type))) +
                    "' not supported",
                e.where, EINVAL);
    }
}

// ---- directories and names ----

int Extractor::create_parents(const std::string& rel, const std::string& where) {
    UniqueFd cur;
    int at = dest_.get();
    std::string prefix;
    for (auto c : split_path(rel)) {
        std::string comp(c);
        prefix = internal::join(prefix, comp);
        UniqueFd next(::openat(at, comp.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC));
        if (!next && errno == ENOENT) {
            if (::mkdirat(at, comp.c_str(), 0700) != 0) throw_sys("mkdir", where);
            created_.push_back({true, prefix});
            Ownership owner;
            if (options_.owners == ExtractOptions::Owners::fixed) {
                owner = options_.owner;
            } else if (options_.layer.enabled) {
                // A layer's directory it does not list (its whiteout's, say) is the
                // sandbox root's, as an image tool would make it: the top layer's copy
                // is the one a sandbox sees.
                owner = {options_.layer.uid_shift, options_.layer.gid_shift};
            }
            dirs_.push_back({prefix, 0755, std::nullopt, owner});
            next.reset(::openat(at, comp.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC));
        }
        if (!next) throw_sys("open", where);
        struct stat st;
        if (::fstat(next.get(), &st) != 0) throw_sys("stat", where);
        if (S_ISLNK(st.st_mode)) throw_sys("open", where, ELOOP);
        if (!S_ISDIR(st.st_mode)) throw_sys("open", where, ENOTDIR);
        cur = std::move(next);
        at = cur.get();
    }
    cache_fd_ = std::move(cur);
    cache_rel_ = rel;
    return cache_fd_.get();
}

// The directory `rel` below dest, never through a symlink; missing ones are created.
int Extractor::dir_fd(const std::string& rel, const std::string& where) {
    if (rel.empty()) return dest_.get();
    if (cache_fd_ && cache_rel_ == rel) return cache_fd_.get();
    UniqueFd fd;
    try {
        fd =
            internal::open_beneath(dest_.get(), rel, O_PATH | O_DIRECTORY, root_.resolver(), where);
    } catch (const SysError& e) {
        if (e.code() != ENOENT) throw;
        return create_parents(rel, where);
    }
    cache_fd_ = std::move(fd);
    cache_rel_ = rel;
    return cache_fd_.get();
}

std::pair<int, std::string> Extractor::parent_of(const Entry& e) {
    size_t slash = e.rel.rfind('/');
    if (slash == std::string::npos) return {dest_.get(), e.rel};
    return {dir_fd(e.rel.substr(0, slash), e.where), e.rel.substr(slash + 1)};
}

Ownership Extractor::owner_for(const Entry& e) const {
    if (options_.owners == ExtractOptions::Owners::fixed) return options_.owner;
    // The sandboxes' uid and gid ranges may start at different host ids.
    const int64_t uid_shift = options_.layer.enabled ? options_.layer.uid_shift : 0;
    const int64_t gid_shift = options_.layer.enabled ? options_.layer.gid_shift : 0;
    if (e.uid + uid_shift > UINT32_MAX - 1 || e.gid + gid_shift > UINT32_MAX - 1)
        bad("entry owner (beyond the id range)", e.where, EINVAL);
    Ownership o;
    o.uid = static_cast<uid_t>(e.uid + uid_shift);
    o.gid = static_cast<gid_t>(e.gid + gid_shift);
    return o;
}

// ---- image layers ----

// Whiteouts and opaque markers; true when `e` was one (and is done).
bool Extractor::layer_entry(Entry& e) {
    const size_t slash = e.rel.rfind('/');
    const std::string base = slash == std::string::npos ? e.rel : e.rel.substr(slash + 1);
    if (base.rfind(".wh.", 0) != 0) return false;
    consume(e.size, e.where);
    const std::string parent = slash == std::string::npos ? "" : e.rel.substr(0, slash);
    if (base == ".wh..wh..opq") {
        if (!parent.empty()) dir_fd(parent, e.where);  // made when missing
        const std::string where =
            parent.empty() ? dest_display_ : internal::join(dest_display_, parent);
        UniqueFd dir = internal::open_beneath(dest_.get(), parent, O_RDONLY | O_DIRECTORY,
                                              root_.resolver(), where);
        const std::string& name = options_.layer.opaque_xattr;
        if (::fsetxattr(dir.get(), name.c_str(), "y", 1, 0) != 0)
            throw_sys("setxattr " + name, where);
        ++summary_.entries;
        return true;
    }
    const std::string target = base.substr(4);
    if (target.empty() || target == "." || target == ".." || target.rfind(".wh.", 0) == 0)
        bad("whiteout entry name", e.where, EINVAL);
    Entry hidden = e;
    hidden.rel = parent.empty() ? target : parent + "/" + target;
    hidden.where = internal::join(dest_display_, hidden.rel);
    auto [dirfd, name] = parent_of(hidden);
    struct stat st;
    if (::fstatat(dirfd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) {
        // This layer made the entry and now hides it: only the whiteout stays.
        if (S_ISDIR(st.st_mode))
            bad("whiteout (of a directory of the same layer)", hidden.where, EISDIR);
        if (::unlinkat(dirfd, name.c_str(), 0) != 0) throw_sys("unlink", hidden.where);
        files_.erase(hidden.rel);
    }
    if (::mknodat(dirfd, name.c_str(), S_IFCHR | 0, makedev(0, 0)) != 0)
        throw_sys("mknod (whiteout)", hidden.where);
    created_.push_back({false, hidden.rel});
    Ownership o = owner_for(e);
    if ((o.uid || o.gid) &&
        ::fchownat(dirfd, name.c_str(), o.uid ? *o.uid : static_cast<uid_t>(-1),
                   o.gid ? *o.gid : static_cast<gid_t>(-1), AT_SYMLINK_NOFOLLOW) != 0)
        throw_sys("lchown", hidden.where);
    ++summary_.entries;
    return true;
}

void Extractor::extract_node(Entry& e) {
    consume(e.size, e.where);
    if (e.rel.empty()) bad("entry name (a device as the destination)", e.name, EINVAL);
    auto [dirfd, base] = parent_of(e);
    const mode_t type = e.type == '3' ? S_IFCHR : e.type == '4' ? S_IFBLK : S_IFIFO;
    if (::mknodat(dirfd, base.c_str(), type | (e.mode & 0777), makedev(e.devmajor, e.devminor)) !=
        0) {
        if (errno == EPERM || errno == EACCES) {
            summary_.warnings.push_back(e.where + ": " + (e.type == '6' ? "fifo" : "device") +
                                        " skipped (" + std::strerror(errno) + ")");
            return;
        }
        throw_sys("mknod", e.where);
    }
    created_.push_back({false, e.rel});
    Ownership o = owner_for(e);
    if (::fchownat(dirfd, base.c_str(), o.uid ? *o.uid : static_cast<uid_t>(-1),
                   o.gid ? *o.gid : static_cast<gid_t>(-1), AT_SYMLINK_NOFOLLOW) != 0)
        throw_sys("lchown", e.where);
    ++summary_.entries;
}

// The entry's xattrs on `fd` (after its chown, which clears security.capability).
// What a layer may set is what means nothing outside the sandbox:
// - user.*, except overlayfs's own (user.overlay.*: a rootless overlay would obey them);
// - security.capability, namespaced (file_caps.h): rootid = the sandboxes' root, so the
//   kernel honours it only in a sandbox's user namespace; without a rootid to give it
//   (a store with no uid shift: the sandboxes' root would be the host's) it is dropped;
// - nothing else: trusted.* is overlayfs's (trusted.overlay.*) and root's own,
//   security.selinux would be a host label of the image's choosing, security.ima and
//   security.evm hashes and signatures the host's appraisal would weigh, system.* ACLs
//   grants to host users. Each one skipped is a warning.
void Extractor::apply_xattrs(int fd, const Entry& e) {
    if (!options_.layer.enabled) return;
    for (const auto& [name, value] : e.xattrs) {
        std::string_view set = value;
        std::string namespaced;
        bool allowed = name.rfind("user.", 0) == 0 && name.rfind("user.overlay.", 0) != 0 &&
                       name.find(".overlay.") == std::string::npos;
        if (name == "security.capability") {
            std::optional<std::string> v;
            if (options_.layer.cap_rootid)
                v = namespaced_file_caps(value, *options_.layer.cap_rootid);
            if (v) {
                namespaced = std::move(*v);
                set = namespaced;
                allowed = true;
            } else {
                summary_.warnings.push_back(e.where + ": xattr security.capability skipped (" +
                                            (options_.layer.cap_rootid
                                                 ? "not a capability of revision 1, 2 or 3"
                                                 : "no sandbox root to namespace it to") +
                                            ")");
                continue;
            }
        }
        if (!allowed) {
            summary_.warnings.push_back(e.where + ": xattr " + name + " skipped");
            continue;
        }
        if (::fsetxattr(fd, name.c_str(), set.data(), set.size(), 0) != 0)
            throw_sys("setxattr " + name, e.where);
    }
}

void Extractor::extract_dir(Entry& e) {
    consume(e.size, e.where);
    ++summary_.entries;
    if (!e.rel.empty()) {
        auto [dirfd, base] = parent_of(e);
        if (::mkdirat(dirfd, base.c_str(), 0700) == 0) {
            created_.push_back({true, e.rel});
        } else {
            if (errno != EEXIST) throw_sys("mkdir", e.where);
            struct stat st;
            if (::fstatat(dirfd, base.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0)
                throw_sys("stat", e.where);
            if (!S_ISDIR(st.st_mode)) throw_sys("mkdir", e.where, ENOTDIR);
        }
    }
    if (!e.xattrs.empty() && options_.layer.enabled) {
        UniqueFd dir = internal::open_beneath(dest_.get(), e.rel, O_RDONLY | O_DIRECTORY,
                                              root_.resolver(), e.where);
        apply_xattrs(dir.get(), e);
    }
    dirs_.push_back({e.rel, e.mode, e.mtime_ns, owner_for(e)});
}

void Extractor::finish_dirs() {
    auto depth = [](const std::string& rel) {
        return rel.empty() ? 0 : 1 + std::count(rel.begin(), rel.end(), '/');
    };
    std::stable_sort(dirs_.begin(), dirs_.end(), [&](const PendingDir& a, const PendingDir& b) {
        return depth(a.rel) > depth(b.rel);
    });
    cache_fd_.reset();
    for (auto& d : dirs_) {
        std::string where = d.rel.empty() ? dest_display_ : internal::join(dest_display_, d.rel);
        UniqueFd fd = internal::open_beneath(dest_.get(), d.rel, O_RDONLY | O_DIRECTORY,
                                             root_.resolver(), where);
        internal::apply_owner(fd.get(), d.owner, where);
        if (::fchmod(fd.get(), d.mode & 07777) != 0) throw_sys("fchmod", where);
        if (d.mtime_ns) {
            timespec ts[2] = {{0, UTIME_OMIT}, to_timespec(*d.mtime_ns)};
            if (::futimens(fd.get(), ts) != 0) throw_sys("utimensat", where);
        }
    }
}

void Extractor::rollback() noexcept {
    cache_fd_.reset();
    if (dest_) {
        for (auto it = created_.rbegin(); it != created_.rend(); ++it) {
            size_t slash = it->rel.rfind('/');
            std::string parent = slash == std::string::npos ? "" : it->rel.substr(0, slash);
            std::string base = slash == std::string::npos ? it->rel : it->rel.substr(slash + 1);
            try {
                UniqueFd dir = internal::open_beneath(dest_.get(), parent, O_PATH | O_DIRECTORY,
                                                      root_.resolver(), it->rel);
                ::unlinkat(dir.get(), base.c_str(), it->dir ? AT_REMOVEDIR : 0);
            } catch (...) {
            }
        }
    }
    dest_.reset();
    for (auto it = created_parents_.rbegin(); it != created_parents_.rend(); ++it) {
        try {
            Root::Parent p = root_.open_parent(*it);
            ::unlinkat(p.dir.get(), p.name.c_str(), AT_REMOVEDIR);
        } catch (...) {
        }
    }
}

// ---- files ----

std::string Extractor::temp_name() {
    static const char chars[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    std::string name = ".berth-tmp-";
    uint64_t r = rng_();
    for (int i = 0; i < 6; ++i, r /= 62) name += chars[r % 62];
    return name;
}

void Extractor::make_temp(Temp& t, int dirfd, const std::string& where, mode_t mode) {
    t.dirfd = dirfd;
    t.created_mode = mode & ~umask_;
    if (tmpfile_ok_) {
        int fd = ::openat(dirfd, ".", O_TMPFILE | O_WRONLY | O_CLOEXEC, mode);
        if (fd >= 0) {
            t.fd.reset(fd);
            return;
        }
        if (errno != EOPNOTSUPP && errno != EISDIR && errno != EINVAL)
            throw_sys("open (temporary)", where);
        tmpfile_ok_ = false;
    }
    for (int tries = 0;; ++tries) {
        std::string name = temp_name();
        int fd = ::openat(dirfd, name.c_str(), O_CREAT | O_EXCL | O_WRONLY | O_NOFOLLOW | O_CLOEXEC,
                          mode);
        if (fd >= 0) {
            t.fd.reset(fd);
            t.name = std::move(name);
            return;
        }
        if (errno != EEXIST || tries > 100) throw_sys("open (temporary)", where);
    }
}

// Creates something under a fresh temporary name with `make` (returns 0 or -1/errno), then
// renames it over `base`.
void Extractor::replace_via_temp(int dirfd, const std::string& base, const Entry& e,
                                 const std::function<int(const char*)>& make) {
    for (int tries = 0;; ++tries) {
        std::string tmp = temp_name();
        if (make(tmp.c_str()) != 0) {
            if (errno == EEXIST && tries < 100) continue;
            throw_sys("link (temporary)", e.where);
        }
        if (::renameat(dirfd, tmp.c_str(), dirfd, base.c_str()) != 0) {
            int err = errno;
            ::unlinkat(dirfd, tmp.c_str(), 0);
            throw_sys("rename", e.where, err);
        }
        return;
    }
}

void Extractor::commit_temp(Temp& t, int dirfd, const std::string& base, const Entry& e) {
    if (t.name.empty()) {
        std::string proc = "/proc/self/fd/" + std::to_string(t.fd.get());
        if (::linkat(AT_FDCWD, proc.c_str(), dirfd, base.c_str(), AT_SYMLINK_FOLLOW) == 0) {
            created_.push_back({false, e.rel});
            return;
        }
        if (errno != EEXIST) throw_sys("link", e.where);
        replace_via_temp(dirfd, base, e, [&](const char* tmp) {
            return ::linkat(AT_FDCWD, proc.c_str(), dirfd, tmp, AT_SYMLINK_FOLLOW);
        });
        return;
    }
    if (::renameat2(dirfd, t.name.c_str(), dirfd, base.c_str(), RENAME_NOREPLACE) == 0) {
        t.name.clear();
        created_.push_back({false, e.rel});
        return;
    }
    bool existed = true;
    if (errno == EINVAL) {  // no RENAME_NOREPLACE on this filesystem
        struct stat st;
        existed = ::fstatat(dirfd, base.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0;
    } else if (errno != EEXIST) {
        throw_sys("rename", e.where);
    }
    if (::renameat(dirfd, t.name.c_str(), dirfd, base.c_str()) != 0) throw_sys("rename", e.where);
    t.name.clear();
    if (!existed) created_.push_back({false, e.rel});
}

void Extractor::read_sparse_map(Entry& e, uint64_t* map_bytes) {
    std::string text;
    size_t pos = 0;
    uint64_t consumed = 0;
    auto next_number = [&]() -> uint64_t {
        for (;;) {
            size_t nl = text.find('\n', pos);
            if (nl != std::string::npos) {
                uint64_t v;
                if (!tar::parse_decimal(std::string_view(text).substr(pos, nl - pos), &v))
                    bad("GNU sparse map", e.where);
                pos = nl + 1;
                return v;
            }
            if (consumed + tar::kBlock > e.size || consumed >= kMaxSparseMapText)
                bad("GNU sparse map", e.where);
            size_t old = text.size();
            text.resize(old + tar::kBlock);
            in_.read_exact(text.data() + old, tar::kBlock, e.where);
            consumed += tar::kBlock;
        }
    };
    uint64_t count = next_number();
    if (count > tar::kMaxSparseSegments) bad("GNU sparse map (too many segments)", e.where);
    for (uint64_t i = 0; i < count; ++i) {
        uint64_t off = next_number();
        uint64_t size = next_number();
        e.segments.push_back({off, size});
    }
    *map_bytes = consumed;
}

bool Extractor::owned_already(const Ownership& owner, int dirfd, const std::string& parent_rel) {
    if (!owner.uid && !owner.gid) return true;  // nothing asked
    if (owner.uid && *owner.uid != ::geteuid()) return false;
    if (owner.gid && *owner.gid != ::getegid()) return false;
    if (!owner.gid) return true;
    // Our directories are 0700 until the end; others are as they were: read once each.
    if (!setgid_rel_ || *setgid_rel_ != parent_rel) {
        struct stat st;
        if (::fstat(dirfd, &st) != 0) return false;
        setgid_ = st.st_mode & S_ISGID;
        setgid_rel_ = parent_rel;
    }
    return !setgid_;
}

// The file of a side entry: the caller's prefilled O_TMPFILE (adopted: it is linked in
// like our own temporaries), or a temporary filled from the passed file in the kernel.
void Extractor::side_data(const Entry& e, Temp& t, int dirfd) {
    if (e.side_file == 1 && options_.prefilled >= 0 && !prefilled_used_) {
        struct stat st;
        if (::fstat(options_.prefilled, &st) != 0) throw_sys("stat", e.where);
        if (!S_ISREG(st.st_mode) || static_cast<uint64_t>(st.st_size) != e.side_size)
            bad("side file (not the announced " + std::to_string(e.side_size) + " bytes)", e.where,
                EIO);
        t.dirfd = dirfd;
        t.fd.reset(::fcntl(options_.prefilled, F_DUPFD_CLOEXEC, 0));
        if (!t.fd) throw_sys("dup", e.where);
        prefilled_used_ = true;
    } else if (e.side_file <= options_.side_data.size()) {
        make_temp(t, dirfd, e.where);
        const uint64_t copied = internal::copy_file_to_file(
            options_.side_data[e.side_file - 1], t.fd.get(), e.side_size, options_.cancel, e.where);
        if (copied != e.side_size)
            bad("side file (shorter than the announced " + std::to_string(e.side_size) + " bytes)",
                e.where, EIO);
    } else {
        bad("side file " + std::to_string(e.side_file) + " (not passed with the stream)", e.where,
            EINVAL);
    }
    summary_.bytes += e.side_size;
}

// A sparse file counts with its apparent size (realsize), not the blocks it takes here: a
// 1 TiB file of holes is cheap in this store but not wherever it goes next (a copy-up of
// it in a sandbox writes no zeros either, but `berth cp` out, an export to a tool that
// does not keep holes, a backup do), and it is the size the layer announces before a
// byte is written, the same on every filesystem.
void Extractor::charge_bytes(uint64_t n, const Entry& e) {
    if (!options_.layer.enabled) return;
    if (n > options_.layer.max_bytes - std::min(charged_bytes_, options_.layer.max_bytes)) {
        throw LimitExceeded(
            options_.layer.limit_name + ": more than " + std::to_string(options_.layer.max_bytes) +
                " bytes of files (refused at " + e.rel + ", " + std::to_string(n) + " bytes)",
            false, options_.layer.max_bytes);
    }
    charged_bytes_ += n;
}

void Extractor::extract_file(Entry& e) {
    if (e.rel.empty()) bad("entry name (a file as the destination)", e.name, EINVAL);
    charge_bytes(e.side_file                       ? e.side_size
                 : e.sparse != Entry::Sparse::none ? e.realsize
                                                   : e.size,
                 e);
    auto [dirfd, base] = parent_of(e);
    Temp t;
    uint64_t data = e.size;
    if (e.side_file) {
        side_data(e, t, dirfd);
    } else {
        // Created with its final permission bits when it has no setuid/setgid/sticky (those
        // must follow the chown): the fchmod can then often be skipped.
        make_temp(t, dirfd, e.where, (e.mode & 07000) ? 0600 : (e.mode & 0777));
    }
    if (e.side_file) {
        // The data is in place already.
    } else if (e.sparse == Entry::Sparse::none) {
        if (e.size <= kSmallData) {
            read_and_peek(in_.scratch(), tar::padded(e.size), e.where);
            size_t done = 0;
            while (done < e.size) {
                ssize_t w = ::pwrite(t.fd.get(), in_.scratch() + done, e.size - done,
                                     static_cast<off_t>(done));
                if (w < 0) {
                    if (errno == EINTR) continue;
                    throw_sys("write", e.where);
                }
                done += static_cast<size_t>(w);
            }
        } else {
            in_.copy_to_file(t.fd.get(), 0, e.size, e.where);
            read_and_peek(in_.scratch(), tar::padding(e.size), e.where);
        }
        summary_.bytes += e.size;
    } else {
        uint64_t map_bytes = 0;
        if (e.sparse == Entry::Sparse::v1) read_sparse_map(e, &map_bytes);
        data -= map_bytes;
        uint64_t sum = 0, end = 0;
        for (auto& s : e.segments) {
            if (s.offset < end || s.size > e.realsize || s.offset > e.realsize - s.size)
                bad("GNU sparse map (bad segment)", e.where);
            end = s.offset + s.size;
            sum += s.size;
        }
        if (sum != data) bad("GNU sparse map (sizes do not add up)", e.where);
        if (::ftruncate(t.fd.get(), static_cast<off_t>(e.realsize)) != 0)
            throw_sys("ftruncate", e.where);
        for (auto& s : e.segments)
            if (s.size) in_.copy_to_file(t.fd.get(), s.offset, s.size, e.where);
        read_and_peek(in_.scratch(), tar::padding(e.size), e.where);
        summary_.bytes += e.realsize;
    }
    const Ownership owner = owner_for(e);
    const size_t slash = e.rel.rfind('/');
    const std::string parent_rel = slash == std::string::npos ? "" : e.rel.substr(0, slash);
    bool chowned = false;
    if (!owned_already(owner, dirfd, parent_rel)) {
        internal::apply_owner(t.fd.get(), owner, e.where);
        chowned = owner.uid || owner.gid;
    }
    // (A chown clears setuid/setgid; files with those were created 0600 and get them here.)
    if (t.created_mode != (e.mode & 07777) || (chowned && (e.mode & 06000))) {
        if (::fchmod(t.fd.get(), e.mode & 07777) != 0) throw_sys("fchmod", e.where);
    }
    apply_xattrs(t.fd.get(), e);
    timespec ts[2] = {{0, UTIME_OMIT}, to_timespec(e.mtime_ns)};
    if (::futimens(t.fd.get(), ts) != 0) throw_sys("utimensat", e.where);
    commit_temp(t, dirfd, base, e);
    files_.insert(e.rel);
    ++summary_.entries;
}

void Extractor::extract_symlink(Entry& e) {
    consume(e.size, e.where);
    if (e.rel.empty()) bad("entry name (a symlink as the destination)", e.name, EINVAL);
    if (e.linkname.empty() || e.linkname.find('\0') != std::string::npos)
        bad("symlink target", e.where, EINVAL);
    auto [dirfd, base] = parent_of(e);
    if (::symlinkat(e.linkname.c_str(), dirfd, base.c_str()) == 0) {
        created_.push_back({false, e.rel});
    } else {
        if (errno != EEXIST) throw_sys("symlink", e.where);
        // (dirfd copied in: clang 14, which the fuzz build uses, cannot capture a binding.)
        replace_via_temp(dirfd, base, e, [&, dirfd = dirfd](const char* tmp) {
            return ::symlinkat(e.linkname.c_str(), dirfd, tmp);
        });
    }
    files_.erase(e.rel);
    Ownership o = owner_for(e);
    if (o.uid || o.gid) {
        if (::fchownat(dirfd, base.c_str(), o.uid ? *o.uid : static_cast<uid_t>(-1),
                       o.gid ? *o.gid : static_cast<gid_t>(-1), AT_SYMLINK_NOFOLLOW) != 0)
            throw_sys("lchown", e.where);
    }
    timespec ts[2] = {{0, UTIME_OMIT}, to_timespec(e.mtime_ns)};
    if (::utimensat(dirfd, base.c_str(), ts, AT_SYMLINK_NOFOLLOW) != 0)
        throw_sys("utimensat", e.where);
    ++summary_.entries;
}

void Extractor::extract_hardlink(Entry& e) {
    consume(e.size, e.where);
    if (e.rel.empty()) bad("entry name (a hardlink as the destination)", e.name, EINVAL);
    Entry target;
    target.name = e.linkname;
    normalize(target);
    if (target.rel.empty() || !files_.count(target.rel))
        bad("hardlink (target is not a file extracted from this archive: " + e.linkname + ")",
            e.where, EINVAL);
    size_t slash = target.rel.rfind('/');
    std::string tparent = slash == std::string::npos ? "" : target.rel.substr(0, slash);
    std::string tbase = slash == std::string::npos ? target.rel : target.rel.substr(slash + 1);
    UniqueFd tdir = internal::open_beneath(dest_.get(), tparent, O_PATH | O_DIRECTORY,
                                           root_.resolver(), target.where);
    auto [dirfd, base] = parent_of(e);
    if (::linkat(tdir.get(), tbase.c_str(), dirfd, base.c_str(), 0) == 0) {
        created_.push_back({false, e.rel});
    } else {
        if (errno != EEXIST) throw_sys("link", e.where);
        // (dirfd copied in: clang 14 cannot capture a structured binding.)
        replace_via_temp(dirfd, base, e, [&, dirfd = dirfd](const char* tmp) {
            return ::linkat(tdir.get(), tbase.c_str(), dirfd, tmp, 0);
        });
    }
    files_.insert(e.rel);
    ++summary_.entries;
}

}  // namespace

Summary extract_archive(int in, const Root& root, std::string_view dest,
                        const ExtractOptions& options) {
    check_path(dest);
    internal::NonBlockGuard nonblock(in, options.cancel != nullptr);
    Extractor x(in, root, dest, options);
    return x.run();
}

}  // namespace berth::transfer
