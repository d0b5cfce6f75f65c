#include "base/files.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <utility>
#include <vector>

#include "base/error.h"
#include "base/remove_tree.h"
#include "base/unique_fd.h"

namespace berth {

std::string read_file(const std::string& path) {
    UniqueFd fd(
        check_sys("open", path, [&] { return ::open(path.c_str(), O_RDONLY | O_CLOEXEC); }));
    std::string out;
    char buf[8192];
    for (;;) {
        ssize_t n = check_sys("read", path, [&] { return ::read(fd.get(), buf, sizeof buf); });
        if (n == 0) break;
        out.append(buf, static_cast<size_t>(n));
    }
    return out;
}

std::optional<std::string> read_file_if_exists(const std::string& path) {
    try {
        return read_file(path);
    } catch (const SysError& e) {
        if (e.code() == ENOENT) return std::nullopt;
        throw;
    }
}

void write_all(int fd, std::string_view data, std::string_view what) {
    while (!data.empty()) {
        ssize_t n = check_sys("write", what, [&] { return ::write(fd, data.data(), data.size()); });
        data.remove_prefix(static_cast<size_t>(n));
    }
}

void write_file(const std::string& path, std::string_view data) {
    UniqueFd fd(
        check_sys("open", path, [&] { return ::open(path.c_str(), O_WRONLY | O_CLOEXEC); }));
    ssize_t n =
        check_sys("write", path, [&] { return ::write(fd.get(), data.data(), data.size()); });
    if (static_cast<size_t>(n) != data.size()) throw_sys("write (short)", path, EIO);
}

void write_file_atomic(const std::string& path, std::string_view data, unsigned mode) {
    std::string tmp = path + ".tmp." + std::to_string(::getpid());
    {
        UniqueFd fd(check_sys("open", tmp, [&] {
            return ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
        }));
        size_t off = 0;
        while (off < data.size()) {
            ssize_t n = check_sys("write", tmp, [&] {
                return ::write(fd.get(), data.data() + off, data.size() - off);
            });
            off += static_cast<size_t>(n);
        }
    }
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
        int err = errno;
        ::unlink(tmp.c_str());
        throw_sys("rename", tmp + " -> " + path, err);
    }
}

void make_dirs(const std::string& path, unsigned mode) {
    if (path.empty()) return;
    for (size_t pos = 1;; ++pos) {
        pos = path.find('/', pos);
        std::string part = path.substr(0, pos);
        if (::mkdir(part.c_str(), mode) != 0 && errno != EEXIST) throw_sys("mkdir", part);
        if (pos == std::string::npos) break;
    }
}

namespace {

// Directories deeper than this are not kept open while their subdirectories are removed: they
// are found again through ".." (checked by device and inode), so a tree of any depth needs at
// most about 2 * kOpenLevels fds.
constexpr size_t kOpenLevels = 64;

struct Level {
    UniqueFd fd;
    DIR* stream = nullptr;  // kept for the top levels: their scan goes on after a descent
    dev_t dev = 0;
    ino_t ino = 0;
    std::string name;  // in the level above
    Level() = default;
    Level(Level&& o) noexcept
        : fd(std::move(o.fd)),
          stream(std::exchange(o.stream, nullptr)),
          dev(o.dev),
          ino(o.ino),
          name(std::move(o.name)) {}
    Level& operator=(Level&&) = delete;
    ~Level() {
        if (stream) ::closedir(stream);
    }
};

// A stream of its own over `fd` (closedir closes the dup, not `fd`).
DIR* open_stream(int fd, const std::string& where) {
    const int dup = check_sys("dup", where, [&] { return ::fcntl(fd, F_DUPFD_CLOEXEC, 0); });
    DIR* d = ::fdopendir(dup);
    if (!d) {
        const int err = errno;
        ::close(dup);
        throw_sys("fdopendir", where, err);
    }
    ::rewinddir(d);
    return d;
}

bool is_mount_root(int fd, dev_t top_dev, dev_t dev) {
    struct statx stx;
    if (::statx(fd, "", AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW, STATX_TYPE, &stx) == 0 &&
        (stx.stx_attributes_mask & STATX_ATTR_MOUNT_ROOT))
        return (stx.stx_attributes & STATX_ATTR_MOUNT_ROOT) != 0;
    return dev != top_dev;
}

}  // namespace

void remove_contents(int dirfd, const std::string& where, bool same_mount) {
    auto at = [&](size_t depth, std::string_view name) {
        // Short at any depth: the top, the entry, and how deep it is when that is not plain.
        const std::string entry(name.substr(0, 255));
        if (depth <= 1) return where + "/" + entry;
        return where + "/.../" + entry + " (depth " + std::to_string(depth) + ")";
    };
    std::vector<Level> levels;
    {
        Level top;
        top.fd.reset(check_sys("dup", where, [&] { return ::fcntl(dirfd, F_DUPFD_CLOEXEC, 0); }));
        struct stat st;
        if (::fstat(top.fd.get(), &st) != 0) throw_sys("fstat", where);
        top.dev = st.st_dev;
        top.ino = st.st_ino;
        top.stream = open_stream(top.fd.get(), where);
        levels.push_back(std::move(top));
    }
    const dev_t top_dev = levels.front().dev;
    while (!levels.empty()) {
        const size_t depth = levels.size() - 1;
        Level& cur = levels.back();
        // The next subdirectory here, unlinking everything else on the way.
        DIR* stream = cur.stream ? cur.stream : open_stream(cur.fd.get(), at(depth, "."));
        std::string sub;
        for (;;) {
            errno = 0;
            dirent* e = ::readdir(stream);
            if (!e) {
                if (errno != 0) {
                    const int err = errno;
                    if (!cur.stream) ::closedir(stream);
                    throw_sys("readdir", at(depth, "."), err);
                }
                break;
            }
            const std::string_view name = e->d_name;
            if (name == "." || name == "..") continue;
            if (e->d_type == DT_DIR) {
                sub = e->d_name;
                break;
            }
            if (::unlinkat(cur.fd.get(), e->d_name, 0) == 0 || errno == ENOENT) continue;
            if (errno == EISDIR || errno == EPERM) {
                sub = e->d_name;
                break;
            }
            const int err = errno;
            if (!cur.stream) ::closedir(stream);
            throw_sys("unlink", at(depth + 1, name), err);
        }
        if (!cur.stream) ::closedir(stream);

        if (!sub.empty()) {
            UniqueFd fd(::openat(cur.fd.get(), sub.c_str(),
                                 O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
            if (!fd) {
                if (errno == ENOENT) continue;
                throw_sys("open", at(depth + 1, sub));
            }
            struct stat st;
            if (::fstat(fd.get(), &st) != 0) throw_sys("fstat", at(depth + 1, sub));
            if (same_mount && is_mount_root(fd.get(), top_dev, st.st_dev))
                throw_sys("remove", at(depth + 1, sub) + " (another mount)", EXDEV);
            // The level we leave: past the top ones, it need not stay open.
            if (depth >= kOpenLevels) cur.fd.reset();
            Level next;
            next.fd = std::move(fd);
            next.dev = st.st_dev;
            next.ino = st.st_ino;
            next.name = std::move(sub);
            if (depth + 1 < kOpenLevels)
                next.stream = open_stream(next.fd.get(), at(depth + 1, next.name));
            levels.push_back(std::move(next));
            continue;
        }
        // Empty now: it goes from the level above (the top itself stays).
        if (depth == 0) break;
        Level& parent = levels[depth - 1];
        if (!parent.fd) {
            UniqueFd up(::openat(cur.fd.get(), "..", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
            if (!up) throw_sys("open", at(depth - 1, ".."));
            struct stat st;
            if (::fstat(up.get(), &st) != 0) throw_sys("fstat", at(depth - 1, ".."));
            if (st.st_dev != parent.dev || st.st_ino != parent.ino)
                throw_sys("remove", at(depth - 1, "..") + " (the tree moved while it was removed)",
                          ESTALE);
            parent.fd = std::move(up);
        }
        const std::string name = std::move(cur.name);
        levels.pop_back();
        if (::unlinkat(levels.back().fd.get(), name.c_str(), AT_REMOVEDIR) != 0 && errno != ENOENT)
            throw_sys("rmdir", at(depth, name));
    }
}

void remove_tree(const std::string& path) {
    struct stat st;
    if (::lstat(path.c_str(), &st) != 0) {
        if (errno == ENOENT) return;
        throw_sys("lstat", path);
    }
    if (!S_ISDIR(st.st_mode)) {
        if (::unlink(path.c_str()) != 0 && errno != ENOENT) throw_sys("unlink", path);
        return;
    }
    {
        UniqueFd fd(check_sys("open", path, [&] {
            return ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        }));
        remove_contents(fd.get(), path, /*same_mount=*/false);
    }
    if (::rmdir(path.c_str()) != 0 && errno != ENOENT) throw_sys("rmdir", path);
}

std::string fd_path(int fd) {
    const std::string link = "/proc/self/fd/" + std::to_string(fd);
    std::string buf(4096, '\0');
    ssize_t n = ::readlink(link.c_str(), buf.data(), buf.size());
    if (n < 0) throw_sys("readlink", link);
    if (static_cast<size_t>(n) == buf.size()) throw SysError("readlink", link, ENAMETOOLONG);
    buf.resize(static_cast<size_t>(n));
    return buf;
}

}  // namespace berth
