// Capabilities and credentials of a process about to exec. apply_identity() runs in a forked
// child between fork and execve, so it reports errors by return value and keeps allocation
// to libcap's one cap_t.
#include <grp.h>
#include <sys/capability.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <type_traits>

#include "base/error.h"
#include "ns/security.h"

namespace berth::ns {
namespace {

struct CapFree {
    void operator()(cap_t caps) const { cap_free(caps); }
};
using CapPtr = std::unique_ptr<std::remove_pointer_t<cap_t>, CapFree>;

// Resolves "CHOWN", "cap_chown" or "CAP_CHOWN" to a capability number, or -1. libcap insists
// on the cap_ prefix and would also take a bare number, which is not a name; the prefix is
// added in a stack buffer so this stays allocation-free.
cap_value_t capability_from_name(const std::string& name) {
    if (name.empty() || std::isdigit(static_cast<unsigned char>(name[0]))) return -1;
    const bool has_prefix = name.size() > 4 && strncasecmp(name.c_str(), "cap_", 4) == 0;
    char buf[64] = "cap_";
    const size_t offset = has_prefix ? 0 : 4;
    if (offset + name.size() >= sizeof(buf)) return -1;
    std::memcpy(buf + offset, name.c_str(), name.size() + 1);

    cap_value_t value = -1;
    if (cap_from_name(buf, &value) != 0) return -1;
    // libcap may know capabilities this kernel does not (and the reverse): only the kernel's
    // count matters, and the mask below has 64 bits.
    if (value < 0 || value >= static_cast<cap_value_t>(cap_max_bits()) || value >= 64) return -1;
    return value;
}

// The bounding set this process (and so every child forked from it) was already reduced to
// by restrict_bounding_set(); all ones = not restricted. Lets apply_identity skip ~40
// prctl calls on the exec hot path.
uint64_t g_bounding_set = ~uint64_t{0};

int resolve_names(const std::vector<std::string>& names, uint64_t* mask, cap_value_t* list,
                  int* count, const char** bad) {
    *mask = 0;
    *count = 0;
    for (const std::string& name : names) {
        const cap_value_t cap = capability_from_name(name);
        if (cap < 0) {
            *bad = name.c_str();
            return -EINVAL;
        }
        if (*mask & (uint64_t{1} << cap)) continue;
        *mask |= uint64_t{1} << cap;
        list[(*count)++] = cap;
    }
    return 0;
}

int drop_bounding_except(uint64_t keep, const char** step) {
    const auto max_cap = static_cast<cap_value_t>(cap_max_bits());
    for (cap_value_t cap = 0; cap < max_cap; ++cap) {
        if (keep & (uint64_t{1} << cap)) continue;
        if (cap_drop_bound(cap) != 0) {
            *step = "cap_drop_bound";
            return -errno;
        }
    }
    g_bounding_set = keep;
    return 0;
}

}  // namespace

int restrict_bounding_set(const std::vector<std::string>& capabilities,
                          const char** failed_step) noexcept {
    const char* unused = nullptr;
    const char*& step = failed_step ? *failed_step : unused;
    uint64_t keep;
    cap_value_t list[64];
    int count;
    if (int rc = resolve_names(capabilities, &keep, list, &count, &step); rc != 0) return rc;
    return drop_bounding_except(keep, &step);
}

const std::vector<std::string>& default_capability_names() {
    static const std::vector<std::string> names = {
        "CHOWN",   "DAC_OVERRIDE", "FSETID",           "FOWNER",
        "MKNOD",   "NET_RAW",      "SETGID",           "SETUID",
        "SETFCAP", "SETPCAP",      "NET_BIND_SERVICE", "SYS_CHROOT",
        "KILL",    "AUDIT_WRITE",
    };
    return names;
}

int apply_identity(const ProcessIdentity& id, const char** failed_step) noexcept {
    const char* unused_step = nullptr;
    const char*& step = failed_step ? *failed_step : unused_step;
    auto fail = [&](const char* what, int err) {
        step = what;
        return -err;
    };

    // Resolve every name before changing anything, so a typo leaves the process untouched.
    uint64_t keep = 0;
    cap_value_t keep_list[64];
    int keep_count = 0;
    if (int rc = resolve_names(id.capabilities, &keep, keep_list, &keep_count, &step); rc != 0)
        return rc;

    // The bounding set first: it limits what any later exec can gain (file caps, setuid
    // binaries), and dropping needs CAP_SETPCAP, which the later steps may remove. Skipped
    // when an ancestor already reduced it to exactly this set (berth-init does, once).
    if (g_bounding_set != keep) {
        if (int rc = drop_bounding_except(keep, &step); rc != 0) return rc;
    }
    // Ambient caps are handed on across execve (the kernel drops them only on a change to a
    // non-root uid); a sandbox process staying uid 0 must not inherit the shim's.
    if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0)
        return fail("PR_CAP_AMBIENT_CLEAR_ALL", errno);

    // Groups before gid before uid: each needs CAP_SETGID/CAP_SETUID, which setresuid to a
    // non-zero uid takes away.
    if (setgroups(id.groups.size(), id.groups.data()) != 0) return fail("setgroups", errno);
    if (setresgid(id.gid, id.gid, id.gid) != 0) return fail("setresgid", errno);
    // From uid 0 to a non-zero uid the kernel clears permitted and effective (unless
    // SECBIT_KEEP_CAPS is set); staying uid 0 keeps them, and cap_set_proc below trims them.
    if (setresuid(id.uid, id.uid, id.uid) != 0) return fail("setresuid", errno);

    // Set all three sets explicitly rather than trusting the kernel's setuid fixup: the shim
    // may have set SECBIT_KEEP_CAPS or inheritable bits, which setuid does not clear. Lowering
    // capabilities never needs privilege, so this also works after the uid change.
    CapPtr caps(cap_init());  // all sets empty
    if (!caps) return fail("cap_init", errno);
    if (id.uid == 0 && keep_count > 0) {
        for (cap_flag_t set : {CAP_PERMITTED, CAP_EFFECTIVE}) {
            if (cap_set_flag(caps.get(), set, keep_count, keep_list, CAP_SET) != 0) {
                return fail("cap_set_flag", errno);
            }
        }
    }
    if (cap_set_proc(caps.get()) != 0) return fail("cap_set_proc", errno);

    // Last: no execve from here on can gain privileges (setuid bits, file caps), and it is
    // what lets the unprivileged process install its seccomp filter.
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return fail("PR_SET_NO_NEW_PRIVS", errno);
    return 0;
}

void confine_process(const std::vector<std::string>& capabilities, const SeccompProgram& filter) {
    ProcessIdentity id;
    id.uid = ::geteuid();
    id.gid = ::getegid();
    id.capabilities = capabilities;
    const char* step = nullptr;
    if (int rc = apply_identity(id, &step); rc != 0)
        throw_sys(step ? step : "apply_identity", "confine", -rc);
    if (int rc = filter.install(); rc != 0) throw_sys("PR_SET_SECCOMP", "confine", -rc);
}

}  // namespace berth::ns
