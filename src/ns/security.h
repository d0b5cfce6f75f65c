// The security defaults every sandbox process gets: Docker's default capability set,
// no_new_privs, a default-deny seccomp allowlist of Docker's shape (its syscall list and
// argument filters, plus a socket family allowlist), and a sane nofile limit.
//
// Built to be cheap on the exec hot path: the seccomp filter is compiled to classic BPF
// once (in the helper) and installed once in berth-init (init::harden_init), so every exec'd
// command inherits it; a process outside a sandbox would install it after apply_identity():
//     apply_identity(id, &step);   // drops privileges, sets no_new_privs
//     program.install();           // allowed because no_new_privs is now set
#pragma once

#include <linux/filter.h>
#include <sys/resource.h>
#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace berth::ns {

// The seccomp profile as data: one row per syscall name the sandbox may make, as in
// sandbox2's PolicyBuilder. A syscall without a row is refused (see SeccompProgram). Names are
// resolved per ABI; a name an ABI lacks (chown32 on x86_64, arch_prctl on i386) is skipped
// there. Verdicts are SECCOMP_RET_* values (SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | errno).
struct SeccompArgCase {
    uint32_t value;
    uint32_t verdict;
};
struct SeccompRule {
    std::string_view name;
    // The verdict when no argument test below decides otherwise.
    uint32_t verdict;
    // Tests of the first argument's low 32 bits (every filtered argument is an int or a flags
    // word the kernel reads as 32 bits: personality, clone, unshare, socket, socketcall):
    // - arg0_cases: the first case whose value equals arg0 gives the verdict;
    // - arg0_flags: if arg0 has any of these bits set, the verdict is flags_verdict.
    std::span<const SeccompArgCase> arg0_cases = {};
    uint32_t arg0_flags = 0;
    uint32_t flags_verdict = 0;
};

// Berth's default profile: Docker's default allowlist (moby profiles/seccomp/default.json)
// for a process with Docker's default capabilities, with these differences:
// - socket/socketpair: only AF_UNIX, AF_INET, AF_INET6, AF_NETLINK and AF_PACKET; any other
//   family (AF_VSOCK, AF_ALG, AF_BLUETOOTH, AF_KEY, ...) fails with EAFNOSUPPORT (Docker
//   denies only AF_VSOCK and AF_ALG);
// - i386 socketcall: SYS_SOCKET and SYS_SOCKETPAIR fail with ENOSYS (their family is behind a
//   pointer seccomp cannot read), the other calls are allowed (Docker allows it all, which
//   lets 32-bit code open any family);
// - unshare without namespace flags is allowed (Docker allows unshare only with
//   CAP_SYS_ADMIN); clone without namespace flags as Docker; clone3 fails with ENOSYS so
//   libc falls back to clone, whose flags the filter can read.
std::span<const SeccompRule> default_seccomp_rules();

// A compiled seccomp filter (classic BPF for all of the host's syscall ABIs: on x86_64 that
// is x86_64, i386 and x32, so a 32-bit syscall cannot slip past a rule; any other ABI kills
// the process).
//
// Default-deny: a syscall without a row in default_seccomp_rules() fails with EPERM (as under
// Docker) if this profile knows its number, and with ENOSYS if the number is newer than every
// syscall the profile knows for that ABI (as runc does): a syscall a newer kernel adds is
// never allowed on arrival, and ENOSYS is what libc expects from a kernel without it, so it
// falls back to the older call it replaces (a new openat variant, say) instead of failing.
class SeccompProgram {
  public:
    // Compiles default_seccomp_rules() to BPF: an arch check, then per ABI a binary search
    // over the allowed syscall numbers. Resolves names with libseccomp's syscall tables (plus
    // the numbers of calls newer than the installed libseccomp); throws SysError on failure.
    // Not for the hot path: build once and share the result.
    static SeccompProgram default_profile();

    // Installs the filter on the calling thread. Requires no_new_privs (or CAP_SYS_ADMIN).
    // Uses only prctl/seccomp: safe to call between fork and exec. Returns -errno on failure
    // (-EINVAL for an empty, default-constructed program).
    int install() const noexcept;

    // Number of BPF instructions (the kernel's limit is BPF_MAXINSNS, 4096).
    size_t size() const { return insns_.size(); }
    // The program itself, for tests and debugging dumps.
    const std::vector<sock_filter>& instructions() const { return insns_; }

    // For berth-helper and berth-images' root part: EPERM for what a privileged service of
    // berth never calls (keyrings, bpf, perf, kexec and modules, handle-based opens,
    // userfaultfd, accounting, swap, reboot, the kernel log, clocks, port I/O, quotas,
    // io_uring, obsolete calls). berth-init is forked from the helper and keeps this filter
    // under its own, so it holds only calls that default_profile() denies with EPERM too:
    // a sandbox sees exactly what it saw without it (tests/ns/security_test.cc).
    static SeccompProgram service_profile();

    // For the unprivileged workers that parse untrusted bytes (the unpack worker, the
    // registry fetcher): default_profile()'s denials, plus ptrace and other processes'
    // memory, and no new process (fork, vfork, clone without CLONE_THREAD: threads only),
    // so once the worker has exited nothing of it is left to race the root side over what
    // it wrote. Without `network`: no sockets either.
    static SeccompProgram worker_profile(bool network);

    // The names service_profile() denies, for tests (none may be in the sandbox's allowlist).
    static std::vector<std::string> service_denied_names();

  private:
    std::vector<sock_filter> insns_;
};

// Docker's default capability names (CHOWN, DAC_OVERRIDE, FSETID, FOWNER, MKNOD, NET_RAW,
// SETGID, SETUID, SETFCAP, SETPCAP, NET_BIND_SERVICE, SYS_CHROOT, KILL, AUDIT_WRITE).
// Capability names are accepted with or without the CAP_ prefix, in any case.
const std::vector<std::string>& default_capability_names();

// Identity and privileges of a process about to exec, applied in this order:
// bounding set reduced to `capabilities`, ambient cleared, supplementary groups, gid, uid;
// then for uid 0 the permitted and effective sets become `capabilities` (a non-root uid ends
// with none, as under Docker) and inheritable is empty either way; then PR_SET_NO_NEW_PRIVS.
//
// Returns 0 or -errno; on failure `*failed_step` (if failed_step is non-null) names the step:
// a static string naming the call ("cap_drop_bound", "setresuid", ...), or, for -EINVAL from
// a capability name the kernel or libcap does not know, a pointer to that name inside
// `id.capabilities` (names are all checked before anything changes). Meant to run in a forked
// child before execve: no exceptions, and after the first failure no allocation.
// The caller needs CAP_SETPCAP, CAP_SETUID and CAP_SETGID (in its user namespace).
struct ProcessIdentity {
    uid_t uid = 0;
    gid_t gid = 0;
    std::vector<gid_t> groups;
    std::vector<std::string> capabilities = default_capability_names();
};
int apply_identity(const ProcessIdentity& id, const char** failed_step) noexcept;

// Confines the calling process (uid 0 in its user namespace, still single-threaded: the
// sets and the filter are per thread, and threads started later inherit them) for the rest of
// its life: bounding, permitted and effective sets reduced to `capabilities`, inheritable
// and ambient cleared, supplementary groups dropped, no_new_privs, then `filter`. Throws
// SysError naming the step.
void confine_process(const std::vector<std::string>& capabilities, const SeccompProgram& filter);

// Reduces the bounding set of this process to `capabilities`, once, so that children's
// apply_identity() with the same list skips that step (berth-init calls it at start).
int restrict_bounding_set(const std::vector<std::string>& capabilities,
                          const char** failed_step) noexcept;

// Raises RLIMIT_NOFILE for this process (and so its children) to min(hard limit, 1<<20)
// for both soft and hard: Docker's 1024 breaks real workloads, and without
// CAP_SYS_RESOURCE the hard limit is the ceiling. The kernel also refuses anything above
// fs.nr_open, so a host with a lower nr_open caps it there. Returns the limit now in force;
// throws SysError if getrlimit/setrlimit fail.
rlim_t raise_nofile_limit();

}  // namespace berth::ns
