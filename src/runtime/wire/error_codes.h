// The one mapping between berth::Error's kinds (and errno) and berth.v1.ErrorCode, for every
// process that reports an error across a boundary (berth-init's file worker, berth-images,
// the helper, the client). Codes cross processes as the protocol enum itself (init.proto,
// helper.proto), never as numbers.
#pragma once

#include "base/error.h"
#include "berth.pb.h"

namespace berth::wire {

// Kind and code have the same values (checked at compile time in the .cc).
v1::ErrorCode error_code(Error::Kind kind);
// A code no Kind has (proto3 enums keep any number) becomes Kind::internal.
Error::Kind error_kind(v1::ErrorCode code);

// The code of errno `err` (base's kind_for_errno); for an errno it does not list,
// `otherwise`.
v1::ErrorCode error_code_for_errno(int err, v1::ErrorCode otherwise = v1::INTERNAL);

// A code as another process sent it, for the client: proto3 enums keep any number, and a
// sandbox's init is not trusted; an unknown or unset code becomes INTERNAL.
v1::ErrorCode error_code_from_peer(v1::ErrorCode code);

}  // namespace berth::wire
