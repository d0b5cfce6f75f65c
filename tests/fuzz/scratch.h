// A scratch directory for the extraction targets, wiped after every input. As root it is
// a private tmpfs (nodev, nosuid) in a mount namespace of the fuzzer's own: the device
// nodes and whiteouts a layer makes cannot be opened, nothing reaches the host's
// filesystems, and an input that fills it fails with ENOSPC rather than filling a disk.
// Otherwise it is a directory under $TMPDIR (the extractor then hits EPERM where it
// chowns or makes nodes, which is still a path worth fuzzing).
#pragma once

#include <fcntl.h>
#include <sched.h>
#include <stdlib.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <system_error>

namespace berth::fuzz {

class Scratch {
  public:
    Scratch() {
        const char* tmp = ::getenv("TMPDIR");
        path_ = std::string(tmp && *tmp ? tmp : "/tmp") + "/berth-fuzz-XXXXXX";
        if (!::mkdtemp(path_.data())) {
            std::perror("mkdtemp");
            std::abort();
        }
        if (::geteuid() == 0 && ::unshare(CLONE_NEWNS) == 0 &&
            ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) == 0 &&
            ::mount("berth-fuzz", path_.c_str(), "tmpfs", MS_NODEV | MS_NOSUID,
                    "size=256m,mode=0700") == 0) {
            tmpfs_ = true;
        }
    }
    ~Scratch() {
        wipe();
        if (tmpfs_) ::umount2(path_.c_str(), MNT_DETACH);
        ::rmdir(path_.c_str());
    }
    Scratch(const Scratch&) = delete;
    Scratch& operator=(const Scratch&) = delete;

    const std::string& path() const { return path_; }

    // Removes everything below the scratch directory. An extraction that failed has rolled
    // back what it made; one that succeeded leaves its tree (with whatever modes the input
    // gave its directories: made writable first, or a non-root run could not remove them).
    void wipe() {
        namespace fs = std::filesystem;
        std::error_code ec;
        for (auto it = fs::recursive_directory_iterator(path_, ec);
             !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
            if (it->is_directory(ec) && !it->is_symlink(ec))
                ::chmod(it->path().c_str(), 0700);
        }
        for (const auto& e : fs::directory_iterator(path_, ec)) fs::remove_all(e.path(), ec);
        if (ec) {
            std::fprintf(stderr, "scratch %s: cannot wipe: %s\n", path_.c_str(),
                         ec.message().c_str());
            std::abort();
        }
    }

  private:
    std::string path_;
    bool tmpfs_ = false;
};

}  // namespace berth::fuzz
