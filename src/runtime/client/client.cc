#include "runtime/client/client.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <map>
#include <thread>

#include "base/error.h"
#include "base/pipe.h"
#include "runtime/wire/frame.h"

namespace berth::client {

std::string default_socket_path() {
    const char* env = std::getenv("BERTH_SOCKET");
    return env && *env ? env : "/run/berth/berth.sock";
}

Client::Client(const std::string& socket_path) {
    fd_.reset(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!fd_) throw ClientError(v1::UNAVAILABLE, std::string("socket: ") + std::strerror(errno));
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    if (socket_path.size() >= sizeof addr.sun_path)
        throw ClientError(v1::INVALID_ARGUMENT, "socket path too long: " + socket_path);
    std::memcpy(addr.sun_path, socket_path.c_str(), socket_path.size() + 1);
    if (::connect(fd_.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
        throw ClientError(v1::UNAVAILABLE, "cannot connect to berthd at " + socket_path + ": " +
                                               std::strerror(errno) + " (is berthd running?)");
    }
    v1::ClientMessage hello;
    hello.mutable_hello()->set_protocol_version(wire::kProtocolVersion);
    hello.mutable_hello()->set_client(std::string("berth-client/") + BERTH_VERSION);
    hello_ = call(std::move(hello)).hello();
}

void Client::send(const v1::ClientMessage& msg, const std::vector<int>& fds) {
    try {
        wire::write_frame(fd_.get(), msg, fds);
    } catch (const std::exception& e) {
        throw ClientError(v1::UNAVAILABLE, std::string("connection to berthd lost: ") + e.what());
    }
}

v1::ServerMessage Client::receive() {
    v1::ServerMessage msg;
    wire::ReadStatus status;
    try {
        status = wire::read_frame(fd_.get(), msg, wire::kDefaultMaxFrame * 2);
    } catch (const std::exception& e) {
        daemon_gone_ = true;
        throw ClientError(v1::UNAVAILABLE, std::string("connection to berthd lost: ") + e.what());
    }
    if (status == wire::ReadStatus::eof) {
        daemon_gone_ = true;
        throw ClientError(v1::UNAVAILABLE, "berthd closed the connection");
    }
    if (status != wire::ReadStatus::ok)
        throw ClientError(v1::INTERNAL, "berthd sent a malformed frame");
    if (msg.has_error() && msg.id() == 0)
        throw ClientError(msg.error().code(), msg.error().message());
    return msg;
}

v1::ServerMessage Client::call(v1::ClientMessage request, const std::vector<int>& fds) {
    request.set_id(next_id());
    send(request, fds);
    for (;;) {
        v1::ServerMessage reply = receive();
        if (reply.id() != request.id()) continue;
        if (reply.has_error()) throw ClientError(reply.error().code(), reply.error().message());
        return reply;
    }
}

void Client::call_each(
    std::vector<v1::ClientMessage> requests, size_t window,
    const std::function<void(size_t, const v1::ServerMessage*, const ClientError*)>& done) {
    window = std::max<size_t>(window, 1);
    std::map<uint64_t, size_t> in_flight;  // request id -> index
    size_t next = 0;
    while (next < requests.size() || !in_flight.empty()) {
        while (next < requests.size() && in_flight.size() < window) {
            requests[next].set_id(next_id());
            send(requests[next]);
            in_flight.emplace(requests[next].id(), next);
            ++next;
        }
        v1::ServerMessage reply = receive();
        auto it = in_flight.find(reply.id());
        if (it == in_flight.end()) continue;
        const size_t index = it->second;
        in_flight.erase(it);
        if (reply.has_error()) {
            const ClientError error(reply.error().code(), reply.error().message());
            done(index, nullptr, &error);
        } else {
            done(index, &reply, nullptr);
        }
    }
}

v1::ServerMessage Client::call_with_progress(
    v1::ClientMessage request, const std::function<void(const v1::ImageProgress&)>& progress,
    const std::vector<int>& fds) {
    request.set_id(next_id());
    send(request, fds);
    for (;;) {
        v1::ServerMessage reply = receive();
        if (reply.id() != request.id()) continue;
        if (reply.has_error()) throw ClientError(reply.error().code(), reply.error().message());
        if (reply.has_image_progress()) {
            if (progress) progress(reply.image_progress());
            continue;
        }
        return reply;
    }
}

v1::ExecExit Client::exec(v1::Exec request, const ExecCallbacks& callbacks, int stdin_fd) {
    v1::ClientMessage msg;
    const uint64_t id = next_id();
    msg.set_id(id);
    request.set_stdin(stdin_fd >= 0);
    *msg.mutable_exec() = std::move(request);
    send(msg);
    bool stdin_open = stdin_fd >= 0;
    for (;;) {
        if (stdin_open) {
            pollfd fds[2] = {{fd_.get(), POLLIN, 0}, {stdin_fd, POLLIN, 0}};
            if (::poll(fds, 2, -1) < 0) {
                if (errno == EINTR) continue;
                throw ClientError(v1::INTERNAL, std::string("poll: ") + std::strerror(errno));
            }
            if (fds[1].revents & (POLLIN | POLLHUP | POLLERR)) {
                char buf[65536];
                ssize_t n = ::read(stdin_fd, buf, sizeof buf);
                v1::ClientMessage in;
                in.set_id(id);
                if (n > 0) {
                    in.mutable_exec_input()->set_data(buf, static_cast<size_t>(n));
                } else {
                    in.mutable_exec_input()->set_close(true);
                    stdin_open = false;
                }
                send(in);
            }
            if (!(fds[0].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        }
        v1::ServerMessage reply = receive();
        if (reply.id() != id) continue;
        if (reply.has_error()) throw ClientError(reply.error().code(), reply.error().message());
        if (reply.has_exec_output()) {
            if (callbacks.output)
                callbacks.output(reply.exec_output().stream(), reply.exec_output().data());
        } else if (reply.has_exec_started()) {
            if (callbacks.started) callbacks.started(reply.exec_started().pid());
        } else if (reply.has_exec_exit()) {
            return reply.exec_exit();
        }
    }
}

v1::CopyReply Client::copy_in(v1::CopyIn request, const std::function<void(int)>& produce,
                              const std::vector<int>& side_files) {
    v1::ClientMessage msg;
    *msg.mutable_copy_in() = std::move(request);
    return copy(std::move(msg), true, produce, side_files);
}

v1::CopyReply Client::copy_out(v1::CopyOut request, const std::function<void(int)>& consume,
                               const std::vector<int>& side_files) {
    v1::ClientMessage msg;
    *msg.mutable_copy_out() = std::move(request);
    return copy(std::move(msg), false, consume, side_files);
}

namespace {

// berthd went away with a copy in flight. Its stream runs between this process (or the
// caller's pipe) and the sandbox without passing through berthd, so the copy may well
// have completed: saying "failed" would send a user to redo (or undo) what happened.
[[noreturn]] void throw_unconfirmed(const ClientError& e, bool upload) {
    throw ClientError(
        v1::UNAVAILABLE,
        std::string(e.what()) + " before confirming the copy; it may have completed (" +
            (upload ? "check the destination in the sandbox, or copy again: files are replaced"
                    : "check the destination, or copy again") +
            ")");
}

}  // namespace

v1::CopyReply Client::copy_in_from_pipe(v1::CopyIn request, int pipe_read_end) {
    v1::ClientMessage msg;
    *msg.mutable_copy_in() = std::move(request);
    try {
        return call(std::move(msg), {pipe_read_end}).copy();
    } catch (const ClientError& e) {
        if (daemon_gone_) throw_unconfirmed(e, true);
        throw;
    }
}

v1::CopyReply Client::copy_out_to_pipe(v1::CopyOut request, int pipe_write_end) {
    v1::ClientMessage msg;
    *msg.mutable_copy_out() = std::move(request);
    try {
        return call(std::move(msg), {pipe_write_end}).copy();
    } catch (const ClientError& e) {
        if (daemon_gone_) throw_unconfirmed(e, false);
        throw;
    }
}

v1::CopyReply Client::copy(v1::ClientMessage request, bool upload,
                           const std::function<void(int)>& stream,
                           const std::vector<int>& side_files) {
    Pipe ends;
    try {
        ends = make_pipe("copy stream");
    } catch (const SysError& e) {
        throw ClientError(v1::RESOURCE_EXHAUSTED, e.what());
    }
    UniqueFd read_end = std::move(ends.read), write_end = std::move(ends.write);
    // Fewer wakeups per megabyte; the default 64 KiB pipe costs throughput.
    ::fcntl(read_end.get(), F_SETPIPE_SZ, 1 << 20);
    UniqueFd ours = upload ? std::move(write_end) : std::move(read_end);
    UniqueFd theirs = upload ? std::move(read_end) : std::move(write_end);

    request.set_id(next_id());
    std::vector<int> fds{theirs.get()};
    fds.insert(fds.end(), side_files.begin(), side_files.end());
    send(request, fds);
    // The sandbox has its end now; ours must not keep the stream open after it is done.
    theirs.reset();

    std::exception_ptr stream_error;
    std::thread worker([&] {
        // A closed stream must be EPIPE here, not a SIGPIPE that kills the process; the
        // signal is thread-directed and dies with the thread.
        sigset_t pipe_signal;
        sigemptyset(&pipe_signal);
        sigaddset(&pipe_signal, SIGPIPE);
        ::pthread_sigmask(SIG_BLOCK, &pipe_signal, nullptr);
        try {
            stream(ours.get());
        } catch (...) {
            stream_error = std::current_exception();
        }
        ours.reset();  // EOF for the sandbox (upload) / it may stop writing (download)
    });
    v1::ServerMessage reply;
    std::exception_ptr daemon_error;
    try {
        for (;;) {
            reply = receive();
            if (reply.id() == request.id()) break;
        }
    } catch (...) {
        daemon_error = std::current_exception();
    }
    // If the sandbox side failed, it has closed its end: a producer gets EPIPE, a
    // consumer EOF, and the thread ends.
    worker.join();
    // Whichever side failed first is the one to report. A broken pipe (EPIPE) or a stream
    // that ended early (EIO) here is the other side's failure showing through; any other
    // local error (the host file unreadable, the host disk full) is the cause, and the
    // sandbox side's error is its echo.
    bool local_is_echo = false;
    if (stream_error) {
        try {
            std::rethrow_exception(stream_error);
        } catch (const SysError& e) {
            local_is_echo = e.code() == EPIPE || e.code() == EIO;
        } catch (...) {
        }
    }
    if (stream_error && !local_is_echo) std::rethrow_exception(stream_error);
    if (daemon_error && daemon_gone_) {
        try {
            std::rethrow_exception(daemon_error);
        } catch (const ClientError& e) {
            // A download whose archive was read to its end-of-archive marker has all of its
            // files here: the sandbox side finished writing it. Only its reply is missing.
            if (!upload && !stream_error) {
                v1::CopyReply complete;
                complete.add_warnings(std::string(e.what()) +
                                      " before confirming the copy; the archive arrived "
                                      "complete (warnings from the sandbox side, if any, are "
                                      "lost)");
                return complete;
            }
            throw_unconfirmed(e, upload);
        }
    }
    if (daemon_error) std::rethrow_exception(daemon_error);
    if (reply.has_error()) throw ClientError(reply.error().code(), reply.error().message());
    if (stream_error) std::rethrow_exception(stream_error);
    return reply.copy();
}

}  // namespace berth::client
