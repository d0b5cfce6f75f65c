// The cgroup drivers against the running kernel (needs root), plus the pure parsers.
//
// BERTH_CGROUP_DRIVER=v1|v2|auto (default auto, i.e. detect()) picks the driver, so the same
// binary runs on the hybrid development host and in the cgroup v2 VM. A driver that cannot be
// made fails every kernel test with the reason; nothing is skipped.
#include "cgroup/cgroup.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/sched.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <set>

#include "base/error.h"
#include "base/files.h"
#include "base/unique_fd.h"
#include "cgroup/devices.h"
#include "cgroup/internal.h"

namespace berth::cgroup {
namespace {

using namespace std::chrono_literals;
using internal::Clock;

constexpr uint64_t kMiB = 1 << 20;

// ---- Pure parsing ----------------------------------------------------------------------------

TEST(MountinfoTest, HybridHostWithSeparateHierarchies) {
    internal::Mounts m = internal::parse_mountinfo(
        "30 22 0:27 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
        "31 30 0:28 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n"
        "32 30 0:29 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct\n"
        "34 30 0:31 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
        "38 30 0:35 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids\n"
        "39 30 0:36 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd\n"
        "40 30 0:37 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n");
    EXPECT_EQ(m.unified, "/sys/fs/cgroup/unified");
    const std::map<std::string, std::string> want = {{"cpu", "/sys/fs/cgroup/cpu"},
                                                     {"cpuacct", "/sys/fs/cgroup/cpuacct"},
                                                     {"memory", "/sys/fs/cgroup/memory"},
                                                     {"pids", "/sys/fs/cgroup/pids"}};
    EXPECT_EQ(m.v1, want);
}

TEST(MountinfoTest, CoMountedHierarchiesOptionalFieldsAndEscapes) {
    internal::Mounts m = internal::parse_mountinfo(
        "25 18 0:22 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid shared:9 - cgroup cgroup "
        "rw,xattr,cpu,cpuacct\n"
        "26 18 0:23 / /sys/fs/cgroup/my\\040mem rw shared:10 master:3 - cgroup cgroup "
        "rw,memory,clone_children,release_agent=/x\n"
        "27 18 0:23 / /mnt/again rw - cgroup cgroup rw,memory\n");
    EXPECT_EQ(m.unified, "");
    const std::map<std::string, std::string> want = {{"cpu", "/sys/fs/cgroup/cpu,cpuacct"},
                                                     {"cpuacct", "/sys/fs/cgroup/cpu,cpuacct"},
                                                     {"memory", "/sys/fs/cgroup/my mem"}};
    EXPECT_EQ(m.v1, want);
    EXPECT_EQ(internal::missing_controllers(m.v1_controllers()), "pids");
}

TEST(MountinfoTest, UnifiedOnlyHost) {
    internal::Mounts m = internal::parse_mountinfo(
        "35 24 0:30 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 "
        "rw,nsdelegate,memory_recursiveprot\n");
    EXPECT_EQ(m.unified, "/sys/fs/cgroup");
    EXPECT_TRUE(m.v1.empty());
    EXPECT_EQ(internal::missing_controllers({"cpuset", "cpu", "io", "memory", "pids"}), "");
    EXPECT_EQ(internal::missing_controllers({}), "memory cpu pids");
}

TEST(CpuQuotaTest, ScalesThePeriodWithAFloor) {
    EXPECT_EQ(internal::cpu_quota_us(0.5), 50'000u);
    EXPECT_EQ(internal::cpu_quota_us(1.25), 125'000u);
    EXPECT_EQ(internal::cpu_quota_us(2), 200'000u);
    EXPECT_EQ(internal::cpu_quota_us(0.001), 1'000u);  // the kernel's minimum quota
    for (double bad : {0.0, -1.0, double(NAN), double(INFINITY)})
        EXPECT_THROW(internal::cpu_quota_us(bad), std::invalid_argument) << bad;
}

TEST(ParseTest, FlatKeyedFiles) {
    const std::string cpu_stat = "usage_usec 1234\nuser_usec 1000\nsystem_usec 234\n";
    EXPECT_EQ(internal::find_key(cpu_stat, "usage_usec"), 1234u);
    EXPECT_EQ(internal::find_key(cpu_stat, "system_usec"), 234u);
    EXPECT_EQ(internal::find_key(cpu_stat, "user"), std::nullopt);
    EXPECT_EQ(internal::find_key("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n", "oom_kill"), 3u);
    EXPECT_EQ(internal::parse_u64("42\n", "x"), 42u);
    EXPECT_THROW(internal::parse_u64("max\n", "x"), std::runtime_error);
}

TEST(ParseTest, NamesStayInsideTheHierarchy) {
    EXPECT_NO_THROW(internal::check_relative("parent", "berth", true));
    EXPECT_NO_THROW(internal::check_relative("parent", "berth/pool", true));
    for (const char* bad : {"", "/abs", "..", "a/../b", "a//b", "a/", "."})
        EXPECT_THROW(internal::check_relative("parent", bad, true), std::invalid_argument) << bad;
    EXPECT_THROW(internal::check_relative("name", "a/b", false), std::invalid_argument);
}

// ---- Against the kernel ----------------------------------------------------------------------

// BERTH_CGROUP_DRIVER, defaulting to auto.
std::string requested_driver() {
    const char* env = std::getenv("BERTH_CGROUP_DRIVER");
    return env && *env ? env : "auto";
}

struct Pipe {
    UniqueFd read, write;
    Pipe() {
        int fds[2];
        check_sys("pipe2", "", [&] { return ::pipe2(fds, O_CLOEXEC); });
        read.reset(fds[0]);
        write.reset(fds[1]);
    }
};

// For children, which must not throw or return into gtest: a failed send ends the child.
template <typename T>
void send(int fd, const T& value) {
    if (::write(fd, &value, sizeof value) != sizeof value) ::_exit(126);
}

template <typename T>
std::optional<T> receive(int fd, std::chrono::milliseconds limit = 5s) {
    pollfd p{fd, POLLIN, 0};
    T value;
    if (::poll(&p, 1, static_cast<int>(limit.count())) != 1) return std::nullopt;
    if (::read(fd, &value, sizeof value) != sizeof value) return std::nullopt;
    return value;
}

// The wait status of `pid`, or nullopt if it has not exited within `limit`.
std::optional<int> reap(pid_t pid, std::chrono::milliseconds limit = 10s) {
    std::optional<int> status;
    internal::poll_until(Clock::now() + limit, [&] {
        int st = 0;
        pid_t r = ::waitpid(pid, &st, WNOHANG);
        if (r == pid) status = st;
        return r != 0;
    });
    return status;
}

bool killed_by_sigkill(std::optional<int> status) {
    return status && WIFSIGNALED(*status) && WTERMSIG(*status) == SIGKILL;
}

// Spins until this process has used `cpu` of processor time, however long that takes: the
// amount is what the cgroup must account, whatever the load on the host.
void spin(std::chrono::nanoseconds cpu) {
    auto used = [] {
        timespec ts;
        ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
        return std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec);
    };
    for (auto end = used() + cpu; used() < end;) {
    }
}

// Writes to every page of a fresh mapping, so all of it is charged to the memory cgroup.
void touch(size_t bytes) {
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) ::_exit(125);
    for (size_t off = 0; off < bytes; off += 4096) static_cast<volatile char*>(p)[off] = 1;
}

class CgroupTest : public testing::Test {
  protected:
    static void SetUpTestSuite() {
        // Orphaned grandchildren come back to this process, so the tests reap them all.
        ::prctl(PR_SET_CHILD_SUBREAPER, 1);
        parent_ = "berth-test-" + std::to_string(::getpid());
        const std::string want = requested_driver();
        try {
            if (want == "v1")
                driver_ = make_v1_driver(parent_);
            else if (want == "v2")
                driver_ = make_v2_driver(parent_);
            else if (want == "auto")
                driver_ = detect(parent_);
            else
                error_ = "BERTH_CGROUP_DRIVER must be v1, v2 or auto, not '" + want + "'";
        } catch (const std::exception& e) {
            error_ = "cannot make the " + want + " driver: " + e.what();
        }
    }

    static void TearDownTestSuite() {
        for (const std::string& dir : parent_dirs_) {
            if (::rmdir(dir.c_str()) != 0 && errno != ENOENT)
                ADD_FAILURE() << SysError("rmdir", dir, errno).what();
        }
        driver_.reset();
    }

    void SetUp() override {
        ASSERT_EQ(::geteuid(), 0u) << "these tests create cgroups and need root";
        ASSERT_TRUE(driver_) << error_;
    }

    // Whatever a test leaves behind is killed, removed and reaped.
    void TearDown() override {
        for (auto& cg : cgroups_) {
            try {
                cg->kill();
                cg->remove();
            } catch (const std::exception& e) {
                ADD_FAILURE() << "cleanup: " << e.what();
            }
        }
        internal::poll_until(Clock::now() + 2s, [] {
            pid_t r;
            while ((r = ::waitpid(-1, nullptr, WNOHANG)) > 0) {
            }
            return r < 0;  // ECHILD: none left
        });
    }

    Cgroup& make(const std::string& name, const Limits& limits = {}) {
        cgroups_.push_back(driver_->create(name, limits));
        for (const std::string& dir : cgroups_.back()->paths())
            parent_dirs_.insert(std::filesystem::path(dir).parent_path());
        return *cgroups_.back();
    }

    // Forks a child that runs `body` once it is in `cg` (so all it does is charged there) and
    // exits with its result.
    static pid_t spawn(Cgroup& cg, const std::function<int()>& body) {
        Pipe go;
        pid_t pid = check_sys("fork", "", [] { return ::fork(); });
        if (pid == 0) {
            go.write.reset();
            char c;
            // EOF instead of the byte: the parent failed to attach us.
            ::_exit(::read(go.read.get(), &c, 1) == 1 ? body() : 127);
        }
        cg.attach(pid);  // on a throw, `go` closes and the child exits
        check_sys("write", "go pipe", [&] { return ::write(go.write.get(), "x", 1); });
        return pid;
    }

    // The trimmed contents of `file` in whichever of the cgroup's directories has it.
    static std::string read_in(const Cgroup& cg, const std::string& file) {
        for (const std::string& dir : cg.paths()) {
            if (!internal::exists(dir + "/" + file)) continue;
            std::string s = read_file(dir + "/" + file);
            if (!s.empty() && s.back() == '\n') s.pop_back();
            return s;
        }
        ADD_FAILURE() << file << " is in none of " << testing::PrintToString(cg.paths());
        return {};
    }

    static bool has_file(const Cgroup& cg, const std::string& file) {
        for (const std::string& dir : cg.paths())
            if (internal::exists(dir + "/" + file)) return true;
        return false;
    }

    static void expect_gone(const std::vector<std::string>& paths) {
        for (const std::string& dir : paths) EXPECT_FALSE(internal::exists(dir)) << dir;
    }

    static inline std::unique_ptr<Driver> driver_;
    static inline std::string error_;
    static inline std::string parent_;
    static inline std::set<std::string> parent_dirs_;
    std::vector<std::unique_ptr<Cgroup>> cgroups_;
};

TEST_F(CgroupTest, ProbeAgreesWithDriver) {
    HostSupport host = probe_host();
    EXPECT_TRUE(host.usable) << host.reason;
    EXPECT_FALSE(host.reason.empty());
    if (requested_driver() == "auto") {
        EXPECT_EQ(host.version, driver_->version());
    }
}

TEST_F(CgroupTest, CreateWritesLimitsAndReuseResetsThem) {
    Cgroup& cg = make("limits", {.memory_bytes = 32 * kMiB, .cpus = 0.5, .pids = 20});
    if (driver_->version() == Version::v1) {
        EXPECT_EQ(read_in(cg, "memory.limit_in_bytes"), "33554432");
        if (has_file(cg, "memory.memsw.limit_in_bytes")) {
            EXPECT_EQ(read_in(cg, "memory.memsw.limit_in_bytes"), "33554432");
        }
        EXPECT_EQ(read_in(cg, "cpu.cfs_period_us"), "100000");
        EXPECT_EQ(read_in(cg, "cpu.cfs_quota_us"), "50000");
    } else {
        EXPECT_EQ(read_in(cg, "memory.max"), "33554432");
        if (has_file(cg, "memory.swap.max")) {
            EXPECT_EQ(read_in(cg, "memory.swap.max"), "0");
        }
        EXPECT_EQ(read_in(cg, "cpu.max"), "50000 100000");
    }
    EXPECT_EQ(read_in(cg, "pids.max"), "20");

    // An empty cgroup of the same name is reused, with unset limits back to unlimited.
    Cgroup& again = make("limits");
    EXPECT_EQ(again.paths(), cg.paths());
    if (driver_->version() == Version::v1) {
        EXPECT_GT(std::stoull(read_in(cg, "memory.limit_in_bytes")), uint64_t{1} << 62);
        EXPECT_EQ(read_in(cg, "cpu.cfs_quota_us"), "-1");
    } else {
        EXPECT_EQ(read_in(cg, "memory.max"), "max");
        EXPECT_EQ(read_in(cg, "cpu.max"), "max 100000");
    }
    EXPECT_EQ(read_in(cg, "pids.max"), "max");

    auto opened = driver_->open("limits");
    ASSERT_TRUE(opened);
    EXPECT_EQ(opened->paths(), cg.paths());
    EXPECT_THROW(driver_->create("a/b", {}), std::invalid_argument);
    EXPECT_THROW(driver_->create("x", {.memory_bytes = {}, .cpus = 0, .pids = {}}),
                 std::invalid_argument);
    EXPECT_FALSE(driver_->open("x")) << "a refused create left directories behind";
}

// Issue 12: a limit the kernel refuses (pids.max past PID_MAX_LIMIT) used to leave the new
// cgroup's directories in every hierarchy for good.
TEST_F(CgroupTest, ACreateWhoseLimitIsRefusedLeavesNothing) {
    EXPECT_THROW(
        driver_->create("refused", {.memory_bytes = {}, .cpus = {}, .pids = uint64_t{1} << 62}),
        SysError);
    EXPECT_FALSE(driver_->open("refused")) << "a failed create left directories behind";
    const auto names = driver_->list();
    EXPECT_EQ(std::count(names.begin(), names.end(), "refused"), 0);
}

TEST_F(CgroupTest, ListNamesTheCgroupsUnderTheParent) {
    make("listed-a");
    make("listed-b");
    const auto names = driver_->list();
    EXPECT_EQ(std::count(names.begin(), names.end(), "listed-a"), 1);
    EXPECT_EQ(std::count(names.begin(), names.end(), "listed-b"), 1);
    EXPECT_TRUE(std::is_sorted(names.begin(), names.end()));
}

TEST_F(CgroupTest, CreateRefusesACgroupInUse) {
    Cgroup& cg = make("busy");
    spawn(cg, [] { return ::pause(); });
    EXPECT_TRUE(cg.populated());
    try {
        driver_->create("busy", {});
        ADD_FAILURE() << "created over a running process";
    } catch (const SysError& e) {
        EXPECT_EQ(e.code(), EBUSY) << e.what();
    }
}

TEST_F(CgroupTest, MemoryLimitOomKills) {
    Cgroup& cg = make("oom", {.memory_bytes = 32 * kMiB, .cpus = {}, .pids = {}});
    EXPECT_EQ(cg.stats().oom_kills, 0u);
    EXPECT_EQ(cg.oom_kills(), 0u);
    pid_t pid = spawn(cg, [] {
        touch(128 * kMiB);
        return 0;
    });
    EXPECT_TRUE(killed_by_sigkill(reap(pid)));
    Stats s = cg.stats();
    EXPECT_GE(s.oom_kills, 1u);
    EXPECT_EQ(cg.oom_kills(), s.oom_kills);
    EXPECT_LE(s.memory_bytes, 32 * kMiB);
    if (s.memory_peak_bytes != 0) {
        EXPECT_GT(s.memory_peak_bytes, 16 * kMiB);
        EXPECT_LE(s.memory_peak_bytes, 32 * kMiB);
    }
}

TEST_F(CgroupTest, StatsCountMemoryAndProcesses) {
    Cgroup& cg = make("usage");
    Pipe ready;
    spawn(cg, [&] {
        touch(16 * kMiB);
        send(ready.write.get(), 'r');
        return ::pause();
    });
    ASSERT_TRUE(receive<char>(ready.read.get()));
    Stats s = cg.stats();
    EXPECT_GE(s.memory_bytes, 16 * kMiB);
    EXPECT_EQ(s.pids, 1u);
}

TEST_F(CgroupTest, PidsLimitStopsForkBomb) {
    constexpr uint64_t kMax = 20;
    Cgroup& cg = make("forkbomb", {.memory_bytes = {}, .cpus = {}, .pids = kMax});
    Pipe report;
    pid_t pid = spawn(cg, [&] {
        // Every process forks until the first failure, then reports its errno and waits.
        for (;;) {
            if (::fork() < 0) {
                send(report.write.get(), errno);
                for (;;) ::pause();
            }
        }
        return 0;
    });
    EXPECT_EQ(receive<int>(report.read.get()), EAGAIN);
    uint64_t most = 0;
    internal::poll_until(Clock::now() + 5s, [&] {
        most = std::max(most, cg.stats().pids);
        return most >= kMax;
    });
    EXPECT_EQ(most, kMax);
    EXPECT_LE(cg.stats().pids, kMax);

    const std::vector<std::string> paths = cg.paths();
    cg.kill();
    EXPECT_FALSE(cg.populated());
    EXPECT_TRUE(killed_by_sigkill(reap(pid)));
    cg.remove();
    expect_gone(paths);
}

TEST_F(CgroupTest, TheParentsBudgetCapsAllChildrenTogether) {
    constexpr uint64_t kBudget = 12;
    driver_->limit_parent({.memory_bytes = 256 * kMiB, .cpus = {}, .pids = kBudget});
    struct Unlimit {
        ~Unlimit() { driver_->limit_parent({}); }
    } unlimit;
    // Each child may have 20 tasks; together they may have 12.
    Cgroup& a = make("budget-a", {.memory_bytes = {}, .cpus = {}, .pids = 20});
    Cgroup& b = make("budget-b", {.memory_bytes = {}, .cpus = {}, .pids = 20});
    Pipe report;
    auto bomb = [&] {
        for (;;) {
            if (::fork() < 0) {
                send(report.write.get(), errno);
                for (;;) ::pause();
            }
        }
        return 0;
    };
    pid_t pa = spawn(a, bomb);
    EXPECT_EQ(receive<int>(report.read.get()), EAGAIN);
    pid_t pb = spawn(b, bomb);
    EXPECT_EQ(receive<int>(report.read.get()), EAGAIN);
    // Moving a process in is charged past any limit (the kernel's rule): b's first one
    // came in with the budget full; none of its forks did.
    EXPECT_LE(a.stats().pids + b.stats().pids, kBudget + 1);
    EXPECT_GE(a.stats().pids + b.stats().pids, kBudget);
    EXPECT_LE(b.stats().pids, 1u);
    a.kill();
    b.kill();
    EXPECT_TRUE(killed_by_sigkill(reap(pa)));
    EXPECT_TRUE(killed_by_sigkill(reap(pb)));
}

TEST_F(CgroupTest, CpuUsageIsAccountedAndQuotaThrottles) {
    Cgroup& free_cg = make("cpu-free");
    pid_t pid = spawn(free_cg, [] {
        spin(200ms);
        return 0;
    });
    auto status = reap(pid);
    ASSERT_TRUE(status && WIFEXITED(*status) && WEXITSTATUS(*status) == 0);
    EXPECT_GE(free_cg.stats().cpu_usage_ns, 200'000'000u);

    // At a fifth of a cpu (20 ms per 100 ms period), 100 ms of cpu takes at least 400 ms.
    Cgroup& slow_cg = make("cpu-quota", {.memory_bytes = {}, .cpus = 0.2, .pids = {}});
    auto start = Clock::now();
    pid = spawn(slow_cg, [] {
        spin(100ms);
        return 0;
    });
    status = reap(pid);
    ASSERT_TRUE(status && WIFEXITED(*status) && WEXITSTATUS(*status) == 0);
    EXPECT_GE(Clock::now() - start, 300ms) << "the quota did not throttle";
    EXPECT_GE(slow_cg.stats().cpu_usage_ns, 100'000'000u);
}

TEST_F(CgroupTest, KillReachesTheWholeTreeAcrossSessions) {
    Cgroup& cg = make("tree");
    Pipe report;
    pid_t pid = spawn(cg, [&] {
        // A grandchild leads a new session and has a child of its own; another grandchild
        // double-forks so its child is orphaned. None of them is a descendant by signal.
        if (::fork() == 0) {
            ::setsid();
            if (::fork() == 0) {
                send(report.write.get(), ::getpid());
                for (;;) ::pause();
            }
            send(report.write.get(), ::getpid());
            for (;;) ::pause();
        }
        if (::fork() == 0) {
            if (::fork() == 0) {
                ::setsid();
                send(report.write.get(), ::getpid());
                for (;;) ::pause();
            }
            ::_exit(0);
        }
        for (;;) ::pause();
        return 0;
    });
    std::vector<pid_t> tree{pid};
    for (int i = 0; i < 3; ++i) {
        auto p = receive<pid_t>(report.read.get());
        ASSERT_TRUE(p);
        tree.push_back(*p);
    }
    int leaders = 0;
    for (pid_t p : tree) leaders += ::getsid(p) == p;
    EXPECT_EQ(leaders, 2);
    EXPECT_GE(cg.stats().pids, tree.size());

    const std::vector<std::string> paths = cg.paths();
    cg.kill();
    EXPECT_FALSE(cg.populated());
    cg.remove();  // before reaping: zombies must not keep the cgroup busy
    expect_gone(paths);
    EXPECT_FALSE(driver_->open("tree"));
    EXPECT_TRUE(killed_by_sigkill(reap(pid)));
    for (pid_t p : tree) {
        reap(p, 1s);
        EXPECT_EQ(::kill(p, 0), -1) << p << " survived";
    }
}

TEST_F(CgroupTest, RemoveWaitsForProcessesThenGivesUp) {
    Cgroup& cg = make("remove");
    const std::vector<std::string> paths = cg.paths();
    pid_t pid = spawn(cg, [] { return ::pause(); });
    try {
        cg.remove();
        ADD_FAILURE() << "removed a cgroup with a live process";
    } catch (const SysError& e) {
        EXPECT_EQ(e.code(), EBUSY) << e.what();
    }
    cg.kill();
    EXPECT_TRUE(killed_by_sigkill(reap(pid)));
    cg.remove();
    expect_gone(paths);
    EXPECT_NO_THROW(cg.remove());  // idempotent
    EXPECT_NO_THROW(cg.kill());
    EXPECT_FALSE(cg.populated());
    EXPECT_FALSE(driver_->open("remove"));
}

TEST_F(CgroupTest, CloneIntoCgroup) {
    Cgroup& cg = make("clone");
    if (driver_->version() == Version::v1) {
        EXPECT_EQ(cg.clone_into_fd(), -1);
        return;
    }
    ASSERT_GE(cg.clone_into_fd(), 0);
    clone_args args{};
    args.flags = CLONE_INTO_CGROUP;
    args.exit_signal = SIGCHLD;
    args.cgroup = static_cast<uint64_t>(cg.clone_into_fd());
    long pid = ::syscall(SYS_clone3, &args, sizeof args);
    if (pid == 0) {
        for (;;) ::pause();
    }
    ASSERT_GT(pid, 0) << SysError("clone3", cg.paths().front(), errno).what();
    EXPECT_TRUE(cg.populated());
    EXPECT_EQ(cg.stats().pids, 1u);
    cg.kill();
    EXPECT_TRUE(killed_by_sigkill(reap(static_cast<pid_t>(pid))));
}

// The device allowlist holds for a node made outside the cgroup's reach: /dev/kmsg's numbers
// (c 1:11, readable by root anywhere else) do not open from inside, /dev/null's do.
TEST_F(CgroupTest, OnlyTheStandardDevicesOpen) {
    char tmpl[] = "/tmp/berth-devices-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    const std::string dir = tmpl;
    const std::string kmsg = dir + "/kmsg", null = dir + "/null";
    ASSERT_EQ(::mknod(kmsg.c_str(), S_IFCHR | 0600, makedev(1, 11)), 0);
    ASSERT_EQ(::mknod(null.c_str(), S_IFCHR | 0666, makedev(1, 3)), 0);
    UniqueFd outside(::open(kmsg.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
    EXPECT_TRUE(outside) << "c 1:11 must open outside the cgroup: " << std::strerror(errno);

    Cgroup& cg = make("devices");
    pid_t pid = spawn(cg, [&] {
        int fd = ::open(kmsg.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
        if (fd >= 0 || errno != EPERM) return 1;
        fd = ::open(null.c_str(), O_WRONLY | O_CLOEXEC);
        if (fd < 0) return 2;
        if (::mknod((kmsg + "2").c_str(), S_IFBLK | 0600, makedev(7, 0)) != 0) return 3;
        fd = ::open((kmsg + "2").c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
        return fd < 0 && errno == EPERM ? 0 : 4;
    });
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "step " << WEXITSTATUS(status) << " of the child failed";
    std::filesystem::remove_all(dir);
}

TEST(DeviceRulesTest, V1LinesAreTheDefaultSet) {
    auto lines = device_rules_v1();
    EXPECT_EQ(lines.front(), "c *:* m");
    EXPECT_NE(std::find(lines.begin(), lines.end(), "c 136:* rwm"), lines.end());
    for (const auto& l : lines) EXPECT_NE(l.rfind("b ", 0) == 0 && l != "b *:* m", true) << l;
}

}  // namespace
}  // namespace berth::cgroup
