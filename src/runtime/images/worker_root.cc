#include "runtime/images/worker_root.h"

#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <stdexcept>

namespace berth::images_service {

std::string worker_root_staging() {
    for (const char* dir : {"/tmp", "/var/tmp", "/mnt"}) {
        struct stat st;
        if (::stat(dir, &st) == 0 && S_ISDIR(st.st_mode) && (st.st_mode & S_IXOTH)) return dir;
    }
    throw std::runtime_error("no /tmp, /var/tmp or /mnt to make a worker's root over");
}

WorkerRoot make_worker_root(const std::string& staging, bool proc) {
    namespace fs = std::filesystem;
    WorkerRoot r;
    r.staging = staging;
    auto add_dirs = [&](const std::string& abs) {  // every component of abs, under staging
        std::string at = staging;
        for (const auto& part : fs::path(abs).relative_path()) {
            at += "/" + part.string();
            if (std::find(r.dirs.begin(), r.dirs.end(), at) == r.dirs.end()) r.dirs.push_back(at);
        }
    };
    for (const char* top : {"/usr", "/etc"}) {
        add_dirs(top);
        r.binds.push_back({top, staging + top, MS_NODEV});
    }
    for (const char* top : {"/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32"}) {
        std::error_code ec;
        const auto st = fs::symlink_status(top, ec);
        if (ec) continue;
        if (fs::is_symlink(st)) {
            r.links.emplace_back(fs::read_symlink(top).string(), staging + top);
        } else if (fs::is_directory(st)) {
            add_dirs(top);
            r.binds.push_back({top, staging + top, MS_NODEV});
        }
    }
    // A resolver configuration kept elsewhere (systemd-resolved: /run/systemd/resolve).
    std::error_code ec;
    if (fs::is_symlink(fs::symlink_status("/etc/resolv.conf", ec))) {
        const fs::path target = fs::canonical("/etc/resolv.conf", ec);
        const std::string dir = target.parent_path().string();
        if (!ec && dir.rfind("/etc", 0) != 0 && dir.rfind("/usr", 0) != 0 && dir != "/") {
            add_dirs(dir);
            r.binds.push_back({dir, staging + dir, MS_NODEV});
        }
    }
    add_dirs("/dev");
    for (const char* node : {"/dev/null", "/dev/zero", "/dev/random", "/dev/urandom"}) {
        r.files.push_back(staging + node);
        r.binds.push_back({node, staging + node, 0});
    }
    if (proc) {
        add_dirs("/proc");
        r.proc = staging + "/proc";
    }
    r.old_root = staging + "/.old";
    return r;
}

int enter_worker_root(const WorkerRoot& root) {
    if (::mount("tmpfs", root.staging.c_str(), "tmpfs", MS_NOSUID | MS_NODEV,
                "size=64k,nr_inodes=256,mode=0755") != 0)
        return 1;
    for (const auto& d : root.dirs)
        if (::mkdir(d.c_str(), 0755) != 0 && errno != EEXIST) return 2;
    for (const auto& f : root.files) {
        const int fd = ::open(f.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
        if (fd < 0) return 3;
        ::close(fd);
    }
    for (const auto& b : root.binds) {
        if (::mount(b.from.c_str(), b.to.c_str(), nullptr, MS_BIND | MS_REC, nullptr) != 0)
            return 4;
        // Read-only, keeping what the original's mount says of atime and exec: in a user
        // namespace those flags are locked, and a remount that changed them is refused.
        struct statvfs sv;
        if (::statvfs(b.to.c_str(), &sv) != 0) return 5;
        unsigned long keep = 0;
        if (sv.f_flag & ST_NOATIME) keep |= MS_NOATIME;
        if (sv.f_flag & ST_NODIRATIME) keep |= MS_NODIRATIME;
        if (sv.f_flag & ST_RELATIME) keep |= MS_RELATIME;
        if (sv.f_flag & ST_NOEXEC) keep |= MS_NOEXEC;
        if (sv.f_flag & ST_NODEV) keep |= MS_NODEV;
        if (::mount(nullptr, b.to.c_str(), nullptr,
                    MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | b.extra_flags | keep,
                    nullptr) != 0)
            return 5;
    }
    for (const auto& [target, path] : root.links)
        if (::symlink(target.c_str(), path.c_str()) != 0) return 6;
    if (!root.proc.empty() &&
        ::mount("proc", root.proc.c_str(), "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr) != 0)
        return 7;
    if (::mkdir(root.old_root.c_str(), 0700) != 0) return 8;
    if (::syscall(SYS_pivot_root, root.staging.c_str(), root.old_root.c_str()) != 0) return 9;
    if (::chdir("/") != 0) return 10;
    if (::umount2("/.old", MNT_DETACH) != 0) return 11;
    if (::rmdir("/.old") != 0) return 12;
    if (::mount(nullptr, "/", nullptr, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV,
                nullptr) != 0)
        return 13;
    return 0;
}

}  // namespace berth::images_service
