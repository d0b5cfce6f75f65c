// berth-init: PID 1 of every sandbox.
//
// It holds the sandbox's namespaces, reaps orphans, and serves execs: one connection per
// exec on its control socket carries a Spawn (with the stdio fds) and later, maybe, a
// Signal; init answers Started or Failed, then Exited. Commands are started with
// CLONE_VM|CLONE_VFORK (command.h), so an exec costs no fork of init's memory; each command
// is its descendants' subreaper, so a timeout or cancel finds every process it started.
// Many execs run at once; init waits on all of them in one poll loop.
#pragma once

#include "base/unique_fd.h"
#include "ns/security.h"

namespace berth::init {

// Puts the sandbox-wide security defaults on the calling process (the future init), so that
// every process forked from it inherits them: the seccomp filter and the capability
// bounding set. Throws SysError.
void harden_init(const ns::SeccompProgram& seccomp);

// Never returns. `control` is a listening Unix socket created (and permission-restricted)
// by the helper before the sandbox's namespaces were entered. `oom_score_adj` is init's own
// /proc/PID/oom_score_adj, opened while it still could (before it became the namespace's
// root: from then on its mm is not dumpable and /proc/self belongs to the host's root);
// commands take their OOM score from it (command.cc). It may be invalid.
[[noreturn]] void run_init(UniqueFd control, UniqueFd oom_score_adj);

}  // namespace berth::init
