#include "runtime/init/init.h"

#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <time.h>

#include <cstring>
#include <set>

#include "base/error.h"
#include "runtime/init/exec_shim.h"
#include "runtime/init/process_tree.h"

namespace berth::init {

void harden_init(const ns::SeccompProgram& seccomp) {
    // The seccomp filter goes on here, once: every shim and command inherits it, so an exec
    // pays nothing for it (installing a filter costs 0.1-0.5 ms). init needs none of the
    // calls it denies; as root of its user namespace it may install it without
    // no_new_privs, which each command still gets from apply_identity().
    if (int rc = seccomp.install(); rc != 0) throw SysError("seccomp install", "berth-init", -rc);
    // Likewise the capability bounding set, which every exec'd command gets anyway.
    const char* step = nullptr;
    if (int rc = ns::restrict_bounding_set(ns::default_capability_names(), &step); rc != 0)
        throw SysError(step ? step : "restrict_bounding_set", "berth-init", -rc);
}

namespace {

// Passes one fd over a Unix socket.
bool send_fd(int channel, int fd) {
    char byte = 'c';
    iovec iov{&byte, 1};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
    msghdr mh{};
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    mh.msg_control = control;
    mh.msg_controllen = sizeof control;
    cmsghdr* c = CMSG_FIRSTHDR(&mh);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &fd, sizeof fd);
    return ::sendmsg(channel, &mh, MSG_NOSIGNAL) == 1;
}

int receive_fd(int channel) {
    char byte;
    iovec iov{&byte, 1};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
    msghdr mh{};
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    mh.msg_control = control;
    mh.msg_controllen = sizeof control;
    ssize_t n;
    do {
        n = ::recvmsg(channel, &mh, MSG_CMSG_CLOEXEC);
    } while (n < 0 && errno == EINTR);
    if (n != 1) return -1;
    cmsghdr* c = CMSG_FIRSTHDR(&mh);
    if (!c || c->cmsg_type != SCM_RIGHTS) return -1;
    int fd;
    std::memcpy(&fd, CMSG_DATA(c), sizeof fd);
    return fd;
}

// A shim forked ahead of need, waiting for its connection: forking is the costliest step of
// an exec on a small VM (0.5-2 ms), so init does it while the sandbox is idle, not while a
// client waits.
struct SpareShim {
    pid_t pid = -1;
    UniqueFd channel;
};

SpareShim fork_spare(int control, int children, const sigset_t& blocked) {
    int pair[2];
    if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) != 0) return {};
    UniqueFd ours(pair[0]), theirs(pair[1]);
    pid_t pid = ::fork();
    if (pid < 0) return {};  // pids limit or memory: the next exec forks on demand
    if (pid == 0) {
        ::close(control);
        ::close(children);
        ours.reset();
        ::sigprocmask(SIG_UNBLOCK, &blocked, nullptr);
        ::prctl(PR_SET_NAME, "berth-spare");
        int conn = receive_fd(theirs.get());
        if (conn < 0) ::_exit(0);  // init is replacing us, or going away
        theirs.reset();
        run_exec_shim(UniqueFd(conn));
    }
    return {pid, std::move(ours)};
}

}  // namespace

[[noreturn]] void run_init(UniqueFd control) {
    ::prctl(PR_SET_NAME, "berth-init");
    // Not dumpable: processes in the sandbox cannot ptrace init or read its memory.
    ::prctl(PR_SET_DUMPABLE, 0);

    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGCHLD);
    ::sigprocmask(SIG_BLOCK, &mask, nullptr);
    UniqueFd children(::signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK));
    SpareShim spare = fork_spare(control.get(), children.get(), mask);
    // Our children are shims, the spare, and orphans a shim left when it exited. `shims`
    // are the ones we forked; `known` is every child as of the last look.
    std::set<pid_t> shims{spare.pid};
    std::set<pid_t> known{spare.pid};

    for (;;) {
        pollfd fds[2] = {{control.get(), POLLIN, 0}, {children.get(), POLLIN, 0}};
        int ready = ::poll(fds, children ? 2 : 1, -1);
        if (ready < 0) continue;  // EINTR; nothing else can fail here

        if (fds[1].revents & POLLIN) {
            signalfd_siginfo info;
            while (::read(children.get(), &info, sizeof info) == sizeof info) {
            }
        }
        // Reap every exited process: shims, and orphans re-parented to PID 1.
        pid_t reaped;
        int status;
        bool shim_killed = false;
        while ((reaped = ::waitpid(-1, &status, WNOHANG)) > 0) {
            if (reaped == spare.pid) spare = {};
            if (shims.erase(reaped) && WIFSIGNALED(status)) shim_killed = true;
        }
        // A shim only dies by a signal when something in the sandbox killed it (its root may
        // signal anything there), most likely to slip its command past a timeout. What it
        // tracked has just been re-parented to us: the children we did not have before.
        // Kill those trees, so the exec's processes end with their shim.
        std::vector<pid_t> now = children_of(1);
        if (shim_killed) {
            std::vector<pid_t> orphans;
            for (pid_t p : now) {
                if (!known.count(p) && !shims.count(p)) orphans.push_back(p);
            }
            for (int round = 0; round < 100 && !orphans.empty(); ++round) {
                std::vector<pid_t> tree = tree_of(orphans);
                for (pid_t p : tree) ::kill(p, SIGKILL);
                orphans.clear();
                for (pid_t p : children_of(1)) {
                    if (!known.count(p) && !shims.count(p)) orphans.push_back(p);
                }
                while (::waitpid(-1, nullptr, WNOHANG) > 0) {
                }
                if (!orphans.empty()) {
                    const timespec pause{0, 1'000'000};
                    ::nanosleep(&pause, nullptr);
                }
            }
            now = children_of(1);
        }
        known = std::set<pid_t>(now.begin(), now.end());

        if (fds[0].revents & POLLIN) {
            int conn = ::accept4(control.get(), nullptr, nullptr, SOCK_CLOEXEC);
            if (conn < 0) continue;
            UniqueFd connection(conn);
            if (spare.pid > 0 && send_fd(spare.channel.get(), connection.get())) {
                spare = {};
            } else {
                pid_t shim = ::fork();
                if (shim > 0) {
                    shims.insert(shim);
                    known.insert(shim);
                }
                if (shim == 0) {
                    control.reset();
                    children.reset();
                    spare.channel.reset();
                    ::sigprocmask(SIG_UNBLOCK, &mask, nullptr);
                    run_exec_shim(std::move(connection));
                }
                // On fork failure (pids limit, memory) the connection closes: the daemon
                // reports it.
            }
            connection.reset();
            if (spare.pid < 0) {
                spare = fork_spare(control.get(), children.get(), mask);
                if (spare.pid > 0) {
                    shims.insert(spare.pid);
                    known.insert(spare.pid);
                }
            }
        }
    }
}

}  // namespace berth::init
