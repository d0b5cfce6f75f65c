// write_archive: a tree walked by fds, as a pax tar stream.
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <map>
#include <utility>

#include "base/error.h"
#include "transfer/archive.h"
#include "transfer/internal.h"
#include "transfer/stream.h"
#include "transfer/tar_format.h"

namespace berth::transfer {

namespace {

using internal::join;
using internal::mtime_ns;
using internal::read_link;

class Writer {
  public:
    Writer(int out, const WriteOptions& options) : out_(out, options.cancel) {}

    // The entry `name` in the directory `dirfd`. `dtype` from getdents (DT_UNKNOWN: stat).
    void entry_at(int dirfd, const char* name, unsigned char dtype, const std::string& arcname,
                  const std::string& display);
    void directory(UniqueFd dir, const struct stat& st, const std::string& arcname,
                   const std::string& display);
    void regular(int fd, const struct stat& st, const std::string& arcname,
                 const std::string& display);
    // A regular file whose data goes outside the stream (see WriteOptions).
    void regular_side(int fd, const struct stat& st, const std::string& arcname,
                      const std::string& display, int side_out, const CancelToken* cancel);
    void symlink(const struct stat& st, const std::string& target, const std::string& arcname);
    void skip_special(const struct stat& st, const std::string& display);
    void finish() {
        out_.append_zeros(2 * tar::kBlock);
        out_.flush();
    }

    Summary summary;

  private:
    // A pax header (mtime and whatever the ustar fields cannot hold, plus `extra`), then the
    // ustar header.
    void header(const std::string& arcname, char type, const struct stat& st, uint64_t size,
                std::string_view linkname, std::string extra = {},
                std::string_view ustar_name = {});
    void sparse(int fd, const struct stat& st, const std::string& arcname,
                const std::string& display);
    void file_data(int fd, uint64_t offset, uint64_t len, const std::string& display);

    internal::OutputStream out_;
    std::map<std::pair<dev_t, ino_t>, std::string> links_;
};

void Writer::header(const std::string& arcname, char type, const struct stat& st, uint64_t size,
                    std::string_view linkname, std::string pax, std::string_view ustar_name) {
    if (ustar_name.empty()) ustar_name = arcname;
    tar::append_pax_record(pax, "mtime", tar::format_pax_time(mtime_ns(st)));
    if (!tar::fits_ustar_name(ustar_name)) tar::append_pax_record(pax, "path", ustar_name);
    if (linkname.size() > 100) tar::append_pax_record(pax, "linkpath", linkname);
    if (size > tar::kMaxOctalSize) tar::append_pax_record(pax, "size", std::to_string(size));
    if (st.st_uid > tar::kMaxOctalId) tar::append_pax_record(pax, "uid", std::to_string(st.st_uid));
    if (st.st_gid > tar::kMaxOctalId) tar::append_pax_record(pax, "gid", std::to_string(st.st_gid));

    tar::HeaderFields x;
    x.name = "././@PaxHeader";
    x.type = 'x';
    x.mode = 0644;
    x.size = pax.size();
    x.mtime = st.st_mtim.tv_sec > 0 ? st.st_mtim.tv_sec : 0;
    tar::encode_header(out_.reserve(tar::kBlock), x);
    out_.commit(tar::kBlock);
    out_.append(pax.data(), pax.size());
    out_.append_zeros(tar::padding(pax.size()));

    tar::HeaderFields h;
    h.name = ustar_name;
    h.type = type;
    h.mode = st.st_mode & 07777;
    h.uid = st.st_uid;
    h.gid = st.st_gid;
    h.size = size;
    h.mtime = st.st_mtim.tv_sec;
    h.linkname = linkname;
    tar::encode_header(out_.reserve(tar::kBlock), h);
    out_.commit(tar::kBlock);
}

void Writer::file_data(int fd, uint64_t offset, uint64_t len, const std::string& display) {
    uint64_t sent = out_.send_file(fd, offset, len, display);
    if (sent < len) {
        out_.append_zeros(len - sent);
        summary.warnings.push_back(display + ": file shrank while being read; padded with zeros");
    }
}

void Writer::entry_at(int dirfd, const char* name, unsigned char dtype, const std::string& arcname,
                      const std::string& display) {
    struct stat st;
    if (dtype != DT_REG && dtype != DT_DIR) {
        if (::fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
            if (errno == ENOENT) {
                summary.warnings.push_back(display + ": removed while being read; skipped");
                return;
            }
            throw_sys("stat", display);
        }
        if (S_ISLNK(st.st_mode)) return symlink(st, read_link(dirfd, name, display), arcname);
        if (S_ISREG(st.st_mode))
            dtype = DT_REG;
        else if (S_ISDIR(st.st_mode))
            dtype = DT_DIR;
        else
            return skip_special(st, display);
    }
    int flags = dtype == DT_DIR ? O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC
                                : O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC;
    UniqueFd fd(::openat(dirfd, name, flags));
    if (!fd) {
        if (errno == ENOENT) {
            summary.warnings.push_back(display + ": removed while being read; skipped");
            return;
        }
        if (errno == ELOOP || errno == ENOTDIR) {
            // Replaced (by a symlink, or a file for a directory) since getdents: look again.
            return entry_at(dirfd, name, DT_UNKNOWN, arcname, display);
        }
        throw_sys("open", display);
    }
    if (::fstat(fd.get(), &st) != 0) throw_sys("stat", display);
    if (S_ISDIR(st.st_mode)) return directory(std::move(fd), st, arcname, display);
    if (S_ISREG(st.st_mode)) return regular(fd.get(), st, arcname, display);
    skip_special(st, display);
}

void Writer::directory(UniqueFd dir, const struct stat& st, const std::string& arcname,
                       const std::string& display) {
    header(arcname == "." ? "./" : arcname + "/", '5', st, 0, {});
    ++summary.entries;
    internal::for_each_dir_entry(dir.get(), display, [&](const char* name, unsigned char type) {
        entry_at(dir.get(), name, type, join(arcname, name), display + "/" + name);
    });
}

void Writer::regular(int fd, const struct stat& st, const std::string& arcname,
                     const std::string& display) {
    if (st.st_nlink > 1) {
        auto [it, inserted] = links_.try_emplace({st.st_dev, st.st_ino}, arcname);
        if (!inserted) {
            header(arcname, '1', st, 0, it->second);
            ++summary.entries;
            return;
        }
    }
    if (st.st_size > 0 &&
        static_cast<uint64_t>(st.st_blocks) * 512 < static_cast<uint64_t>(st.st_size))
        return sparse(fd, st, arcname, display);
    uint64_t size = static_cast<uint64_t>(st.st_size);
    header(arcname, '0', st, size, {});
    file_data(fd, 0, size, display);
    out_.append_zeros(tar::padding(size));
    ++summary.entries;
    summary.bytes += size;
}

void Writer::regular_side(int fd, const struct stat& st, const std::string& arcname,
                          const std::string& display, int side_out, const CancelToken* cancel) {
    const uint64_t size = static_cast<uint64_t>(st.st_size);
    if (side_out >= 0) {
        // The data first: once the reader sees the header, the file is complete.
        const uint64_t copied = internal::copy_file_to_file(fd, side_out, size, cancel, display);
        if (copied != size) throw_sys("read", display + " (changed while being copied)", EIO);
    }
    std::string pax;
    tar::append_pax_record(pax, "BERTH.side_file", "1");
    tar::append_pax_record(pax, "BERTH.side_size", std::to_string(size));
    header(arcname, tar::kSideFileType, st, 0, {}, std::move(pax));
    ++summary.entries;
    summary.bytes += size;
}

// GNU sparse 1.0: the map ("count\n" then "offset\nsize\n" per segment, padded to a block)
// at the start of the data, then the data segments back to back.
void Writer::sparse(int fd, const struct stat& st, const std::string& arcname,
                    const std::string& display) {
    uint64_t realsize = static_cast<uint64_t>(st.st_size);
    std::vector<tar::SparseSegment> segs;
    off_t pos = 0;
    while (static_cast<uint64_t>(pos) < realsize) {
        off_t data = ::lseek(fd, pos, SEEK_DATA);
        if (data < 0) {
            if (errno == ENXIO) break;
            if (errno == EINVAL || errno == EOPNOTSUPP) {  // no SEEK_DATA here: one segment
                segs.assign(1, {0, realsize});
                break;
            }
            throw_sys("lseek", display);
        }
        if (static_cast<uint64_t>(data) >= realsize) break;
        off_t hole = ::lseek(fd, data, SEEK_HOLE);
        if (hole < 0) throw_sys("lseek", display);
        uint64_t end = std::min<uint64_t>(static_cast<uint64_t>(hole), realsize);
        segs.push_back({static_cast<uint64_t>(data), end - static_cast<uint64_t>(data)});
        pos = static_cast<off_t>(end);
    }
    if (segs.size() == 1 && segs[0].offset == 0 && segs[0].size == realsize) {
        // Not sparse after all (e.g. compressed or inline data).
        uint64_t size = realsize;
        header(arcname, '0', st, size, {});
        file_data(fd, 0, size, display);
        out_.append_zeros(tar::padding(size));
        ++summary.entries;
        summary.bytes += size;
        return;
    }
    if (segs.empty() || segs.back().offset + segs.back().size < realsize)
        segs.push_back({realsize, 0});
    std::string map = std::to_string(segs.size()) + "\n";
    uint64_t data_size = 0;
    for (auto& s : segs) {
        map += std::to_string(s.offset) + "\n" + std::to_string(s.size) + "\n";
        data_size += s.size;
    }
    uint64_t map_size = tar::padded(map.size());
    std::string pax;
    tar::append_pax_record(pax, "GNU.sparse.major", "1");
    tar::append_pax_record(pax, "GNU.sparse.minor", "0");
    tar::append_pax_record(pax, "GNU.sparse.name", arcname);
    tar::append_pax_record(pax, "GNU.sparse.realsize", std::to_string(realsize));
    size_t slash = arcname.rfind('/');
    std::string fake = slash == std::string::npos ? "GNUSparseFile.0/" + arcname
                                                  : arcname.substr(0, slash) + "/GNUSparseFile.0/" +
                                                        arcname.substr(slash + 1);
    header(arcname, '0', st, map_size + data_size, {}, std::move(pax), fake);
    out_.append(map.data(), map.size());
    out_.append_zeros(map_size - map.size());
    for (auto& s : segs) file_data(fd, s.offset, s.size, display);
    out_.append_zeros(tar::padding(map_size + data_size));
    ++summary.entries;
    summary.bytes += realsize;
}

void Writer::symlink(const struct stat& st, const std::string& target, const std::string& arcname) {
    header(arcname, '2', st, 0, target);
    ++summary.entries;
}

void Writer::skip_special(const struct stat& st, const std::string& display) {
    const char* what = S_ISFIFO(st.st_mode)   ? "fifo"
                       : S_ISSOCK(st.st_mode) ? "socket"
                       : S_ISCHR(st.st_mode)  ? "character device"
                       : S_ISBLK(st.st_mode)  ? "block device"
                                              : "special file";
    summary.warnings.push_back(display + ": " + what + " skipped");
}

// The name the top entry gets: a relative path with no "..", or "." for "contents only".
std::string top_name(std::string_view path, const WriteOptions& options) {
    std::string name = options.name;
    if (name.empty()) {
        auto comps = internal::split_path(path);
        name = comps.empty() ? "." : std::string(comps.back());
        if (name == "..") name = ".";
    }
    while (name.size() > 1 && name.back() == '/') name.pop_back();
    if (name[0] == '/') throw_sys("archive name", name, EINVAL);
    for (auto comp : internal::split_path(name))
        if (comp == "..") throw_sys("archive name", name, EINVAL);
    if (name.find('\0') != std::string::npos) throw_sys("archive name", name, EINVAL);
    return name;
}

}  // namespace

void enlarge_pipe(int fd) {
    ::fcntl(fd, F_SETPIPE_SZ, 1 << 20);
}

Summary write_archive(const Root& root, std::string_view path, int out,
                      const WriteOptions& options) {
    std::string name = top_name(path, options);
    std::string display(path);
    internal::NonBlockGuard nonblock(out, options.cancel != nullptr);
    Writer w(out, options);
    UniqueFd top = root.open_at(path, O_PATH | O_NOFOLLOW);
    struct stat st;
    if (::fstat(top.get(), &st) != 0) throw_sys("stat", display);
    if (S_ISDIR(st.st_mode)) {
        UniqueFd dir(::openat(top.get(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
        if (!dir) throw_sys("open", display);
        if (::fstat(dir.get(), &st) != 0) throw_sys("stat", display);
        w.directory(std::move(dir), st, options.contents_only ? "." : name, display);
    } else if (S_ISLNK(st.st_mode)) {
        w.symlink(st, read_link(top.get(), "", display), name);
    } else if (S_ISREG(st.st_mode)) {
        UniqueFd file = root.open_at(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY);
        if (::fstat(file.get(), &st) != 0) throw_sys("stat", display);
        if (!S_ISREG(st.st_mode)) throw_sys("open", display, EAGAIN);  // replaced meanwhile
        const bool holes = st.st_size > 0 && static_cast<uint64_t>(st.st_blocks) * 512 <
                                                 static_cast<uint64_t>(st.st_size);
        if ((options.side_data_out >= 0 || options.side_data_passed) && !holes)
            w.regular_side(file.get(), st, name, display, options.side_data_out, options.cancel);
        else
            w.regular(file.get(), st, name, display);
    } else {
        w.skip_special(st, display);
    }
    w.finish();
    return std::move(w.summary);
}

}  // namespace berth::transfer
