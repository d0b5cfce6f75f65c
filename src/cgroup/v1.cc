// The v1 driver: one directory per hierarchy (memory, cpu, cpuacct, pids, and freezer when
// mounted), which may be fewer directories than controllers where hierarchies are co-mounted.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <stdexcept>

#include "base/error.h"
#include "base/files.h"
#include "cgroup/cgroup.h"
#include "cgroup/devices.h"
#include "cgroup/internal.h"

namespace berth::cgroup {
namespace internal {
namespace {

// The sandbox's directory in each hierarchy it uses. cpuacct and freezer are optional: cpu
// usage then reads 0 and kill() falls back to the plain procs loop.
struct Dirs {
    std::string memory, cpu, cpuacct, pids, freezer, devices;

    Dirs(const Mounts& mounts, const std::string& rel) {
        auto dir = [&](const char* controller) {
            auto it = mounts.v1.find(controller);
            return it == mounts.v1.end() ? std::string() : it->second + "/" + rel;
        };
        memory = dir("memory");
        cpu = dir("cpu");
        cpuacct = dir("cpuacct");
        pids = dir("pids");
        freezer = dir("freezer");
        devices = dir("devices");
    }

    // Each directory once, in a fixed order (co-mounted hierarchies share one).
    std::vector<std::string> unique() const {
        std::vector<std::string> out;
        for (const std::string* d : {&memory, &cpu, &cpuacct, &pids, &freezer, &devices}) {
            if (!d->empty() && std::find(out.begin(), out.end(), *d) == out.end())
                out.push_back(*d);
        }
        return out;
    }
};

// Holds a freezer cgroup FROZEN for the scope: frozen tasks can neither fork nor exit, so one
// pass over cgroup.procs reaches every process and no listed pid is recycled before we signal
// it. Thawing on exit lets the queued SIGKILLs take effect.
// memory.limit_in_bytes of `dir`, unlimited when unset, with no room for swap: memsw
// (memory+swap) must never be below limit_in_bytes, so it is lifted first and set equal to
// the limit afterwards.
void write_memory_limit(const std::string& dir, std::optional<uint64_t> bytes) {
    const std::string mem = bytes ? std::to_string(*bytes) : "-1";
    const std::string memsw = dir + "/memory.memsw.limit_in_bytes";
    const bool has_memsw = exists(memsw);
    if (has_memsw) write_file(memsw, "-1");
    write_file(dir + "/memory.limit_in_bytes", mem);
    if (has_memsw) write_file(memsw, mem);
}

class Freeze {
  public:
    explicit Freeze(const std::string& dir) : state_(dir.empty() ? "" : dir + "/freezer.state") {
        if (state_.empty() || !exists(state_)) {
            state_.clear();
            return;
        }
        write_file(state_, "FROZEN");
        // A task in uninterruptible sleep can hold the cgroup in FREEZING; the caller's kill
        // loop copes with that, so the wait is short and its outcome is not an error.
        poll_until(Clock::now() + kSettleTime / 4, [&] { return read_file(state_) == "FROZEN\n"; });
    }
    Freeze(const Freeze&) = delete;
    Freeze& operator=(const Freeze&) = delete;
    ~Freeze() {
        if (state_.empty()) return;
        try {
            write_file(state_, "THAWED");
        } catch (const SysError&) {
            // Only possible if the cgroup vanished meanwhile, and then nothing is left frozen.
        }
    }

  private:
    std::string state_;
};

class V1Cgroup final : public Cgroup {
  public:
    explicit V1Cgroup(Dirs dirs) : d_(std::move(dirs)) {}

    void attach(pid_t pid) override {
        std::string s = std::to_string(pid);
        for (const std::string& dir : d_.unique()) write_file(dir + "/cgroup.procs", s);
    }

    Stats stats() const override {
        Stats s;
        if (!d_.cpuacct.empty()) s.cpu_usage_ns = read_u64(d_.cpuacct + "/cpuacct.usage");
        s.memory_bytes = read_u64(d_.memory + "/memory.usage_in_bytes");
        s.memory_peak_bytes = read_u64(d_.memory + "/memory.max_usage_in_bytes");
        s.pids = read_u64(d_.pids + "/pids.current");
        s.oom_kills = oom_kills();
        return s;
    }

    uint64_t oom_kills() const override {
        return find_key(read_file(d_.memory + "/memory.oom_control"), "oom_kill").value_or(0);
    }

    // The pids controller charges every task, so its hierarchy is the reference membership.
    bool populated() const override { return !read_pids(procs()).empty(); }

    void kill() override {
        // An empty cgroup is the usual case at cleanup, and a freeze/thaw cycle costs ~20 ms.
        if (read_pids(procs()).empty()) return;
        {
            Freeze frozen(d_.freezer);
            for (pid_t pid : read_pids(procs())) kill_pid(pid);
        }
        // Without a freezer, or if freezing stalled, processes may have forked past the pass.
        kill_procs(procs(), Clock::now() + kSettleTime);
    }

    void remove() override {
        auto deadline = Clock::now() + kSettleTime;
        for (const std::string& dir : d_.unique()) remove_dir(dir, deadline);
    }

    std::vector<std::string> paths() const override { return d_.unique(); }

    std::vector<int> open_procs() const override {
        std::vector<int> fds;
        try {
            for (const std::string& dir : d_.unique()) {
                const std::string file = dir + "/cgroup.procs";
                fds.push_back(check_sys(
                    "open", file, [&] { return ::open(file.c_str(), O_WRONLY | O_CLOEXEC); }));
            }
        } catch (...) {
            for (int fd : fds) ::close(fd);
            throw;
        }
        return fds;
    }

    bool rename(const std::string& name) override {
        check_relative("name", name, false);
        std::vector<std::pair<std::string, std::string>> done;  // from, to
        try {
            for (const std::string& dir : d_.unique()) {
                const std::string to = dir.substr(0, dir.rfind('/') + 1) + name;
                check_sys("rename", dir + " -> " + to,
                          [&] { return ::rename(dir.c_str(), to.c_str()); });
                done.emplace_back(dir, to);
            }
        } catch (...) {
            for (auto it = done.rbegin(); it != done.rend(); ++it)
                ::rename(it->second.c_str(), it->first.c_str());
            throw;
        }
        for (std::string* d :
             {&d_.memory, &d_.cpu, &d_.cpuacct, &d_.pids, &d_.freezer, &d_.devices})
            if (!d->empty()) *d = d->substr(0, d->rfind('/') + 1) + name;
        return true;
    }

    void set_limits(const Limits& limits) override {
        check_limits(limits);
        write_memory_limit(d_.memory, limits.memory_bytes);
        write_file(d_.cpu + "/cpu.cfs_period_us", std::to_string(kCpuPeriodUs));
        write_file(d_.cpu + "/cpu.cfs_quota_us",
                   limits.cpus ? std::to_string(cpu_quota_us(*limits.cpus)) : "-1");
        write_file(d_.pids + "/pids.max", limits.pids ? std::to_string(*limits.pids) : "max");
    }

    // Sets every limit, unset ones to unlimited, so a reused cgroup carries nothing over.
    void apply(const Limits& limits) {
        set_limits(limits);
        // Deny all, then allow the standard nodes (a fresh v1 devices cgroup inherits its
        // parent's list, usually "a *:* rwm"). Without a devices hierarchy the sandbox
        // still has nodev mounts and no device nodes from images; doctor says so.
        if (!d_.devices.empty()) {
            write_file(d_.devices + "/devices.deny", "a");
            for (const std::string& rule : device_rules_v1())
                write_file(d_.devices + "/devices.allow", rule);
        }
    }

  private:
    std::string procs() const { return d_.pids + "/cgroup.procs"; }

    Dirs d_;
};

class V1Driver final : public Driver {
  public:
    V1Driver(Mounts mounts, std::string parent)
        : mounts_(std::move(mounts)), parent_(std::move(parent)) {}

    Version version() const override { return Version::v1; }

    std::unique_ptr<Cgroup> create(const std::string& name, const Limits& limits) override {
        check_relative("name", name, false);
        check_limits(limits);
        Dirs dirs(mounts_, parent_ + "/" + name);
        bool existed = false;
        for (const std::string& dir : dirs.unique()) existed |= !make_dir(dir);
        auto cg = std::make_unique<V1Cgroup>(std::move(dirs));
        if (existed && cg->populated())
            throw SysError("create", cg->paths().front() + " (still has processes)", EBUSY);
        try {
            cg->apply(limits);
        } catch (...) {
            // What we made goes (one that was there and empty is left as it was).
            if (!existed) {
                try {
                    cg->remove();
                } catch (const std::exception&) {
                }
            }
            throw;
        }
        return cg;
    }

    void limit_parent(const Limits& budget) override {
        check_limits(budget);
        Dirs dirs(mounts_, parent_);
        for (const std::string& dir : dirs.unique()) make_dir(dir);
        // Hierarchical on v1 too: use_hierarchy is always on in the kernels berth supports
        // (writes of 0 are refused since 6.x, and it is inherited from the root).
        write_memory_limit(dirs.memory, budget.memory_bytes);
        write_file(dirs.pids + "/pids.max", budget.pids ? std::to_string(*budget.pids) : "max");
    }

    std::vector<std::string> list() override {
        std::vector<std::string> out;
        for (const std::string& dir : Dirs(mounts_, parent_).unique())
            for (std::string& name : child_dirs(dir)) out.push_back(std::move(name));
        std::sort(out.begin(), out.end());
        out.erase(std::unique(out.begin(), out.end()), out.end());
        return out;
    }

    std::unique_ptr<Cgroup> open(const std::string& name) override {
        check_relative("name", name, false);
        Dirs dirs(mounts_, parent_ + "/" + name);
        // Any surviving directory counts, so a half-finished remove() can be completed.
        for (const std::string& dir : dirs.unique())
            if (exists(dir)) return std::make_unique<V1Cgroup>(std::move(dirs));
        return nullptr;
    }

  private:
    Mounts mounts_;
    std::string parent_;
};

}  // namespace
}  // namespace internal

std::unique_ptr<Driver> make_v1_driver(const std::string& parent) {
    internal::check_relative("parent", parent, true);
    internal::Mounts mounts = internal::read_mounts();
    if (std::string missing = internal::missing_controllers(mounts.v1_controllers());
        !missing.empty())
        throw std::runtime_error("cgroup v1: no hierarchy mounted for " + missing);
    return std::make_unique<internal::V1Driver>(std::move(mounts), parent);
}

}  // namespace berth::cgroup
