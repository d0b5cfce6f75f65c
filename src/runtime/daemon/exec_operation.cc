#include "runtime/daemon/exec_operation.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cstring>

#include "base/error.h"
#include "base/pipe.h"
#include "base/unique_fd.h"
#include "runtime/daemon/init_connection.h"
#include "runtime/daemon/server.h"
#include "runtime/wire/error_codes.h"
#include "runtime/wire/frame.h"

namespace berth::daemon {

struct ExecOperation::Stream {
    Stream(asio::io_context& io, int fd, v1::ExecOutput::Stream kind) : desc(io, fd), kind(kind) {}
    asio::posix::stream_descriptor desc;
    v1::ExecOutput::Stream kind;
    std::array<char, 65536> buf;
    bool reading = false;
    bool eof = false;
};

ExecOperation::ExecOperation(asio::io_context& io, std::shared_ptr<Session> session,
                             uint64_t request_id, Sandbox& sandbox, int dev_null)
    : io_(io),
      session_(session),
      request_id_(request_id),
      sandbox_id_(sandbox.info.id()),
      init_socket_(sandbox.init_socket),
      workdir_(sandbox.info.workdir()),
      image_env_(sandbox.info.image_config().env()),
      image_user_(sandbox.info.image_config().user()),
      cgroup_(sandbox.cgroup),
      dev_null_(dev_null),
      timer_(io) {}

ExecOperation::~ExecOperation() = default;

void ExecOperation::start(const v1::Exec& request) {
    started_at_ = std::chrono::steady_clock::now();
    if (request.argv_size() == 0 || request.argv(0).empty()) {
        finish_with_error(v1::INVALID_ARGUMENT, "empty argv: give a command to run");
        return;
    }
    Pipe out, err, in;
    try {
        out = make_pipe("exec stdout");
        err = make_pipe("exec stderr");
        if (request.stdin()) in = make_pipe("exec stdin");
    } catch (const SysError& e) {
        finish_with_error(v1::RESOURCE_EXHAUSTED, e.what());
        return;
    }
    UniqueFd &out_r = out.read, &out_w = out.write, &err_r = err.read, &err_w = err.write,
             &in_r = in.read, &in_w = in.write;

    if (cgroup_) {
        try {
            oom_kills_before_ = cgroup_->oom_kills();
        } catch (const std::exception&) {
        }
    }

    InitConnection connection = connect_to_init(init_socket_, sandbox_id_);
    if (!connection.fd) {
        finish_with_error(connection.code, connection.message);
        return;
    }
    UniqueFd conn = std::move(connection.fd);

    v1::init::ToSandbox spawn;
    auto* sp = spawn.mutable_spawn();
    *sp->mutable_argv() = request.argv();
    // The image's Env under the exec's own: a variable the exec sets replaces the image's.
    if (image_env_.empty()) {
        *sp->mutable_env() = request.env();
    } else {
        auto key_of = [](const std::string& kv) {
            return std::string_view(kv).substr(0, kv.find('='));
        };
        for (const auto& kv : image_env_) {
            bool overridden = false;
            for (const auto& mine : request.env())
                if (key_of(mine) == key_of(kv)) overridden = true;
            if (!overridden) sp->add_env(kv);
        }
        for (const auto& kv : request.env()) sp->add_env(kv);
    }
    sp->set_cwd(in_workdir(workdir_, request.cwd()));
    sp->set_user(request.user().empty() ? image_user_ : request.user());
    try {
        wire::write_frame(conn.get(), spawn,
                          {request.stdin() ? in_r.get() : dev_null_, out_w.get(), err_w.get()});
    } catch (const std::exception& e) {
        finish_with_error(v1::UNAVAILABLE,
                          "sandbox " + sandbox_id_ + ": sending the exec to its init: " + e.what());
        return;
    }
    // The command has its copies now; ours would hide EOF.
    in_r.reset();
    out_w.reset();
    err_w.reset();

    out_ = std::make_unique<Stream>(io_, out_r.release(), v1::ExecOutput::STDOUT);
    err_ = std::make_unique<Stream>(io_, err_r.release(), v1::ExecOutput::STDERR);
    if (in_w) stdin_ = std::make_unique<asio::posix::stream_descriptor>(io_, in_w.release());

    init_ = std::make_shared<FramedSocket>(
        UnixSocket(io_, asio::local::stream_protocol(), conn.release()), wire::kInitMaxFrame);
    auto self = shared_from_this();
    init_->start([this, self](FramedSocket::Event event, std::string&& payload) {
        on_init_frame(event, std::move(payload));
    });
    read_stream(*out_);
    read_stream(*err_);

    if (request.timeout_ms() > 0) {
        timer_.expires_after(std::chrono::milliseconds(request.timeout_ms()));
        timer_.async_wait([this, self](boost::system::error_code ec) {
            if (ec || finished_ || exited_) return;
            timed_out_ = true;
            kill_tree();
        });
    }
}

void ExecOperation::on_init_frame(FramedSocket::Event event, std::string&& payload) {
    if (finished_) return;
    if (event != FramedSocket::Event::frame) {
        if (!exited_) {
            finish_with_error(v1::UNAVAILABLE,
                              "the command ended without an exit status: sandbox " + sandbox_id_ +
                                  " stopped, or something in it killed the exec's berth-exec "
                                  "shim (the exec's processes are killed with it)");
        }
        return;
    }
    v1::init::FromSandbox msg;
    if (!msg.ParseFromString(payload)) {
        finish_with_error(v1::INTERNAL, "sandbox " + sandbox_id_ + " sent a malformed reply");
        return;
    }
    if (msg.has_failed()) {
        finish_with_error(wire::error_code_from_peer(msg.failed().code()), msg.failed().message());
    } else if (msg.has_started()) {
        if (auto session = session_.lock()) {
            v1::ServerMessage reply;
            reply.set_id(request_id_);
            reply.mutable_exec_started()->set_pid(msg.started().pid());
            session->send(reply);
        }
    } else if (msg.has_exited()) {
        exit_ = msg.exited();
        exited_ = true;
        timer_.cancel();
        boost::system::error_code ignored;
        if (out_ && out_->reading) out_->desc.cancel(ignored);
        if (err_ && err_->reading) err_->desc.cancel(ignored);
        maybe_finish();
    }
}

void ExecOperation::read_stream(Stream& s) {
    if (s.eof || finished_ || exited_) return;
    s.reading = true;
    auto self = shared_from_this();
    s.desc.async_read_some(asio::buffer(s.buf),
                           [this, self, &s](boost::system::error_code ec, size_t n) {
                               s.reading = false;
                               if (finished_) return;
                               if (n > 0) {
                                   if (auto session = session_.lock()) {
                                       v1::ServerMessage msg;
                                       msg.set_id(request_id_);
                                       auto* o = msg.mutable_exec_output();
                                       o->set_stream(s.kind);
                                       o->set_data(s.buf.data(), n);
                                       session->send(msg);
                                   }
                               }
                               if (ec && ec != asio::error::operation_aborted) s.eof = true;
                               if (exited_ || s.eof) {
                                   maybe_finish();
                                   return;
                               }
                               auto session = session_.lock();
                               if (!session) return;
                               // Backpressure: a slow client slows the command, not the daemon's
                               // memory.
                               session->socket->when_drained([this, self, &s] {
                                   if (!finished_) read_stream(s);
                               });
                           });
}

void ExecOperation::maybe_finish() {
    if (finished_ || !exited_) return;
    if ((out_ && out_->reading) || (err_ && err_->reading)) return;
    auto session = session_.lock();
    // What the command wrote before it exited is in the pipes now: take it, but do not
    // wait for EOF — a background process may hold the pipe open for ever.
    for (Stream* s : {out_.get(), err_.get()}) {
        if (!s || s->eof) continue;
        int fd = s->desc.native_handle();
        ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
        for (;;) {
            ssize_t n = ::read(fd, s->buf.data(), s->buf.size());
            if (n <= 0) break;
            if (session) {
                v1::ServerMessage msg;
                msg.set_id(request_id_);
                msg.mutable_exec_output()->set_stream(s->kind);
                msg.mutable_exec_output()->set_data(s->buf.data(), static_cast<size_t>(n));
                session->send(msg);
            }
        }
    }
    if (session) {
        v1::ServerMessage msg;
        msg.set_id(request_id_);
        auto* e = msg.mutable_exec_exit();
        e->set_exit_code(exit_.exit_code());
        e->set_signal(exit_.signal());
        e->set_timed_out(timed_out_);
        e->set_canceled(canceled_ && !timed_out_);
        e->set_storage_full(exit_.storage_full());
        if (exit_.signal() == SIGKILL && !exit_.killed_by_request() && cgroup_) {
            try {
                e->set_oom_killed(cgroup_->oom_kills() > oom_kills_before_);
            } catch (const std::exception&) {
            }
        }
        e->set_duration_us(
            static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(
                                      std::chrono::steady_clock::now() - started_at_)
                                      .count()));
        session->send(msg);
    }
    done();
}

void ExecOperation::kill_tree() {
    if (!init_ || finished_) return;
    v1::init::ToSandbox msg;
    msg.mutable_signal()->set_signal(SIGKILL);
    init_->send(wire::encode_frame(msg));
}

void ExecOperation::cancel() {
    if (finished_ || exited_) return;
    canceled_ = true;
    kill_tree();
}

void ExecOperation::abandon() {
    if (finished_) return;
    // Closing the init connection makes the shim kill the whole tree.
    session_.reset();
    done();
}

namespace {
// Stdin bytes berthd queues for one exec's command: past the high mark the client's
// requests are not read (it blocks in its own send) until the command has taken the
// queue below the low one.
constexpr size_t kStdinHigh = 1u << 20, kStdinLow = 256u << 10;
}  // namespace

void ExecOperation::input(const v1::ExecInput& in) {
    if (!stdin_ || finished_) return;
    if (!in.data().empty()) {
        stdin_queued_ += in.data().size();
        stdin_queue_.push_back(in.data());
    }
    if (in.close()) stdin_close_requested_ = true;
    if (stdin_queued_ > kStdinHigh && !holding_client_) {
        if (auto session = session_.lock()) {
            session->socket->hold_reading();
            holding_client_ = true;
        }
    }
    if (stdin_writing_) return;
    auto self = shared_from_this();
    struct Pump {
        static void next(const std::shared_ptr<ExecOperation>& op) {
            if (!op->stdin_ || op->finished_) return;
            if (op->stdin_queue_.empty()) {
                op->stdin_writing_ = false;
                if (op->stdin_close_requested_) {
                    boost::system::error_code ignored;
                    op->stdin_->close(ignored);
                    op->stdin_.reset();
                }
                return;
            }
            op->stdin_writing_ = true;
            asio::async_write(*op->stdin_, asio::buffer(op->stdin_queue_.front()),
                              [op](boost::system::error_code ec, size_t) {
                                  if (op->stdin_queue_.size()) {
                                      op->stdin_queued_ -= op->stdin_queue_.front().size();
                                      op->stdin_queue_.pop_front();
                                  }
                                  if (ec) {
                                      // The command closed its stdin: drop what is left.
                                      op->stdin_queue_.clear();
                                      op->stdin_queued_ = 0;
                                      op->stdin_close_requested_ = true;
                                  }
                                  if (op->stdin_queued_ < kStdinLow) op->release_client();
                                  next(op);
                              });
        }
    };
    Pump::next(self);
}

void ExecOperation::release_client() {
    if (!holding_client_) return;
    holding_client_ = false;
    if (auto session = session_.lock()) session->socket->release_reading();
}

void ExecOperation::finish_with_error(v1::ErrorCode code, const std::string& message) {
    if (finished_) return;
    if (auto session = session_.lock()) session->send_error(request_id_, code, message);
    done();
}

void ExecOperation::done() {
    if (finished_) return;
    finished_ = true;
    release_client();
    stdin_queue_.clear();
    stdin_queued_ = 0;
    timer_.cancel();
    boost::system::error_code ignored;
    if (init_) init_->close();
    if (out_) out_->desc.close(ignored);
    if (err_) err_->desc.close(ignored);
    if (stdin_) stdin_->close(ignored);
    if (auto session = session_.lock()) session->execs.erase(request_id_);
}

}  // namespace berth::daemon
