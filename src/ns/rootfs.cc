#include "ns/rootfs.h"

#include <fcntl.h>
#include <linux/mount.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <vector>

#include "base/child_process.h"
#include "base/error.h"
#include "base/files.h"
#include "base/pipe.h"

namespace berth::ns {

namespace {

// Host device nodes that a sandbox may use. Creating device nodes needs CAP_MKNOD in the
// initial user namespace, so they are bind mounts of the host's nodes instead.
constexpr std::array<const char*, 6> kDevices = {"null",   "zero",    "full",
                                                 "random", "urandom", "tty"};

// Docker's masked paths: files get /dev/null over them, directories an empty read-only tmpfs.
constexpr std::array<const char*, 12> kMaskedPaths = {"/proc/asound",
                                                      "/proc/acpi",
                                                      "/proc/kcore",
                                                      "/proc/keys",
                                                      "/proc/latency_stats",
                                                      "/proc/timer_list",
                                                      "/proc/timer_stats",
                                                      "/proc/sched_debug",
                                                      "/proc/scsi",
                                                      "/sys/firmware",
                                                      "/sys/devices/virtual/powercap",
                                                      "/proc/interrupts"};

constexpr std::array<const char*, 5> kReadOnlyPaths = {"/proc/bus", "/proc/fs", "/proc/irq",
                                                       "/proc/sys", "/proc/sysrq-trigger"};

// `optional_flag`, if given, is set where the kernel knows it and skipped where it does not.
UniqueFd new_filesystem(const char* type,
                        const std::vector<std::pair<const char*, const char*>>& opts,
                        unsigned attrs, const char* optional_flag = nullptr) {
    UniqueFd fs(check_sys("fsopen", type, [&] { return ::fsopen(type, FSOPEN_CLOEXEC); }));
    for (const auto& [key, value] : opts) {
        check_sys("fsconfig", std::string(type) + " " + key, [&] {
            return value ? ::fsconfig(fs.get(), FSCONFIG_SET_STRING, key, value, 0)
                         : ::fsconfig(fs.get(), FSCONFIG_SET_FLAG, key, nullptr, 0);
        });
    }
    if (optional_flag && ::fsconfig(fs.get(), FSCONFIG_SET_FLAG, optional_flag, nullptr, 0) != 0 &&
        errno != EINVAL) {
        throw_sys("fsconfig", std::string(type) + " " + optional_flag);
    }
    check_sys("fsconfig create", type,
              [&] { return ::fsconfig(fs.get(), FSCONFIG_CMD_CREATE, nullptr, nullptr, 0); });
    return UniqueFd(
        check_sys("fsmount", type, [&] { return ::fsmount(fs.get(), FSMOUNT_CLOEXEC, attrs); }));
}

void attach(int mount_fd, const std::string& target) {
    check_sys("move_mount", target, [&] {
        return ::move_mount(mount_fd, "", AT_FDCWD, target.c_str(), MOVE_MOUNT_F_EMPTY_PATH);
    });
}

void ensure_dir(const std::string& path, mode_t mode = 0755) {
    if (::mkdir(path.c_str(), mode) != 0 && errno != EEXIST) throw_sys("mkdir", path);
}

void ensure_file(const std::string& path) {
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0 && errno != EEXIST) throw_sys("create", path);
    if (fd >= 0) ::close(fd);
}

void ensure_symlink(const char* target, const std::string& path) {
    if (::symlink(target, path.c_str()) != 0 && errno != EEXIST) throw_sys("symlink", path);
}

void mount_tmpfs(const std::string& target, const char* options, unsigned long flags) {
    check_sys("mount tmpfs", target,
              [&] { return ::mount("tmpfs", target.c_str(), "tmpfs", flags, options); });
}

void make_read_only(const std::string& path) {
    if (::mount(path.c_str(), path.c_str(), nullptr, MS_BIND | MS_REC, nullptr) != 0) {
        if (errno == ENOENT) return;  // not every kernel has every /proc file
        throw_sys("bind", path);
    }
    mount_attr attr{};
    attr.attr_set = MOUNT_ATTR_RDONLY;
    check_sys("mount_setattr ro", path, [&] {
        return ::mount_setattr(AT_FDCWD, path.c_str(), AT_RECURSIVE, &attr, sizeof attr);
    });
}

void mask(const std::string& path) {
    struct stat st;
    if (::lstat(path.c_str(), &st) != 0) return;  // absent: nothing to hide
    if (S_ISDIR(st.st_mode)) {
        mount_tmpfs(path, "size=0,mode=755", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC);
    } else {
        check_sys("mask", path,
                  [&] { return ::mount("/dev/null", path.c_str(), nullptr, MS_BIND, nullptr); });
    }
}

// The provided files live on one small tmpfs of the sandbox's own (bounded, charged to the
// sandbox's memory, nothing on the host's disks, owned by its root), each bind-mounted over
// its path. Runs right after the pivot, before /proc and /dev exist: every path resolves
// inside the image's own tree (a symlinked /etc included), and no process of the sandbox
// runs yet.
void provide_files(const std::vector<ProvidedFile>& files) {
    UniqueFd store =
        new_filesystem("tmpfs", {{"size", "1m"}, {"nr_inodes", "64"}, {"mode", "0755"}},
                       MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC);
    // Kernels before 6.15 refuse to clone from a mount that is not attached (open_tree:
    // EINVAL), so the store is attached for the span of this function where /proc goes
    // next: a mountpoint anyway, whose image contents nothing sees.
    ensure_dir("/proc", 0555);
    attach(store.get(), "/proc");
    for (size_t i = 0; i < files.size(); ++i) {
        const ProvidedFile& file = files[i];
        const std::string name = std::to_string(i);
        {
            UniqueFd out(check_sys("create", "provided " + file.path, [&] {
                return ::openat(store.get(), name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC,
                                0644);
            }));
            write_all(out.get(), file.content, "provided " + file.path);
        }
        UniqueFd bind(check_sys("open_tree", "provided " + file.path, [&] {
            return ::open_tree(store.get(), name.c_str(), OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
        }));
        const std::string parent = file.path.substr(0, file.path.rfind('/'));
        if (!parent.empty()) ensure_dir(parent);
        // The mountpoint is a regular file of the path's own: the image's, or a new empty
        // one in the writable layer. A symlink there (Ubuntu's resolv.conf points into
        // /run, often at nothing) is replaced in the writable layer, so that berth's file
        // is the path itself and never lands on whatever the link names.
        // (An existing file is never opened for writing: that would copy it up.)
        struct stat st;
        bool make = false;
        if (::lstat(file.path.c_str(), &st) == 0) {
            if (S_ISLNK(st.st_mode)) {
                check_sys("unlink", file.path + " (a symlink)",
                          [&] { return ::unlink(file.path.c_str()); });
                make = true;
            } else if (!S_ISREG(st.st_mode)) {
                throw Error(Error::Kind::invalid_argument,
                            "the image's " + file.path +
                                " is not a regular file: berth mounts its own over it");
            }
        } else if (errno == ENOENT) {
            make = true;
        } else {
            throw_sys("lstat", file.path);
        }
        if (make) {
            int fd = ::open(file.path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
            if (fd < 0) throw_sys("create", file.path);
            ::close(fd);
        }
        check_sys("move_mount", file.path, [&] {
            return ::move_mount(bind.get(), "", AT_FDCWD, file.path.c_str(),
                                MOVE_MOUNT_F_EMPTY_PATH);
        });
    }
    // The binds keep the store alive.
    check_sys("umount2", "/proc (the provided files' store)",
              [] { return ::umount2("/proc", MNT_DETACH); });
}

}  // namespace

UniqueFd make_userns_fd(const IdMapping& mapping) {
    // A short-lived child unshares a user namespace; we map it and keep a handle to it.
    Pipe ready = make_pipe("userns template"), done = make_pipe("userns template");
    const int ready_write = ready.write.get(), done_read = done.read.get();
    // (Our end of `done` is not the child's: its read below sees EOF when we close ours.)
    ChildProcess child = ChildProcess::fork("userns template", {ready_write, done_read}, [&] {
        char byte = ::unshare(CLONE_NEWUSER) == 0 ? 'k' : 'e';
        if (::write(ready_write, &byte, 1) != 1) return 1;
        ssize_t ignored = ::read(done_read, &byte, 1);  // until the parent is done
        (void)ignored;
        return 0;
    });
    ready.write.reset();
    done.read.reset();
    UniqueFd& ready_read = ready.read;
    UniqueFd& done_write = done.write;
    char byte = 0;
    ssize_t n = ::read(ready_read.get(), &byte, 1);
    UniqueFd result;
    std::string error = "the child could not unshare CLONE_NEWUSER";
    if (n == 1 && byte == 'k') {
        try {
            write_id_maps(child.pid(), mapping);
            const std::string ns = "/proc/" + std::to_string(child.pid()) + "/ns/user";
            result.reset(
                check_sys("open", ns, [&] { return ::open(ns.c_str(), O_RDONLY | O_CLOEXEC); }));
        } catch (const SysError& e) {
            error = e.what();
        }
    }
    done_write.reset();
    child.wait();
    if (!result) throw std::runtime_error("cannot create the template user namespace: " + error);
    return result;
}

UniqueFd make_idmapped_tree(int dir_fd, const std::string& dir, int userns_fd) {
    UniqueFd tree(check_sys("open_tree", dir, [&] {
        return ::open_tree(dir_fd, "",
                           AT_EMPTY_PATH | OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE);
    }));
    mount_attr attr{};
    // nodev: a device node in the directory (a block device of the host's disk) must not
    // open as a device through the sandbox's view of it.
    attr.attr_set = MOUNT_ATTR_IDMAP | MOUNT_ATTR_RDONLY | MOUNT_ATTR_NODEV;
    attr.userns_fd = static_cast<uint64_t>(userns_fd);
    check_sys("mount_setattr idmap", dir, [&] {
        return ::mount_setattr(tree.get(), "", AT_EMPTY_PATH | AT_RECURSIVE, &attr, sizeof attr);
    });
    return tree;
}

UniqueFd make_overlay(int lower_fd, const std::string& upper, const std::string& work,
                      const std::string& staging_dir) {
    // Kernels before 6.5 cannot take a detached mount as a layer ("failed to clone
    // lowerpath"): attach it in our (the helper's private) mount namespace for as long as
    // the overlay takes to make, which holds its own clone of it afterwards.
    attach(lower_fd, staging_dir);
    UniqueFd overlay;
    try {
        // volatile: the writable layer is thrown away with the sandbox and cannot outlive a
        // host crash (the runtime state is gone then), so syncing it buys nothing. Without
        // it, unmounting the overlay when the sandbox dies syncs the whole upper filesystem
        // (writeback, a journal commit, a disk cache flush: 2-10 ms of every delete), and a
        // sync or fsync in one sandbox flushes the host filesystem under all of them.
        // Kernels before 5.10 do not know it and sync as before.
        overlay = new_filesystem("overlay",
                                 {{"lowerdir", staging_dir.c_str()},
                                  {"upperdir", upper.c_str()},
                                  {"workdir", work.c_str()},
                                  {"index", "off"},
                                  {"metacopy", "off"}},
                                 MOUNT_ATTR_NODEV, "volatile");
    } catch (...) {
        ::umount2(staging_dir.c_str(), MNT_DETACH);
        throw;
    }
    check_sys("umount2", staging_dir, [&] { return ::umount2(staging_dir.c_str(), MNT_DETACH); });
    return overlay;
}

UniqueFd make_layered_overlay(const std::vector<std::string>& lowers, const std::string& upper,
                              const std::string& work, const std::string& staging_dir) {
    if (lowers.empty()) throw std::invalid_argument("an overlay needs at least one lower layer");
    for (const auto& dir : lowers) {
        // overlayfs splits lowerdir on ':' and options on ','; a path with either (or an
        // escape) would be read as something else.
        if (dir.find_first_of(":,\\") != std::string::npos)
            throw std::invalid_argument("layer path '" + dir + "' holds ':', ',' or '\\'");
    }
    // Kernels since 6.8 take the layers one at a time ("lowerdir+"), which has no length
    // limit. Older ones take one "lowerdir=a:b:c" string, and fsconfig() cuts strings at 256
    // bytes (two layer paths), so there the overlay is made with mount(2), whose option
    // page holds ~40 layers, on the staging dir and then cloned off it.
    UniqueFd fs(check_sys("fsopen", "overlay", [] { return ::fsopen("overlay", FSOPEN_CLOEXEC); }));
    bool append_ok = true;
    for (const auto& dir : lowers) {
        if (::fsconfig(fs.get(), FSCONFIG_SET_STRING, "lowerdir+", dir.c_str(), 0) == 0) continue;
        if (errno != EINVAL || &dir != &lowers.front()) throw_sys("fsconfig lowerdir+", dir);
        append_ok = false;
        break;
    }
    if (append_ok) {
        const std::pair<const char*, const char*> opts[] = {{"upperdir", upper.c_str()},
                                                            {"workdir", work.c_str()},
                                                            {"index", "off"},
                                                            {"metacopy", "off"}};
        for (const auto& [key, value] : opts) {
            check_sys("fsconfig", std::string("overlay ") + key,
                      [&] { return ::fsconfig(fs.get(), FSCONFIG_SET_STRING, key, value, 0); });
        }
        // See make_overlay for why the upper layer is volatile.
        ::fsconfig(fs.get(), FSCONFIG_SET_FLAG, "volatile", nullptr, 0);
        // Image layers are unpacked in a user namespace, which can write only the user.*
        // form of overlay's xattrs (user.overlay.opaque; image store format 2).
        check_sys("fsconfig", "overlay userxattr",
                  [&] { return ::fsconfig(fs.get(), FSCONFIG_SET_FLAG, "userxattr", nullptr, 0); });
        // Before 6.5 overlay takes the new API's keys as legacy text (any key is accepted)
        // and refuses "lowerdir+" only here: then mount(2) as below.
        if (::fsconfig(fs.get(), FSCONFIG_CMD_CREATE, nullptr, nullptr, 0) == 0) {
            return UniqueFd(check_sys("fsmount", "overlay", [&] {
                return ::fsmount(fs.get(), FSMOUNT_CLOEXEC, MOUNT_ATTR_NODEV);
            }));
        }
        if (errno != EINVAL) throw_sys("fsconfig create", "overlay");
    }
    std::string data = "lowerdir=";
    for (size_t i = 0; i < lowers.size(); ++i) data += (i ? ":" : "") + lowers[i];
    data +=
        ",upperdir=" + upper + ",workdir=" + work + ",index=off,metacopy=off,volatile,userxattr";
    if (data.size() >= 4096) {
        throw std::invalid_argument("an image of " + std::to_string(lowers.size()) +
                                    " layers is too deep for this kernel's overlay options "
                                    "(Linux 6.8 or later has no such limit)");
    }
    check_sys("mount overlay", staging_dir, [&] {
        return ::mount("overlay", staging_dir.c_str(), "overlay", MS_NODEV, data.c_str());
    });
    UniqueFd tree(::open_tree(AT_FDCWD, staging_dir.c_str(), OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC));
    const int saved = errno;
    ::umount2(staging_dir.c_str(), MNT_DETACH);
    if (!tree) throw SysError("open_tree", staging_dir, saved);
    return tree;
}

void enter_rootfs(int overlay_fd, const std::string& mountpoint,
                  const std::vector<ProvidedFile>& files) {
    // Nothing we mount may propagate back to the host.
    check_sys("mount", "/ (rslave)",
              [] { return ::mount(nullptr, "/", nullptr, MS_REC | MS_SLAVE, nullptr); });

    // Filesystems that must be created while a full /proc is still visible (the kernel
    // refuses a new proc or sysfs in a user namespace that could not see one), and the
    // host device nodes to bind: all as detached mounts, attached after the pivot, so every
    // target path resolves inside the new root whatever symlinks the image holds.
    UniqueFd proc =
        new_filesystem("proc", {}, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC);
    UniqueFd sys = new_filesystem(
        "sysfs", {}, MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC);
    std::vector<UniqueFd> devices;
    for (const char* name : kDevices) {
        const std::string host = std::string("/dev/") + name;
        devices.emplace_back(check_sys("open_tree", host, [&] {
            return ::open_tree(AT_FDCWD, host.c_str(), OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
        }));
    }

    attach(overlay_fd, mountpoint);
    check_sys("fchdir", "overlay root", [&] { return ::fchdir(overlay_fd); });
    check_sys("pivot_root", "overlay root", [] { return ::syscall(SYS_pivot_root, ".", "."); });
    check_sys("umount2", "old root", [] { return ::umount2(".", MNT_DETACH); });
    check_sys("chdir", "/", [] { return ::chdir("/"); });
    provide_files(files);

    ensure_dir("/proc", 0555);
    attach(proc.get(), "/proc");

    ensure_dir("/dev");
    // nodev: the device nodes here are binds of the host's, each its own mount.
    mount_tmpfs("/dev", "mode=755,size=65536k", MS_NOSUID | MS_NODEV | MS_NOEXEC);
    for (size_t i = 0; i < kDevices.size(); ++i) {
        const std::string path = std::string("/dev/") + kDevices[i];
        ensure_file(path);
        attach(devices[i].get(), path);
    }
    ensure_dir("/dev/pts");
    check_sys("mount devpts", "/dev/pts", [] {
        return ::mount("devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC,
                       "newinstance,ptmxmode=0666,mode=0620");
    });
    ensure_symlink("pts/ptmx", "/dev/ptmx");
    ensure_dir("/dev/shm", 01777);
    mount_tmpfs("/dev/shm", "mode=1777,size=65536k", MS_NOSUID | MS_NODEV | MS_NOEXEC);
    ensure_dir("/dev/mqueue");
    check_sys("mount mqueue", "/dev/mqueue", [] {
        return ::mount("mqueue", "/dev/mqueue", "mqueue", MS_NOSUID | MS_NODEV | MS_NOEXEC,
                       nullptr);
    });
    ensure_symlink("/proc/self/fd", "/dev/fd");
    ensure_symlink("/proc/self/fd/0", "/dev/stdin");
    ensure_symlink("/proc/self/fd/1", "/dev/stdout");
    ensure_symlink("/proc/self/fd/2", "/dev/stderr");
    ensure_symlink("/proc/kcore", "/dev/core");

    ensure_dir("/sys");
    attach(sys.get(), "/sys");

    for (const char* path : kMaskedPaths) mask(path);
    for (const char* path : kReadOnlyPaths) make_read_only(path);
}

}  // namespace berth::ns
