#include "runtime/init/init.h"

#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/vfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <vector>

#include "base/error.h"
#include "init.pb.h"
#include "runtime/init/command.h"
#include "runtime/init/file_worker.h"
#include "runtime/wire/frame.h"

namespace berth::init {

void harden_init(const ns::SeccompProgram& seccomp) {
    // The seccomp filter goes on here, once: every command inherits it, so an exec pays
    // nothing for it (installing a filter costs 0.1-0.5 ms). init needs none of the calls
    // it denies; as root of its user namespace it may install it without no_new_privs,
    // which each command still gets from apply_identity().
    if (int rc = seccomp.install(); rc != 0) throw SysError("seccomp install", "berth-init", -rc);
    // Likewise the capability bounding set, which every exec'd command gets anyway.
    const char* step = nullptr;
    if (int rc = ns::restrict_bounding_set(ns::default_capability_names(), &step); rc != 0)
        throw SysError(step ? step : "restrict_bounding_set", "berth-init", -rc);
}

namespace {

constexpr v1::ErrorCode kInvalidArgument = v1::INVALID_ARGUMENT,
                        kResourceExhausted = v1::RESOURCE_EXHAUSTED;

// One exec: the daemon's connection and the command's pid.
struct Exec {
    UniqueFd connection;
    pid_t pid = -1;
    bool kill_requested = false;
};

void send(int fd, const v1::init::FromSandbox& msg) {
    try {
        wire::write_frame(fd, msg);
    } catch (const std::exception&) {
        // The daemon went away; its connection is closed when the command ends.
    }
}

void send_failure(int fd, v1::ErrorCode code, const std::string& message) {
    v1::init::FromSandbox msg;
    msg.mutable_failed()->set_code(code);
    msg.mutable_failed()->set_message(message);
    send(fd, msg);
}

// A connection stuck mid-frame must not hang PID 1 for long.
void set_timeouts(int fd) {
    timeval limit{2, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
    ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof limit);
}

// Forks the worker for a file operation; it owns the connection and the stream fd from
// here on, and init forgets it (it is reaped like any orphan).
void start_file_worker(UniqueFd connection, const v1::init::FileOp& op, std::vector<UniqueFd> fds) {
    const pid_t pid = ::fork();
    if (pid < 0) {
        send_failure(connection.get(), kResourceExhausted,
                     std::string("fork of a file worker: ") + std::strerror(errno));
        return;
    }
    if (pid > 0) return;
    // Keep only what the operation needs: init's other connections must not be held open
    // by a worker (their peers would miss EOF).
    std::vector<unsigned> keep{static_cast<unsigned>(connection.get())};
    for (const auto& f : fds) keep.push_back(static_cast<unsigned>(f.get()));
    std::sort(keep.begin(), keep.end());
    unsigned next = 3;
    for (unsigned k : keep) {
        if (k > next) ::close_range(next, k - 1, 0);
        next = std::max(next, k + 1);
    }
    ::close_range(next, ~0U, 0);
    ::prctl(PR_SET_NAME, "berth-files");
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    ::signal(SIGPIPE, SIG_IGN);  // a client that goes away is EPIPE, reported, not death
    // No socket timeouts: a large copy takes as long as it takes; the daemon closing the
    // connection is what stops it.
    timeval none{0, 0};
    ::setsockopt(connection.get(), SOL_SOCKET, SO_RCVTIMEO, &none, sizeof none);
    ::setsockopt(connection.get(), SOL_SOCKET, SO_SNDTIMEO, &none, sizeof none);
    run_file_op(connection.get(), op, std::move(fds));
    ::_exit(0);
}

// Reads the first request of a new connection: a Spawn starts its command (returns the
// pid), a FileOp its worker (returns -1, as does a failure, after telling the daemon why).
pid_t accept_request(UniqueFd& connection) {
    const int fd = connection.get();
    v1::init::ToSandbox request;
    std::vector<UniqueFd> fds;
    wire::ReadStatus status;
    try {
        status = wire::read_frame(fd, request, wire::kInitMaxFrame, &fds);
    } catch (const std::exception&) {
        return -1;
    }
    if (status == wire::ReadStatus::eof) return -1;
    if (status == wire::ReadStatus::ok && request.has_file_op()) {
        const auto kind = request.file_op().op_case();
        if (kind == v1::init::FileOp::kStat || kind == v1::init::FileOp::kMakeDirs) {
            // A few syscalls, bounded by the path's length and the symlink budget: done
            // here, a fork would cost more than the work (cp asks for a stat every time).
            run_file_op(fd, request.file_op(), std::move(fds));
        } else {
            start_file_worker(std::move(connection), request.file_op(), std::move(fds));
        }
        return -1;
    }
    if (status != wire::ReadStatus::ok || !request.has_spawn()) {
        send_failure(fd, kInvalidArgument, "expected a Spawn or FileOp request");
        return -1;
    }
    auto started = start_command(request.spawn(), fds);
    if (auto* failure = std::get_if<CommandFailure>(&started)) {
        send_failure(fd, failure->code, failure->message);
        return -1;
    }
    const pid_t pid = std::get<pid_t>(started);
    v1::init::FromSandbox msg;
    msg.mutable_started()->set_pid(pid);
    send(fd, msg);
    return pid;
}

}  // namespace

[[noreturn]] void run_init(UniqueFd control, UniqueFd oom_score_adj) {
    ::prctl(PR_SET_NAME, "berth-init");
    prepare_commands(std::move(oom_score_adj));
    // Not dumpable: processes in the sandbox cannot ptrace init or read its memory. Nothing
    // that shares this mm ever sets it back (see command.cc).
    ::prctl(PR_SET_DUMPABLE, 0);

    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGCHLD);
    ::sigprocmask(SIG_BLOCK, &mask, nullptr);
    UniqueFd children(::signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK));

    // Running execs by command pid. Every other child of ours is an orphan (a background
    // process whose exec ended), reaped and forgotten.
    std::map<pid_t, Exec> execs;
    std::vector<pollfd> fds;
    std::vector<pid_t> owners;

    for (;;) {
        fds.assign({{control.get(), POLLIN, 0}, {children.get(), POLLIN, 0}});
        owners.assign({-1, -1});
        for (auto& [pid, exec] : execs) {
            if (!exec.connection) continue;
            fds.push_back({exec.connection.get(), POLLIN, 0});
            owners.push_back(pid);
        }
        if (::poll(fds.data(), fds.size(), -1) < 0) continue;  // EINTR

        if (fds[1].revents & POLLIN) {
            signalfd_siginfo info;
            while (::read(children.get(), &info, sizeof info) == sizeof info) {
            }
        }
        int status;
        pid_t reaped;
        while ((reaped = ::waitpid(-1, &status, WNOHANG)) > 0) {
            auto it = execs.find(reaped);
            if (it == execs.end()) continue;
            if (it->second.connection) {
                v1::init::FromSandbox msg;
                auto* e = msg.mutable_exited();
                if (WIFSIGNALED(status))
                    e->set_signal(WTERMSIG(status));
                else
                    e->set_exit_code(WEXITSTATUS(status));
                e->set_killed_by_request(it->second.kill_requested);
                // A failure is worth a statfs: was the writable layer full (ENOSPC is what
                // the command saw; the client gets to know why)? Not on a success's path.
                if (WIFSIGNALED(status) || WEXITSTATUS(status) != 0) {
                    struct statfs sf;
                    if (::statfs("/", &sf) == 0) {
                        const uint64_t free_bytes = uint64_t{sf.f_bavail} * sf.f_bsize;
                        e->set_storage_full(free_bytes < (uint64_t{2} << 20) ||
                                            (sf.f_files > 0 && sf.f_ffree == 0));
                    }
                }
                send(it->second.connection.get(), msg);
            }
            execs.erase(it);
        }

        for (size_t i = 2; i < fds.size(); ++i) {
            if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
            auto it = execs.find(owners[i]);
            if (it == execs.end()) continue;  // exited and reaped above
            Exec& exec = it->second;
            v1::init::ToSandbox msg;
            wire::ReadStatus rs;
            try {
                rs = wire::read_frame(exec.connection.get(), msg, wire::kInitMaxFrame);
            } catch (const std::exception&) {
                rs = wire::ReadStatus::eof;
            }
            if (rs == wire::ReadStatus::ok && msg.has_signal() &&
                msg.signal().signal() != SIGKILL) {
                ::kill(exec.pid, msg.signal().signal());
                continue;
            }
            // SIGKILL asked for, the daemon gone, or garbage: end everything the exec started.
            exec.kill_requested = true;
            kill_command_tree(exec.pid);
            if (rs != wire::ReadStatus::ok) exec.connection.reset();  // nobody to tell
        }

        if (fds[0].revents & POLLIN) {
            int fd = ::accept4(control.get(), nullptr, nullptr, SOCK_CLOEXEC);
            if (fd < 0) continue;
            UniqueFd connection(fd);
            set_timeouts(fd);
            pid_t pid = accept_request(connection);
            if (pid > 0) execs[pid] = Exec{std::move(connection), pid, false};
        }
    }
}

}  // namespace berth::init
