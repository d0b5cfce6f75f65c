// Facts about processes, from /proc.
#pragma once

#include <sys/types.h>

#include <cstdint>

namespace berth {

// Field 22 of /proc/PID/stat (clock ticks after boot): with the pid, it names one process
// for good, where a pid alone may be reused. 0 when the process does not exist (ENOENT,
// ESRCH) or has ended (a zombie). Any other failure (EMFILE, ENOMEM...) says nothing about the
// process and throws SysError: a caller out of fds must not conclude that a sandbox's init has
// died.
uint64_t process_start_time(pid_t pid);

}  // namespace berth
