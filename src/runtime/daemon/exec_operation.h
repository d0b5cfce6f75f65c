// One exec, from the daemon's side: a connection to the sandbox's init carrying the Spawn
// and the stdio pipes; output streamed to the client as it comes; a timeout or cancel that
// kills the whole process tree; and a result that says how the command ended.
#pragma once

#include <boost/asio.hpp>
#include <chrono>
#include <memory>

#include "berth.pb.h"
#include "init.pb.h"
#include "runtime/daemon/framed_socket.h"
#include "runtime/daemon/sandboxes.h"

namespace berth::daemon {

class Session;

class ExecOperation : public std::enable_shared_from_this<ExecOperation> {
  public:
    ExecOperation(asio::io_context& io, std::shared_ptr<Session> session, uint64_t request_id,
                  Sandbox& sandbox, int dev_null);
    ~ExecOperation();

    // Validates and starts; errors are reported to the client and end the operation.
    void start(const v1::Exec& request);
    void input(const v1::ExecInput& in);
    void cancel();   // the client asked: kill the tree, report canceled
    void abandon();  // the client is gone: kill the tree, report nothing
    bool finished() const { return finished_; }

  private:
    struct Stream;
    void on_init_frame(FramedSocket::Event event, std::string&& payload);
    void read_stream(Stream& s);
    void kill_tree();
    void maybe_finish();
    void finish_with_error(v1::ErrorCode code, const std::string& message);
    void done();

    asio::io_context& io_;
    std::weak_ptr<Session> session_;
    uint64_t request_id_;
    std::string sandbox_id_;
    std::string init_socket_;
    std::string workdir_;  // relative cwds start here
    // The image's settings an exec inherits unless it says otherwise.
    google::protobuf::RepeatedPtrField<std::string> image_env_;
    std::string image_user_;
    std::shared_ptr<cgroup::Cgroup> cgroup_;  // the sandbox's, kept past its delete
    int dev_null_;
    std::shared_ptr<FramedSocket> init_;
    std::unique_ptr<Stream> out_, err_;
    std::unique_ptr<asio::posix::stream_descriptor> stdin_;
    std::deque<std::string> stdin_queue_;
    size_t stdin_queued_ = 0;
    bool holding_client_ = false;  // the client's reading is held for a full stdin queue
    void release_client();
    bool stdin_writing_ = false, stdin_close_requested_ = false;
    asio::steady_timer timer_;
    std::chrono::steady_clock::time_point started_at_;
    uint64_t oom_kills_before_ = 0;
    bool timed_out_ = false, canceled_ = false, exited_ = false, finished_ = false;
    v1::init::Exited exit_;
};

}  // namespace berth::daemon
