#include "runtime/daemon/framed_socket.h"

#include "runtime/wire/frame.h"

namespace berth::daemon {

namespace {
constexpr size_t kLowWater = 1u << 20;
}

FramedSocket::FramedSocket(UnixSocket socket, uint32_t max_frame)
    : socket_(std::move(socket)), max_frame_(max_frame) {}

void FramedSocket::start(Handler handler) {
    handler_ = std::move(handler);
    read_header();
}

void FramedSocket::notify_closed() {
    // Once: a read error and the close() that follows it must not both report it.
    if (closed_notified_) return;
    closed_notified_ = true;
    handler_(Event::closed, {});
}

void FramedSocket::read_header() {
    auto self = shared_from_this();
    asio::async_read(socket_, asio::buffer(header_, 4),
                     [this, self](boost::system::error_code ec, size_t) {
                         if (ec) {
                             notify_closed();
                             return;
                         }
                         uint32_t length = wire::decode_length(header_);
                         if (length > max_frame_) {
                             handler_(Event::too_large, std::to_string(length));
                             return;
                         }
                         read_body(length);
                     });
}

void FramedSocket::read_body(uint32_t length) {
    body_.resize(length);
    auto self = shared_from_this();
    asio::async_read(socket_, asio::buffer(body_),
                     [this, self](boost::system::error_code ec, size_t) {
                         if (ec) {
                             notify_closed();
                             return;
                         }
                         handler_(Event::frame, std::move(body_));
                         if (socket_.is_open() && !closing_) read_header();
                     });
}

void FramedSocket::send(std::string frame) {
    if (!socket_.is_open()) return;
    queued_bytes_ += frame.size();
    queue_.push_back(std::move(frame));
    if (!writing_) write_next();
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
    asio::async_write(socket_, asio::buffer(queue_.front()),
                      [this, self](boost::system::error_code ec, size_t) {
                          if (ec) {
                              close();
                              return;
                          }
                          queued_bytes_ -= queue_.front().size();
                          queue_.pop_front();
                          if (queued_bytes_ < kLowWater) notify_drained();
                          write_next();
                      });
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
}

}  // namespace berth::daemon
