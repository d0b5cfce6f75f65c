// Facts about processes, from /proc.
#pragma once

#include <sys/types.h>

#include <cstdint>

namespace berth {

// Field 22 of /proc/PID/stat (clock ticks after boot): with the pid, it names one process
// for good, where a pid alone may be reused. 0 when the process does not exist.
uint64_t process_start_time(pid_t pid);

}  // namespace berth
