// The default seccomp profile, as data (a table of allowed syscalls, like sandbox2's
// PolicyBuilder) compiled once into classic BPF by a small generator here, then installed in
// every exec'd process with a single prctl, so the hot path never touches libseccomp.
//
// libseccomp supplies only the syscall number tables. Its filter compiler is not used: on
// i386 it rewrites every rule on socket(2) into a rule on socketcall(SYS_SOCKET) whose first
// argument is the sub-call number, so a family test would silently vanish on the 32-bit
// path, and its output can only be checked after the fact. Here each ABI gets a binary
// search over the intervals of the syscall number line, every leaf a verdict.
#include <linux/audit.h>
#include <linux/net.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <seccomp.h>
#include <sys/prctl.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/error.h"
#include "ns/security.h"

#ifndef CLONE_NEWTIME
#define CLONE_NEWTIME 0x00000080
#endif

namespace berth::ns {
namespace {

constexpr uint32_t kAllow = SECCOMP_RET_ALLOW;
constexpr uint32_t errno_verdict(int err) {
    return SECCOMP_RET_ERRNO | (static_cast<uint32_t>(err) & SECCOMP_RET_DATA);
}
constexpr uint32_t kEperm = errno_verdict(EPERM);
constexpr uint32_t kEnosys = errno_verdict(ENOSYS);

// Docker's unconditional allowlist (moby profiles/seccomp/default.json, the first rule),
// alphabetical as there so the two diff line by line; the profile test checks it against its
// own copy of Docker's list. Left out here and given argument rules below: personality,
// socket, socketpair and socketcall. Names for other architectures (riscv_hwprobe) and names
// newer than the installed libseccomp resolve to nothing on an ABI and are skipped there.
constexpr std::string_view kDockerAllowed[] = {
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

// Allowed by Docker's other rules for a container with Docker's default capabilities:
// ptrace and process_vm_* (Docker: any kernel >= 4.8, so every kernel berth runs on; a traced
// process is one the tracer could already signal and whose uid it shares), chroot
// (CAP_SYS_CHROOT is in the default set), and the x86 thread-area calls (arch_prctl on
// x86_64/x32, modify_ldt on all three x86 ABIs; an ABI without the name skips it).
constexpr std::string_view kDockerAllowedForDefaultCaps[] = {
    "ptrace", "process_vm_readv", "process_vm_writev", "chroot", "arch_prctl", "modify_ldt",
};

// personality(2): Docker's values only. PER_LINUX, PER_LINUX32, UNAME26, both, and the query.
constexpr SeccompArgCase kPersonalityCases[] = {
    {0x0, kAllow}, {0x8, kAllow}, {0x20000, kAllow}, {0x20008, kAllow}, {0xffffffff, kAllow},
};

// The address families a sandbox may open. AF_PACKET is what CAP_NET_RAW is for (Docker keeps
// it); AF_NETLINK carries `ip`, iproute2 and getaddrinfo's interface queries. Every other
// family is refused with EAFNOSUPPORT, what a kernel built without that family says, so
// programs that probe (Python's socket module, systemd tools) carry on: AF_VSOCK (a channel
// to the hypervisor and other guests, past the network namespace), AF_ALG (kernel crypto
// attack surface), AF_BLUETOOTH, AF_KEY, AF_TIPC, AF_RDS, AF_XDP, AF_CAN, AF_SMC, ...
constexpr SeccompArgCase kSocketFamilies[] = {
    {AF_UNIX, kAllow},    {AF_INET, kAllow},   {AF_INET6, kAllow},
    {AF_NETLINK, kAllow}, {AF_PACKET, kAllow},
};

// i386's socketcall(call, args) multiplexes the socket calls; `args` points at the real
// arguments, which seccomp cannot read, so socketcall(SYS_SOCKET) would open any family past
// the filter above (Docker's profile has this hole). SYS_SOCKET and SYS_SOCKETPAIR get ENOSYS:
// the multiplexer's entry for them does not exist here, and 32-bit code must use the direct
// socket(2)/socketpair(2) syscalls (i386 359/360, Linux 4.3+; what glibc built with
// --enable-kernel=4.3 or later calls), which the family filter covers. The cost, chosen over
// the hole: 32-bit programs whose libc goes through socketcall for socket() (Debian 12's i386
// glibc, built for kernel 3.2, has no fallback) cannot create sockets; 64-bit programs, the
// sandbox's norm, are untouched. Filtering the pointed-to family would need a user-space
// supervisor (SECCOMP_RET_USER_NOTIF), not a filter. The other sub-calls act on a socket that
// exists already (accept/accept4 return the listener's family) and stay allowed, as Docker
// allows them; unknown sub-calls get EPERM.
constexpr SeccompArgCase kSocketcallCases[] = {
    {SYS_SOCKET, kEnosys},     {SYS_SOCKETPAIR, kEnosys}, {SYS_BIND, kAllow},
    {SYS_CONNECT, kAllow},     {SYS_LISTEN, kAllow},      {SYS_ACCEPT, kAllow},
    {SYS_GETSOCKNAME, kAllow}, {SYS_GETPEERNAME, kAllow}, {SYS_SEND, kAllow},
    {SYS_RECV, kAllow},        {SYS_SENDTO, kAllow},      {SYS_RECVFROM, kAllow},
    {SYS_SHUTDOWN, kAllow},    {SYS_SETSOCKOPT, kAllow},  {SYS_GETSOCKOPT, kAllow},
    {SYS_SENDMSG, kAllow},     {SYS_RECVMSG, kAllow},     {SYS_ACCEPT4, kAllow},
    {SYS_RECVMMSG, kAllow},    {SYS_SENDMMSG, kAllow},
};

// Namespace creation needs CAP_SYS_ADMIN, which the sandbox lacks in Docker's set: Docker
// allows clone only without these flags. For clone(2) the low byte of flags is the exit
// signal (CSIGNAL), so CLONE_NEWTIME (0x80) means nothing there; unshare(2) takes it too.
constexpr uint32_t kCloneNsFlags = CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER |
                                   CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWCGROUP;
constexpr uint32_t kUnshareNsFlags = kCloneNsFlags | CLONE_NEWTIME;

std::vector<SeccompRule> build_rules() {
    std::vector<SeccompRule> rules;
    for (std::string_view name : kDockerAllowed) rules.push_back({name, kAllow});
    for (std::string_view name : kDockerAllowedForDefaultCaps) rules.push_back({name, kAllow});
    rules.push_back({.name = "personality", .verdict = kEperm, .arg0_cases = kPersonalityCases});
    rules.push_back(
        {.name = "clone", .verdict = kAllow, .arg0_flags = kCloneNsFlags, .flags_verdict = kEperm});
    // clone3 passes its flags in a struct the filter cannot read: ENOSYS, as Docker, so glibc
    // falls back to clone(2), whose flags the rule above inspects.
    rules.push_back({"clone3", kEnosys});
    // Docker refuses unshare without CAP_SYS_ADMIN; unsharing what a process already owns
    // (CLONE_FILES, CLONE_FS, CLONE_SYSVSEM) is harmless and some programs do it.
    rules.push_back({.name = "unshare",
                     .verdict = kAllow,
                     .arg0_flags = kUnshareNsFlags,
                     .flags_verdict = kEperm});
    rules.push_back(
        {.name = "socket", .verdict = errno_verdict(EAFNOSUPPORT), .arg0_cases = kSocketFamilies});
    // socketpair supports AF_UNIX only in practice, but a family the kernel might grow
    // socketpair support for later must not get past the list either.
    rules.push_back({.name = "socketpair",
                     .verdict = errno_verdict(EAFNOSUPPORT),
                     .arg0_cases = kSocketFamilies});
    rules.push_back({.name = "socketcall", .verdict = kEperm, .arg0_cases = kSocketcallCases});
    return rules;
}

// One syscall ABI the program covers. x32 shares x86_64's audit arch; its numbers carry
// __X32_SYSCALL_BIT.
struct Abi {
    uint32_t scmp_arch;  // for libseccomp's tables
    uint32_t nr_base;    // 0, or the x32 bit
};
constexpr uint32_t kX32Bit = 0x40000000;
// libseccomp's tables are scanned up to here (x32's own numbers end at 547).
constexpr uint32_t kScanLimit = 1024;

// Calls newer than the libseccomp Debian ships (2.5.4 knows up to futex_wake, 454). Since
// Linux 5.1 new syscalls get one number on every architecture but alpha, so each of these is
// that number on x86_64, x32 (| the x32 bit) and i386, except uretprobe (x86_64 and x32).
// A number here only widens what the profile knows (EPERM instead of ENOSYS) unless the name
// is also on the allowlist.
struct NewerSyscall {
    std::string_view name;
    uint32_t nr;
    bool x86_64_only;
};
constexpr NewerSyscall kNewerSyscalls[] = {
    {"uretprobe", 335, true},          {"futex_wake", 454, false},
    {"futex_wait", 455, false},        {"futex_requeue", 456, false},
    {"statmount", 457, false},         {"listmount", 458, false},
    {"lsm_get_self_attr", 459, false}, {"lsm_set_self_attr", 460, false},
    {"lsm_list_modules", 461, false},  {"mseal", 462, false},
    {"setxattrat", 463, false},        {"getxattrat", 464, false},
    {"listxattrat", 465, false},       {"removexattrat", 466, false},
    {"open_tree_attr", 467, false},
};

// name -> number for one ABI, from libseccomp's table plus kNewerSyscalls.
std::map<std::string, uint32_t, std::less<>> syscall_numbers(const Abi& abi) {
    std::map<std::string, uint32_t, std::less<>> numbers;
    std::vector<bool> taken(kScanLimit);
    for (uint32_t off = 0; off < kScanLimit; ++off) {
        std::unique_ptr<char, decltype(&std::free)> name(
            seccomp_syscall_resolve_num_arch(abi.scmp_arch, static_cast<int>(abi.nr_base + off)),
            &std::free);
        if (!name) continue;
        numbers.emplace(name.get(), abi.nr_base + off);
        taken[off] = true;
    }
    for (const NewerSyscall& s : kNewerSyscalls) {
        if (s.x86_64_only && abi.scmp_arch == SCMP_ARCH_X86) continue;
        if (numbers.contains(s.name) || taken[s.nr]) continue;
        numbers.emplace(std::string(s.name), abi.nr_base + s.nr);
    }
    return numbers;
}

// What the program does for one interval of syscall numbers: a plain verdict, or a rule with
// argument tests (whose code ends in its own returns).
struct Leaf {
    uint32_t verdict = kEperm;
    const SeccompRule* rule = nullptr;
    bool operator==(const Leaf&) const = default;
};
struct Interval {
    uint32_t lo;  // covers [lo, next interval's lo)
    Leaf leaf;
};

sock_filter stmt(uint16_t code, uint32_t k) {
    return BPF_STMT(code, k);
}
sock_filter jump(uint16_t code, uint32_t k, size_t jt, size_t jf) {
    if (jt > 255 || jf > 255) throw_sys("seccomp: BPF jump out of range", {}, E2BIG);
    return BPF_JUMP(code, k, static_cast<uint8_t>(jt), static_cast<uint8_t>(jf));
}

// The low 32 bits of args[0]: every argument the profile tests is read by the kernel as a
// 32-bit int or flags word, so the upper half changes nothing the kernel does.
constexpr uint32_t kArg0Low =
    offsetof(seccomp_data, args[0]) + (__BYTE_ORDER == __BIG_ENDIAN ? 4 : 0);

void emit_leaf(const Leaf& leaf, std::vector<sock_filter>& out) {
    const SeccompRule* rule = leaf.rule;
    if (!rule) {
        out.push_back(stmt(BPF_RET | BPF_K, leaf.verdict));
        return;
    }
    out.push_back(stmt(BPF_LD | BPF_W | BPF_ABS, kArg0Low));
    if (rule->arg0_flags != 0) {
        out.push_back(jump(BPF_JMP | BPF_JSET | BPF_K, rule->arg0_flags, 0, 1));
        out.push_back(stmt(BPF_RET | BPF_K, rule->flags_verdict));
        out.push_back(stmt(BPF_RET | BPF_K, rule->verdict));
        return;
    }
    // n comparisons, the rule's verdict when none matches, then one return per distinct case
    // verdict: every jump is short and forward.
    std::vector<uint32_t> verdicts;
    for (const SeccompArgCase& c : rule->arg0_cases) {
        if (std::find(verdicts.begin(), verdicts.end(), c.verdict) == verdicts.end()) {
            verdicts.push_back(c.verdict);
        }
    }
    const size_t n = rule->arg0_cases.size();
    for (size_t i = 0; i < n; ++i) {
        const SeccompArgCase& c = rule->arg0_cases[i];
        const size_t slot = static_cast<size_t>(
            std::find(verdicts.begin(), verdicts.end(), c.verdict) - verdicts.begin());
        out.push_back(jump(BPF_JMP | BPF_JEQ | BPF_K, c.value, n - i + slot, 0));
    }
    out.push_back(stmt(BPF_RET | BPF_K, rule->verdict));
    for (uint32_t v : verdicts) out.push_back(stmt(BPF_RET | BPF_K, v));
}

// A binary search over the intervals on the syscall number in A: each node "nr >= lo of the
// middle interval?", each leaf an interval's verdict. The depth is log2 of the interval count
// (about 8 here), whatever the number of rules.
void emit_tree(std::span<const Interval> iv, std::vector<sock_filter>& out) {
    if (iv.size() == 1) {
        emit_leaf(iv[0].leaf, out);
        return;
    }
    const size_t mid = iv.size() / 2;
    std::vector<sock_filter> left;
    emit_tree(iv.first(mid), left);
    if (left.size() <= 255) {
        out.push_back(jump(BPF_JMP | BPF_JGE | BPF_K, iv[mid].lo, left.size(), 0));
    } else {
        out.push_back(jump(BPF_JMP | BPF_JGE | BPF_K, iv[mid].lo, 0, 1));
        out.push_back(stmt(BPF_JMP | BPF_JA, static_cast<uint32_t>(left.size())));
    }
    out.insert(out.end(), left.begin(), left.end());
    emit_tree(iv.subspan(mid), out);
}

// The dispatch for one ABI, entered with the syscall number in A.
std::vector<sock_filter> compile_abi(const Abi& abi, std::span<const SeccompRule> rules) {
    const auto numbers = syscall_numbers(abi);
    // The newest number the profile knows below 512, and above it x32's own block (512..547).
    uint32_t newest = 0, high = 0;
    for (const auto& [name, nr] : numbers) {
        const uint32_t off = nr - abi.nr_base;
        if (off < 512) {
            newest = std::max(newest, off);
        } else {
            high = std::max(high, off);
        }
    }
    auto fallback = [&](uint32_t off) {
        const bool known = off <= newest || (high != 0 && off >= 512 && off <= high);
        return Leaf{known ? kEperm : kEnosys};
    };
    std::vector<Leaf> leaves(kScanLimit);
    for (uint32_t off = 0; off < kScanLimit; ++off) leaves[off] = fallback(off);
    for (const SeccompRule& rule : rules) {
        const auto it = numbers.find(rule.name);
        if (it == numbers.end()) continue;
        const bool has_args = !rule.arg0_cases.empty() || rule.arg0_flags != 0;
        leaves[it->second - abi.nr_base] =
            has_args ? Leaf{rule.verdict, &rule} : Leaf{rule.verdict};
    }
    std::vector<Interval> intervals;
    for (uint32_t off = 0; off < kScanLimit; ++off) {
        if (intervals.empty() || !(intervals.back().leaf == leaves[off]) || leaves[off].rule) {
            intervals.push_back({abi.nr_base + off, leaves[off]});
        }
    }
    if (!(intervals.back().leaf == Leaf{kEnosys})) {
        intervals.push_back({abi.nr_base + kScanLimit, Leaf{kEnosys}});
    }
    std::vector<sock_filter> out;
    emit_tree(intervals, out);
    return out;
}

void append(std::vector<sock_filter>& out, const std::vector<sock_filter>& more) {
    out.insert(out.end(), more.begin(), more.end());
}

}  // namespace

std::span<const SeccompRule> default_seccomp_rules() {
    static const std::vector<SeccompRule> rules = build_rules();
    return rules;
}

SeccompProgram SeccompProgram::default_profile() {
    const auto rules = default_seccomp_rules();
    const uint32_t native = seccomp_arch_native();
    constexpr uint16_t kLdArch = BPF_LD | BPF_W | BPF_ABS;
    constexpr uint32_t kArch = offsetof(seccomp_data, arch);
    constexpr uint32_t kNr = offsetof(seccomp_data, nr);
    // Any other ABI is a foreign architecture: its numbers mean other calls. Kill the whole
    // process (not the thread, which leaves the rest of it running half-broken).
    const sock_filter kill = stmt(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS);
    std::vector<sock_filter> prog;

    if (native == SCMP_ARCH_X86_64) {
        // [arch check] [x86_64: split off x32, tree] [x32 tree] [i386 tree]
        std::vector<sock_filter> x86_64 = compile_abi({SCMP_ARCH_X86_64, 0}, rules);
        const std::vector<sock_filter> x32 = compile_abi({SCMP_ARCH_X32, kX32Bit}, rules);
        const std::vector<sock_filter> i386 = compile_abi({SCMP_ARCH_X86, 0}, rules);
        std::vector<sock_filter> s64{stmt(BPF_LD | BPF_W | BPF_ABS, kNr),
                                     jump(BPF_JMP | BPF_JGE | BPF_K, kX32Bit, 0, 1),
                                     stmt(BPF_JMP | BPF_JA, static_cast<uint32_t>(x86_64.size()))};
        append(s64, x86_64);
        append(s64, x32);
        std::vector<sock_filter> s32{stmt(BPF_LD | BPF_W | BPF_ABS, kNr)};
        append(s32, i386);
        prog = {stmt(kLdArch, kArch),
                jump(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 0, 1),
                stmt(BPF_JMP | BPF_JA, 3),  // to s64, just past this prologue
                jump(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_I386, 0, 1),
                stmt(BPF_JMP | BPF_JA, static_cast<uint32_t>(1 + s64.size())),
                kill};
        append(prog, s64);
        append(prog, s32);
    } else {
        // Other hosts: the native ABI only (their compat ABIs, like 32-bit arm, are killed).
        prog = {stmt(kLdArch, kArch), jump(BPF_JMP | BPF_JEQ | BPF_K, native, 1, 0), kill,
                stmt(BPF_LD | BPF_W | BPF_ABS, kNr)};
        append(prog, compile_abi({native, 0}, rules));
    }
    if (prog.size() > BPF_MAXINSNS) {
        throw_sys("seccomp: compile", std::to_string(prog.size()) + " instructions", E2BIG);
    }
    SeccompProgram program;
    program.insns_ = std::move(prog);
    return program;
}

int SeccompProgram::install() const noexcept {
    if (insns_.empty()) return -EINVAL;
    // The kernel copies the program and never writes through the pointer; sock_fprog just
    // lacks a const member.
    sock_fprog prog{static_cast<unsigned short>(insns_.size()),
                    const_cast<sock_filter*>(insns_.data())};
    if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog, 0, 0) != 0) return -errno;
    return 0;
}

}  // namespace berth::ns
