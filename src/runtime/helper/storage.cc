#include "runtime/helper/storage.h"

#include <fcntl.h>
#include <linux/dqblk_xfs.h>
#include <linux/fs.h>
#include <linux/mount.h>
#include <linux/quota.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/sysinfo.h>
#include <unistd.h>

#include <cstdio>
#include <functional>

#include "base/error.h"
#include "base/size.h"
#include "runtime/helper/sandbox_factory.h"

namespace berth::helper {

namespace {

constexpr v1::ErrorCode kInvalidArgument = v1::INVALID_ARGUMENT,
                        kResourceExhausted = v1::RESOURCE_EXHAUSTED;

// Project ids berth hands out: above the small ids admins give by hand (/etc/projid), below
// 2^31 (some tools print ids as signed).
constexpr uint32_t kFirstProject = 1u << 24, kProjectSpan = (1u << 31) - kFirstProject;

long quotactl_fd(int fd, unsigned cmd, int type, uint32_t id, void* addr) {
    return ::syscall(SYS_quotactl_fd, fd, QCMD(cmd, type), id, addr);
}

// True where the filesystem of `fd` accounts and enforces project quotas. Any failure
// (ENOSYS: no quota in this kernel; ESRCH/ENOTSUP/EINVAL: none on this filesystem) means no.
bool project_quota_enforced(int fd) {
    fs_quota_stat st{};
    if (quotactl_fd(fd, Q_XGETQSTAT, PRJQUOTA, 0, &st) != 0) return false;
    return (st.qs_flags & FS_QUOTA_PDQ_ACCT) && (st.qs_flags & FS_QUOTA_PDQ_ENFD);
}

}  // namespace

uint64_t storage_inode_limit(uint64_t bytes) {
    return std::max<uint64_t>(bytes / (16 << 10), 4096);
}

Storage::Storage(std::string dir)
    : dir_(std::move(dir)), dir_fd_(check_sys("open", dir_, [&] {
          return ::open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
      })) {
    backend_ = project_quota_enforced(dir_fd_.get()) ? StorageBackend::project_quota
                                                     : StorageBackend::tmpfs;
}

void Storage::check(uint64_t bytes) const {
    if (backend_ == StorageBackend::project_quota) {
        struct statvfs st;
        check_sys("statvfs", dir_, [&] { return ::fstatvfs(dir_fd_.get(), &st); });
        const uint64_t total = static_cast<uint64_t>(st.f_blocks) * st.f_frsize;
        if (bytes > total) {
            throw HelperError(kInvalidArgument, "storage: " + std::to_string(bytes) +
                                                    " bytes is more than the " +
                                                    "state filesystem holds (" +
                                                    format_size(total) + ", " + dir_ + ")");
        }
        return;
    }
    struct sysinfo si {};
    check_sys("sysinfo", "memory", [&] { return ::sysinfo(&si); });
    const uint64_t memory = (static_cast<uint64_t>(si.totalram) + si.totalswap) * si.mem_unit;
    if (bytes > memory) {
        throw HelperError(kInvalidArgument,
                          "storage: " + std::to_string(bytes) + " bytes is more than this " +
                              "host's memory and swap (" + format_size(memory) +
                              "), which hold a bounded writable layer here (a tmpfs: the " +
                              "state filesystem " + dir_ + " has no project quota)");
    }
}

uint32_t Storage::limit_project(const std::vector<std::string>& dirs, uint64_t bytes) {
    // A free id is one the quota knows nothing of: no usage, no limits. One whose layer the
    // janitor has yet to remove still counts usage (its limit went at delete), so it is not
    // handed out again until it is gone. Ids start at a hash of the first dir (the sandbox's
    // id is in it) so that a helper restart does not walk the same crowded range first.
    uint32_t start = static_cast<uint32_t>(std::hash<std::string>{}(dirs.at(0)) % kProjectSpan);
    uint32_t project = 0;
    for (uint32_t i = 0; i < 4096 && project == 0; ++i) {
        const uint32_t candidate = kFirstProject + (start + i) % kProjectSpan;
        if_dqblk q{};
        if (quotactl_fd(dir_fd_.get(), Q_GETQUOTA, PRJQUOTA, candidate, &q) != 0) {
            if (errno == ENOENT || errno == ESRCH)
                project = candidate;  // never used
            else
                throw_sys("quotactl Q_GETQUOTA", dir_ + " project " + std::to_string(candidate));
            continue;
        }
        if (q.dqb_curspace == 0 && q.dqb_curinodes == 0 && q.dqb_bhardlimit == 0 &&
            q.dqb_ihardlimit == 0 && q.dqb_bsoftlimit == 0 && q.dqb_isoftlimit == 0)
            project = candidate;
    }
    if (project == 0)
        throw HelperError(kResourceExhausted, "no free project quota id under " + dir_);

    // The limit first: the dirs are empty, and from the moment they carry the id nothing may
    // be written without it.
    if_dqblk q{};
    q.dqb_bhardlimit = (bytes + QIF_DQBLKSIZE - 1) / QIF_DQBLKSIZE;
    q.dqb_ihardlimit = storage_inode_limit(bytes);
    q.dqb_valid = QIF_LIMITS;
    if (quotactl_fd(dir_fd_.get(), Q_SETQUOTA, PRJQUOTA, project, &q) != 0)
        throw_sys("quotactl Q_SETQUOTA", dir_ + " project " + std::to_string(project));
    try {
        for (const std::string& dir : dirs) {
            UniqueFd fd(check_sys("open", dir, [&] {
                return ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            }));
            fsxattr attr{};
            check_sys("ioctl FS_IOC_FSGETXATTR", dir,
                      [&] { return ::ioctl(fd.get(), FS_IOC_FSGETXATTR, &attr); });
            attr.fsx_projid = project;
            attr.fsx_xflags |= FS_XFLAG_PROJINHERIT;
            check_sys("ioctl FS_IOC_FSSETXATTR", dir,
                      [&] { return ::ioctl(fd.get(), FS_IOC_FSSETXATTR, &attr); });
        }
    } catch (...) {
        release_project(project);
        throw;
    }
    return project;
}

void Storage::release_project(uint32_t project_id) {
    if_dqblk q{};
    q.dqb_valid = QIF_LIMITS;  // all zero: no limits
    if (quotactl_fd(dir_fd_.get(), Q_SETQUOTA, PRJQUOTA, project_id, &q) != 0)
        throw_sys("quotactl Q_SETQUOTA", dir_ + " project " + std::to_string(project_id));
}

UniqueFd Storage::make_tmpfs(uint64_t bytes) const {
    UniqueFd fs(check_sys("fsopen", "tmpfs", [] { return ::fsopen("tmpfs", FSOPEN_CLOEXEC); }));
    const std::string size = std::to_string(bytes),
                      inodes = std::to_string(storage_inode_limit(bytes));
    const std::pair<const char*, const char*> opts[] = {
        {"size", size.c_str()}, {"nr_inodes", inodes.c_str()}, {"mode", "0755"}};
    for (const auto& [key, value] : opts) {
        check_sys("fsconfig", std::string("tmpfs ") + key + "=" + value,
                  [&] { return ::fsconfig(fs.get(), FSCONFIG_SET_STRING, key, value, 0); });
    }
    check_sys("fsconfig create", "tmpfs",
              [&] { return ::fsconfig(fs.get(), FSCONFIG_CMD_CREATE, nullptr, nullptr, 0); });
    return UniqueFd(check_sys("fsmount", "tmpfs", [&] {
        return ::fsmount(fs.get(), FSMOUNT_CLOEXEC, MOUNT_ATTR_NODEV | MOUNT_ATTR_NOSUID);
    }));
}

StorageCount storage_count(int fd, const std::string& what) {
    struct statfs st;
    check_sys("fstatfs", what, [&] { return ::fstatfs(fd, &st); });
    StorageCount count;
    count.total_bytes = static_cast<uint64_t>(st.f_blocks) * st.f_bsize;
    count.used_bytes = static_cast<uint64_t>(st.f_blocks - st.f_bfree) * st.f_bsize;
    return count;
}

}  // namespace berth::helper
