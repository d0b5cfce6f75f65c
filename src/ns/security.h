// The security defaults every sandbox process gets: Docker's default capability set,
// no_new_privs, a default seccomp filter in the shape of Docker's, and a sane nofile limit.
//
// Built to be cheap on the exec hot path: the seccomp filter is compiled to classic BPF
// once (in the helper or init) and each exec'd process only installs the ready program.
//
// Hot-path sequence in the per-exec shim's forked child, before execve:
//     apply_identity(id, &step);   // drops privileges, sets no_new_privs
//     program.install();           // allowed because no_new_privs is now set
#pragma once

#include <linux/filter.h>
#include <sys/resource.h>
#include <sys/types.h>

#include <cstddef>
#include <string>
#include <vector>

namespace berth::ns {

// A compiled seccomp filter (classic BPF for all of the host's syscall ABIs: on x86_64 that
// is x86_64, i386 and x32, so a 32-bit syscall cannot slip past a rule).
class SeccompProgram {
  public:
    // Docker-shaped profile: allow by default, EPERM for the dangerous calls — keyctl,
    // add_key, request_key, bpf, perf_event_open, kexec_*, *_module, mount, umount2,
    // pivot_root, the new mount API, setns, unshare/clone with namespace flags (CLONE_NEWUSER
    // and friends), open_by_handle_at, userfaultfd, acct, swapon/off, reboot, syslog,
    // clock/time setting, iopl/ioperm, personality changes, quotactl, lookup_dcookie, ...
    // clone3 gets ENOSYS so libc falls back to clone(2), whose flags the filter can inspect.
    // personality is allowed only for Docker's values: 0 (PER_LINUX), 8 (PER_LINUX32),
    // 0x20000 (UNAME26), 0x20008 and 0xffffffff (query).
    // Compiles with libseccomp; throws SysError (naming the libseccomp call) on failure.
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
