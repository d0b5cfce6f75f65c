#include "base/files.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/error.h"
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

// Deletes the entries of the directory open at `dirfd`, depth first, never following links.
static void remove_contents(int dirfd, const std::string& where) {
    int dupfd = check_sys("dup", where, [&] { return ::fcntl(dirfd, F_DUPFD_CLOEXEC, 0); });
    DIR* dir = ::fdopendir(dupfd);
    if (!dir) {
        int err = errno;
        ::close(dupfd);
        throw_sys("fdopendir", where, err);
    }
    while (dirent* e = ::readdir(dir)) {
        std::string_view name = e->d_name;
        if (name == "." || name == "..") continue;
        std::string child = where + "/" + e->d_name;
        if (::unlinkat(dirfd, e->d_name, 0) == 0) continue;
        if (errno != EISDIR && errno != EPERM) {
            ::closedir(dir);
            throw_sys("unlink", child);
        }
        int sub = ::openat(dirfd, e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (sub < 0) {
            ::closedir(dir);
            throw_sys("open", child);
        }
        UniqueFd subfd(sub);
        try {
            remove_contents(subfd.get(), child);
        } catch (...) {
            ::closedir(dir);
            throw;
        }
        if (::unlinkat(dirfd, e->d_name, AT_REMOVEDIR) != 0) {
            ::closedir(dir);
            throw_sys("rmdir", child);
        }
    }
    ::closedir(dir);
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
        remove_contents(fd.get(), path);
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
