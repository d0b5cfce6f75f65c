// Who an exec runs as, resolved from the sandbox's own /etc/passwd and /etc/group.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace berth::init {

struct ResolvedUser {
    uid_t uid = 0;
    gid_t gid = 0;
    std::vector<gid_t> groups;  // supplementary
    std::string home = "/";
    std::string name;  // empty for a uid with no passwd entry
};

// Resolves "name", "uid", "name:group", "uid:gid" (group by name or number).
// A numeric uid need not exist in passwd (as in Docker); a name must.
// Returns nullopt and sets `error` ("user 'bob' not found in /etc/passwd") when it cannot.
std::optional<ResolvedUser> resolve_user(std::string_view spec, std::string_view passwd,
                                         std::string_view group, std::string* error);

// The ids a user namespace maps, from /proc/PID/uid_map or gid_map text: (first, count)
// extents of ids inside.
struct IdRanges {
    std::vector<std::pair<uint32_t, uint32_t>> extents;
    bool contains(uint32_t id) const;
    static IdRanges parse(std::string_view map_text);
};

// "" when the user's uid, gid and every supplementary group are mapped in the sandbox,
// else a message naming the first that is not ("user: uid 70000 is not mapped in the
// sandbox (ids 0-65535)"). An id a passwd entry gives counts like a numeric one: an image's
// /etc/passwd saying 4294967295 ((uid_t)-1, "unchanged" to setresuid) must not keep root.
std::string check_mapped(const ResolvedUser& user, const IdRanges& uids, const IdRanges& gids);
// check_mapped() against this process's own user namespace (maps read once).
std::string check_mapped_here(const ResolvedUser& user);

// resolve_user() against the sandbox's own /etc/passwd and /etc/group (read as berth-init
// sees them: its root is the sandbox's). A file that is missing, not a regular file (a
// fifo planted to hang init) or over 4 MiB counts as empty.
std::optional<ResolvedUser> resolve_sandbox_user(std::string_view spec, std::string* error);

}  // namespace berth::init
