// One file operation (copy in/out, stat, mkdir -p, remove) from the daemon's side: it is
// checked here, then handed to the sandbox's init with the client's pipe, and the answer
// passed back. The daemon never reads or writes the data and never opens a path: the
// copying happens inside the sandbox (a worker forked by its init, with the sandbox's
// rights) and in the client (with the client's rights), connected by the pipe.
#pragma once

#include <boost/asio.hpp>
#include <memory>
#include <vector>

#include "base/unique_fd.h"
#include "berth.pb.h"
#include "init.pb.h"
#include "runtime/daemon/framed_socket.h"
#include "runtime/daemon/sandboxes.h"

namespace berth::daemon {

class Session;

class FileOperation : public std::enable_shared_from_this<FileOperation> {
  public:
    FileOperation(asio::io_context& io, std::shared_ptr<Session> session, uint64_t request_id,
                  const Sandbox& sandbox);

    // `request` is one of the file requests of ClientMessage; `fds` came with it.
    void start(const v1::ClientMessage& request, std::vector<UniqueFd> fds);
    // The client is gone or asked to cancel: closing the init connection stops the worker
    // (an upload then removes what it created).
    void cancel();
    void abandon();

  private:
    void on_init_frame(FramedSocket::Event event, std::string&& payload);
    void reply(const v1::init::FileResult& result);
    void finish_with_error(v1::ErrorCode code, const std::string& message);
    void done();

    asio::io_context& io_;
    std::weak_ptr<Session> session_;
    uint64_t request_id_;
    std::string sandbox_id_;
    std::string init_socket_;
    std::string workdir_;
    uint64_t storage_bytes_ = 0;  // the sandbox's storage limit (0: none)
    v1::ClientMessage::BodyCase kind_ = v1::ClientMessage::BODY_NOT_SET;
    std::shared_ptr<FramedSocket> init_;
    bool finished_ = false;
};

// Makes a sandbox path absolute against the workdir and checks it (NUL, length). Returns
// an empty string after setting `error` when it is not a usable path.
std::string sandbox_path(const std::string& path, const std::string& workdir, std::string* error);

}  // namespace berth::daemon
