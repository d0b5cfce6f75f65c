// One way to say "stop" to work that runs elsewhere (a thread, a poll loop, a child
// process given the fd): a CancelToken. Threads check cancelled(); code that blocks in
// poll() adds fd() to its set and treats any event on it as the cancel.
//
// A token either owns an eventfd that cancel() makes readable (berth-images' jobs), or
// watches an fd someone else owns, where "readable or hung up" means cancelled: berth-init's
// connection to berthd during a file transfer, an unpack worker's inherited cancel fd.
#pragma once

#include <atomic>
#include <string_view>

#include "base/unique_fd.h"

namespace berth {

class CancelToken {
  public:
    // Owns an eventfd (throws SysError if none can be made).
    CancelToken();
    // Watches `fd` (not owned; it must outlive the token).
    static CancelToken watching(int fd) { return CancelToken(fd); }

    CancelToken(const CancelToken&) = delete;
    CancelToken& operator=(const CancelToken&) = delete;

    // Thread-safe and idempotent. For a watching token it sets the flag only: whoever polls
    // fd() does not see it (the watched fd's owner cancels by writing or closing it).
    void cancel();
    // The flag; for a watching token also a zero-timeout poll of its fd (a cancel seen there
    // is remembered).
    bool cancelled() const;
    // Throws Error(Kind::cancelled, "<what>: cancelled") once cancelled.
    void throw_if_cancelled(std::string_view what) const;
    // Readable (POLLIN; a watched fd may report POLLHUP/POLLERR instead) once cancelled.
    int fd() const { return fd_; }

  private:
    explicit CancelToken(int watched) : fd_(watched) {}

    mutable std::atomic<bool> flag_{false};
    UniqueFd owned_;
    int fd_;
};

}  // namespace berth
