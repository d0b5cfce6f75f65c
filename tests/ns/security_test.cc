// Kernel-level tests for ns/security: each case forks a child that changes its own
// credentials or installs the seccomp filter (neither can be undone), checks what the kernel
// now does, and reports failures through a pipe; the parent asserts on the exit status and
// prints the child's report. Needs root (uid 0 with CAP_SETPCAP/SETUID/SETGID/SYS_ADMIN).
#include "ns/security.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/audit.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <sys/capability.h>
#include <sys/mount.h>
#include <sys/personality.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <csignal>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace berth::ns {
namespace {

// What a child wrote to its report pipe, and how it ended.
struct ChildOutcome {
    int status = 0;
    std::string output;
};

// Runs body(report_fd) in a forked child and _exits with its return value, so nothing of
// gtest's state (atexit handlers, buffered output) runs twice.
template <typename Body>
ChildOutcome run_in_child(Body body) {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) {
        ADD_FAILURE() << "pipe2: " << std::strerror(errno);
        return {};
    }
    fflush(nullptr);
    const pid_t pid = fork();
    if (pid < 0) {
        ADD_FAILURE() << "fork: " << std::strerror(errno);
        return {};
    }
    if (pid == 0) {
        close(fds[0]);
        _exit(body(fds[1]));
    }
    close(fds[1]);
    ChildOutcome outcome;
    char buf[4096];
    for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) != 0;) {
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) break;
        outcome.output.append(buf, static_cast<size_t>(n));
    }
    close(fds[0]);
    while (waitpid(pid, &outcome.status, 0) < 0 && errno == EINTR) {
    }
    return outcome;
}

std::string describe_status(const ChildOutcome& o) {
    if (WIFEXITED(o.status)) return "exit " + std::to_string(WEXITSTATUS(o.status));
    if (WIFSIGNALED(o.status)) return std::string("signal ") + strsignal(WTERMSIG(o.status));
    return "status " + std::to_string(o.status);
}

#define EXPECT_CHILD_OK(outcome)                                                   \
    EXPECT_TRUE(WIFEXITED((outcome).status) && WEXITSTATUS((outcome).status) == 0) \
        << describe_status(outcome) << "\n"                                        \
        << (outcome).output

// Failure bookkeeping inside a child: every miss is written to the report pipe and counted.
class Checks {
  public:
    explicit Checks(int fd) : fd_(fd) {}
    int failures() const { return failures_; }

    void expect(bool ok, const char* fmt, ...) __attribute__((format(printf, 3, 4))) {
        if (ok) return;
        ++failures_;
        va_list ap;
        va_start(ap, fmt);
        dprintf(fd_, "FAILED: ");
        vdprintf(fd_, fmt, ap);
        dprintf(fd_, "\n");
        va_end(ap);
    }
    // A libc-style call that must fail with `want` (errno).
    void expect_errno(long rc, int err, int want, const char* what) {
        expect(rc == -1 && err == want, "%s: rc=%ld errno=%d (%s), want errno %d (%s)", what, rc,
               err, strerror(err), want, strerror(want));
    }
    // A libc-style call that must succeed.
    void expect_ok(long rc, int err, const char* what) {
        expect(rc != -1, "%s: failed with errno %d (%s)", what, err, strerror(err));
    }

  private:
    int fd_;
    int failures_ = 0;
};

// Expands to (rc, errno) of a call, evaluated in that order.
#define CALL(expr)                               \
    [&] {                                        \
        errno = 0;                               \
        long rc_ = (expr);                       \
        return std::pair<long, int>(rc_, errno); \
    }()
#define EXPECT_ERRNO(checks, expr, want)                 \
    do {                                                 \
        auto [rc_, err_] = CALL(expr);                   \
        (checks).expect_errno(rc_, err_, (want), #expr); \
    } while (0)
#define EXPECT_SYS_OK(checks, expr)           \
    do {                                      \
        auto [rc_, err_] = CALL(expr);        \
        (checks).expect_ok(rc_, err_, #expr); \
    } while (0)

const SeccompProgram& profile() {
    static const SeccompProgram program = SeccompProgram::default_profile();
    return program;
}

// /proc/self/status as key -> value (tabs and spaces trimmed from the value).
std::map<std::string, std::string> parse_status(const std::string& text) {
    std::map<std::string, std::string> fields;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) {
        const auto colon = line.find(':');
        if (colon == std::string::npos) continue;
        const auto start = line.find_first_not_of(" \t", colon + 1);
        const auto end = line.find_last_not_of(" \t");
        fields[line.substr(0, colon)] =
            start == std::string::npos ? "" : line.substr(start, end + 1 - start);
    }
    return fields;
}

uint64_t hex_field(const std::map<std::string, std::string>& fields, const std::string& key) {
    const auto it = fields.find(key);
    if (it == fields.end()) {
        ADD_FAILURE() << key << " missing from /proc status";
        return ~uint64_t{0};
    }
    return std::stoull(it->second, nullptr, 16);
}

// Copies /proc/self/status into the report pipe.
int send_own_status(int fd) {
    const int in = open("/proc/self/status", O_RDONLY | O_CLOEXEC);
    if (in < 0) return 100;
    char buf[8192];
    for (ssize_t n; (n = read(in, buf, sizeof buf)) > 0;) {
        if (write(fd, buf, static_cast<size_t>(n)) != n) return 101;
    }
    close(in);
    return 0;
}

constexpr uint64_t cap_bit(int cap) {
    return uint64_t{1} << cap;
}

// Docker's 14 default capabilities; CapEff of a root process under Docker reads 00000000a80425fb.
constexpr uint64_t kDockerCaps =
    cap_bit(CAP_CHOWN) | cap_bit(CAP_DAC_OVERRIDE) | cap_bit(CAP_FSETID) | cap_bit(CAP_FOWNER) |
    cap_bit(CAP_MKNOD) | cap_bit(CAP_NET_RAW) | cap_bit(CAP_SETGID) | cap_bit(CAP_SETUID) |
    cap_bit(CAP_SETFCAP) | cap_bit(CAP_SETPCAP) | cap_bit(CAP_NET_BIND_SERVICE) |
    cap_bit(CAP_SYS_CHROOT) | cap_bit(CAP_KILL) | cap_bit(CAP_AUDIT_WRITE);
static_assert(kDockerCaps == 0xa80425fb);

// Gives the process an inheritable+ambient capability, so the tests can see apply_identity
// clear both (the kernel alone would keep them for a process that stays uid 0).
bool raise_ambient_net_raw() {
    cap_t caps = cap_get_proc();
    if (!caps) return false;
    const cap_value_t net_raw = CAP_NET_RAW;
    const bool ok = cap_set_flag(caps, CAP_INHERITABLE, 1, &net_raw, CAP_SET) == 0 &&
                    cap_set_proc(caps) == 0 && cap_set_ambient(CAP_NET_RAW, CAP_SET) == 0;
    cap_free(caps);
    return ok;
}

class SecurityTest : public ::testing::Test {
  protected:
    void SetUp() override {
        if (geteuid() != 0) GTEST_SKIP() << "needs root";
    }
};

#if defined(__x86_64__)
// A syscall through the i386 entry (int $0x80): i386 numbers, 32-bit arguments.
long int80(long nr, long a = 0, long b = 0, long c = 0) {
    long ret;
    asm volatile("int $0x80"
                 : "=a"(ret)
                 : "a"(nr), "b"(a), "c"(b), "d"(c), "S"(0L), "D"(0L)
                 : "r8", "r9", "r10", "r11", "memory", "cc");
    return ret;
}
constexpr long kI386Getpid = 20;
constexpr long kI386Mount = 21;
constexpr long kI386Personality = 136;
constexpr long kI386Keyctl = 288;
constexpr long kI386Unshare = 310;
constexpr long kI386Clone3 = 435;
constexpr long kX32Bit = 0x40000000;  // __X32_SYSCALL_BIT

// Some kernels have no i386 entry at all (ia32_emulation=0, or a paravirtual guest without
// the int $0x80 gate): there int $0x80 raises SIGSEGV, so probe in a child.
bool ia32_available() {
    const auto outcome = run_in_child([](int) {
        signal(SIGSEGV, SIG_DFL);  // no sanitizer report for the expected fault
        return int80(kI386Getpid) == getpid() ? 0 : 1;
    });
    return WIFEXITED(outcome.status) && WEXITSTATUS(outcome.status) == 0;
}
#endif

TEST_F(SecurityTest, ProfileCompiles) {
    const auto start = std::chrono::steady_clock::now();
    const SeccompProgram program = SeccompProgram::default_profile();
    const auto us = std::chrono::duration_cast<std::chrono::microseconds>(
                        std::chrono::steady_clock::now() - start)
                        .count();
    EXPECT_GT(program.size(), 0u);
    EXPECT_LE(program.size(), size_t{BPF_MAXINSNS});
    std::printf(
        "[ info     ] default_profile(): %zu BPF instructions (%zu bytes), compiled in %lld us\n",
        program.size(), program.size() * sizeof(sock_filter), static_cast<long long>(us));
    RecordProperty("filter_instructions", static_cast<int>(program.size()));
}

TEST_F(SecurityTest, EmptyProgramRefusesToInstall) {
    EXPECT_EQ(SeccompProgram().install(), -EINVAL);
}

TEST_F(SecurityTest, InstallNeedsNoNewPrivsWhenUnprivileged) {
    const SeccompProgram& program = profile();
    const auto outcome = run_in_child([&](int fd) {
        Checks c(fd);
        c.expect(setresuid(65534, 65534, 65534) == 0, "setresuid: %s", strerror(errno));
        const int rc = program.install();
        c.expect(rc == -EACCES, "install without no_new_privs: %d, want -EACCES", rc);
        return c.failures();
    });
    EXPECT_CHILD_OK(outcome);
}

TEST_F(SecurityTest, FilterDeniesDangerousCalls) {
    const SeccompProgram& program = profile();
    const auto outcome = run_in_child([&](int fd) {
        Checks c(fd);
        if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return 90;
        const int rc = program.install();
        if (rc != 0) {
            dprintf(fd, "install: %s\n", strerror(-rc));
            return 91;
        }
        // Arguments that would fail differently without the filter (EBADF, ENOENT, EFAULT),
        // so a hole shows up as a wrong errno rather than a changed host.
        EXPECT_ERRNO(c, syscall(SYS_keyctl, 0 /* KEYCTL_GET_KEYRING_ID */, -1, 0), EPERM);
        EXPECT_ERRNO(c, syscall(SYS_add_key, "user", "x", "y", 1, -1), EPERM);
        EXPECT_ERRNO(c, syscall(SYS_bpf, 0, nullptr, 0), EPERM);
        EXPECT_ERRNO(c, syscall(SYS_perf_event_open, nullptr, 0, -1, -1, 0), EPERM);
        EXPECT_ERRNO(c, syscall(SYS_init_module, nullptr, 0, ""), EPERM);
        EXPECT_ERRNO(c, syscall(SYS_finit_module, -1, "", 0), EPERM);
        EXPECT_ERRNO(c, syscall(SYS_delete_module, "berth_nonexistent", 0), EPERM);
        EXPECT_ERRNO(c, syscall(SYS_kexec_load, 0, 0, nullptr, 0), EPERM);
        EXPECT_ERRNO(c, mount("none", "/berth-nonexistent", "tmpfs", 0, nullptr), EPERM);
        EXPECT_ERRNO(c, umount2("/berth-nonexistent", 0), EPERM);
        EXPECT_ERRNO(c, syscall(SYS_pivot_root, "/berth-nonexistent", "/berth-nonexistent"), EPERM);
        EXPECT_ERRNO(c, syscall(SYS_fsopen, "tmpfs", 0), EPERM);
        EXPECT_ERRNO(c, syscall(SYS_open_tree, -1, "/berth-nonexistent", 0), EPERM);
        EXPECT_ERRNO(c, syscall(SYS_move_mount, -1, "", -1, "", 0), EPERM);
        EXPECT_ERRNO(c, setns(-1, 0), EPERM);
        EXPECT_ERRNO(c, syscall(SYS_open_by_handle_at, -1, nullptr, 0), EPERM);
        EXPECT_ERRNO(c, syscall(SYS_userfaultfd, 0), EPERM);
        EXPECT_ERRNO(c, acct("/berth-nonexistent"), EPERM);
        EXPECT_ERRNO(c, syscall(SYS_reboot, 0, 0, 0, nullptr), EPERM);
        EXPECT_ERRNO(c, syscall(SYS_syslog, 3 /* SYSLOG_ACTION_READ_ALL */, nullptr, 0), EPERM);
        EXPECT_ERRNO(c, syscall(SYS_clock_settime, CLOCK_REALTIME, nullptr), EPERM);
        EXPECT_ERRNO(c, syscall(SYS_settimeofday, nullptr, nullptr), EPERM);
        EXPECT_ERRNO(c, syscall(SYS_iopl, 0), EPERM);
        EXPECT_ERRNO(c, syscall(SYS_swapoff, "/berth-nonexistent"), EPERM);
        EXPECT_ERRNO(c, syscall(SYS_quotactl, 0, nullptr, 0, nullptr), EPERM);

        // Namespace creation: every flag on its own, through unshare and through clone.
        const std::pair<unsigned long, const char*> ns_flags[] = {
            {CLONE_NEWUSER, "CLONE_NEWUSER"},     {CLONE_NEWNS, "CLONE_NEWNS"},
            {CLONE_NEWPID, "CLONE_NEWPID"},       {CLONE_NEWNET, "CLONE_NEWNET"},
            {CLONE_NEWUTS, "CLONE_NEWUTS"},       {CLONE_NEWIPC, "CLONE_NEWIPC"},
            {CLONE_NEWCGROUP, "CLONE_NEWCGROUP"},
        };
        for (const auto& [flag, name] : ns_flags) {
            errno = 0;
            long rc = unshare(static_cast<int>(flag));
            int err = errno;
            c.expect_errno(rc, err, EPERM, (std::string("unshare(") + name + ")").c_str());
            errno = 0;
            rc = syscall(SYS_clone, flag | SIGCHLD, 0, nullptr, nullptr, 0);
            err = errno;
            if (rc == 0) _exit(0);  // a filter hole forked us; the parent reports it
            c.expect_errno(rc, err, EPERM, (std::string("clone(") + name + ")").c_str());
        }
        EXPECT_ERRNO(c, unshare(CLONE_NEWTIME), EPERM);
        EXPECT_ERRNO(c, unshare(CLONE_FILES | CLONE_NEWUSER), EPERM);

        // clone3 hides its flags in memory: ENOSYS, so libc falls back to clone.
        EXPECT_ERRNO(c, syscall(SYS_clone3, nullptr, 0), ENOSYS);
        return c.failures();
    });
    EXPECT_CHILD_OK(outcome);
}

TEST_F(SecurityTest, FilterAllowsOrdinaryCalls) {
    const SeccompProgram& program = profile();
    const auto outcome = run_in_child([&](int fd) {
        Checks c(fd);
        if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return 90;
        if (program.install() != 0) return 91;

        c.expect(syscall(SYS_getpid) == getpid(), "getpid");
        const int file = open("/proc/self/status", O_RDONLY | O_CLOEXEC);
        c.expect_ok(file, errno, "open /proc/self/status");
        if (file >= 0) {
            char buf[64];
            c.expect(read(file, buf, sizeof buf) > 0, "read /proc/self/status");
            close(file);
        }
        std::string status;
        {
            std::ifstream in("/proc/self/status");
            std::stringstream ss;
            ss << in.rdbuf();
            status = ss.str();
        }
        c.expect(status.find("Seccomp:\t2") != std::string::npos, "Seccomp: 2 in status");
        c.expect(status.find("NoNewPrivs:\t1") != std::string::npos, "NoNewPrivs: 1");

        // fork is clone(2) without namespace flags.
        const pid_t pid = fork();
        if (pid == 0) _exit(42);
        c.expect_ok(pid, errno, "fork");
        int wstatus = 0;
        if (pid > 0) {
            waitpid(pid, &wstatus, 0);
            c.expect(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 42, "forked child exit");
        }
        // glibc's pthread_create tries clone3 first and must fall back to clone on ENOSYS.
        bool ran = false;
        std::thread([&] { ran = true; }).join();
        c.expect(ran, "std::thread ran");

        EXPECT_SYS_OK(c, unshare(0));
        EXPECT_SYS_OK(c, unshare(CLONE_FILES));  // not a namespace flag
        EXPECT_SYS_OK(c, syscall(SYS_kcmp, getpid(), getpid(), 0 /* KCMP_FILE */, 0, 0));
        return c.failures();
    });
    EXPECT_CHILD_OK(outcome);
}

TEST_F(SecurityTest, PersonalityAllowsOnlyDockersValues) {
    const SeccompProgram& program = profile();
    const auto outcome = run_in_child([&](int fd) {
        Checks c(fd);
        if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return 90;
        if (program.install() != 0) return 91;

        const uint32_t allowed[] = {0, 0x8, 0x20000, 0x20008, 0xffffffff};
        auto is_allowed = [&](uint32_t v) {
            return std::find(std::begin(allowed), std::end(allowed), v) != std::end(allowed);
        };
        // Every single bit, every "all ones but one bit", the allowed set and its
        // neighbours, and random values: the denied set is an exact complement.
        std::vector<uint32_t> values(std::begin(allowed), std::end(allowed));
        for (int bit = 0; bit < 32; ++bit) {
            values.push_back(uint32_t{1} << bit);
            values.push_back(~(uint32_t{1} << bit));
        }
        for (uint32_t v : allowed) {
            values.push_back(v + 1);
            values.push_back(v - 1);
        }
        std::mt19937 rng(12345);
        for (int i = 0; i < 2000; ++i) values.push_back(static_cast<uint32_t>(rng()));

        for (uint32_t v : values) {
            errno = 0;
            const long rc = syscall(SYS_personality, static_cast<unsigned long>(v));
            const int err = errno;
            if (is_allowed(v)) {
                c.expect(rc != -1, "personality(0x%" PRIx32 ") denied: %s", v, strerror(err));
            } else {
                c.expect(rc == -1 && err == EPERM, "personality(0x%" PRIx32 ") = %ld errno %d", v,
                         rc, err);
            }
            syscall(SYS_personality, 0UL);  // back to PER_LINUX for the next probe
        }
        // The kernel reads only the low 32 bits; so does the filter.
        EXPECT_ERRNO(c, syscall(SYS_personality, (1UL << 32) | ADDR_NO_RANDOMIZE), EPERM);
        EXPECT_SYS_OK(c, syscall(SYS_personality, 1UL << 32));
        EXPECT_ERRNO(c, personality(ADDR_NO_RANDOMIZE), EPERM);  // what setarch -R does
        c.expect(personality(0xffffffff) == PER_LINUX, "personality query");
        return c.failures();
    });
    EXPECT_CHILD_OK(outcome);
}

#if defined(__x86_64__)
TEST_F(SecurityTest, FilterCoversI386Abi) {
    if (!ia32_available()) {
        GTEST_SKIP() << "int $0x80 faults on this kernel (no i386 syscall entry); "
                        "ProgramVerdictsPerAbi checks the i386 rules instead";
    }
    const SeccompProgram& program = profile();
    const auto outcome = run_in_child([&](int fd) {
        Checks c(fd);
        if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return 90;
        if (program.install() != 0) return 91;

        long rc = int80(kI386Keyctl, 0, -1);
        c.expect(rc == -EPERM, "i386 keyctl = %ld, want -EPERM", rc);
        rc = int80(kI386Mount);
        c.expect(rc == -EPERM, "i386 mount = %ld, want -EPERM", rc);
        rc = int80(kI386Unshare, CLONE_NEWUSER);
        c.expect(rc == -EPERM, "i386 unshare(CLONE_NEWUSER) = %ld, want -EPERM", rc);
        rc = int80(kI386Clone3);
        c.expect(rc == -ENOSYS, "i386 clone3 = %ld, want -ENOSYS", rc);
        rc = int80(kI386Personality, ADDR_NO_RANDOMIZE);
        c.expect(rc == -EPERM, "i386 personality(ADDR_NO_RANDOMIZE) = %ld, want -EPERM", rc);
        rc = int80(kI386Personality, 0xffffffffL);
        c.expect(rc == PER_LINUX, "i386 personality query = %ld", rc);
        rc = int80(kI386Getpid);
        c.expect(rc == getpid(), "i386 getpid = %ld, want %d", rc, getpid());
        return c.failures();
    });
    EXPECT_CHILD_OK(outcome);
}

// seccomp sees an x32 call (x86_64 arch, nr | 0x40000000) before the kernel decides whether
// it has the x32 ABI, so this runs on any x86_64 kernel: keyctl is denied, and an allowed
// call is not killed as a foreign architecture.
TEST_F(SecurityTest, FilterCoversX32Abi) {
    const SeccompProgram& program = profile();
    const auto outcome = run_in_child([&](int fd) {
        Checks c(fd);
        if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return 90;
        if (program.install() != 0) return 91;
        errno = 0;
        long rc = syscall(kX32Bit | SYS_keyctl, 0, -1, 0);
        c.expect_errno(rc, errno, EPERM, "x32 keyctl");
        errno = 0;
        rc = syscall(kX32Bit | SYS_unshare, CLONE_NEWUSER);
        c.expect_errno(rc, errno, EPERM, "x32 unshare(CLONE_NEWUSER)");
        errno = 0;
        rc = syscall(kX32Bit | SYS_getpid);
        const int err = errno;
        c.expect(rc == getpid() || (rc == -1 && err == ENOSYS), "x32 getpid = %ld errno %d", rc,
                 err);
        return c.failures();
    });
    EXPECT_CHILD_OK(outcome);
}

// Runs a classic BPF seccomp program over `data` the way the kernel does (the subset of
// instructions a seccomp filter may use). Returns the SECCOMP_RET_* value, or nullopt for an
// instruction it does not know or a jump out of the program.
std::optional<uint32_t> run_filter(const std::vector<sock_filter>& prog, const seccomp_data& data) {
    uint32_t a = 0, x = 0, mem[BPF_MEMWORDS] = {};
    for (size_t pc = 0; pc < prog.size(); ++pc) {
        const sock_filter& in = prog[pc];
        const uint32_t src = BPF_SRC(in.code) == BPF_X ? x : in.k;
        switch (BPF_CLASS(in.code)) {
            case BPF_LD:
                if (in.code == (BPF_LD | BPF_W | BPF_ABS)) {
                    if (in.k % 4 != 0 || in.k + 4 > sizeof data) return std::nullopt;
                    std::memcpy(&a, reinterpret_cast<const char*>(&data) + in.k, 4);
                } else if (in.code == (BPF_LD | BPF_IMM)) {
                    a = in.k;
                } else if (in.code == (BPF_LD | BPF_MEM) && in.k < BPF_MEMWORDS) {
                    a = mem[in.k];
                } else {
                    return std::nullopt;
                }
                break;
            case BPF_LDX:
                if (in.code == (BPF_LDX | BPF_IMM)) {
                    x = in.k;
                } else if (in.code == (BPF_LDX | BPF_MEM) && in.k < BPF_MEMWORDS) {
                    x = mem[in.k];
                } else {
                    return std::nullopt;
                }
                break;
            case BPF_ST:
            case BPF_STX:
                if (in.k >= BPF_MEMWORDS) return std::nullopt;
                mem[in.k] = BPF_CLASS(in.code) == BPF_ST ? a : x;
                break;
            case BPF_ALU:
                switch (BPF_OP(in.code)) {
                    case BPF_ADD:
                        a += src;
                        break;
                    case BPF_SUB:
                        a -= src;
                        break;
                    case BPF_AND:
                        a &= src;
                        break;
                    case BPF_OR:
                        a |= src;
                        break;
                    case BPF_XOR:
                        a ^= src;
                        break;
                    case BPF_LSH:
                        a <<= src;
                        break;
                    case BPF_RSH:
                        a >>= src;
                        break;
                    case BPF_NEG:
                        a = -a;
                        break;
                    default:
                        return std::nullopt;
                }
                break;
            case BPF_JMP: {
                bool taken;
                switch (BPF_OP(in.code)) {
                    case BPF_JA:
                        pc += in.k;
                        continue;
                    case BPF_JEQ:
                        taken = a == src;
                        break;
                    case BPF_JGT:
                        taken = a > src;
                        break;
                    case BPF_JGE:
                        taken = a >= src;
                        break;
                    case BPF_JSET:
                        taken = (a & src) != 0;
                        break;
                    default:
                        return std::nullopt;
                }
                pc += taken ? in.jt : in.jf;
                break;
            }
            case BPF_RET:
                return BPF_RVAL(in.code) == BPF_A ? a : in.k;
            case BPF_MISC:
                if (BPF_MISCOP(in.code) == BPF_TAX) {
                    x = a;
                } else if (BPF_MISCOP(in.code) == BPF_TXA) {
                    a = x;
                } else {
                    return std::nullopt;
                }
                break;
            default:
                return std::nullopt;
        }
    }
    return std::nullopt;  // fell off the end: the kernel's checker would have refused it
}

// The verdicts of the exported program per ABI, including the i386 rules this kernel may be
// unable to exercise (see FilterCoversI386Abi).
TEST_F(SecurityTest, ProgramVerdictsPerAbi) {
    const auto& prog = profile().instructions();
    constexpr uint32_t kEperm = SECCOMP_RET_ERRNO | EPERM;
    constexpr uint32_t kEnosys = SECCOMP_RET_ERRNO | ENOSYS;
    constexpr uint32_t kAllow = SECCOMP_RET_ALLOW;
    constexpr uint32_t kX86_64 = AUDIT_ARCH_X86_64;
    constexpr uint32_t kI386 = AUDIT_ARCH_I386;
    struct Case {
        const char* what;
        uint32_t arch;
        long nr;
        uint64_t arg0;
        uint32_t want;
    };
    const Case cases[] = {
        {"x86_64 keyctl", kX86_64, SYS_keyctl, 0, kEperm},
        {"x86_64 getpid", kX86_64, SYS_getpid, 0, kAllow},
        {"x86_64 clone3", kX86_64, SYS_clone3, 0, kEnosys},
        {"x86_64 unshare(NEWUSER)", kX86_64, SYS_unshare, CLONE_NEWUSER, kEperm},
        {"x86_64 unshare(FILES)", kX86_64, SYS_unshare, CLONE_FILES, kAllow},
        {"x86_64 personality(query)", kX86_64, SYS_personality, 0xffffffff, kAllow},
        {"x86_64 personality(ADDR_NO_RANDOMIZE)", kX86_64, SYS_personality, ADDR_NO_RANDOMIZE,
         kEperm},
        {"x32 keyctl", kX86_64, kX32Bit | SYS_keyctl, 0, kEperm},
        {"x32 getpid", kX86_64, kX32Bit | SYS_getpid, 0, kAllow},
        {"x32 clone(NEWNET)", kX86_64, kX32Bit | SYS_clone, CLONE_NEWNET | SIGCHLD, kEperm},
        {"i386 keyctl", kI386, kI386Keyctl, 0, kEperm},
        {"i386 mount", kI386, kI386Mount, 0, kEperm},
        {"i386 umount", kI386, 22, 0, kEperm},
        {"i386 stime", kI386, 25, 0, kEperm},
        {"i386 vm86old", kI386, 113, 0, kEperm},
        {"i386 vm86", kI386, 166, 0, kEperm},
        {"i386 getpid", kI386, kI386Getpid, 0, kAllow},
        {"i386 clone3", kI386, kI386Clone3, 0, kEnosys},
        {"i386 unshare(NEWUSER)", kI386, kI386Unshare, CLONE_NEWUSER, kEperm},
        {"i386 unshare(0)", kI386, kI386Unshare, 0, kAllow},
        {"i386 clone(NEWPID)", kI386, 120, CLONE_NEWPID | SIGCHLD, kEperm},
        {"i386 clone(SIGCHLD)", kI386, 120, SIGCHLD, kAllow},
        {"i386 personality(query)", kI386, kI386Personality, 0xffffffff, kAllow},
        {"i386 personality(ADDR_NO_RANDOMIZE)", kI386, kI386Personality, ADDR_NO_RANDOMIZE, kEperm},
        // Any other ABI is a foreign architecture: libseccomp's default bad-arch action.
        {"aarch64 getpid", AUDIT_ARCH_AARCH64, 172, 0, SECCOMP_RET_KILL_THREAD},
    };
    for (const Case& tc : cases) {
        seccomp_data data{};
        data.nr = static_cast<int>(tc.nr);
        data.arch = tc.arch;
        data.args[0] = tc.arg0;
        const auto verdict = run_filter(prog, data);
        ASSERT_TRUE(verdict.has_value()) << tc.what << ": program not understood";
        EXPECT_EQ(*verdict, tc.want) << tc.what;
    }
}
#endif

TEST_F(SecurityTest, IdentityNonRootEndsWithoutCapabilities) {
    ProcessIdentity id;
    id.uid = 65534;
    id.gid = 65534;
    id.groups = {65534, 100};
    const auto outcome = run_in_child([&](int fd) {
        if (!raise_ambient_net_raw()) return 80;
        const char* step = nullptr;
        const int rc = apply_identity(id, &step);
        if (rc != 0) {
            dprintf(fd, "apply_identity: %s at %s\n", strerror(-rc), step ? step : "?");
            return 81;
        }
        return send_own_status(fd);
    });
    ASSERT_TRUE(WIFEXITED(outcome.status) && WEXITSTATUS(outcome.status) == 0)
        << describe_status(outcome) << "\n"
        << outcome.output;
    const auto status = parse_status(outcome.output);
    EXPECT_EQ(hex_field(status, "CapEff"), 0u);
    EXPECT_EQ(hex_field(status, "CapPrm"), 0u);
    EXPECT_EQ(hex_field(status, "CapInh"), 0u);
    EXPECT_EQ(hex_field(status, "CapAmb"), 0u);
    EXPECT_EQ(hex_field(status, "CapBnd"), kDockerCaps);
    EXPECT_EQ(status.at("NoNewPrivs"), "1");
    EXPECT_EQ(status.at("Uid"), "65534\t65534\t65534\t65534");
    EXPECT_EQ(status.at("Gid"), "65534\t65534\t65534\t65534");
    EXPECT_EQ(status.at("Groups"), "100 65534");
}

TEST_F(SecurityTest, IdentityRootKeepsDockerCapabilities) {
    const ProcessIdentity id;  // uid 0, gid 0, no groups, Docker's caps
    const auto outcome = run_in_child([&](int fd) {
        if (!raise_ambient_net_raw()) return 80;
        const char* step = nullptr;
        const int rc = apply_identity(id, &step);
        if (rc != 0) {
            dprintf(fd, "apply_identity: %s at %s\n", strerror(-rc), step ? step : "?");
            return 81;
        }
        return send_own_status(fd);
    });
    ASSERT_TRUE(WIFEXITED(outcome.status) && WEXITSTATUS(outcome.status) == 0)
        << describe_status(outcome) << "\n"
        << outcome.output;
    const auto status = parse_status(outcome.output);
    EXPECT_EQ(hex_field(status, "CapEff"), kDockerCaps);
    EXPECT_EQ(hex_field(status, "CapPrm"), kDockerCaps);
    EXPECT_EQ(hex_field(status, "CapBnd"), kDockerCaps);
    EXPECT_EQ(hex_field(status, "CapInh"), 0u);
    EXPECT_EQ(hex_field(status, "CapAmb"), 0u);
    EXPECT_EQ(status.at("NoNewPrivs"), "1");
    EXPECT_EQ(status.at("Uid"), "0\t0\t0\t0");
    EXPECT_EQ(status.at("Groups"), "");
}

// The whole exec path: identity, then the filter, then execve. What the exec'd program
// sees is what a sandbox process gets (a root exec receives its bounding set as permitted).
TEST_F(SecurityTest, IdentityAndFilterSurviveExec) {
    const SeccompProgram& program = profile();
    for (const uid_t uid : {uid_t{0}, uid_t{65534}}) {
        ProcessIdentity id;
        id.uid = uid;
        id.gid = uid;
        const auto outcome = run_in_child([&](int fd) {
            const char* step = nullptr;
            int rc = apply_identity(id, &step);
            if (rc != 0) {
                dprintf(fd, "apply_identity: %s at %s\n", strerror(-rc), step ? step : "?");
                return 81;
            }
            if ((rc = program.install()) != 0) {
                dprintf(fd, "install: %s\n", strerror(-rc));
                return 82;
            }
            if (dup2(fd, STDOUT_FILENO) < 0) return 83;
            execl("/bin/cat", "cat", "/proc/self/status", static_cast<char*>(nullptr));
            return 84;
        });
        SCOPED_TRACE("uid " + std::to_string(uid));
        ASSERT_TRUE(WIFEXITED(outcome.status) && WEXITSTATUS(outcome.status) == 0)
            << describe_status(outcome) << "\n"
            << outcome.output;
        const auto status = parse_status(outcome.output);
        const uint64_t want = uid == 0 ? kDockerCaps : 0;
        EXPECT_EQ(hex_field(status, "CapEff"), want);
        EXPECT_EQ(hex_field(status, "CapPrm"), want);
        EXPECT_EQ(hex_field(status, "CapBnd"), kDockerCaps);
        EXPECT_EQ(hex_field(status, "CapInh"), 0u);
        EXPECT_EQ(hex_field(status, "CapAmb"), 0u);
        EXPECT_EQ(status.at("NoNewPrivs"), "1");
        EXPECT_EQ(status.at("Seccomp"), "2");
        EXPECT_EQ(status.at("Seccomp_filters"), "1");
    }
}

TEST_F(SecurityTest, IdentityAcceptsNameSpellings) {
    ProcessIdentity id;
    id.capabilities = {"cap_chown", "CAP_KILL", "kill", "Net_Bind_Service"};
    const auto outcome = run_in_child([&](int fd) {
        const char* step = nullptr;
        const int rc = apply_identity(id, &step);
        if (rc != 0) {
            dprintf(fd, "apply_identity: %s at %s\n", strerror(-rc), step ? step : "?");
            return 81;
        }
        return send_own_status(fd);
    });
    ASSERT_TRUE(WIFEXITED(outcome.status) && WEXITSTATUS(outcome.status) == 0)
        << describe_status(outcome) << "\n"
        << outcome.output;
    const auto status = parse_status(outcome.output);
    const uint64_t want = cap_bit(CAP_CHOWN) | cap_bit(CAP_KILL) | cap_bit(CAP_NET_BIND_SERVICE);
    EXPECT_EQ(hex_field(status, "CapEff"), want);
    EXPECT_EQ(hex_field(status, "CapBnd"), want);
}

TEST_F(SecurityTest, IdentityEmptyCapabilityListLeavesRootWithNone) {
    ProcessIdentity id;
    id.capabilities.clear();
    const auto outcome = run_in_child([&](int fd) {
        const char* step = nullptr;
        if (apply_identity(id, &step) != 0) return 81;
        return send_own_status(fd);
    });
    ASSERT_TRUE(WIFEXITED(outcome.status) && WEXITSTATUS(outcome.status) == 0)
        << describe_status(outcome);
    const auto status = parse_status(outcome.output);
    EXPECT_EQ(hex_field(status, "CapEff"), 0u);
    EXPECT_EQ(hex_field(status, "CapPrm"), 0u);
    EXPECT_EQ(hex_field(status, "CapBnd"), 0u);
}

TEST_F(SecurityTest, IdentityRejectsUnknownCapabilityBeforeChangingAnything) {
    for (const char* bad : {"CAP_BOGUS", "12", "", "cap_"}) {
        ProcessIdentity id;
        id.uid = 65534;
        id.capabilities = {"CHOWN", bad, "KILL"};
        const auto outcome = run_in_child([&](int fd) {
            Checks c(fd);
            const char* step = nullptr;
            const int rc = apply_identity(id, &step);
            c.expect(rc == -EINVAL, "rc = %d, want -EINVAL", rc);
            c.expect(step == id.capabilities[1].c_str(), "failed_step = %p (%s), want the name",
                     static_cast<const void*>(step), step ? step : "null");
            // Nothing changed: still uid 0 with the full bounding set and no no_new_privs.
            c.expect(getuid() == 0, "uid changed to %d", getuid());
            c.expect(prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) == 0, "no_new_privs set");
            c.expect(cap_get_bound(CAP_SYS_ADMIN) == 1, "bounding set touched");
            // A null failed_step is fine too.
            c.expect(apply_identity(id, nullptr) == -EINVAL, "null failed_step");
            return c.failures();
        });
        SCOPED_TRACE(std::string("name \"") + bad + "\"");
        EXPECT_CHILD_OK(outcome);
    }
}

TEST_F(SecurityTest, RaiseNofileLimitUsesTheHardLimit) {
    rlimit before{};
    ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &before), 0);
    rlim_t nr_open = RLIM_INFINITY;
    std::ifstream("/proc/sys/fs/nr_open") >> nr_open;
    const rlim_t want = std::min({before.rlim_max, rlim_t{1} << 20, nr_open});

    struct Result {
        rlim_t returned, soft, hard;
    };
    const auto outcome = run_in_child([&](int fd) {
        Result r{};
        try {
            r.returned = raise_nofile_limit();
        } catch (const std::exception& e) {
            dprintf(fd, "raise_nofile_limit: %s\n", e.what());
            return 1;
        }
        rlimit now{};
        if (getrlimit(RLIMIT_NOFILE, &now) != 0) return 2;
        r.soft = now.rlim_cur;
        r.hard = now.rlim_max;
        return write(fd, &r, sizeof r) == sizeof r ? 0 : 3;
    });
    ASSERT_TRUE(WIFEXITED(outcome.status) && WEXITSTATUS(outcome.status) == 0)
        << describe_status(outcome) << "\n"
        << outcome.output;
    ASSERT_EQ(outcome.output.size(), sizeof(Result));
    Result r;
    std::memcpy(&r, outcome.output.data(), sizeof r);
    EXPECT_EQ(r.returned, want);
    EXPECT_EQ(r.soft, want);
    EXPECT_EQ(r.hard, want);
    std::printf("[ info     ] raise_nofile_limit(): %llu (hard limit before: %llu)\n",
                static_cast<unsigned long long>(r.returned),
                static_cast<unsigned long long>(before.rlim_max));
}

// Not a pass/fail test: prints what install() costs, in fresh children as on the exec path.
TEST_F(SecurityTest, InstallCost) {
    const SeccompProgram& program = profile();
    constexpr int kRuns = 100;
    std::vector<double> micros;
    for (int i = 0; i < kRuns; ++i) {
        const auto outcome = run_in_child([&](int fd) {
            if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return 90;
            const auto start = std::chrono::steady_clock::now();
            const int rc = program.install();
            const std::chrono::duration<double, std::micro> took =
                std::chrono::steady_clock::now() - start;
            if (rc != 0) return 91;
            const double us = took.count();
            return write(fd, &us, sizeof us) == sizeof us ? 0 : 92;
        });
        ASSERT_TRUE(WIFEXITED(outcome.status) && WEXITSTATUS(outcome.status) == 0)
            << describe_status(outcome);
        ASSERT_EQ(outcome.output.size(), sizeof(double));
        double us;
        std::memcpy(&us, outcome.output.data(), sizeof us);
        micros.push_back(us);
    }
    std::sort(micros.begin(), micros.end());
    std::printf(
        "[ info     ] install() of %zu insns over %d fresh children: min %.1f us, "
        "median %.1f us, p90 %.1f us, max %.1f us\n",
        program.size(), kRuns, micros.front(), micros[kRuns / 2], micros[kRuns * 9 / 10],
        micros.back());
    RecordProperty("install_median_us", static_cast<int>(micros[kRuns / 2]));
}

}  // namespace
}  // namespace berth::ns
