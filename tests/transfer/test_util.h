// Helpers for the transfer tests: scratch directories, files, a private mount namespace.
#pragma once

#include <fcntl.h>
#include <ftw.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "base/error.h"
#include "base/files.h"
#include "transfer/root.h"

namespace berth::transfer::testing {

// The whole test program runs in its own mount namespace (set up before any thread
// exists), so tests can mount procfs and small tmpfs without touching the host.
class PrivateMountNs : public ::testing::Environment {
  public:
    void SetUp() override {
        ::signal(SIGPIPE, SIG_IGN);  // a stream reader that stops early: EPIPE, not death
        if (::unshare(CLONE_NEWNS) == 0 &&
            ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) == 0)
            available = true;
    }
    static inline bool available = false;
};

class TempDir {
  public:
    TempDir() {
        char tmpl[] = "/tmp/berth-transfer-test.XXXXXX";
        if (!::mkdtemp(tmpl)) throw_sys("mkdtemp", tmpl);
        path_ = tmpl;
    }
    ~TempDir() {
        // Unmount anything left below, then remove.
        std::string cmd = "umount -R -l '" + path_ + "' 2>/dev/null; chmod -R u+rwx '" + path_ +
                          "' 2>/dev/null; rm -rf '" + path_ + "'";
        (void)std::system(cmd.c_str());
    }
    const std::string& path() const { return path_; }
    std::string operator/(const std::string& rel) const { return path_ + "/" + rel; }

  private:
    std::string path_;
};

inline void write_file(const std::string& path, const std::string& data, mode_t mode = 0644) {
    UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode));
    if (!fd) throw_sys("open", path);
    size_t off = 0;
    while (off < data.size()) {
        ssize_t n = ::write(fd.get(), data.data() + off, data.size() - off);
        if (n < 0) throw_sys("write", path);
        off += static_cast<size_t>(n);
    }
}

inline std::string read_file_or(const std::string& path,
                                const std::string& fallback = "<missing>") {
    try {
        return berth::read_file(path);
    } catch (const SysError&) {
        return fallback;
    }
}

inline bool exists(const std::string& path) {
    struct stat st;
    return ::lstat(path.c_str(), &st) == 0;
}

inline void mkdir_p(const std::string& path) {
    berth::make_dirs(path, 0755);
}

inline void symlink_(const std::string& target, const std::string& path) {
    if (::symlink(target.c_str(), path.c_str()) != 0) throw_sys("symlink", path);
}

inline std::string fd_content(int fd) {
    std::string out;
    char buf[4096];
    ssize_t n;
    while ((n = ::pread(fd, buf, sizeof buf, static_cast<off_t>(out.size()))) > 0)
        out.append(buf, static_cast<size_t>(n));
    return out;
}

inline std::vector<Resolver> resolvers() {
    std::vector<Resolver> r{Resolver::walk};
    if (openat2_available()) r.push_back(Resolver::openat2);
    return r;
}

inline std::string resolver_name(const ::testing::TestParamInfo<Resolver>& info) {
    return info.param == Resolver::walk ? "walk" : "openat2";
}

// Runs `fn` expecting a SysError; returns its errno (0 if none was thrown).
template <typename F>
int error_of(F&& fn, std::string* what = nullptr) {
    try {
        fn();
    } catch (const SysError& e) {
        if (what) *what = e.what();
        return e.code();
    }
    return 0;
}

}  // namespace berth::transfer::testing
