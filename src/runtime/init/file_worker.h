// File operations inside the sandbox: copy in, copy out, stat, mkdir -p, remove. Copies
// and removals run in a worker that berth-init forks for them, so PID 1 never blocks on a
// slow or stuck stream or a huge tree (stat and mkdir -p, a few syscalls, run in init); the worker
// has the sandbox's rights and nothing more (it is in the sandbox's namespaces, under its seccomp
// filter and capability bounding set), and it loads nothing from the sandbox's filesystem (no NSS,
// no dlopen: users come from parsing /etc/passwd).
#pragma once

#include <vector>

#include "base/unique_fd.h"
#include "init.pb.h"

namespace berth::init {

// Does `op` and answers on `connection` with one FileResult. `fds` are what came with
// the request (the stream pipe for copies). The connection doubles as the cancel signal:
// if the daemon closes it, the operation stops (a copy-in removes what it created).
void run_file_op(int connection, const v1::init::FileOp& op, std::vector<UniqueFd> fds);

}  // namespace berth::init
