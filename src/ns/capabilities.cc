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

}  // namespace

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
    for (const std::string& name : id.capabilities) {
        const cap_value_t cap = capability_from_name(name);
        if (cap < 0) return fail(name.c_str(), EINVAL);
        if (keep & (uint64_t{1} << cap)) continue;
        keep |= uint64_t{1} << cap;
        keep_list[keep_count++] = cap;
    }

    // The bounding set first: it limits what any later exec can gain (file caps, setuid
    // binaries), and dropping needs CAP_SETPCAP, which the later steps may remove.
    const auto max_cap = static_cast<cap_value_t>(cap_max_bits());
    for (cap_value_t cap = 0; cap < max_cap; ++cap) {
        if (keep & (uint64_t{1} << cap)) continue;
        if (cap_drop_bound(cap) != 0) return fail("cap_drop_bound", errno);
    }
    // Ambient caps are handed on across execve (the kernel drops them only on a change to a
    // non-root uid); a sandbox process staying uid 0 must not inherit the shim's.
    if (cap_reset_ambient() != 0) return fail("cap_reset_ambient", errno);

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

}  // namespace berth::ns
