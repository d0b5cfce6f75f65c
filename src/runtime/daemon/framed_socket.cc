#include "runtime/daemon/framed_socket.h"

#include <sys/socket.h>

#include <cstring>

#include "runtime/wire/frame.h"

namespace berth::daemon {

namespace {
constexpr size_t kLowWater = 1u << 20;
constexpr size_t kMaxFdsPerRead = 16;
}  // namespace

FramedSocket::FramedSocket(UnixSocket socket, uint32_t max_frame)
    : socket_(std::move(socket)), max_frame_(max_frame) {}

void FramedSocket::start(Handler handler) {
    handler_ = std::move(handler);
    auto self = shared_from_this();
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
    auto self = shared_from_this();
    socket_.async_wait(UnixSocket::wait_read, [this, self](boost::system::error_code ec) {
        if (ec) {
            notify_closed();
            return;
        }
        on_readable();
    });
}

void FramedSocket::on_readable() {
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
    if (!fds.empty())
        fd_batches_.push_back({begin, begin + static_cast<uint64_t>(n), std::move(fds)});
    if (deliver_frames() && socket_.is_open() && !closing_) wait_readable();
}

bool FramedSocket::deliver_frames() {
    size_t pos = 0;
    bool go_on = true;
    while (in_.size() - pos >= 4) {
        const uint32_t length =
            wire::decode_length(reinterpret_cast<const unsigned char*>(in_.data() + pos));
        if (length > max_frame_) {
            if (handler_) handler_(Event::too_large, std::to_string(length));
            go_on = false;
            break;
        }
        if (in_.size() - pos - 4 < length) break;
        const uint64_t start = in_begin_ + pos, next = start + 4 + length;
        frame_fds_.clear();
        while (!fd_batches_.empty() && fd_batches_.front().end <= start) fd_batches_.pop_front();
        if (!fd_batches_.empty()) {
            FdBatch& b = fd_batches_.front();
            if (b.begin <= start && start < b.end && next >= b.end) {
                frame_fds_ = std::move(b.fds);
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
    notify_drained();
    release_handler();
}

}  // namespace berth::daemon
