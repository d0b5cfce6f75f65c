// The seccomp filters of berth's own processes (the sandbox's profile is seccomp.cc's):
// deny lists compiled with libseccomp. service_profile() for the root services,
// worker_profile() for the unprivileged workers that parse untrusted bytes.
#include <linux/seccomp.h>
#include <sched.h>
#include <seccomp.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <iterator>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/error.h"
#include "base/unique_fd.h"
#include "ns/security.h"

namespace berth::ns {
namespace {

struct SeccompRelease {
    void operator()(void* ctx) const { seccomp_release(ctx); }
};
// scmp_filter_ctx is a void*; the unique_ptr owns what it points at.
using SeccompCtx = std::unique_ptr<void, SeccompRelease>;

// libseccomp reports failure as a negative errno return value, not through errno.
void check_scmp(int rc, std::string_view call, std::string_view subject = {}) {
    if (rc < 0) throw_sys(call, subject, -rc);
}

// service_profile(): what neither berth-helper nor berth-images ever calls; none of these has
// a row in default_seccomp_rules() (a test checks it), so the sandbox below the helper, whose
// own filter answers first with the same EPERM, sees no difference. (Not bpf, nor quotactl:
// the helper loads and attaches the cgroup v2 device program, and sets project quotas for
// --storage.)
constexpr const char* kServiceDenied[] = {
    "keyctl",
    "add_key",
    "request_key",
    "perf_event_open",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "create_module",
    "get_kernel_syms",
    "query_module",
    "open_by_handle_at",
    "userfaultfd",
    "acct",
    "swapon",
    "swapoff",
    "reboot",
    "syslog",
    "settimeofday",
    "clock_settime",
    "stime",
    "iopl",
    "ioperm",
    "vm86",
    "vm86old",
    "lookup_dcookie",
    "nfsservctl",
    "uselib",
    "ustat",
    "sysfs",
    "_sysctl",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
};

// worker_profile(): beyond kServiceDenied, what a parser of untrusted bytes never needs.
constexpr const char* kWorkerDenied[] = {
    // What the helper keeps and a worker never needs: eBPF, quotas, mounts and namespaces,
    // handle-based opens, clock adjustment.
    "bpf",
    "mount",
    "umount",
    "umount2",
    "pivot_root",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "move_mount",
    "open_tree",
    "mount_setattr",
    "setns",
    "name_to_handle_at",
    "clock_adjtime",
    "adjtimex",
    "quotactl",
    "quotactl_fd",
    // Other processes: their memory and their tracing.
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "kcmp",
    "pidfd_getfd",
    // New processes (threads go through clone with CLONE_THREAD, checked below).
    "fork",
    "vfork",
    // Its own privileges, namespaces and root.
    "unshare",
    "chroot",
    "setuid",
    "setgid",
    "setreuid",
    "setregid",
    "setresuid",
    "setresgid",
    "setgroups",
    "setfsuid",
    "setfsgid",
    "capset",
    "seccomp",
};
constexpr const char* kSocketCalls[] = {
    "socket", "socketpair", "connect", "bind", "listen", "accept", "accept4",
};

// Namespace creation flags. unshare(2) takes all of them; for clone(2) the low byte of flags
// is the exit signal (CSIGNAL), so CLONE_NEWTIME (0x80) means nothing there and is not
// checked (a time namespace can only come from unshare or clone3).
constexpr uint64_t kCloneNsFlags[] = {
    CLONE_NEWUSER, CLONE_NEWNS,  CLONE_NEWPID,    CLONE_NEWNET,
    CLONE_NEWUTS,  CLONE_NEWIPC, CLONE_NEWCGROUP,
};
constexpr uint64_t kUnshareNsFlags[] = {
    CLONE_NEWUSER, CLONE_NEWNS,  CLONE_NEWPID,    CLONE_NEWNET,
    CLONE_NEWUTS,  CLONE_NEWIPC, CLONE_NEWCGROUP, CLONE_NEWTIME,
};

// Adds `action` for syscall `name` when all of `args` match.
void add_rule(scmp_filter_ctx ctx, const char* name, uint32_t action,
              std::span<const scmp_arg_cmp> args = {}) {
    int nr = seccomp_syscall_resolve_name(name);
    // A name this libseccomp does not know on any architecture (older than the syscall)
    // cannot be expressed; skipping it keeps berth usable there, at the cost of that rule.
    if (nr == __NR_SCMP_ERROR) return;
    check_scmp(
        seccomp_rule_add_array(ctx, action, nr, static_cast<unsigned>(args.size()), args.data()),
        "seccomp_rule_add", name);
}

// One rule per flag: the call is denied if any single flag bit is set. A libseccomp rule
// can test an argument only once, so "flags & ANY != 0" has to be an OR of rules.
void deny_flag_bits(scmp_filter_ctx ctx, const char* name, std::span<const uint64_t> flags) {
    for (uint64_t flag : flags) {
        const scmp_arg_cmp cmp{0, SCMP_CMP_MASKED_EQ, flag, flag};
        add_rule(ctx, name, SCMP_ACT_ERRNO(EPERM), {&cmp, 1});
    }
}

// The other ABIs the kernel will accept from a process on this host. A rule added by name
// covers every architecture in the context, so an i386 int $0x80 keyctl is denied as well.
void add_compat_arches(scmp_filter_ctx ctx) {
    constexpr uint32_t kX86Arches[] = {SCMP_ARCH_X86_64, SCMP_ARCH_X86, SCMP_ARCH_X32};
    const uint32_t native = seccomp_arch_native();
    if (native != SCMP_ARCH_X86_64 && native != SCMP_ARCH_X32) return;
    for (uint32_t arch : kX86Arches) {
        int rc = seccomp_arch_add(ctx, arch);
        if (rc != -EEXIST) check_scmp(rc, "seccomp_arch_add");
    }
}

std::vector<sock_filter> export_bpf(scmp_filter_ctx ctx) {
    // libseccomp 2.5 can only export to a file descriptor; a memfd keeps it off disk.
    UniqueFd fd(memfd_create("berth-seccomp", MFD_CLOEXEC));
    if (!fd) throw_sys("memfd_create", "berth-seccomp");
    check_scmp(seccomp_export_bpf(ctx, fd.get()), "seccomp_export_bpf");

    struct stat st {};
    check_sys("fstat", "seccomp memfd", [&] { return fstat(fd.get(), &st); });
    const auto bytes = static_cast<size_t>(st.st_size);
    if (bytes == 0 || bytes % sizeof(sock_filter) != 0) {
        throw_sys("seccomp_export_bpf", "program size " + std::to_string(bytes), EPROTO);
    }
    if (bytes / sizeof(sock_filter) > BPF_MAXINSNS) {
        throw_sys("seccomp_export_bpf", "program over BPF_MAXINSNS", E2BIG);
    }
    std::vector<sock_filter> insns(bytes / sizeof(sock_filter));
    auto* dst = reinterpret_cast<char*>(insns.data());
    for (size_t done = 0; done < bytes;) {
        ssize_t r = check_sys("pread", "seccomp memfd",
                              [&] { return pread(fd.get(), dst + done, bytes - done, done); });
        if (r == 0) throw_sys("pread", "seccomp memfd", EPROTO);
        done += static_cast<size_t>(r);
    }
    return insns;
}

}  // namespace

std::vector<std::string> SeccompProgram::service_denied_names() {
    return {std::begin(kServiceDenied), std::end(kServiceDenied)};
}

namespace {

SeccompCtx new_default_allow() {
    SeccompCtx ctx(seccomp_init(SCMP_ACT_ALLOW));
    if (!ctx) throw_sys("seccomp_init", {}, ENOMEM);
    check_scmp(seccomp_attr_set(ctx.get(), SCMP_FLTATR_CTL_NNP, 0), "seccomp_attr_set", "CTL_NNP");
    check_scmp(seccomp_attr_set(ctx.get(), SCMP_FLTATR_CTL_OPTIMIZE, 2), "seccomp_attr_set",
               "CTL_OPTIMIZE");
    add_compat_arches(ctx.get());
    return ctx;
}

}  // namespace

SeccompProgram SeccompProgram::service_profile() {
    SeccompCtx ctx = new_default_allow();
    for (const char* name : kServiceDenied) add_rule(ctx.get(), name, SCMP_ACT_ERRNO(EPERM));
    SeccompProgram program;
    program.insns_ = export_bpf(ctx.get());
    return program;
}

SeccompProgram SeccompProgram::worker_profile(bool network) {
    SeccompCtx ctx = new_default_allow();
    scmp_filter_ctx c = ctx.get();
    for (const char* name : kServiceDenied) add_rule(c, name, SCMP_ACT_ERRNO(EPERM));
    for (const char* name : kWorkerDenied) add_rule(c, name, SCMP_ACT_ERRNO(EPERM));
    if (!network) {
        for (const char* name : kSocketCalls) add_rule(c, name, SCMP_ACT_ERRNO(EPERM));
    }
    deny_flag_bits(c, "clone", kCloneNsFlags);
    // A clone that is not a thread is a new process.
    const scmp_arg_cmp not_thread{0, SCMP_CMP_MASKED_EQ, CLONE_THREAD, 0};
    add_rule(c, "clone", SCMP_ACT_ERRNO(EPERM), {&not_thread, 1});
    add_rule(c, "clone3", SCMP_ACT_ERRNO(ENOSYS));  // glibc falls back to clone(2)
    SeccompProgram program;
    program.insns_ = export_bpf(c);
    return program;
}

}  // namespace berth::ns
