// stat, mkdir -p and rm -r inside a Root, plus the path helpers the library shares.
#include "transfer/file_ops.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <climits>

#include "base/error.h"
#include "base/remove_tree.h"
#include "transfer/internal.h"

namespace berth::transfer {

namespace internal {

std::vector<std::string_view> split_path(std::string_view path) {
    std::vector<std::string_view> out;
    size_t i = 0;
    while (i < path.size()) {
        size_t j = path.find('/', i);
        if (j == std::string_view::npos) j = path.size();
        if (j > i) out.push_back(path.substr(i, j - i));
        i = j + 1;
    }
    return out;
}

std::string join(std::string_view a, std::string_view b) {
    if (a.empty() || a == ".") return std::string(b);
    std::string s(a);
    if (s.back() != '/') s += '/';
    s += b;
    return s;
}

UniqueFd open_beneath(int dirfd, std::string_view rel, int flags, Resolver resolver,
                      std::string_view subject) {
    auto comps = split_path(rel);
    if (comps.empty()) {
        int fd = ::openat(dirfd, ".", (flags & ~O_NOFOLLOW) | O_CLOEXEC);
        if (fd < 0) throw_sys("open", subject);
        return UniqueFd(fd);
    }
    if (resolver == Resolver::openat2) {
        std::string p(rel);
        open_how how{};
        // RESOLVE_NO_SYMLINKS refuses a trailing symlink too (ELOOP), unless O_NOFOLLOW
        // with O_PATH asks for the link itself: leave O_NOFOLLOW out.
        how.flags = static_cast<uint64_t>((flags & ~O_NOFOLLOW) | O_CLOEXEC);
        how.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
        for (int tries = 0;; ++tries) {
            long fd = ::syscall(SYS_openat2, dirfd, p.c_str(), &how, sizeof how);
            if (fd >= 0) return UniqueFd(static_cast<int>(fd));
            if (errno == EINTR || (errno == EAGAIN && tries < 100)) continue;
            throw_sys("open", subject);
        }
    }
    UniqueFd cur;
    int at = dirfd;
    for (size_t i = 0; i + 1 < comps.size(); ++i) {
        if (comps[i] == ".") continue;
        if (comps[i] == "..") throw_sys("open", subject, EXDEV);
        std::string c(comps[i]);
        UniqueFd next(::openat(at, c.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC));
        if (!next) throw_sys("open", subject);
        struct stat st;
        if (::fstat(next.get(), &st) != 0) throw_sys("fstat", subject);
        if (S_ISLNK(st.st_mode)) throw_sys("open", subject, ELOOP);
        if (!S_ISDIR(st.st_mode)) throw_sys("open", subject, ENOTDIR);
        cur = std::move(next);
        at = cur.get();
    }
    std::string last(comps.back());
    if (last == "..") throw_sys("open", subject, EXDEV);
    int fd = ::openat(at, last.c_str(), flags | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
        int err = errno;
        if (err == ENOTDIR && (flags & O_DIRECTORY)) {
            // O_NOFOLLOW|O_DIRECTORY on a symlink says ENOTDIR; openat2 would say ELOOP.
            struct stat st;
            if (::fstatat(at, last.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode))
                err = ELOOP;
        }
        throw_sys("open", subject, err);
    }
    return UniqueFd(fd);
}

void apply_owner(int fd, const Ownership& owner, std::string_view subject) {
    if (!owner.uid && !owner.gid) return;
    uid_t uid = owner.uid ? *owner.uid : static_cast<uid_t>(-1);
    gid_t gid = owner.gid ? *owner.gid : static_cast<gid_t>(-1);
    if (::fchown(fd, uid, gid) != 0) throw_sys("fchown", subject);
}

bool make_dirs_tracked(const Root& root, std::string_view path, mode_t mode, const Ownership& owner,
                       std::vector<std::string>* created) {
    check_path(path);
    try {
        root.open_at(path, O_PATH | O_DIRECTORY);
        return false;
    } catch (const SysError& e) {
        if (e.code() != ENOENT) throw;
    }
    std::string prefix = path[0] == '/' ? "/" : "";
    bool created_last = false;
    for (auto comp : split_path(path)) {
        if (!prefix.empty() && prefix.back() != '/') prefix += '/';
        prefix += comp;
        created_last = false;
        if (comp == "." || comp == "..") continue;
        Root::Parent parent = root.open_parent(prefix);
        if (::mkdirat(parent.dir.get(), parent.name.c_str(), 0700) == 0) {
            if (created) created->push_back(prefix);
            created_last = true;
            UniqueFd dir(::openat(parent.dir.get(), parent.name.c_str(),
                                  O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
            if (!dir) throw_sys("open", prefix);
            apply_owner(dir.get(), owner, prefix);
            if (::fchmod(dir.get(), mode & 07777) != 0) throw_sys("fchmod", prefix);
        } else if (errno == EEXIST) {
            root.open_at(prefix, O_PATH | O_DIRECTORY);  // ENOTDIR naming it if not a directory
        } else {
            throw_sys("mkdir", prefix);
        }
    }
    return created_last;
}

void for_each_dir_entry(int dir_fd, std::string_view display,
                        const std::function<void(const char* name, unsigned char type)>& f) {
    int dupfd = ::fcntl(dir_fd, F_DUPFD_CLOEXEC, 0);
    if (dupfd < 0) throw_sys("dup", display);
    DIR* d = ::fdopendir(dupfd);
    if (!d) {
        int err = errno;
        ::close(dupfd);
        throw_sys("fdopendir", display, err);
    }
    struct Closer {
        DIR* d;
        ~Closer() { ::closedir(d); }
    } closer{d};
    for (;;) {
        errno = 0;
        dirent* e = ::readdir(d);
        if (!e) {
            if (errno) throw_sys("readdir", display);
            return;
        }
        std::string_view n = e->d_name;
        if (n == "." || n == "..") continue;
        f(e->d_name, e->d_type);
    }
}

std::string read_link(int dirfd, const char* name, std::string_view subject) {
    std::string buf(256, '\0');
    for (;;) {
        ssize_t n = ::readlinkat(dirfd, name, buf.data(), buf.size());
        if (n < 0) throw_sys("readlink", subject);
        if (static_cast<size_t>(n) < buf.size()) {
            buf.resize(static_cast<size_t>(n));
            return buf;
        }
        buf.resize(buf.size() * 2);
    }
}

int64_t mtime_ns(const struct stat& st) {
    return static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
}

}  // namespace internal

namespace {

bool is_mount_root(int dirfd, const struct stat& parent_st, const struct stat& st) {
    struct statx stx;
    if (::statx(dirfd, "", AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW, STATX_TYPE, &stx) == 0 &&
        (stx.stx_attributes_mask & STATX_ATTR_MOUNT_ROOT))
        return (stx.stx_attributes & STATX_ATTR_MOUNT_ROOT) != 0;
    return st.st_dev != parent_st.st_dev;
}

// Removes the directory `name` in `parent` and everything below it, never following a link
// and never entering another mount.
void remove_tree_at(int parent, const struct stat& parent_st, const std::string& name,
                    const std::string& display) {
    UniqueFd dir(::openat(parent, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!dir) throw_sys("open", display);
    struct stat st;
    if (::fstat(dir.get(), &st) != 0) throw_sys("fstat", display);
    if (is_mount_root(dir.get(), parent_st, st)) throw_sys("remove", display, EXDEV);
    // Any depth with a bounded number of fds, never into another mount (base/remove_tree.h).
    remove_contents(dir.get(), display, /*same_mount=*/true);
    if (::unlinkat(parent, name.c_str(), AT_REMOVEDIR) != 0) throw_sys("rmdir", display);
}

}  // namespace

EntryStat stat_path(const Root& root, std::string_view path, bool follow) {
    EntryStat out;
    UniqueFd fd;
    try {
        fd = root.open_at(path, O_PATH | (follow ? 0 : O_NOFOLLOW));
    } catch (const SysError& e) {
        if (e.code() == ENOENT) return out;
        throw;
    }
    struct stat st;
    if (::fstat(fd.get(), &st) != 0) throw_sys("stat", path);
    if (S_ISREG(st.st_mode))
        out.type = EntryStat::Type::regular;
    else if (S_ISDIR(st.st_mode))
        out.type = EntryStat::Type::directory;
    else if (S_ISLNK(st.st_mode))
        out.type = EntryStat::Type::symlink;
    else
        out.type = EntryStat::Type::other;
    out.mode = st.st_mode & 07777;
    out.size = static_cast<uint64_t>(st.st_size);
    out.uid = st.st_uid;
    out.gid = st.st_gid;
    out.mtime_ns = internal::mtime_ns(st);
    if (out.type == EntryStat::Type::symlink)
        out.link_target = internal::read_link(fd.get(), "", path);
    return out;
}

bool make_dirs(const Root& root, std::string_view path, mode_t mode, const Ownership& owner) {
    return internal::make_dirs_tracked(root, path, mode, owner, nullptr);
}

void remove_path(const Root& root, std::string_view path, bool recursive) {
    check_path(path);
    size_t depth = 0;  // lexically: a path that names the root itself is refused
    for (auto comp : internal::split_path(path)) {
        if (comp == ".") continue;
        if (comp == "..") {
            if (depth > 0) --depth;
        } else {
            ++depth;
        }
    }
    if (depth == 0) throw_sys("remove", path, EBUSY);
    Root::Parent parent = root.open_parent(path);
    struct stat st;
    if (::fstatat(parent.dir.get(), parent.name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0)
        throw_sys("stat", path);
    if (!S_ISDIR(st.st_mode)) {
        if (::unlinkat(parent.dir.get(), parent.name.c_str(), 0) != 0) throw_sys("unlink", path);
        return;
    }
    if (!recursive) throw_sys("remove", path, EISDIR);
    struct stat parent_st;
    if (::fstat(parent.dir.get(), &parent_st) != 0) throw_sys("stat", path);
    remove_tree_at(parent.dir.get(), parent_st, parent.name, std::string(path));
}

}  // namespace berth::transfer
