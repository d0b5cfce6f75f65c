// A framed, queued, asynchronous Unix stream connection (client sessions and the helper
// channel): reads frames one after another, writes queued frames in order.
#pragma once

#include <boost/asio.hpp>
#include <deque>
#include <functional>
#include <memory>
#include <string>

namespace berth::daemon {

namespace asio = boost::asio;
using UnixSocket = asio::local::stream_protocol::socket;

class FramedSocket : public std::enable_shared_from_this<FramedSocket> {
  public:
    enum class Event { frame, closed, too_large };
    // Called for each frame (payload without header), on EOF/error (closed), or when a
    // frame exceeds the cap (too_large; the connection can no longer be read).
    using Handler = std::function<void(Event, std::string&& payload)>;

    FramedSocket(UnixSocket socket, uint32_t max_frame);

    void start(Handler handler);
    // Queues a ready frame (header included). After close() it is dropped.
    void send(std::string frame);
    // Stops reading and closes once the queued frames are written.
    void close_after_flush();
    void close();
    bool open() const { return socket_.is_open(); }
    size_t queued_bytes() const { return queued_bytes_; }
    // Runs `f` once the write queue has drained below the low-water mark (or on close).
    void when_drained(std::function<void()> f);
    int native_handle() { return socket_.native_handle(); }

  private:
    void read_header();
    void read_body(uint32_t length);
    void write_next();
    void notify_drained();
    void notify_closed();

    UnixSocket socket_;
    uint32_t max_frame_;
    Handler handler_;
    unsigned char header_[4];
    std::string body_;
    std::deque<std::string> queue_;
    size_t queued_bytes_ = 0;
    bool writing_ = false;
    bool closing_ = false;
    bool closed_notified_ = false;
    std::vector<std::function<void()>> drain_waiters_;
};

}  // namespace berth::daemon
