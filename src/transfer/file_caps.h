// File capabilities (the security.capability xattr) of an image layer, made namespaced.
//
// A v1 or v2 capability (VFS_CAP_REVISION_1/2) is honoured by the kernel for every user on
// the host: written as they come by root in the initial user namespace, a layer's
// cap_setuid+ep file would make whoever runs it uid 0. A v3 one (VFS_CAP_REVISION_3)
// carries a rootid and is honoured only in a user namespace whose root is that host uid
// (or one nested in it): the sandboxes' root, never the host's.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace berth::transfer {

// `value` (a security.capability of revision 1, 2 or 3) rewritten as revision 3 with
// `rootid`: permitted, inheritable and the effective flag kept, any rootid the value had
// replaced (a layer may not choose whose namespace honours it). nullopt when `value` is
// not a well-formed capability of those revisions.
std::optional<std::string> namespaced_file_caps(std::string_view value, uint32_t rootid);

// The rootid of a revision 3 value; nullopt for another revision or a malformed value.
std::optional<uint32_t> file_caps_rootid(std::string_view value);

}  // namespace berth::transfer
