// Resource control for sandboxes: one interface, a driver per cgroup version.
//
// The v2 driver (unified hierarchy) is the target; the v1 driver serves hybrid and legacy
// hosts, where v1 controllers are mounted and cgroup2 has none (crun refuses those hosts;
// berth must not). detect() picks the driver from what the host actually mounts.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace berth::cgroup {

enum class Version { v1, v2 };

struct Limits {
    std::optional<uint64_t> memory_bytes;  // memory.max / memory.limit_in_bytes; swap is off
    std::optional<double> cpus;            // fractional cpus -> quota/period (period 100 ms)
    std::optional<uint64_t> pids;          // pids.max
};

struct Stats {
    uint64_t cpu_usage_ns = 0;
    uint64_t memory_bytes = 0;       // current usage
    uint64_t memory_peak_bytes = 0;  // 0 where the kernel does not report it
    uint64_t pids = 0;
    uint64_t oom_kills = 0;  // processes killed by the OOM killer in this cgroup
};

// One sandbox's cgroup (one directory per hierarchy on v1, one directory on v2).
class Cgroup {
  public:
    virtual ~Cgroup() = default;
    // Moves a process (all its threads) into the cgroup.
    virtual void attach(pid_t pid) = 0;
    // v2: an O_DIRECTORY fd for clone3(CLONE_INTO_CGROUP); -1 where unsupported.
    virtual int clone_into_fd() const { return -1; }
    // Its cgroup.procs files, opened for writing (one per hierarchy on v1): a process that
    // holds them can move itself in by writing "0" to each (the kernel checks the opener's
    // credentials, not the writer's). A pooled sandbox shell does so while the helper goes
    // on: on v1 the first move after a quiet spell waits for an RCU grace period.
    virtual std::vector<int> open_procs() const = 0;
    // Gives the cgroup a new name under the same parent, processes and all: true when done,
    // false where the hierarchy cannot rename (cgroup2 has no rename). Throws SysError
    // naming the directory (EEXIST: the name is taken); on v1 a failure leaves every
    // hierarchy's directory under its old name.
    virtual bool rename(const std::string& name) = 0;
    // Sets memory, cpu and pids limits (unset ones to unlimited) on a cgroup that may
    // already hold processes. Throws SysError naming the file.
    virtual void set_limits(const Limits& limits) = 0;
    virtual Stats stats() const = 0;
    // Just Stats::oom_kills, from one file: the exec path reads it twice per command.
    virtual uint64_t oom_kills() const = 0;
    // True while any process is in the cgroup.
    virtual bool populated() const = 0;
    // SIGKILLs every process in the cgroup (cgroup.kill on v2 >= 5.14, else a procs loop).
    // Returns once the cgroup is empty, or after a bounded wait (then remove() reports it).
    virtual void kill() = 0;
    // Removes the directories; waits (briefly, bounded) for the last processes to go.
    // Throws if the cgroup stays busy. Idempotent.
    virtual void remove() = 0;
    // The directories, for state files and for `inspect`.
    virtual std::vector<std::string> paths() const = 0;
};

struct HostSupport {
    Version version = Version::v1;
    std::string unified_mount;                // where cgroup2 is mounted, if at all
    std::vector<std::string> v2_controllers;  // available in the cgroup2 root
    std::vector<std::string> v1_controllers;  // v1 hierarchies mounted (memory, cpu, ...)
    bool cgroup_kill = false;                 // v2 cgroup.kill
    bool memory_swap = false;                 // swap accounting available
    std::string reason;                       // why this version was chosen, for `berth doctor`
    bool usable = false;                      // memory, cpu and pids are there: detect() succeeds
};

class Driver {
  public:
    virtual ~Driver() = default;
    virtual Version version() const = 0;
    // Creates (or reuses, when it exists and is empty) the cgroup for `name` under the
    // driver's parent, applying limits (unset ones become unlimited). Throws SysError naming
    // the file on failure; std::invalid_argument for a bad name or limits, before any mkdir.
    // A cgroup it made is removed again when a limit cannot be written.
    virtual std::unique_ptr<Cgroup> create(const std::string& name, const Limits& limits) = 0;
    // Applies `budget` (memory and pids; cpus is ignored) to the parent itself, making it if
    // needed: what all sandboxes together may use, whatever each one's own limits say.
    // Unset fields become unlimited. Throws SysError naming the file (EBUSY when the
    // sandboxes already use more memory than the new budget).
    virtual void limit_parent(const Limits& budget) = 0;
    // Opens an existing cgroup (after a daemon or helper restart); nullptr if absent.
    virtual std::unique_ptr<Cgroup> open(const std::string& name) = 0;
    // The names of the cgroups under the parent (in any hierarchy, on v1), sorted: what a
    // start-up sweep compares with the sandboxes that exist.
    virtual std::vector<std::string> list() = 0;
};

// Looks at /proc/self/mountinfo and the hierarchies to see what the host offers.
HostSupport probe_host();

// Chooses the driver: v2 when the unified hierarchy has memory, cpu and pids controllers,
// else v1 when those v1 controllers are mounted; throws with the reason otherwise.
// `parent` is the directory (relative to each hierarchy's root) that holds berth's cgroups.
std::unique_ptr<Driver> detect(const std::string& parent = "berth");

// Drivers by name, for tests and for the VM test.
std::unique_ptr<Driver> make_v1_driver(const std::string& parent);
std::unique_ptr<Driver> make_v2_driver(const std::string& parent);

}  // namespace berth::cgroup
