// The one mapping from errno to berth.v1.ErrorCode, for every process that reports a
// system error across a boundary (berth-init's file worker, berth-images). Codes cross
// processes as the protocol enum itself (init.proto, helper.proto), never as numbers.
#pragma once

#include "berth.pb.h"

namespace berth::wire {

// ENOENT -> NOT_FOUND; EACCES, EPERM, EROFS -> PERMISSION_DENIED; ENOSPC, EDQUOT, EMFILE,
// ENFILE, ENOMEM, EFBIG -> RESOURCE_EXHAUSTED; EEXIST, ENOTEMPTY -> ALREADY_EXISTS; EPIPE ->
// UNAVAILABLE (the peer closed its end); ECANCELED -> CANCELED; ENOTDIR, EISDIR, EINVAL,
// ENAMETOOLONG, ELOOP, EXDEV, EBUSY, EBADMSG -> INVALID_ARGUMENT; anything else
// `otherwise`.
v1::ErrorCode error_code_for_errno(int err, v1::ErrorCode otherwise = v1::INTERNAL);

// A code as another process sent it, for the client: proto3 enums keep any number, and a
// sandbox's init is not trusted; an unknown or unset code becomes INTERNAL.
v1::ErrorCode error_code_from_peer(v1::ErrorCode code);

}  // namespace berth::wire
