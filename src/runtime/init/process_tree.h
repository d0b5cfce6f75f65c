// Process trees inside a sandbox, read from /proc: who descends from whom, and killing a
// whole tree so that nothing it started lives on.
#pragma once

#include <sys/types.h>

#include <vector>

namespace berth::init {

// Children of `pid` (of all its threads), from /proc/PID/task/*/children.
std::vector<pid_t> children_of(pid_t pid);

// `roots` and all their descendants, parents before children.
std::vector<pid_t> tree_of(const std::vector<pid_t>& roots);

}  // namespace berth::init
