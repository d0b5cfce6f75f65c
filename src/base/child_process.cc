#include "base/child_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <string>

#include "base/error.h"

namespace berth {

namespace {

// In the child: no allocation (see fork's comment), `sorted` was made before the fork.
void close_all_but(const std::vector<int>& sorted) {
    unsigned next = 0;
    for (int fd : sorted) {
        if (fd < 0) continue;
        if (static_cast<unsigned>(fd) > next) ::syscall(SYS_close_range, next, fd - 1U, 0U);
        next = std::max(next, static_cast<unsigned>(fd) + 1);
    }
    ::syscall(SYS_close_range, next, ~0U, 0U);
}

}  // namespace

ChildProcess& ChildProcess::operator=(ChildProcess&& other) noexcept {
    if (this != &other) {
        if (pidfd_ && !reaped_) kill_and_wait();
        pid_ = std::exchange(other.pid_, -1);
        pidfd_ = std::move(other.pidfd_);
        reaped_ = std::exchange(other.reaped_, false);
        status_ = other.status_;
    }
    return *this;
}

ChildProcess::~ChildProcess() {
    if (pidfd_ && !reaped_) kill_and_wait();
}

ChildProcess ChildProcess::fork(std::string_view what, const std::vector<int>& keep,
                                const std::function<int()>& body) {
    std::vector<int> sorted = keep;
    sorted.insert(sorted.end(), {0, 1, 2});
    std::sort(sorted.begin(), sorted.end());
    // The child waits for a byte on `go` until the parent holds its pidfd: a parent that
    // ignores SIGCHLD (berth-helper) has its children reaped by the kernel the moment they
    // exit, and a child quicker than pidfd_open would be gone, its pid free for reuse.
    int go[2];
    check_sys("pipe2", what, [&] { return ::pipe2(go, O_CLOEXEC); });
    UniqueFd go_read(go[0]), go_write(go[1]);
    const pid_t pid = check_sys("fork", what, [] { return ::fork(); });
    if (pid == 0) {
        int status = 1;
        try {
            char byte = 0;
            ssize_t n;
            do {
                n = ::read(go_read.get(), &byte, 1);
            } while (n < 0 && errno == EINTR);
            if (n != 1) ::_exit(1);  // the parent failed (or died) before it let us go
            close_all_but(sorted);   // go's ends are not in `keep`
            status = body();
        } catch (const std::exception& e) {
            std::fprintf(stderr, "%.*s: %s\n", static_cast<int>(what.size()), what.data(),
                         e.what());
        }
        ::_exit(status);
    }
    go_read.reset();
    // Our child's pid is not another process's until the child is reaped, and it cannot
    // exit before it reads `go`: this pidfd is its.
    int fd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
    if (fd < 0) {
        const int err = errno;
        ::kill(pid, SIGKILL);
        ::waitpid(pid, nullptr, 0);
        throw_sys("pidfd_open", what, err);
    }
    UniqueFd pidfd(fd);
    const char byte = 1;
    if (::write(go_write.get(), &byte, 1) != 1) {
        const int err = errno;
        ::syscall(SYS_pidfd_send_signal, pidfd.get(), SIGKILL, nullptr, 0);
        ::waitpid(pid, nullptr, 0);
        throw_sys("write", std::string(what) + " (starting the child)", err);
    }
    return ChildProcess(pid, std::move(pidfd));
}

std::optional<int> ChildProcess::wait(std::chrono::milliseconds timeout) {
    if (!pidfd_) throw std::logic_error("waiting for no child process");
    if (reaped_) return status_;
    pollfd pfd{pidfd_.get(), POLLIN, 0};
    int n;
    do {
        n = ::poll(&pfd, 1, static_cast<int>(timeout.count()));
    } while (n < 0 && errno == EINTR);
    if (n < 0) throw_sys("poll", "pidfd of child " + std::to_string(pid_));
    if (n == 0) return std::nullopt;
    siginfo_t info{};
    int status = 0;
    if (::waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(pidfd_.get()), &info, WEXITED) ==
        0) {
        status = info.si_code == CLD_EXITED ? W_EXITCODE(info.si_status, 0) : info.si_status;
    }
    // ECHILD: reaped by the kernel already (SIGCHLD ignored), or by someone else.
    reaped_ = true;
    status_ = status;
    return status;
}

bool ChildProcess::kill_and_wait(std::chrono::milliseconds timeout) {
    if (!pidfd_ || reaped_) return true;
    ::syscall(SYS_pidfd_send_signal, pidfd_.get(), SIGKILL, nullptr, 0);
    try {
        return wait(timeout).has_value();
    } catch (const std::exception& e) {
        std::fprintf(stderr, "berth: waiting for child %d: %s\n", static_cast<int>(pid_), e.what());
        return false;
    }
}

void ChildProcess::release() {
    pidfd_.reset();
    pid_ = -1;
}

}  // namespace berth
