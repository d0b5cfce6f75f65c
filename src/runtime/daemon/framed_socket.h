// A framed, queued, asynchronous Unix stream connection (client sessions, the helper
// channel, init connections): reads frames one after another, with the fds that came with
// each (SCM_RIGHTS), and writes queued frames in order.
#pragma once

#include <boost/asio.hpp>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/unique_fd.h"

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
    // During a frame event: the fds that came with that frame (those not taken are closed
    // after the handler returns).
    std::vector<UniqueFd> take_fds() { return std::move(frame_fds_); }
    // Queues a ready frame (header included). After close() it is dropped.
    void send(std::string frame);
    // The same with `fds` attached to the frame's first byte (SCM_RIGHTS): how the daemon
    // hands a client's fd on (to berth-images). They are closed here once sent.
    void send(std::string frame, std::vector<UniqueFd> fds);
    // Stops reading and closes once the queued frames are written.
    void close_after_flush();
    void close();
    bool open() const { return socket_.is_open(); }
    size_t queued_bytes() const { return queued_bytes_; }
    // Runs `f` once the write queue has drained below the low-water mark (or on close).
    void when_drained(std::function<void()> f);
    int native_handle() { return socket_.native_handle(); }

  private:
    void wait_readable();
    void on_readable();
    // Delivers complete frames from in_; false once reading must stop.
    bool deliver_frames();
    void write_next();
    void notify_drained();
    void notify_closed();
    void release_handler();

    UnixSocket socket_;
    uint32_t max_frame_;
    Handler handler_;
    // Received bytes not yet delivered; in_begin_ is the stream offset of in_[0].
    std::string in_;
    uint64_t in_begin_ = 0;
    // Fds by the stream range [begin, end) of the recvmsg() that brought them. The kernel
    // ends a read after the message that carried fds, so they belong to the last frame
    // that starts inside that range.
    struct FdBatch {
        uint64_t begin, end;
        std::vector<UniqueFd> fds;
    };
    std::deque<FdBatch> fd_batches_;
    std::vector<UniqueFd> frame_fds_;
    struct Outgoing {
        std::string frame;
        std::vector<UniqueFd> fds;  // go with the first byte written
        size_t sent = 0;
    };
    // sendmsg() of what is left of `out` with its fds; false when it must wait (EAGAIN).
    bool send_with_fds(Outgoing& out);
    std::deque<Outgoing> queue_;
    size_t queued_bytes_ = 0;
    bool writing_ = false;
    bool closing_ = false;
    bool closed_notified_ = false;
    bool handler_released_ = false;
    std::vector<std::function<void()>> drain_waiters_;
};

}  // namespace berth::daemon
