// Helpers shared by the cgroup drivers: mount discovery, small file formats, bounded waits.
// Private to src/cgroup (and its tests); the public interface is cgroup.h.
#pragma once

#include <sys/types.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "cgroup/cgroup.h"

namespace berth::cgroup::internal {

using Clock = std::chrono::steady_clock;

// Bound on every wait here: ample for SIGKILLed processes to exit and free their memory, short
// enough that a stuck cgroup surfaces as an error instead of a hang.
inline constexpr std::chrono::milliseconds kSettleTime{2000};

// The CFS period for both versions; quotas are expressed against it.
inline constexpr uint64_t kCpuPeriodUs = 100'000;

// The non-empty pieces of `s` between `sep`s.
std::vector<std::string_view> split(std::string_view s, char sep);

// Where the cgroup filesystems are mounted.
struct Mounts {
    std::string unified;                    // cgroup2 mount point; empty when not mounted
    std::map<std::string, std::string> v1;  // v1 controller -> mount point of its hierarchy

    std::vector<std::string> v1_controllers() const {
        std::vector<std::string> out;
        for (const auto& [controller, dir] : v1) out.push_back(controller);
        return out;
    }
};

// Parses /proc/self/mountinfo text. A v1 hierarchy's controllers are its super options (so
// "cpu,cpuacct" co-mounts map both names to one directory); the first mount of each wins.
Mounts parse_mountinfo(std::string_view mountinfo);
Mounts read_mounts();

// The controllers berth needs from either version.
inline constexpr std::string_view kRequired[] = {"memory", "cpu", "pids"};
// The kRequired names not in `have`, space-separated; empty when all are there.
std::string missing_controllers(const std::vector<std::string>& have);

// CFS quota for `cpus` over kCpuPeriodUs, at least the kernel's 1 ms minimum.
// Throws std::invalid_argument unless cpus is a positive finite number.
uint64_t cpu_quota_us(double cpus);
// Throws std::invalid_argument for limits the kernel would refuse, so create() can check
// before it makes any directory.
void check_limits(const Limits& limits);

// The value of the "key N" line of a flat-keyed file (cpu.stat, memory.events, ...).
std::optional<uint64_t> find_key(std::string_view text, std::string_view key);
// A decimal number with an optional trailing newline; throws naming `what` otherwise.
uint64_t parse_u64(std::string_view text, std::string_view what);
// A file holding one decimal number.
uint64_t read_u64(const std::string& path);
// The space-separated names in cgroup.controllers or cgroup.subtree_control.
std::vector<std::string> read_controllers(const std::string& path);
bool exists(const std::string& path);

// Rejects what could escape the hierarchy root: empty, absolute, "." or ".." components, and
// (unless allow_nested) any '/'.
void check_relative(std::string_view what, std::string_view path, bool allow_nested);

// mkdir, creating missing parents; returns false when the directory already existed.
bool make_dir(const std::string& path);
// The names of the directories in `dir` (none when it does not exist), sorted.
std::vector<std::string> child_dirs(const std::string& dir);
// rmdir, retrying EBUSY (processes still exiting) until `deadline`; a missing dir is fine.
void remove_dir(const std::string& path, Clock::time_point deadline);

// The pids in a cgroup.procs file; a removed cgroup holds none.
std::vector<pid_t> read_pids(const std::string& procs);
// SIGKILLs `pid`; one that has already exited is fine.
void kill_pid(pid_t pid);
// SIGKILLs whatever `procs` lists, again and again (to catch forks), until it reads empty or
// `deadline` passes. Returns whether it emptied.
bool kill_procs(const std::string& procs, Clock::time_point deadline);

// Calls `done` until it returns true or `deadline` passes, sleeping a little longer each time
// (cgroup state settles within microseconds usually, yet may take the full bound under load).
template <typename Done>
bool poll_until(Clock::time_point deadline, Done&& done) {
    auto nap = std::chrono::microseconds(50);
    for (;;) {
        if (done()) return true;
        if (Clock::now() >= deadline) return false;
        std::this_thread::sleep_for(nap);
        nap = std::min<std::chrono::microseconds>(nap * 2, std::chrono::milliseconds(10));
    }
}

}  // namespace berth::cgroup::internal
