// The v2 driver: one directory in the unified hierarchy, kept open for clone3(CLONE_INTO_CGROUP).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <stdexcept>

#include "base/error.h"
#include "base/files.h"
#include "base/unique_fd.h"
#include "cgroup/cgroup.h"
#include "cgroup/devices.h"
#include "cgroup/internal.h"

namespace berth::cgroup {
namespace internal {
namespace {

// Lets the children of `dir` use the kRequired controllers. Only missing ones are written:
// the kernel refuses any enabling write (EBUSY) in a non-root cgroup that holds processes,
// even of controllers already on, and berth's parent may be in use by another tool's setup.
void delegate(const std::string& dir) {
    const std::string file = dir + "/cgroup.subtree_control";
    const std::vector<std::string> have = read_controllers(file);
    std::string add;
    for (std::string_view c : kRequired) {
        if (std::find(have.begin(), have.end(), c) != have.end()) continue;
        if (!add.empty()) add += ' ';
        add += '+';
        add += c;
    }
    if (!add.empty()) write_file(file, add);
}

class V2Cgroup final : public Cgroup {
  public:
    V2Cgroup(std::string dir, UniqueFd fd) : dir_(std::move(dir)), fd_(std::move(fd)) {}

    // Opens `dir` read-only, which is all an unprivileged reader can do and what clone3 needs
    // (it rejects O_PATH descriptors). nullptr when the cgroup does not exist.
    static std::unique_ptr<V2Cgroup> open(const std::string& dir) {
        int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (fd < 0) {
            if (errno == ENOENT) return nullptr;
            throw_sys("open", dir);
        }
        return std::make_unique<V2Cgroup>(dir, UniqueFd(fd));
    }

    void attach(pid_t pid) override { write_file(dir_ + "/cgroup.procs", std::to_string(pid)); }

    int clone_into_fd() const override { return fd_.get(); }
    const std::string& dir() const { return dir_; }

    Stats stats() const override {
        Stats s;
        s.cpu_usage_ns = find_key(read_file(dir_ + "/cpu.stat"), "usage_usec").value_or(0) * 1000;
        s.memory_bytes = read_u64(dir_ + "/memory.current");
        // memory.peak arrived in Linux 5.19.
        if (auto peak = read_file_if_exists(dir_ + "/memory.peak"))
            s.memory_peak_bytes = parse_u64(*peak, dir_ + "/memory.peak");
        s.pids = read_u64(dir_ + "/pids.current");
        s.oom_kills = oom_kills();
        return s;
    }

    uint64_t oom_kills() const override {
        return find_key(read_file(dir_ + "/memory.events"), "oom_kill").value_or(0);
    }

    // cgroup.events covers descendants too, unlike cgroup.procs; a removed cgroup is empty.
    bool populated() const override {
        auto events = read_file_if_exists(dir_ + "/cgroup.events");
        return events && find_key(*events, "populated").value_or(0) != 0;
    }

    void kill() override {
        auto deadline = Clock::now() + kSettleTime;
        // cgroup.kill (Linux 5.14) is atomic against concurrent forks; older kernels get the loop.
        const std::string kill_file = dir_ + "/cgroup.kill";
        if (!exists(kill_file)) {
            kill_procs(dir_ + "/cgroup.procs", deadline);
            return;
        }
        write_file(kill_file, "1");
        poll_until(deadline, [&] { return !populated(); });
    }

    void remove() override { remove_dir(dir_, Clock::now() + kSettleTime); }

    std::vector<std::string> paths() const override { return {dir_}; }

    std::vector<int> open_procs() const override {
        const std::string file = dir_ + "/cgroup.procs";
        return {
            check_sys("open", file, [&] { return ::open(file.c_str(), O_WRONLY | O_CLOEXEC); })};
    }

    bool rename(const std::string&) override { return false; }

    void set_limits(const Limits& limits) override {
        check_limits(limits);
        apply(limits);
    }

    // Sets every limit, unset ones to unlimited, so a reused cgroup carries nothing over.
    void apply(const Limits& limits) {
        write_file(dir_ + "/memory.max",
                   limits.memory_bytes ? std::to_string(*limits.memory_bytes) : "max");
        // Sandboxes never swap; the file is absent when the kernel has no swap accounting.
        if (exists(dir_ + "/memory.swap.max")) write_file(dir_ + "/memory.swap.max", "0");
        write_file(dir_ + "/cpu.max",
                   (limits.cpus ? std::to_string(cpu_quota_us(*limits.cpus)) : "max") + " " +
                       std::to_string(kCpuPeriodUs));
        write_file(dir_ + "/pids.max", limits.pids ? std::to_string(*limits.pids) : "max");
    }

  private:
    std::string dir_;
    UniqueFd fd_;  // for clone_into_fd()
};

class V2Driver final : public Driver {
  public:
    V2Driver(std::string root, std::string parent)
        : root_(std::move(root)), parent_(std::move(parent)) {}

    Version version() const override { return Version::v2; }

    // Makes the parent, every level from the root down to it passing the controllers on
    // to the next. Returns its path.
    std::string make_parent() {
        std::string dir = root_;
        delegate(dir);
        for (std::string_view part : split(parent_, '/')) {
            dir += '/';
            dir += part;
            make_dir(dir);
            delegate(dir);
        }
        return dir;
    }

    void limit_parent(const Limits& budget) override {
        check_limits(budget);
        const std::string dir = make_parent();
        write_file(dir + "/memory.max",
                   budget.memory_bytes ? std::to_string(*budget.memory_bytes) : "max");
        if (exists(dir + "/memory.swap.max")) write_file(dir + "/memory.swap.max", "0");
        write_file(dir + "/pids.max", budget.pids ? std::to_string(*budget.pids) : "max");
    }

    std::unique_ptr<Cgroup> create(const std::string& name, const Limits& limits) override {
        check_relative("name", name, false);
        check_limits(limits);
        std::string dir = make_parent() + "/" + name;
        const bool created = make_dir(dir);
        auto cg = V2Cgroup::open(dir);
        if (!cg) throw_sys("open", dir, ENOENT);  // removed by someone else in between
        if (!created && cg->populated())
            throw SysError("create", dir + " (still has processes)", EBUSY);
        try {
            cg->apply(limits);
            // The device allowlist (v2 has no devices controller: a BPF program per cgroup).
            // Compiled and verified once; attaching it is one bpf() call. A reused cgroup gets
            // a second copy, which allows and denies the same.
            if (!device_program_) device_program_ = load_device_program();
            attach_device_program(cg->clone_into_fd(), device_program_.get(), cg->dir());
            return cg;
        } catch (...) {
            // What we made goes (one that was there and empty is left as it was).
            if (created) {
                try {
                    cg->remove();
                } catch (const std::exception&) {
                }
            }
            throw;
        }
    }

    std::unique_ptr<Cgroup> open(const std::string& name) override {
        check_relative("name", name, false);
        return V2Cgroup::open(root_ + "/" + parent_ + "/" + name);
    }

    std::vector<std::string> list() override { return child_dirs(root_ + "/" + parent_); }

  private:
    UniqueFd device_program_;
    std::string root_;  // the cgroup2 mount point
    std::string parent_;
};

}  // namespace
}  // namespace internal

std::unique_ptr<Driver> make_v2_driver(const std::string& parent) {
    internal::check_relative("parent", parent, true);
    const std::string root = internal::read_mounts().unified;
    if (root.empty()) throw std::runtime_error("cgroup v2: cgroup2 is not mounted");
    const std::string file = root + "/cgroup.controllers";
    if (std::string missing = internal::missing_controllers(internal::read_controllers(file));
        !missing.empty())
        throw std::runtime_error("cgroup v2: " + file + " lacks " + missing);
    return std::make_unique<internal::V2Driver>(root, parent);
}

}  // namespace berth::cgroup
