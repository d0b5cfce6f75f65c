#include "base/cancel.h"

#include <poll.h>
#include <sys/eventfd.h>

#include <cstdint>
#include <string>

#include "base/error.h"

namespace berth {

CancelToken::CancelToken() : owned_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)), fd_(owned_.get()) {
    if (!owned_) throw_sys("eventfd");
}

void CancelToken::cancel() {
    if (flag_.exchange(true) || !owned_) return;
    const uint64_t one = 1;
    // Cannot fail short of EAGAIN at a counter near 2^64: one write ever is made.
    (void)!::write(owned_.get(), &one, sizeof one);
}

bool CancelToken::cancelled() const {
    if (flag_.load()) return true;
    if (owned_ || fd_ < 0) return false;  // an owned eventfd is written only by cancel()
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, 0) > 0 && p.revents) {
        flag_ = true;
        return true;
    }
    return false;
}

void CancelToken::throw_if_cancelled(std::string_view what) const {
    if (cancelled()) throw Error(Error::Kind::cancelled, std::string(what) + ": cancelled");
}

}  // namespace berth
