// The device allowlist every sandbox's cgroup gets (runs as root, in the helper): Docker's
// and runc's default set, as data. Enforced by the devices controller on cgroup v1 and by a
// BPF_PROG_TYPE_CGROUP_DEVICE program on v2. It is the third line: sandbox filesystems are
// mounted nodev and image layers hold no device nodes; this one holds even for a device node
// that reaches a sandbox some other way.
#pragma once

#include <string>
#include <vector>

#include "base/unique_fd.h"

namespace berth::cgroup {

struct DeviceRule {
    char type;           // 'c', 'b', or 'a' (all)
    int major;           // -1 = any
    int minor;           // -1 = any
    const char* access;  // some of "rwm"
};

// null, zero, full, random, urandom, tty, console, ptmx, the devpts ptys (136:*), tun;
// mknod of any (which a user namespace refuses anyway). Nothing else; no block device.
const std::vector<DeviceRule>& default_device_rules();

// The rules as cgroup v1 devices.allow lines ("c 1:3 rwm", "b *:* m").
std::vector<std::string> device_rules_v1();

// The rules compiled to a cgroup device BPF program and loaded (bpf(BPF_PROG_LOAD)).
// Throws SysError("bpf BPF_PROG_LOAD", ...) with the verifier's log in the message.
UniqueFd load_device_program();

// Attaches a program from load_device_program() to the cgroup directory `cgroup_fd`
// (BPF_F_ALLOW_MULTI: programs of the parents still run, and all must allow).
void attach_device_program(int cgroup_fd, int program_fd, const std::string& cgroup_dir);

}  // namespace berth::cgroup
