// What all sandboxes together may use of the host (the budget, set on berth's parent
// cgroup) and what one sandbox gets when its create asks for no limit (the defaults),
// derived from the host so that any number of default sandboxes leaves it alive.
#pragma once

#include <cstdint>
#include <string>

namespace berth::daemon {

struct HostFacts {
    uint64_t memory_total = 0;  // MemTotal, bytes
    uint64_t pid_max = 0;       // /proc/sys/kernel/pid_max
    uint64_t threads_max = 0;   // /proc/sys/kernel/threads-max
};

struct HostBudget {
    uint64_t total_memory = 0;    // 0: no budget
    uint64_t total_pids = 0;      // 0: no budget
    uint64_t default_memory = 0;  // 0: no limit
    uint64_t default_pids = 0;    // always set: a sandbox without a pids limit can fork-bomb
};

// Reads HostFacts from /proc; throws SysError naming the file.
HostFacts read_host_facts();

// The derived values:
// - total memory: MemTotal less max(1 GiB, 20%) (half of it on hosts under 2 GiB), so the
//   host keeps room for itself, its page cache and berth's own processes;
// - total pids: half of min(pid_max, threads-max), tasks (threads) being what both count;
// - default memory: an eighth of the total, at least 512 MiB (at most the total);
//   memory in whole MiB;
// - default pids: a sixteenth of the total, within [256, 4096].
HostBudget derive_budget(const HostFacts& host);
// Sets default_memory and default_pids from total_memory and total_pids as above (no
// budget: no default memory limit, and 4096 pids).
void derive_defaults(HostBudget* budget);

// One of berthd's budget options: "auto" keeps `derived`, "none" (or "0") is no limit,
// else a number (a size with K/M/G/T suffixes, of 1024, when `size`). Returns false with
// `error` set for anything else.
bool parse_budget_option(const std::string& text, bool size, uint64_t derived, uint64_t* out,
                         std::string* error);

}  // namespace berth::daemon
