#include "runtime/daemon/framed_socket.h"

#include <poll.h>
#include <sys/socket.h>

#include <cstring>

#include "runtime/wire/frame.h"

namespace berth::daemon {

namespace {
constexpr size_t kLowWater = 1u << 20;
constexpr size_t kMaxFdsPerRead = 16;
}  // namespace

void ReadBudget::charge(size_t old_bytes, size_t new_bytes) {
    used_ = used_ - old_bytes + new_bytes;
    if (new_bytes >= old_bytes || waiters_.empty()) return;
    // Room was given back: every waiter tries again (from a task of its own: this runs
    // inside another connection's read); those still without room queue up again.
    auto waiters = std::move(waiters_);
    waiters_.clear();
    for (auto& weak : waiters) {
        auto socket = weak.lock();
        if (!socket) continue;
        asio::post(socket->socket_.get_executor(), [socket] {
            socket->budget_waiting_ = false;
            socket->resume_reading();
        });
    }
}

FramedSocket::FramedSocket(UnixSocket socket, uint32_t max_frame)
    : socket_(std::move(socket)), max_frame_(max_frame) {}

FramedSocket::FramedSocket(UnixSocket socket, uint32_t max_frame, ReadLimits limits)
    : socket_(std::move(socket)), max_frame_(max_frame), limits_(std::move(limits)) {}

FramedSocket::~FramedSocket() {
    if (limits_ && limits_->budget) limits_->budget->charge(charged_, 0);
}

void FramedSocket::start(Handler handler) {
    handler_ = std::move(handler);
    auto self = shared_from_this();
    if (limits_) watch_hangup();
    // Frames may already be waiting.
    asio::post(socket_.get_executor(), [this, self] {
        if (socket_.is_open()) on_readable();
    });
}

void FramedSocket::notify_closed() {
    // Once: a read error and the close() that follows it must not both report it.
    if (closed_notified_) return;
    closed_notified_ = true;
    if (handler_) handler_(Event::closed, {});
    release_handler();
}

void FramedSocket::release_handler() {
    // The handler's owner usually holds this socket while the handler holds its owner (an
    // exec, a session): a cycle that would keep both, with their buffers, for ever once the
    // connection is over. The handler may be running now (it called close()): it is
    // destroyed from a task of its own, after it has returned.
    if (handler_released_) return;
    handler_released_ = true;
    asio::post(socket_.get_executor(), [self = shared_from_this()] { self->handler_ = nullptr; });
}

void FramedSocket::wait_readable() {
    if (read_waiting_ || !socket_.is_open() || closing_ || stopped_reading_ || holds_ > 0) return;
    read_waiting_ = true;
    auto self = shared_from_this();
    socket_.async_wait(UnixSocket::wait_read, [this, self](boost::system::error_code ec) {
        read_waiting_ = false;
        if (ec) {
            notify_closed();
            return;
        }
        on_readable();
    });
}

void FramedSocket::watch_hangup() {
    // A connection berthd is not reading (held, or waiting for budget) would not see its
    // peer go away: the EOF sits behind requests not read. The peer's full close raises
    // EPOLLHUP on our end, which completes an error wait. While reading, EOF is found in
    // order, after the requests sent before it, so nothing is done here then.
    auto self = shared_from_this();
    socket_.async_wait(UnixSocket::wait_error, [this, self](boost::system::error_code ec) {
        if (ec || !socket_.is_open()) return;
        pollfd p{socket_.native_handle(), 0, 0};
        const bool hung_up = ::poll(&p, 1, 0) == 1 && (p.revents & (POLLHUP | POLLERR));
        if (hung_up && (holds_ > 0 || budget_waiting_)) {
            notify_closed();
            close();
        }
    });
}

void FramedSocket::hold_reading() {
    ++holds_;
}

void FramedSocket::release_reading() {
    if (holds_ > 0 && --holds_ == 0) {
        // Not from inside the caller (a drain callback, an exec's stdin pump).
        asio::post(socket_.get_executor(), [self = shared_from_this()] { self->resume_reading(); });
    }
}

void FramedSocket::resume_reading() {
    if (!socket_.is_open() || closing_ || stopped_reading_ || holds_ > 0 || budget_waiting_) return;
    if (!deliver_frames()) {
        settle_buffer();
        return;
    }
    settle_buffer();
    wait_readable();
}

void FramedSocket::refuse(const std::string& why) {
    stopped_reading_ = true;
    in_.clear();
    fd_batches_.clear();
    pending_fds_ = 0;
    settle_buffer();
    if (handler_) handler_(Event::refused, std::string(why));
}

void FramedSocket::drop_batch_front() {
    pending_fds_ -= fd_batches_.front().fds.size();
    fd_batches_.pop_front();
}

void FramedSocket::settle_buffer() {
    // A big frame leaves a big buffer behind; keep what a few frames need, no more.
    if (in_.empty()) {
        if (in_.capacity() > 65536) std::string().swap(in_);
    } else if (in_.capacity() > 4 * std::max<size_t>(in_.size(), 65536)) {
        in_.shrink_to_fit();
    }
    if (limits_ && limits_->budget) {
        // A connection's first read is free (what one read brings): the budget counts
        // what it holds beyond that.
        const size_t now = in_.size() > 65536 ? in_.size() : 0;
        limits_->budget->charge(charged_, now);
        charged_ = now;
    }
    if (limits_ && !in_.empty()) arm_frame_timer();
}

void FramedSocket::arm_frame_timer() {
    if (frame_timer_armed_ || stopped_reading_ || !socket_.is_open()) return;
    if (!frame_timer_) frame_timer_ = std::make_unique<asio::steady_timer>(socket_.get_executor());
    frame_start_seen_ = in_begin_;
    frame_timer_armed_ = true;
    frame_timer_->expires_after(limits_->frame_timeout);
    auto self = shared_from_this();
    frame_timer_->async_wait([this, self](boost::system::error_code ec) {
        frame_timer_armed_ = false;
        if (ec || !socket_.is_open() || stopped_reading_ || in_.empty()) return;
        if (holds_ > 0) {
            // berthd is not reading it (its replies or its exec's stdin are backed up):
            // not the frame's fault. It gets a full period once reading goes on.
            arm_frame_timer();
            return;
        }
        if (in_begin_ != frame_start_seen_) {
            // Frames were completed since the timer was set: the one in progress now began
            // later; give it its own period.
            arm_frame_timer();
            return;
        }
        refuse("a frame begun " + std::to_string(limits_->frame_timeout.count()) +
               " ms ago is still not complete (" + std::to_string(in_.size()) + " bytes received)");
    });
}

void FramedSocket::on_readable() {
    if (!socket_.is_open() || closing_ || stopped_reading_ || holds_ > 0) return;
    if (limits_ && limits_->budget && !in_.empty() && !limits_->budget->room(65536)) {
        if (!budget_waiting_) {
            budget_waiting_ = true;
            limits_->budget->waiters_.push_back(weak_from_this());
        }
        return;
    }
    // recvmsg() by hand: asio's reads drop ancillary data, and clients pass pipes with
    // their requests. One read per wakeup keeps a flooding peer from starving the others.
    char buf[65536];
    iovec iov{buf, sizeof buf};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFdsPerRead)];
    msghdr mh{};
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    mh.msg_control = control;
    mh.msg_controllen = sizeof control;
    const ssize_t n = ::recvmsg(socket_.native_handle(), &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n < 0) {
        if (errno == EAGAIN || errno == EINTR) return wait_readable();
        notify_closed();
        return;
    }
    const uint64_t begin = in_begin_ + in_.size();
    std::vector<UniqueFd> fds;
    for (cmsghdr* c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
        const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < count; ++i) {
            int fd;
            std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
            fds.emplace_back(fd);
        }
    }
    if (n == 0) {
        notify_closed();
        return;
    }
    in_.append(buf, static_cast<size_t>(n));
    if (!fds.empty()) {
        pending_fds_ += fds.size();
        fd_batches_.push_back({begin, begin + static_cast<uint64_t>(n), std::move(fds)});
    }
    const bool go_on = deliver_frames();
    if (limits_ && pending_fds_ > limits_->max_pending_fds) {
        refuse("passed " + std::to_string(pending_fds_) +
               " fds with requests not yet complete (at most " +
               std::to_string(limits_->max_pending_fds) + ")");
        return;
    }
    settle_buffer();
    if (go_on) wait_readable();
}

bool FramedSocket::deliver_frames() {
    size_t pos = 0;
    bool go_on = true;
    while (in_.size() - pos >= 4) {
        if (holds_ > 0) {
            go_on = false;
            break;
        }
        if (limits_ && queued_bytes_ >= limits_->pause_above_queued) {
            // The peer is not reading its replies: read no more requests from it until
            // they drain (when_drained also runs on close, which ends the hold).
            hold_reading();
            std::weak_ptr<FramedSocket> weak = weak_from_this();
            drain_waiters_.push_back([weak] {
                if (auto self = weak.lock()) self->release_reading();
            });
            go_on = false;
            break;
        }
        const uint32_t length =
            wire::decode_length(reinterpret_cast<const unsigned char*>(in_.data() + pos));
        if (length > max_frame_) {
            stopped_reading_ = true;
            if (handler_) handler_(Event::too_large, std::to_string(length));
            go_on = false;
            break;
        }
        if (in_.size() - pos - 4 < length) break;
        const uint64_t start = in_begin_ + pos, next = start + 4 + length;
        frame_fds_.clear();
        while (!fd_batches_.empty() && fd_batches_.front().end <= start) drop_batch_front();
        if (!fd_batches_.empty()) {
            FdBatch& b = fd_batches_.front();
            if (b.begin <= start && start < b.end && next >= b.end) {
                frame_fds_ = std::move(b.fds);
                pending_fds_ -= frame_fds_.size();
                fd_batches_.pop_front();
            }
        }
        std::string body = in_.substr(pos + 4, length);
        pos += 4 + length;
        if (handler_) handler_(Event::frame, std::move(body));
        frame_fds_.clear();
        if (!socket_.is_open() || closing_) {
            go_on = false;
            break;
        }
    }
    in_.erase(0, pos);
    in_begin_ += pos;
    // Batches wholly inside frames already delivered can belong to no frame now.
    while (!fd_batches_.empty() && fd_batches_.front().end <= in_begin_) drop_batch_front();
    return go_on;
}

void FramedSocket::send(std::string frame) {
    send(std::move(frame), {});
}

void FramedSocket::send(std::string frame, std::vector<UniqueFd> fds) {
    if (!socket_.is_open()) return;
    queued_bytes_ += frame.size();
    queue_.push_back({std::move(frame), std::move(fds), 0});
    if (!writing_) write_next();
}

bool FramedSocket::send_with_fds(Outgoing& out) {
    iovec iov{out.frame.data() + out.sent, out.frame.size() - out.sent};
    std::vector<char> control(CMSG_SPACE(sizeof(int) * out.fds.size()));
    msghdr mh{};
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    mh.msg_control = control.data();
    mh.msg_controllen = control.size();
    cmsghdr* c = CMSG_FIRSTHDR(&mh);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * out.fds.size());
    for (size_t i = 0; i < out.fds.size(); ++i) {
        const int fd = out.fds[i].get();
        std::memcpy(CMSG_DATA(c) + i * sizeof(int), &fd, sizeof fd);
    }
    const ssize_t n = ::sendmsg(socket_.native_handle(), &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n < 0) {
        if (errno == EAGAIN || errno == EINTR) return false;
        throw boost::system::system_error(errno, boost::system::system_category());
    }
    out.sent += static_cast<size_t>(n);
    out.fds.clear();  // the peer has them now (ours close)
    return true;
}

void FramedSocket::write_next() {
    if (queue_.empty()) {
        writing_ = false;
        notify_drained();
        if (closing_) close();
        return;
    }
    writing_ = true;
    auto self = shared_from_this();
    Outgoing& out = queue_.front();
    if (!out.fds.empty()) {
        // asio's writes carry no ancillary data: the first bytes go by sendmsg() with the
        // fds, once the socket takes them; the rest as any frame.
        socket_.async_wait(UnixSocket::wait_write, [this, self](boost::system::error_code ec) {
            if (ec || queue_.empty()) {
                close();
                return;
            }
            try {
                send_with_fds(queue_.front());
            } catch (const boost::system::system_error&) {
                close();
                return;
            }
            write_next();
        });
        return;
    }
    auto done = [this, self](boost::system::error_code ec, size_t) {
        if (ec) {
            close();
            return;
        }
        queued_bytes_ -= queue_.front().frame.size();
        queue_.pop_front();
        if (queued_bytes_ < kLowWater) notify_drained();
        write_next();
    };
    if (out.sent == out.frame.size()) {
        done({}, 0);
        return;
    }
    asio::async_write(socket_,
                      asio::buffer(out.frame.data() + out.sent, out.frame.size() - out.sent), done);
}

void FramedSocket::notify_drained() {
    auto waiters = std::move(drain_waiters_);
    drain_waiters_.clear();
    for (auto& f : waiters) f();
}

void FramedSocket::when_drained(std::function<void()> f) {
    if (queued_bytes_ < kLowWater || !socket_.is_open()) {
        f();
        return;
    }
    drain_waiters_.push_back(std::move(f));
}

void FramedSocket::close_after_flush() {
    closing_ = true;
    if (!writing_) close();
}

void FramedSocket::close() {
    if (!socket_.is_open()) return;
    boost::system::error_code ignored;
    socket_.shutdown(UnixSocket::shutdown_both, ignored);
    socket_.close(ignored);
    queue_.clear();
    queued_bytes_ = 0;
    in_.clear();
    fd_batches_.clear();
    pending_fds_ = 0;
    if (frame_timer_) frame_timer_->cancel();
    settle_buffer();
    notify_drained();
    release_handler();
}

}  // namespace berth::daemon
