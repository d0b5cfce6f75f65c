// A child process with an owner: forked, followed by a pidfd, and killed and waited for if
// it is still running when its owner goes, so that no error path leaves one behind.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/unique_fd.h"

namespace berth {

class ChildProcess {
  public:
    ChildProcess() = default;
    ChildProcess(ChildProcess&&) noexcept = default;
    ChildProcess& operator=(ChildProcess&& other) noexcept;
    ChildProcess(const ChildProcess&) = delete;
    ChildProcess& operator=(const ChildProcess&) = delete;
    ~ChildProcess();

    // fork(2): the child runs `body` and _exits with what it returns (status 1 if it throws:
    // what() goes to stderr first). Every fd but 0-2 and `keep` is closed in the child
    // before `body` runs, so it holds nothing of the parent's by accident (a channel whose
    // EOF someone waits for). glibc's fork, not a raw clone: it keeps malloc usable in the
    // child of a threaded process; a body forked from one keeps to async-signal-safe calls
    // all the same (another thread may hold a lock it needs), as this function does in the
    // child before `body`. The child starts `body` only once the parent holds its pidfd (in
    // a parent that ignores SIGCHLD the kernel reaps a quick child before pidfd_open could
    // name it). Throws SysError naming `what`.
    static ChildProcess fork(std::string_view what, const std::vector<int>& keep,
                             const std::function<int()>& body);

    pid_t pid() const { return pid_; }
    // Readable once the child has exited (poll it beside other work).
    int pidfd() const { return pidfd_.get(); }
    explicit operator bool() const { return pidfd_.valid(); }

    // Its exit status (waitpid's), waiting at most `timeout`; nullopt while it still runs.
    // If SIGCHLD is ignored (the kernel reaps children at once) there is no status to have:
    // an exited child then reads as 0 (callers of such processes report through a pipe).
    std::optional<int> wait(std::chrono::milliseconds timeout);
    // The same without a time limit.
    int wait() { return *wait(std::chrono::milliseconds(-1)); }
    // SIGKILL, then wait for it to be gone (at most `timeout`; false if it outlived that).
    bool kill_and_wait(std::chrono::milliseconds timeout = std::chrono::seconds(10));
    // Gives the process up: it is no longer killed when this goes.
    void release();

  private:
    ChildProcess(pid_t pid, UniqueFd pidfd) : pid_(pid), pidfd_(std::move(pidfd)) {}
    pid_t pid_ = -1;
    UniqueFd pidfd_;
    bool reaped_ = false;
    int status_ = 0;
};

}  // namespace berth
