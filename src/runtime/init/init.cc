#include "runtime/init/init.h"

#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/error.h"
#include "runtime/init/exec_shim.h"

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

[[noreturn]] void run_init(UniqueFd control) {
    ::prctl(PR_SET_NAME, "berth-init");
    // Not dumpable: processes in the sandbox cannot ptrace init or read its memory.
    ::prctl(PR_SET_DUMPABLE, 0);
    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGCHLD);
    ::sigprocmask(SIG_BLOCK, &mask, nullptr);
    UniqueFd children(::signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK));

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
        while (::waitpid(-1, nullptr, WNOHANG) > 0) {
        }

        if (fds[0].revents & POLLIN) {
            int conn = ::accept4(control.get(), nullptr, nullptr, SOCK_CLOEXEC);
            if (conn < 0) continue;
            UniqueFd connection(conn);
            pid_t shim = ::fork();
            if (shim == 0) {
                control.reset();
                children.reset();
                ::sigprocmask(SIG_UNBLOCK, &mask, nullptr);
                run_exec_shim(std::move(connection));
            }
            // On fork failure (pids limit, memory) the connection closes: the daemon reports it.
        }
    }
}

}  // namespace berth::init
