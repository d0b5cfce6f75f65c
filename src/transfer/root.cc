// Path resolution inside a root: openat2(RESOLVE_IN_ROOT) or a userspace walk that does the
// same, component by component, from the root's fd.
#include "transfer/root.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <string>
#include <vector>

#include "base/error.h"
#include "transfer/internal.h"

namespace berth::transfer {

namespace {

constexpr int kSymlinkBudget = 40;

long sys_openat2(int dirfd, const char* path, open_how* how) {
    return ::syscall(SYS_openat2, dirfd, path, how, sizeof(*how));
}

bool wants_mode(int flags) {
    return (flags & O_CREAT) || (flags & O_TMPFILE) == O_TMPFILE;
}

// openat2 with retries on EINTR and EAGAIN (a concurrent rename made the kernel give up).
int openat2_retry(int dirfd, const char* path, int flags, mode_t mode, uint64_t resolve) {
    open_how how{};
    how.flags = static_cast<uint64_t>(flags | O_CLOEXEC);
    how.mode = wants_mode(flags) ? mode : 0;
    how.resolve = resolve;
    for (int tries = 0;; ++tries) {
        long fd = sys_openat2(dirfd, path, &how);
        if (fd >= 0) return static_cast<int>(fd);
        if (errno == EINTR || (errno == EAGAIN && tries < 100)) continue;
        return -1;
    }
}

std::string read_link_at(int dirfd, const char* name) {
    std::string buf(256, '\0');
    for (;;) {
        ssize_t n = ::readlinkat(dirfd, name, buf.data(), buf.size());
        if (n < 0) return {};
        if (static_cast<size_t>(n) < buf.size()) {
            buf.resize(static_cast<size_t>(n));
            return buf;
        }
        if (buf.size() > PATH_MAX) {
            errno = ENAMETOOLONG;
            return {};
        }
        buf.resize(buf.size() * 2);
    }
}

// A symlink in a procfs directory is only followed when it reads like a plain relative path
// ("self" -> "1234", "mounts" -> "self/mounts"); magic links (root, cwd, exe, fd/N, ns/*)
// read as absolute paths or "pipe:[...]" and are refused.
bool is_magic(int parent_fd, const std::string& target) {
    struct statfs fs;
    if (::fstatfs(parent_fd, &fs) != 0) return true;
    if (fs.f_type != PROC_SUPER_MAGIC) return false;
    return target.empty() || target[0] == '/' || target.find(':') != std::string::npos;
}

// The userspace resolver. `stack` holds the directories entered below the root, so ".."
// pops one (and at the root stays there) without ever opening ".." by name.
int walk_open(int root_fd, std::string_view path, int flags, mode_t mode) {
    std::vector<UniqueFd> stack;
    std::vector<std::string> todo;  // components still to resolve, next at the back
    auto push_path = [&](std::string_view p) {
        auto comps = internal::split_path(p);
        for (auto it = comps.rbegin(); it != comps.rend(); ++it) todo.emplace_back(*it);
    };
    push_path(path);
    bool trailing_slash = !path.empty() && path.back() == '/';
    if (todo.empty()) todo.emplace_back(".");
    int budget = kSymlinkBudget;
    bool excl_create = (flags & O_CREAT) && (flags & O_EXCL);
    bool follow_last = trailing_slash || !((flags & O_NOFOLLOW) || excl_create);
    if (trailing_slash && !(flags & O_CREAT)) flags |= O_DIRECTORY;

    auto cur = [&] { return stack.empty() ? root_fd : stack.back().get(); };
    auto expand = [&](int parent_fd, const std::string& target) -> bool {
        if (--budget < 0) {
            errno = ELOOP;
            return false;
        }
        if (is_magic(parent_fd, target)) {
            errno = ELOOP;
            return false;
        }
        if (target.empty()) {
            errno = ENOENT;
            return false;
        }
        if (target[0] == '/') stack.clear();
        size_t before = todo.size();
        push_path(target);
        if (todo.size() == before) todo.emplace_back(".");
        return true;
    };

    while (!todo.empty()) {
        std::string comp = std::move(todo.back());
        todo.pop_back();
        bool last = todo.empty();
        if (comp == "." || comp == "..") {
            if (comp == ".." && !stack.empty()) stack.pop_back();
            if (!last) continue;
            return ::openat(cur(), ".", (flags & ~O_NOFOLLOW) | O_CLOEXEC, mode);
        }
        if (!last) {
            UniqueFd fd(::openat(cur(), comp.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC));
            if (!fd) return -1;
            struct stat st;
            if (::fstat(fd.get(), &st) != 0) return -1;
            if (S_ISLNK(st.st_mode)) {
                std::string target = read_link_at(fd.get(), "");
                if (target.empty() && errno) return -1;
                if (!expand(cur(), target)) return -1;
                continue;
            }
            if (!S_ISDIR(st.st_mode)) {
                errno = ENOTDIR;
                return -1;
            }
            stack.push_back(std::move(fd));
            continue;
        }
        // The last component.
        if (!follow_last)
            return ::openat(cur(), comp.c_str(), flags | O_NOFOLLOW | O_CLOEXEC, mode);
        if (flags & O_PATH) {
            UniqueFd fd(::openat(cur(), comp.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC));
            if (!fd) return -1;
            struct stat st;
            if (::fstat(fd.get(), &st) != 0) return -1;
            if (S_ISLNK(st.st_mode)) {
                errno = 0;
                std::string target = read_link_at(fd.get(), "");
                if (target.empty() && errno) return -1;
                if (!expand(cur(), target)) return -1;
                continue;
            }
            if ((flags & O_DIRECTORY) && !S_ISDIR(st.st_mode)) {
                errno = ENOTDIR;
                return -1;
            }
            return fd.release();
        }
        int fd = ::openat(cur(), comp.c_str(), flags | O_NOFOLLOW | O_CLOEXEC, mode);
        if (fd >= 0) return fd;
        int err = errno;
        if (err != ELOOP && err != ENOTDIR) return -1;
        errno = 0;
        std::string target = read_link_at(cur(), comp.c_str());
        if (target.empty()) {
            errno = err;  // not a symlink: the open's own error
            return -1;
        }
        if (!expand(cur(), target)) return -1;
    }
    errno = ENOENT;
    return -1;
}

}  // namespace

bool openat2_available() {
    static const bool available = [] {
        int fd = openat2_retry(AT_FDCWD, "/", O_PATH, 0, RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS);
        if (fd < 0) return false;
        ::close(fd);
        return true;
    }();
    return available;
}

void check_path(std::string_view path) {
    if (path.empty() || path.find('\0') != std::string_view::npos) throw_sys("path", path, EINVAL);
    if (path.size() > PATH_MAX - 1) throw_sys("path", path.substr(0, 64), ENAMETOOLONG);
    for (auto comp : internal::split_path(path))
        if (comp.size() > NAME_MAX) throw_sys("path", path, ENAMETOOLONG);
}

Root::Root(UniqueFd dir, Resolver resolver) : dir_(std::move(dir)), resolver_(resolver) {
    if (!dir_) throw_sys("root", "", EBADF);
    if (resolver_ == Resolver::automatic)
        resolver_ = openat2_available() ? Resolver::openat2 : Resolver::walk;
}

Root Root::open(const std::string& path, Resolver resolver) {
    UniqueFd fd(check_sys("open", path,
                          [&] { return ::open(path.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC); }));
    return Root(std::move(fd), resolver);
}

UniqueFd Root::open_at(std::string_view path, int flags, mode_t mode) const {
    check_path(path);
    std::string p(path);
    int fd;
    for (;;) {
        if (resolver_ == Resolver::openat2)
            fd = openat2_retry(dir_.get(), p.c_str(), flags, mode,
                               RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS);
        else
            fd = walk_open(dir_.get(), p, flags, mode);
        if (fd >= 0 || errno != EINTR) break;
    }
    if (fd < 0) throw_sys("open", path);
    return UniqueFd(fd);
}

Root::Parent Root::open_parent(std::string_view path) const {
    check_path(path);
    std::string_view p = path;
    while (!p.empty() && p.back() == '/') p.remove_suffix(1);
    if (p.empty()) throw_sys("open_parent", path, EINVAL);
    size_t slash = p.rfind('/');
    std::string_view name = slash == std::string_view::npos ? p : p.substr(slash + 1);
    std::string_view dir = slash == std::string_view::npos ? std::string_view(".")
                           : slash == 0                    ? std::string_view("/")
                                                           : p.substr(0, slash);
    if (name == "." || name == "..") throw_sys("open_parent", path, EINVAL);
    Parent parent;
    try {
        parent.dir = open_at(dir, O_PATH | O_DIRECTORY);
    } catch (const SysError& e) {
        // Name what the caller asked for, not the directory above it.
        throw SysError("open", path, e.code());
    }
    parent.name = std::string(name);
    return parent;
}

}  // namespace berth::transfer
