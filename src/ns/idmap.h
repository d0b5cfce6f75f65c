// User-namespace id maps: where root inside a sandbox lands on the host.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

namespace berth::ns {

// A contiguous host id range [host_start, host_start + count) mapped to 0.. inside.
struct IdRange {
    uint32_t host_start = 0;
    uint32_t count = 0;
};

struct IdMapping {
    IdRange uids;
    IdRange gids;
};

// Finds `user`'s (name or numeric uid) first range in an /etc/subuid-format file.
std::optional<IdRange> find_subordinate_range(const std::string& file, const std::string& user,
                                              uid_t uid);
// All of `user`'s ranges there, in file order.
std::vector<IdRange> subordinate_ranges(const std::string& file, const std::string& user,
                                        uid_t uid);

// Host uids to own the sandboxes' user namespaces, one per sandbox: the kernel charges a
// namespace's per-user counters (inotify instances and watches, user and mount
// namespaces...: /proc/sys/user, fs.inotify) to its owner as well, so sandboxes owned by
// root would share root's (a sandbox holding 128 inotify instances made root's
// inotify_init1 fail). They come from `user`'s subordinate uids past the 65536 the
// mapping uses: the rest of that range, else its next range that overlaps none mapped.
// No file and no process ever has these uids. nullopt when there are none.
std::optional<IdRange> owner_range_for_user(const std::string& user, uid_t uid,
                                            const IdMapping& mapping,
                                            const std::string& subuid_file = "/etc/subuid");

// The mapping for sandboxes of a service user, from /etc/subuid and /etc/subgid.
// Throws with a message that says which file lacks the user and how to fix it.
IdMapping mapping_for_user(const std::string& user, uid_t uid,
                           const std::string& subuid_file = "/etc/subuid",
                           const std::string& subgid_file = "/etc/subgid");

// "0 <host_start> <count>\n", the uid_map/gid_map line for a range.
std::string map_line(const IdRange& range);

// Writes uid_map and gid_map of `pid` (the caller must be privileged over the namespace;
// rootless mode goes through newuidmap/newgidmap instead).
void write_id_maps(pid_t pid, const IdMapping& mapping);

}  // namespace berth::ns
