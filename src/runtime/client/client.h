// A synchronous berth client: what the CLI and the C++ benchmarks use.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "base/error.h"
#include "base/unique_fd.h"
#include "berth.pb.h"
#include "runtime/wire/error_codes.h"

namespace berth::client {

// An Error reply from the daemon (or a broken connection, as UNAVAILABLE).
// `code` stays a member beside the kind it sets (callers read e.code): the daemon's code as
// it came.
class ClientError : public Error {
  public:
    ClientError(v1::ErrorCode code, const std::string& message)
        : Error(wire::error_kind(code), message), code(code) {}
    v1::ErrorCode code;
};

// $BERTH_SOCKET, else /run/berth/berth.sock.
std::string default_socket_path();

class Client {
  public:
    // Connects and says Hello. Throws ClientError.
    explicit Client(const std::string& socket_path = default_socket_path());

    // Sends one request (with `fds` attached) and waits for its single reply (not for Exec).
    v1::ServerMessage call(v1::ClientMessage request, const std::vector<int>& fds = {});
    // Several single-reply requests at once, at most `window` of them in flight: `done` gets
    // each one's index in `requests` and its reply, or the ClientError it came back with, in
    // the order the daemon finishes them (`berth rm A B C` deletes them side by side). A
    // broken connection throws, as call does.
    void call_each(std::vector<v1::ClientMessage> requests, size_t window,
                   const std::function<void(size_t index, const v1::ServerMessage* reply,
                                            const ClientError* error)>& done);
    // The same for a request that streams ImageProgress before its reply (PullImage,
    // BootstrapImage): each goes to `progress` as it comes.
    v1::ServerMessage call_with_progress(
        v1::ClientMessage request, const std::function<void(const v1::ImageProgress&)>& progress,
        const std::vector<int>& fds = {});

    // File transfer through a pipe (see CopyIn/CopyOut in berth.proto). `produce` writes
    // the tar stream to the fd it is given, `consume` reads it; either runs on a thread of
    // its own while this one waits for the daemon, and the fd is closed when it returns.
    // The first failure is reported: an exception of produce/consume is rethrown as it is,
    // unless it is only EPIPE/EIO from the sandbox side stopping, whose error (ClientError)
    // is then thrown.
    // `side_files` go with the request after the pipe (see CopyIn/CopyOut).
    v1::CopyReply copy_in(v1::CopyIn request, const std::function<void(int fd)>& produce,
                          const std::vector<int>& side_files = {});
    v1::CopyReply copy_out(v1::CopyOut request, const std::function<void(int fd)>& consume,
                           const std::vector<int>& side_files = {});
    // The same with a ready pipe end (the CLI's `-` when stdin/stdout is a pipe): the
    // stream flows between that pipe and the sandbox without passing through this process.
    v1::CopyReply copy_in_from_pipe(v1::CopyIn request, int pipe_read_end);
    v1::CopyReply copy_out_to_pipe(v1::CopyOut request, int pipe_write_end);

    struct ExecCallbacks {
        std::function<void(v1::ExecOutput::Stream, std::string_view)> output;
        std::function<void(int pid)> started;
    };
    // Runs an exec to its end. If `stdin_fd` >= 0 its contents are sent as the command's
    // stdin (the request's stdin flag is set for you).
    v1::ExecExit exec(v1::Exec request, const ExecCallbacks& callbacks, int stdin_fd = -1);

    const v1::HelloReply& hello() const { return hello_; }
    int fd() const { return fd_.get(); }

  private:
    uint64_t next_id() { return ++last_id_; }
    void send(const v1::ClientMessage& msg, const std::vector<int>& fds = {});
    v1::CopyReply copy(v1::ClientMessage request, bool upload,
                       const std::function<void(int fd)>& stream,
                       const std::vector<int>& side_files);
    v1::ServerMessage receive();

    UniqueFd fd_;
    bool daemon_gone_ = false;  // its connection closed or broke: no reply will come
    uint64_t last_id_ = 0;
    v1::HelloReply hello_;
};

}  // namespace berth::client
