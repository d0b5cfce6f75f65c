// berth-init: PID 1 of every sandbox.
//
// It holds the sandbox's namespaces, reaps orphans, and is the sandbox's fork server: for
// each connection on its control socket it forks an exec shim (exec_shim.h) and goes back
// to waiting. init itself never parses a byte from the daemon: a malformed request can at
// worst crash the shim that owns it.
#pragma once

#include "base/unique_fd.h"
#include "ns/security.h"

namespace berth::init {

// Puts the sandbox-wide security defaults on the calling process (the future init), so that
// every process forked from it inherits them: the seccomp filter and the capability
// bounding set. Throws SysError.
void harden_init(const ns::SeccompProgram& seccomp);

// Never returns. `control` is a listening Unix socket created (and permission-restricted)
// by the helper before the sandbox's namespaces were entered.
[[noreturn]] void run_init(UniqueFd control);

}  // namespace berth::init
