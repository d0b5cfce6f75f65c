// Kernel-level tests for ns/security: each case forks a child that changes its own
// credentials or installs the seccomp filter (neither can be undone), checks what the kernel
// now does, and reports failures through a pipe; the parent asserts on the exit status and
// prints the child's report. Needs root (uid 0 with CAP_SETPCAP/SETUID/SETGID/SYS_ADMIN).
#include "ns/security.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/audit.h>
#include <linux/net.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <seccomp.h>
#include <sys/capability.h>
#include <sys/mount.h>
#include <sys/personality.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
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
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <set>
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
constexpr long kI386Socketcall = 102;
constexpr long kI386Socket = 359;
constexpr long kI386KexecLoad = 283;
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
        // Not on Docker's list for its default capabilities (CAP_SYS_PTRACE, CAP_SYS_NICE, ...).
        EXPECT_ERRNO(c, syscall(SYS_kcmp, getpid(), getpid(), 0 /* KCMP_FILE */, 0, 0), EPERM);
        EXPECT_ERRNO(c, syscall(SYS_pidfd_getfd, -1, 0, 0), EPERM);
        EXPECT_ERRNO(c, syscall(SYS_io_uring_setup, 1, nullptr), EPERM);
        EXPECT_ERRNO(c, syscall(SYS_set_mempolicy, 0, nullptr, 0), EPERM);
        EXPECT_ERRNO(c, syscall(SYS_sethostname, "x", 1), EPERM);
        EXPECT_ERRNO(c, syscall(SYS_vhangup), EPERM);
        EXPECT_ERRNO(c, syscall(SYS_fanotify_init, 0, 0), EPERM);
        EXPECT_ERRNO(c, syscall(SYS_request_key, "user", "x", nullptr, 0), EPERM);
        EXPECT_ERRNO(c, syscall(SYS_kexec_file_load, -1, -1, 0, "", 0), EPERM);

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
        // Allowed families work (AF_PACKET needs CAP_NET_RAW, which the test's root has).
        for (const int family : {AF_UNIX, AF_INET, AF_INET6, AF_NETLINK, AF_PACKET}) {
            const int type = family == AF_NETLINK || family == AF_PACKET ? SOCK_RAW : SOCK_DGRAM;
            errno = 0;
            const int s = socket(family, type | SOCK_CLOEXEC, 0);
            c.expect(s >= 0, "socket(family %d): %s", family, strerror(errno));
            if (s >= 0) close(s);
        }
        int pair[2];
        EXPECT_SYS_OK(c, socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair));
        // What the file worker and exec'd programs lean on.
        const int dir = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
        c.expect_ok(dir, errno, "open / O_PATH");
        if (dir >= 0) {
            struct {
                uint64_t flags, mode, resolve;
            } how{O_RDONLY | O_CLOEXEC, 0, 0x10 /* RESOLVE_IN_ROOT */};
            const long fd2 = syscall(SYS_openat2, dir, "proc/self/status", &how, sizeof how);
            c.expect(fd2 >= 0 || errno == ENOSYS, "openat2: %s", strerror(errno));
            if (fd2 >= 0) close(static_cast<int>(fd2));
            close(dir);
        }
        EXPECT_SYS_OK(c, syscall(SYS_pidfd_open, getpid(), 0));
        EXPECT_SYS_OK(c, syscall(SYS_close_range, 1000, 1010, 0));
        EXPECT_SYS_OK(c, chroot("/"));  // CAP_SYS_CHROOT is in Docker's set
        return c.failures();
    });
    EXPECT_CHILD_OK(outcome);
}

// Every family outside the allowlist fails with EAFNOSUPPORT before the kernel looks at it,
// through socket(2) and socketpair(2), whatever the upper half of the argument holds.
TEST_F(SecurityTest, FilterRefusesSocketFamiliesOffTheList) {
    const SeccompProgram& program = profile();
    const auto outcome = run_in_child([&](int fd) {
        Checks c(fd);
        if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return 90;
        if (program.install() != 0) return 91;
        const std::pair<int, const char*> denied[] = {
            {AF_VSOCK, "AF_VSOCK"},
            {AF_ALG, "AF_ALG"},
            {AF_BLUETOOTH, "AF_BLUETOOTH"},
            {AF_KEY, "AF_KEY"},
            {AF_TIPC, "AF_TIPC"},
            {AF_RDS, "AF_RDS"},
            {AF_XDP, "AF_XDP"},
            {AF_CAN, "AF_CAN"},
            {AF_LLC, "AF_LLC"},
            {AF_PPPOX, "AF_PPPOX"},
            {AF_SMC, "AF_SMC"},
            {AF_APPLETALK, "AF_APPLETALK"},
            {AF_X25, "AF_X25"},
            {AF_AX25, "AF_AX25"},
            {AF_IB, "AF_IB"},
            {AF_MCTP, "AF_MCTP"},
            {AF_QIPCRTR, "AF_QIPCRTR"},
            {AF_UNSPEC, "AF_UNSPEC"},
            {AF_MAX, "AF_MAX"},
            {1000, "1000"},
            {-1, "-1"},
        };
        for (const auto& [family, name] : denied) {
            for (const int type : {SOCK_STREAM, SOCK_DGRAM, SOCK_SEQPACKET, SOCK_RAW}) {
                errno = 0;
                long rc = socket(family, type, 0);
                c.expect_errno(
                    rc, errno, EAFNOSUPPORT,
                    (std::string("socket(") + name + ", " + std::to_string(type) + ")").c_str());
            }
            int pair[2];
            errno = 0;
            long rc = socketpair(family, SOCK_STREAM, 0, pair);
            c.expect_errno(rc, errno, EAFNOSUPPORT,
                           (std::string("socketpair(") + name + ")").c_str());
        }
        // The kernel reads the family as an int; so does the filter: AF_INET with junk above
        // is AF_INET, AF_VSOCK with junk above is still AF_VSOCK.
        EXPECT_ERRNO(c, syscall(SYS_socket, (1UL << 32) | AF_VSOCK, SOCK_STREAM, 0), EAFNOSUPPORT);
        const long s = syscall(SYS_socket, (1UL << 32) | AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        c.expect(s >= 0, "socket(AF_INET | 1<<32): %s", strerror(errno));
        return c.failures();
    });
    EXPECT_CHILD_OK(outcome);
}

// A syscall the profile does not list is refused: EPERM for a number the profile knows,
// ENOSYS for one newer than every syscall it knows (and never allowed either way).
TEST_F(SecurityTest, FilterRefusesSyscallsOffTheList) {
    const SeccompProgram& program = profile();
    const auto outcome = run_in_child([&](int fd) {
        Checks c(fd);
        if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return 90;
        if (program.install() != 0) return 91;
        EXPECT_ERRNO(c, syscall(SYS_kexec_load, 0, 0, nullptr, 0), EPERM);
        EXPECT_ERRNO(c, syscall(SYS_add_key, "user", "x", "y", 1, -1), EPERM);
        EXPECT_ERRNO(c, syscall(SYS_lookup_dcookie, 0, nullptr, 0), EPERM);
        // Unassigned numbers inside the known range (x86_64 leaves 336..423 free) get EPERM.
        EXPECT_ERRNO(c, syscall(400), EPERM);
        // file_getattr (Linux 6.17, number 468) is newer than the profile: refused with
        // ENOSYS even where the kernel has it (without the filter: EBADF for fd -1).
        EXPECT_ERRNO(c, syscall(468, -1, "", nullptr, 0, 0), ENOSYS);
        EXPECT_ERRNO(c, syscall(999), ENOSYS);
        EXPECT_ERRNO(c, syscall(0x3fffffff), ENOSYS);
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
        // socketcall's SYS_SOCKET hides the family behind a pointer: ENOSYS, so a 32-bit
        // socket of any family goes through the direct i386 socket(2), which checks it.
        const uint32_t args[3] = {AF_VSOCK, SOCK_STREAM, 0};
        rc = int80(kI386Socketcall, SYS_SOCKET, reinterpret_cast<long>(args));
        c.expect(rc == -ENOSYS, "i386 socketcall(SYS_SOCKET) = %ld, want -ENOSYS", rc);
        rc = int80(kI386Socketcall, SYS_SOCKETPAIR, reinterpret_cast<long>(args));
        c.expect(rc == -ENOSYS, "i386 socketcall(SYS_SOCKETPAIR) = %ld, want -ENOSYS", rc);
        rc = int80(kI386Socket, AF_VSOCK, SOCK_STREAM);
        c.expect(rc == -EAFNOSUPPORT, "i386 socket(AF_VSOCK) = %ld, want -EAFNOSUPPORT", rc);
        rc = int80(kI386Socket, AF_ALG, SOCK_SEQPACKET);
        c.expect(rc == -EAFNOSUPPORT, "i386 socket(AF_ALG) = %ld, want -EAFNOSUPPORT", rc);
        rc = int80(kI386Socket, AF_INET, SOCK_DGRAM);
        c.expect(rc >= 0, "i386 socket(AF_INET) = %ld", rc);
        rc = int80(kI386KexecLoad);
        c.expect(rc == -EPERM, "i386 kexec_load = %ld, want -EPERM", rc);
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
        rc = syscall(kX32Bit | SYS_socket, AF_VSOCK, SOCK_STREAM, 0);
        c.expect_errno(rc, errno, EAFNOSUPPORT, "x32 socket(AF_VSOCK)");
        errno = 0;
        rc = syscall(kX32Bit | SYS_socket, AF_ALG, SOCK_SEQPACKET, 0);
        c.expect_errno(rc, errno, EAFNOSUPPORT, "x32 socket(AF_ALG)");
        errno = 0;
        rc = syscall(kX32Bit | SYS_kexec_load, 0, 0, nullptr, 0);
        c.expect_errno(rc, errno, EPERM, "x32 kexec_load");
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
    constexpr uint32_t kEafnosupport = SECCOMP_RET_ERRNO | EAFNOSUPPORT;
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
        // Socket families, per ABI.
        {"x86_64 socket(AF_INET)", kX86_64, SYS_socket, AF_INET, kAllow},
        {"x86_64 socket(AF_INET6)", kX86_64, SYS_socket, AF_INET6, kAllow},
        {"x86_64 socket(AF_UNIX)", kX86_64, SYS_socket, AF_UNIX, kAllow},
        {"x86_64 socket(AF_NETLINK)", kX86_64, SYS_socket, AF_NETLINK, kAllow},
        {"x86_64 socket(AF_PACKET)", kX86_64, SYS_socket, AF_PACKET, kAllow},
        {"x86_64 socket(AF_VSOCK)", kX86_64, SYS_socket, AF_VSOCK, kEafnosupport},
        {"x86_64 socket(AF_ALG)", kX86_64, SYS_socket, AF_ALG, kEafnosupport},
        {"x86_64 socket(AF_BLUETOOTH)", kX86_64, SYS_socket, AF_BLUETOOTH, kEafnosupport},
        {"x86_64 socket(AF_KEY)", kX86_64, SYS_socket, AF_KEY, kEafnosupport},
        {"x86_64 socket(AF_TIPC)", kX86_64, SYS_socket, AF_TIPC, kEafnosupport},
        {"x86_64 socket(AF_XDP)", kX86_64, SYS_socket, AF_XDP, kEafnosupport},
        {"x86_64 socket(AF_INET | 1<<32)", kX86_64, SYS_socket, (1ULL << 32) | AF_INET, kAllow},
        {"x86_64 socket(AF_VSOCK | 1<<32)", kX86_64, SYS_socket, (1ULL << 32) | AF_VSOCK,
         kEafnosupport},
        {"x86_64 socketpair(AF_UNIX)", kX86_64, SYS_socketpair, AF_UNIX, kAllow},
        {"x86_64 socketpair(AF_VSOCK)", kX86_64, SYS_socketpair, AF_VSOCK, kEafnosupport},
        {"x32 socket(AF_INET)", kX86_64, kX32Bit | SYS_socket, AF_INET, kAllow},
        {"x32 socket(AF_VSOCK)", kX86_64, kX32Bit | SYS_socket, AF_VSOCK, kEafnosupport},
        {"x32 socket(AF_ALG)", kX86_64, kX32Bit | SYS_socket, AF_ALG, kEafnosupport},
        {"x32 socketpair(AF_ALG)", kX86_64, kX32Bit | SYS_socketpair, AF_ALG, kEafnosupport},
        {"i386 socket(AF_INET)", kI386, kI386Socket, AF_INET, kAllow},
        {"i386 socket(AF_NETLINK)", kI386, kI386Socket, AF_NETLINK, kAllow},
        {"i386 socket(AF_VSOCK)", kI386, kI386Socket, AF_VSOCK, kEafnosupport},
        {"i386 socket(AF_ALG)", kI386, kI386Socket, AF_ALG, kEafnosupport},
        {"i386 socketpair(AF_UNIX)", kI386, 360, AF_UNIX, kAllow},
        {"i386 socketpair(AF_KEY)", kI386, 360, AF_KEY, kEafnosupport},
        // i386 socketcall: the family is behind a pointer, so socket creation through it is
        // refused; the other sub-calls work on an existing socket and pass.
        {"i386 socketcall(SYS_SOCKET)", kI386, kI386Socketcall, SYS_SOCKET, kEnosys},
        {"i386 socketcall(SYS_SOCKETPAIR)", kI386, kI386Socketcall, SYS_SOCKETPAIR, kEnosys},
        {"i386 socketcall(SYS_CONNECT)", kI386, kI386Socketcall, SYS_CONNECT, kAllow},
        {"i386 socketcall(SYS_ACCEPT4)", kI386, kI386Socketcall, SYS_ACCEPT4, kAllow},
        {"i386 socketcall(SYS_SENDMMSG)", kI386, kI386Socketcall, SYS_SENDMMSG, kAllow},
        {"i386 socketcall(0)", kI386, kI386Socketcall, 0, kEperm},
        {"i386 socketcall(21)", kI386, kI386Socketcall, 21, kEperm},
        {"i386 socketcall(SYS_SOCKET | 1<<32)", kI386, kI386Socketcall, (1ULL << 32) | SYS_SOCKET,
         kEnosys},
        {"i386 connect", kI386, 362, 0, kAllow},
        {"i386 ipc", kI386, 117, 0, kAllow},
        // Off the list: EPERM for a number the profile knows, ENOSYS past the newest.
        {"x86_64 kexec_load", kX86_64, SYS_kexec_load, 0, kEperm},
        {"x86_64 add_key", kX86_64, SYS_add_key, 0, kEperm},
        {"x86_64 kcmp", kX86_64, SYS_kcmp, 0, kEperm},
        {"x86_64 io_uring_setup", kX86_64, SYS_io_uring_setup, 0, kEperm},
        {"x86_64 unassigned 400", kX86_64, 400, 0, kEperm},
        {"x86_64 open_tree_attr (467)", kX86_64, 467, 0, kEperm},
        {"x86_64 file_getattr (468)", kX86_64, 468, 0, kEnosys},
        {"x86_64 999", kX86_64, 999, 0, kEnosys},
        {"x86_64 520 (x32-only number)", kX86_64, 520, 0, kEnosys},
        {"x86_64 0x3fffffff", kX86_64, 0x3fffffff, 0, kEnosys},
        {"x32 kexec_load (528)", kX86_64, kX32Bit | 528, 0, kEperm},
        {"x32 execve (520)", kX86_64, kX32Bit | 520, 0, kAllow},
        {"x32 999", kX86_64, kX32Bit | 999, 0, kEnosys},
        {"x32 -1", kX86_64, -1, 0, kEnosys},
        {"i386 kexec_load", kI386, kI386KexecLoad, 0, kEperm},
        {"i386 468", kI386, 468, 0, kEnosys},
        {"i386 999", kI386, 999, 0, kEnosys},
        {"i386 0x40000000", kI386, 0x40000000, 0, kEnosys},
        // Any other ABI is a foreign architecture: its numbers mean other calls.
        {"aarch64 getpid", AUDIT_ARCH_AARCH64, 172, 0, SECCOMP_RET_KILL_PROCESS},
        {"arm getpid", AUDIT_ARCH_ARM, 20, 0, SECCOMP_RET_KILL_PROCESS},
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

// Every number of every ABI, both ways: a verdict of ALLOW (with zero arguments) only for a
// number whose name is on the profile's list, and every plain entry on the list allowed where
// the ABI has it. This catches an off-by-one in the generated search tree anywhere on the
// number line, not just at the numbers the cases above name.
TEST_F(SecurityTest, ProgramAllowsExactlyTheListedNumbers) {
    const auto& prog = profile().instructions();
    std::set<std::string> allowed_plain, listed;
    for (const SeccompRule& r : default_seccomp_rules()) {
        listed.emplace(r.name);
        if (r.verdict == SECCOMP_RET_ALLOW && r.arg0_cases.empty() && r.arg0_flags == 0) {
            allowed_plain.emplace(r.name);
        }
    }
    struct Abi {
        const char* name;
        uint32_t scmp_arch, audit_arch, base;
    };
    const Abi abis[] = {{"x86_64", SCMP_ARCH_X86_64, AUDIT_ARCH_X86_64, 0},
                        {"x32", SCMP_ARCH_X32, AUDIT_ARCH_X86_64, kX32Bit},
                        {"i386", SCMP_ARCH_X86, AUDIT_ARCH_I386, 0}};
    int allowed_count[3] = {};
    for (size_t a = 0; a < 3; ++a) {
        const Abi& abi = abis[a];
        for (uint32_t off = 0; off < 2048; ++off) {
            seccomp_data data{};
            data.arch = abi.audit_arch;
            data.nr = static_cast<int>(abi.base + off);
            const auto verdict = run_filter(prog, data);
            ASSERT_TRUE(verdict.has_value()) << abi.name << " " << off;
            char* raw = seccomp_syscall_resolve_num_arch(abi.scmp_arch, data.nr);
            const std::string name = raw ? raw : "";
            std::free(raw);
            if (*verdict == SECCOMP_RET_ALLOW) {
                ++allowed_count[a];
                // Numbers libseccomp does not name can only be the newer calls the profile
                // adds itself (uretprobe, mseal, ...): none of them beyond 467.
                if (name.empty()) {
                    EXPECT_TRUE(off <= 467) << abi.name << " " << off << " allowed, unnamed";
                } else {
                    EXPECT_TRUE(listed.contains(name)) << abi.name << " " << name << " allowed";
                }
            } else if (allowed_plain.contains(name)) {
                ADD_FAILURE() << abi.name << " " << name << " (" << off << ") listed but verdict "
                              << std::hex << *verdict;
            }
            // Unlisted or unnamed: refused with an errno, never killed and never allowed.
            if (!listed.contains(name)) {
                EXPECT_TRUE(*verdict == (SECCOMP_RET_ERRNO | EPERM) ||
                            *verdict == (SECCOMP_RET_ERRNO | ENOSYS) ||
                            (*verdict == SECCOMP_RET_ALLOW && name.empty()))
                    << abi.name << " " << off << " " << name << ": " << std::hex << *verdict;
            }
        }
    }
    std::printf("[ info     ] allowed numbers: x86_64 %d, x32 %d, i386 %d\n", allowed_count[0],
                allowed_count[1], allowed_count[2]);
}

// Docker's default profile as of moby/profiles seccomp/default_linux.go (2025), the
// unconditional allowlist; diffed against berth's table, which must follow it except where
// berth's header says why.
constexpr std::string_view kDockerDefaultAllow[] = {
    "accept",
    "accept4",
    "access",
    "adjtimex",
    "alarm",
    "bind",
    "brk",
    "cachestat",
    "capget",
    "capset",
    "chdir",
    "chmod",
    "chown",
    "chown32",
    "clock_adjtime",
    "clock_adjtime64",
    "clock_getres",
    "clock_getres_time64",
    "clock_gettime",
    "clock_gettime64",
    "clock_nanosleep",
    "clock_nanosleep_time64",
    "close",
    "close_range",
    "connect",
    "copy_file_range",
    "creat",
    "dup",
    "dup2",
    "dup3",
    "epoll_create",
    "epoll_create1",
    "epoll_ctl",
    "epoll_ctl_old",
    "epoll_pwait",
    "epoll_pwait2",
    "epoll_wait",
    "epoll_wait_old",
    "eventfd",
    "eventfd2",
    "execve",
    "execveat",
    "exit",
    "exit_group",
    "faccessat",
    "faccessat2",
    "fadvise64",
    "fadvise64_64",
    "fallocate",
    "fanotify_mark",
    "fchdir",
    "fchmod",
    "fchmodat",
    "fchmodat2",
    "fchown",
    "fchown32",
    "fchownat",
    "fcntl",
    "fcntl64",
    "fdatasync",
    "fgetxattr",
    "flistxattr",
    "flock",
    "fork",
    "fremovexattr",
    "fsetxattr",
    "fstat",
    "fstat64",
    "fstatat64",
    "fstatfs",
    "fstatfs64",
    "fsync",
    "ftruncate",
    "ftruncate64",
    "futex",
    "futex_requeue",
    "futex_time64",
    "futex_wait",
    "futex_waitv",
    "futex_wake",
    "futimesat",
    "getcpu",
    "getcwd",
    "getdents",
    "getdents64",
    "getegid",
    "getegid32",
    "geteuid",
    "geteuid32",
    "getgid",
    "getgid32",
    "getgroups",
    "getgroups32",
    "getitimer",
    "getpeername",
    "getpgid",
    "getpgrp",
    "getpid",
    "getppid",
    "getpriority",
    "getrandom",
    "getresgid",
    "getresgid32",
    "getresuid",
    "getresuid32",
    "getrlimit",
    "get_robust_list",
    "getrusage",
    "getsid",
    "getsockname",
    "getsockopt",
    "get_thread_area",
    "gettid",
    "gettimeofday",
    "getuid",
    "getuid32",
    "getxattr",
    "getxattrat",
    "inotify_add_watch",
    "inotify_init",
    "inotify_init1",
    "inotify_rm_watch",
    "io_cancel",
    "ioctl",
    "io_destroy",
    "io_getevents",
    "io_pgetevents",
    "io_pgetevents_time64",
    "ioprio_get",
    "ioprio_set",
    "io_setup",
    "io_submit",
    "ipc",
    "kill",
    "landlock_add_rule",
    "landlock_create_ruleset",
    "landlock_restrict_self",
    "lchown",
    "lchown32",
    "lgetxattr",
    "link",
    "linkat",
    "listen",
    "listmount",
    "listxattr",
    "listxattrat",
    "llistxattr",
    "_llseek",
    "lremovexattr",
    "lseek",
    "lsetxattr",
    "lstat",
    "lstat64",
    "madvise",
    "map_shadow_stack",
    "membarrier",
    "memfd_create",
    "memfd_secret",
    "mincore",
    "mkdir",
    "mkdirat",
    "mknod",
    "mknodat",
    "mlock",
    "mlock2",
    "mlockall",
    "mmap",
    "mmap2",
    "mprotect",
    "mq_getsetattr",
    "mq_notify",
    "mq_open",
    "mq_timedreceive",
    "mq_timedreceive_time64",
    "mq_timedsend",
    "mq_timedsend_time64",
    "mq_unlink",
    "mremap",
    "mseal",
    "msgctl",
    "msgget",
    "msgrcv",
    "msgsnd",
    "msync",
    "munlock",
    "munlockall",
    "munmap",
    "name_to_handle_at",
    "nanosleep",
    "newfstatat",
    "_newselect",
    "open",
    "openat",
    "openat2",
    "pause",
    "pidfd_open",
    "pidfd_send_signal",
    "pipe",
    "pipe2",
    "pkey_alloc",
    "pkey_free",
    "pkey_mprotect",
    "poll",
    "ppoll",
    "ppoll_time64",
    "prctl",
    "pread64",
    "preadv",
    "preadv2",
    "prlimit64",
    "process_mrelease",
    "pselect6",
    "pselect6_time64",
    "pwrite64",
    "pwritev",
    "pwritev2",
    "read",
    "readahead",
    "readlink",
    "readlinkat",
    "readv",
    "recv",
    "recvfrom",
    "recvmmsg",
    "recvmmsg_time64",
    "recvmsg",
    "remap_file_pages",
    "removexattr",
    "removexattrat",
    "rename",
    "renameat",
    "renameat2",
    "restart_syscall",
    "riscv_hwprobe",
    "rmdir",
    "rseq",
    "rt_sigaction",
    "rt_sigpending",
    "rt_sigprocmask",
    "rt_sigqueueinfo",
    "rt_sigreturn",
    "rt_sigsuspend",
    "rt_sigtimedwait",
    "rt_sigtimedwait_time64",
    "rt_tgsigqueueinfo",
    "sched_getaffinity",
    "sched_getattr",
    "sched_getparam",
    "sched_get_priority_max",
    "sched_get_priority_min",
    "sched_getscheduler",
    "sched_rr_get_interval",
    "sched_rr_get_interval_time64",
    "sched_setaffinity",
    "sched_setattr",
    "sched_setparam",
    "sched_setscheduler",
    "sched_yield",
    "seccomp",
    "select",
    "semctl",
    "semget",
    "semop",
    "semtimedop",
    "semtimedop_time64",
    "send",
    "sendfile",
    "sendfile64",
    "sendmmsg",
    "sendmsg",
    "sendto",
    "setfsgid",
    "setfsgid32",
    "setfsuid",
    "setfsuid32",
    "setgid",
    "setgid32",
    "setgroups",
    "setgroups32",
    "setitimer",
    "setpgid",
    "setpriority",
    "setregid",
    "setregid32",
    "setresgid",
    "setresgid32",
    "setresuid",
    "setresuid32",
    "setreuid",
    "setreuid32",
    "setrlimit",
    "set_robust_list",
    "setsid",
    "setsockopt",
    "set_thread_area",
    "set_tid_address",
    "setuid",
    "setuid32",
    "setxattr",
    "setxattrat",
    "shmat",
    "shmctl",
    "shmdt",
    "shmget",
    "shutdown",
    "sigaltstack",
    "signalfd",
    "signalfd4",
    "sigprocmask",
    "sigreturn",
    "socketcall",
    "socketpair",
    "splice",
    "stat",
    "stat64",
    "statfs",
    "statfs64",
    "statmount",
    "statx",
    "symlink",
    "symlinkat",
    "sync",
    "sync_file_range",
    "syncfs",
    "sysinfo",
    "tee",
    "tgkill",
    "time",
    "timer_create",
    "timer_delete",
    "timer_getoverrun",
    "timer_gettime",
    "timer_gettime64",
    "timer_settime",
    "timer_settime64",
    "timerfd_create",
    "timerfd_gettime",
    "timerfd_gettime64",
    "timerfd_settime",
    "timerfd_settime64",
    "times",
    "tkill",
    "truncate",
    "truncate64",
    "ugetrlimit",
    "umask",
    "uname",
    "unlink",
    "unlinkat",
    "uretprobe",
    "utime",
    "utimensat",
    "utimensat_time64",
    "utimes",
    "vfork",
    "vmsplice",
    "wait4",
    "waitid",
    "waitpid",
    "write",
    "writev",
};

// The profile is data: print it, and diff it against Docker's list.
TEST_F(SecurityTest, ProfileTableMatchesDockerDefault) {
    std::map<std::string, const SeccompRule*> ours;
    for (const SeccompRule& r : default_seccomp_rules()) {
        EXPECT_TRUE(ours.emplace(std::string(r.name), &r).second) << "duplicate row " << r.name;
    }
    auto describe = [](uint32_t v) -> std::string {
        if (v == SECCOMP_RET_ALLOW) return "allow";
        if ((v & SECCOMP_RET_ACTION_FULL) == SECCOMP_RET_ERRNO) {
            return std::string("errno ") +
                   (strerrorname_np(static_cast<int>(v & SECCOMP_RET_DATA)) ?: "?");
        }
        return "0x" + std::to_string(v);
    };
    std::printf("[ info     ] seccomp profile, %zu rows (name: verdict [arg0 tests]):\n",
                ours.size());
    for (const auto& [name, r] : ours) {
        std::string line = name + ": " + describe(r->verdict);
        for (const SeccompArgCase& c : r->arg0_cases) {
            char buf[64];
            std::snprintf(buf, sizeof buf, " [arg0==0x%x: %s]", c.value,
                          describe(c.verdict).c_str());
            line += buf;
        }
        if (r->arg0_flags != 0) {
            char buf[64];
            std::snprintf(buf, sizeof buf, " [arg0&0x%x: %s]", r->arg0_flags,
                          describe(r->flags_verdict).c_str());
            line += buf;
        }
        // One ABI's numbers, to see what the name became.
        const int nr =
            seccomp_syscall_resolve_name_arch(SCMP_ARCH_X86_64, std::string(name).c_str());
        if (nr < 0) line += "  (not on x86_64)";
        std::printf("    %s\n", line.c_str());
    }

    // Everything Docker allows unconditionally is allowed here, plainly, but for the rows
    // berth filters by argument (each documented in security.h).
    const std::set<std::string> filtered_here = {"socketpair", "socketcall"};
    for (std::string_view name : kDockerDefaultAllow) {
        const auto it = ours.find(std::string(name));
        ASSERT_NE(it, ours.end()) << name << " is on Docker's list, not on berth's";
        const SeccompRule& r = *it->second;
        if (filtered_here.contains(std::string(name))) continue;
        EXPECT_EQ(r.verdict, SECCOMP_RET_ALLOW) << name;
        EXPECT_TRUE(r.arg0_cases.empty() && r.arg0_flags == 0) << name << " filtered";
    }
    // Everything berth allows is Docker's: its unconditional list, its other rules for
    // Docker's default capabilities (kernel >= 4.8: ptrace, process_vm_*; CAP_SYS_CHROOT:
    // chroot; x86: arch_prctl, modify_ldt; personality, socket and clone with argument tests,
    // clone3 as ENOSYS), and unshare without namespace flags (berth's one addition).
    const std::set<std::string> docker_other_rules = {
        "ptrace",      "process_vm_readv", "process_vm_writev",
        "chroot",      "arch_prctl",       "modify_ldt",
        "personality", "socket",           "clone",
        "clone3",      "unshare"};
    const std::set<std::string> docker(std::begin(kDockerDefaultAllow),
                                       std::end(kDockerDefaultAllow));
    for (const auto& [name, r] : ours) {
        EXPECT_TRUE(docker.contains(name) || docker_other_rules.contains(name))
            << name << " is allowed by berth, not by Docker's default profile";
    }
    // What Docker's profile refuses a container without CAP_SYS_ADMIN and friends: none of
    // these has a row, so each gets EPERM.
    for (const char* name : {"kexec_load",
                             "kexec_file_load",
                             "add_key",
                             "keyctl",
                             "request_key",
                             "bpf",
                             "perf_event_open",
                             "mount",
                             "umount",
                             "umount2",
                             "pivot_root",
                             "setns",
                             "open_by_handle_at",
                             "init_module",
                             "finit_module",
                             "delete_module",
                             "acct",
                             "swapon",
                             "swapoff",
                             "reboot",
                             "syslog",
                             "iopl",
                             "ioperm",
                             "settimeofday",
                             "clock_settime",
                             "stime",
                             "quotactl",
                             "quotactl_fd",
                             "lookup_dcookie",
                             "userfaultfd",
                             "io_uring_setup",
                             "io_uring_enter",
                             "io_uring_register",
                             "kcmp",
                             "pidfd_getfd",
                             "process_madvise",
                             "fanotify_init",
                             "vhangup",
                             "mbind",
                             "set_mempolicy",
                             "get_mempolicy",
                             "sethostname",
                             "setdomainname",
                             "fsopen",
                             "fsconfig",
                             "fsmount",
                             "fspick",
                             "move_mount",
                             "open_tree",
                             "mount_setattr",
                             "nfsservctl",
                             "uselib",
                             "_sysctl",
                             "ustat",
                             "sysfs",
                             "vm86",
                             "vm86old",
                             "create_module",
                             "get_kernel_syms",
                             "query_module",
                             "lsm_set_self_attr",
                             "uprobe"}) {
        EXPECT_FALSE(ours.contains(name)) << name << " has a row";
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

// berth-init is forked from the helper and keeps the helper's filter under its own: every
// call the service filter denies must be one the sandbox's profile denies (with the same
// EPERM), or a sandbox would lose a call it had.
TEST(ServiceProfile, DeniesOnlyWhatTheSandboxProfileDenies) {
    const auto service = SeccompProgram::service_denied_names();
    EXPECT_FALSE(service.empty());
    const auto rules = default_seccomp_rules();
    for (const auto& name : service) {
        const bool allowed = std::any_of(rules.begin(), rules.end(),
                                         [&](const SeccompRule& r) { return r.name == name; });
        EXPECT_FALSE(allowed) << name << " has a row in the sandbox's allowlist";
    }
}

TEST_F(SecurityTest, ServiceProfileKeepsMountsAndDeniesKeyrings) {
    const SeccompProgram program = SeccompProgram::service_profile();
    const auto outcome = run_in_child([&](int fd) {
        Checks c(fd);
        if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 || program.install() != 0) return 90;
        EXPECT_ERRNO(c, syscall(SYS_keyctl, 0, -1, 0), EPERM);
        // (bpf stays: the helper loads the cgroup v2 device program.)
        EXPECT_ERRNO(c, syscall(SYS_io_uring_setup, 1, nullptr), EPERM);
        // What the helper does: mounts (ENOENT: the call got through), namespaces.
        EXPECT_ERRNO(c, mount("none", "/berth-nonexistent", "tmpfs", 0, nullptr), ENOENT);
        c.expect(unshare(CLONE_NEWNS) == 0, "unshare(CLONE_NEWNS): %s", strerror(errno));
        return c.failures();
    });
    EXPECT_CHILD_OK(outcome);
}

TEST_F(SecurityTest, WorkerProfileAllowsThreadsOnly) {
    const SeccompProgram offline = SeccompProgram::worker_profile(false);
    const SeccompProgram online = SeccompProgram::worker_profile(true);
    for (const SeccompProgram* program : {&offline, &online}) {
        const bool network = program == &online;
        const auto outcome = run_in_child([&](int fd) {
            Checks c(fd);
            if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 || program->install() != 0) return 90;
            EXPECT_ERRNO(c, fork(), EPERM);
            EXPECT_ERRNO(c, syscall(SYS_clone, SIGCHLD, 0, 0, 0, 0), EPERM);
            EXPECT_ERRNO(c, syscall(SYS_ptrace, 0 /* PTRACE_TRACEME */, 0, 0, 0), EPERM);
            EXPECT_ERRNO(c, unshare(CLONE_NEWUSER), EPERM);
            EXPECT_ERRNO(c, syscall(SYS_setresuid, 0, 0, 0), EPERM);
            EXPECT_ERRNO(c, syscall(SYS_keyctl, 0, -1, 0), EPERM);
            const int s = socket(AF_UNIX, SOCK_STREAM, 0);
            if (network) {
                c.expect(s >= 0, "socket with network: %s", strerror(errno));
            } else {
                c.expect(s < 0 && errno == EPERM, "socket without network: %d", s);
            }
            // Threads work (glibc's clone3 gets ENOSYS and falls back to clone).
            bool ran = false;
            std::thread t([&] { ran = true; });
            t.join();
            c.expect(ran, "a thread did not run");
            return c.failures();
        });
        EXPECT_CHILD_OK(outcome);
    }
}

}  // namespace
}  // namespace berth::ns
