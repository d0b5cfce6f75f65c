// The exec shim: one per exec, forked by berth-init, living inside the sandbox.
//
// It reads the Spawn request and stdio fds from its connection, forks the command with the
// sandbox's security defaults, and stays as a child subreaper so that every process the
// command starts — a double-forked, setsid'd grandchild included — is its descendant until
// the command exits. A Signal(SIGKILL) or a closed connection kills that whole tree.
#pragma once

#include "base/unique_fd.h"
#include "ns/security.h"

namespace berth::init {

// The sandbox's seccomp filter is already in force (inherited from init).
[[noreturn]] void run_exec_shim(UniqueFd connection);

}  // namespace berth::init
