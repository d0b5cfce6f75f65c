// Host probing and driver choice.
#include "cgroup/cgroup.h"

#include <filesystem>
#include <stdexcept>

#include "base/files.h"
#include "cgroup/internal.h"

namespace berth::cgroup {

namespace {

// Whether interface files like cgroup.kill or memory.swap.max exist, which they only do below
// the cgroup2 root: any child of the root answers for the kernel (on systemd hosts init.scope
// and the slices are there). Unknown, so false, on a host with no child cgroups yet.
bool v2_child_has(const std::string& root, const char* file) {
    std::error_code ec;  // an unreadable root means no answer, not an error
    for (const auto& entry : std::filesystem::directory_iterator(root, ec)) {
        if (entry.is_directory(ec) && internal::exists(entry.path() / file)) return true;
    }
    return false;
}

}  // namespace

HostSupport probe_host() {
    HostSupport h;
    const internal::Mounts mounts = internal::read_mounts();
    h.unified_mount = mounts.unified;
    h.v1_controllers = mounts.v1_controllers();
    std::string why_not_v2 = "cgroup2 is not mounted";
    if (!mounts.unified.empty()) {
        h.v2_controllers = internal::read_controllers(mounts.unified + "/cgroup.controllers");
        std::string missing = internal::missing_controllers(h.v2_controllers);
        if (missing.empty()) {
            h.version = Version::v2;
            h.usable = true;
            h.cgroup_kill = v2_child_has(mounts.unified, "cgroup.kill");
            h.memory_swap = v2_child_has(mounts.unified, "memory.swap.max");
            h.reason = "cgroup v2 at " + mounts.unified + " offers memory, cpu and pids";
            return h;
        }
        why_not_v2 = "cgroup2 at " + mounts.unified + " lacks " + missing;
    }
    h.version = Version::v1;
    std::string missing = internal::missing_controllers(h.v1_controllers);
    if (!missing.empty()) {
        h.reason = "no usable cgroups: " + why_not_v2 + "; no cgroup v1 hierarchy for " + missing;
        return h;
    }
    h.usable = true;
    h.memory_swap = internal::exists(mounts.v1.at("memory") + "/memory.memsw.limit_in_bytes");
    h.reason = "cgroup v1 hierarchies for memory, cpu and pids (" + why_not_v2 + ")";
    return h;
}

std::unique_ptr<Driver> detect(const std::string& parent) {
    HostSupport host = probe_host();
    if (!host.usable) throw std::runtime_error(host.reason);
    return host.version == Version::v2 ? make_v2_driver(parent) : make_v1_driver(parent);
}

}  // namespace berth::cgroup
