#include "rootfs-tools/source_dir.h"

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>

#include "base/error.h"

namespace berth::images {

namespace {

// The permission class that applies to `caller` (owner, group, other), as the kernel picks
// it, and whether it grants `bit` (4 = read, 1 = search/execute).
bool permitted(const struct stat& st, const Caller& caller, unsigned bit) {
    if (caller.uid == 0) return true;
    unsigned shift = 0;
    if (st.st_uid == caller.uid) {
        shift = 6;
    } else if (st.st_gid == caller.gid || std::find(caller.groups.begin(), caller.groups.end(),
                                                    st.st_gid) != caller.groups.end()) {
        shift = 3;
    }
    return (st.st_mode >> shift) & bit;
}

std::vector<std::string> components(const std::string& rel, const std::string& where) {
    std::vector<std::string> out;
    size_t start = 0;
    while (start <= rel.size()) {
        size_t slash = rel.find('/', start);
        if (slash == std::string::npos) slash = rel.size();
        std::string c = rel.substr(start, slash - start);
        if (c.empty() || c == "." || c == ".." || c.find('\0') != std::string::npos)
            throw_sys("open", where, EINVAL);
        out.push_back(std::move(c));
        start = slash + 1;
    }
    return out;
}

}  // namespace

SourceDir::SourceDir(UniqueFd dir, std::string label, std::optional<Caller> caller)
    : dir_(std::move(dir)), label_(std::move(label)), caller_(std::move(caller)) {
    struct stat st;
    if (::fstat(dir_.get(), &st) != 0) throw_sys("stat", label_);
    if (!S_ISDIR(st.st_mode)) throw_sys("open", label_, ENOTDIR);
    if (caller_ && !permitted(st, *caller_, 1)) throw_sys("open", label_, EACCES);
    dev_ = st.st_dev;
}

UniqueFd SourceDir::open_component(int at, const std::string& name, bool directory,
                                   const std::string& rel) const {
    // O_NONBLOCK: a fifo planted in the directory must not hang the import on open().
    open_how how{};
    how.flags = O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | (directory ? O_DIRECTORY : 0);
    how.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV;
    int fd = static_cast<int>(::syscall(SYS_openat2, at, name.c_str(), &how, sizeof how));
    if (fd < 0 && errno == ENOSYS) {
        // Before Linux 5.6: one checked component with O_NOFOLLOW is the same walk; the
        // mount check is below.
        fd = ::openat(at, name.c_str(), static_cast<int>(how.flags));
    }
    if (fd < 0) {
        const int err = errno;
        // O_NOFOLLOW says ELOOP for a symlink, or ENOTDIR with O_DIRECTORY: say which.
        struct stat lst;
        if ((err == ELOOP || err == ENOTDIR) &&
            ::fstatat(at, name.c_str(), &lst, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(lst.st_mode))
            throw_sys("open", where(rel) + " (" + name + " is a symlink: never followed)", ELOOP);
        throw_sys("open", where(rel), err);
    }
    UniqueFd out(fd);
    struct stat st;
    if (::fstat(out.get(), &st) != 0) throw_sys("stat", where(rel));
    if (st.st_dev != dev_) throw_sys("open", where(rel), EXDEV);
    if (directory ? !S_ISDIR(st.st_mode) : !S_ISREG(st.st_mode))
        throw_sys("open",
                  where(rel) + " (not a " + (directory ? "directory" : "regular file") + ")",
                  EINVAL);
    if (caller_ && !permitted(st, *caller_, directory ? 1 : 4))
        throw_sys("open", where(rel) + " (as uid " + std::to_string(caller_->uid) + ")", EACCES);
    return out;
}

UniqueFd SourceDir::open_file(const std::string& rel) const {
    const auto parts = components(rel, where(rel));
    UniqueFd cur;
    int at = dir_.get();
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
        cur = open_component(at, parts[i], true, rel);
        at = cur.get();
    }
    UniqueFd file = open_component(at, parts.back(), false, rel);
    // Reads of a regular file never block anyway; clear it so it is a plain fd for others.
    const int flags = ::fcntl(file.get(), F_GETFL);
    if (flags < 0 || ::fcntl(file.get(), F_SETFL, flags & ~O_NONBLOCK) != 0)
        throw_sys("fcntl", where(rel));
    return file;
}

std::string SourceDir::read_file(const std::string& rel, uint64_t max_bytes) const {
    UniqueFd fd = open_file(rel);
    struct stat st;
    if (::fstat(fd.get(), &st) != 0) throw_sys("stat", where(rel));
    if (static_cast<uint64_t>(st.st_size) > max_bytes) throw_sys("read", where(rel), EFBIG);
    std::string out;
    out.resize(static_cast<size_t>(st.st_size));
    size_t got = 0;
    for (;;) {
        if (got == out.size()) out.resize(std::min<uint64_t>(max_bytes + 1, out.size() + 65536));
        const ssize_t n = check_sys("read", where(rel), [&] {
            return ::read(fd.get(), out.data() + got, out.size() - got);
        });
        if (n == 0) break;
        got += static_cast<size_t>(n);
        if (got > max_bytes) throw_sys("read", where(rel), EFBIG);
    }
    out.resize(got);
    return out;
}

bool SourceDir::has(const std::string& rel) const {
    try {
        open_file(rel);
        return true;
    } catch (const SysError& e) {
        if (e.code() == ENOENT) return false;
        throw;
    }
}

}  // namespace berth::images
