// A framed, queued, asynchronous Unix stream connection (client sessions, the helper
// channel, init connections): reads frames one after another, with the fds that came with
// each (SCM_RIGHTS), and writes queued frames in order.
#pragma once

#include <boost/asio.hpp>
#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/unique_fd.h"

namespace berth::daemon {

namespace asio = boost::asio;
using UnixSocket = asio::local::stream_protocol::socket;

class FramedSocket;

// What all untrusted connections together may hold of berthd in frames not yet complete.
// A connection with nothing held may always read (one read, 64 KiB at most, so small
// requests always get through); one that would hold more waits, unread (its peer's writes
// block in the kernel), until another gives some back or its frame times out.
class ReadBudget {
  public:
    explicit ReadBudget(size_t max_bytes) : max_bytes_(max_bytes) {}
    size_t used() const { return used_; }
    size_t max() const { return max_bytes_; }

  private:
    friend class FramedSocket;
    bool room(size_t bytes) const { return used_ + bytes <= max_bytes_; }
    void charge(size_t old_bytes, size_t new_bytes);
    size_t max_bytes_, used_ = 0;
    std::deque<std::weak_ptr<FramedSocket>> waiters_;
};

// Limits for a peer that is not trusted (a client). Without them a socket reads whatever
// its peer sends (the helper, berth-images, and inits, whose frames are small and whose
// fds berthd does not take).
struct ReadLimits {
    std::shared_ptr<ReadBudget> budget;
    // Fds held for frames not yet complete. A request passes at most a few, with its first
    // byte; more is abuse and ends the connection.
    size_t max_pending_fds = 16;
    // A frame not complete this long after its first byte (not counting time berthd held
    // the connection) ends the connection: a stalled or trickled half-frame holds memory
    // for nothing.
    std::chrono::milliseconds frame_timeout{30'000};
    // Above this many bytes queued for the peer, its requests are not read until the queue
    // drains: a client that sends requests and never reads the replies stalls itself only.
    size_t pause_above_queued = 4u << 20;
};

class FramedSocket : public std::enable_shared_from_this<FramedSocket> {
  public:
    enum class Event { frame, closed, too_large, refused };
    // Called for each frame (payload without header), on EOF/error (closed), when a frame
    // exceeds the cap (too_large: its length as payload), or when the peer broke a limit
    // (refused: what it did). After too_large and refused the connection is not read again.
    using Handler = std::function<void(Event, std::string&& payload)>;

    FramedSocket(UnixSocket socket, uint32_t max_frame);
    FramedSocket(UnixSocket socket, uint32_t max_frame, ReadLimits limits);
    ~FramedSocket();

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
    // Stops delivering (and reading) frames until as many release_reading() calls: how
    // another queue that this peer fills (an exec's stdin) pushes back on it.
    void hold_reading();
    void release_reading();
    // Bytes received and not yet delivered (a frame in progress), for tests and stats.
    size_t pending_bytes() const { return in_.size(); }

  private:
    friend class ReadBudget;
    void wait_readable();
    void on_readable();
    // Reads again if nothing stops it (holds, budget, a read already waiting).
    void resume_reading();
    // After frames were taken from in_: frees spare capacity and brings the budget's
    // charge in line with what is held now.
    void settle_buffer();
    void drop_batch_front();
    void arm_frame_timer();
    void watch_hangup();
    void refuse(const std::string& why);
    // Delivers complete frames from in_; false once reading must stop.
    bool deliver_frames();
    void write_next();
    void notify_drained();
    void notify_closed();
    void release_handler();

    UnixSocket socket_;
    uint32_t max_frame_;
    std::optional<ReadLimits> limits_;
    Handler handler_;
    int holds_ = 0;
    bool read_waiting_ = false;     // an async_wait for readability is outstanding
    bool budget_waiting_ = false;   // queued in the budget's waiters
    bool stopped_reading_ = false;  // too_large or refused: never read again
    size_t charged_ = 0, pending_fds_ = 0;
    std::unique_ptr<asio::steady_timer> frame_timer_;
    bool frame_timer_armed_ = false;
    uint64_t frame_start_seen_ = 0;  // in_begin_ when the frame timer was last set
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
