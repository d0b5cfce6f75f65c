// Starting an exec's command inside the sandbox, and ending it with everything it started.
#pragma once

#include <sys/types.h>

#include <string>
#include <variant>
#include <vector>

#include "base/unique_fd.h"
#include "berth.pb.h"
#include "init.pb.h"

namespace berth::init {

struct CommandFailure {
    v1::ErrorCode code;
    std::string message;
};

// Starts the command of `spawn` as a child of the caller (berth-init): user and groups
// from the sandbox's /etc/passwd and /etc/group, Docker's capabilities, no_new_privs, its
// own session, stdio from `stdio` (stdin, stdout, stderr), PATH searched in its own
// environment. The child is cloned with CLONE_VM|CLONE_VFORK: no page tables are copied.
// Returns the pid once the command runs, or why it could not start.
std::variant<pid_t, CommandFailure> start_command(const v1::init::Spawn& spawn,
                                                  const std::vector<UniqueFd>& stdio);

// Gives start_command init's own oom_score_adj (see run_init), read once here: call once at
// start, after the helper has set init's score.
void prepare_commands(UniqueFd oom_score_adj);

// Stops, then SIGKILLs, `main` and all its descendants.
void kill_command_tree(pid_t main);

}  // namespace berth::init
