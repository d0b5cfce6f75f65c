// Who an exec runs as, resolved from the sandbox's own /etc/passwd and /etc/group.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <string_view>
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

// resolve_user() against the sandbox's own /etc/passwd and /etc/group (read as berth-init
// sees them: its root is the sandbox's). A file that is missing, not a regular file (a
// fifo planted to hang init) or over 4 MiB counts as empty.
std::optional<ResolvedUser> resolve_sandbox_user(std::string_view spec, std::string* error);

}  // namespace berth::init
