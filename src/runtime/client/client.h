// A synchronous berth client: what the CLI and the C++ benchmarks use.
#pragma once

#include <functional>
#include <stdexcept>
#include <string>
#include <string_view>

#include "base/unique_fd.h"
#include "berth.pb.h"

namespace berth::client {

// An Error reply from the daemon (or a broken connection, as UNAVAILABLE).
class ClientError : public std::runtime_error {
  public:
    ClientError(v1::ErrorCode code, const std::string& message)
        : std::runtime_error(message), code(code) {}
    v1::ErrorCode code;
};

// $BERTH_SOCKET, else /run/berth/berth.sock.
std::string default_socket_path();

class Client {
  public:
    // Connects and says Hello. Throws ClientError.
    explicit Client(const std::string& socket_path = default_socket_path());

    // Sends one request and waits for its single reply (not for Exec).
    v1::ServerMessage call(v1::ClientMessage request);

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
    void send(const v1::ClientMessage& msg);
    v1::ServerMessage receive();

    UniqueFd fd_;
    uint64_t last_id_ = 0;
    v1::HelloReply hello_;
};

}  // namespace berth::client
