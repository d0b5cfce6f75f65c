// The error of a request the helper refuses or cannot do, with the code berthd passes on.
#pragma once

#include <string>

#include "base/error.h"
#include "berth.pb.h"
#include "runtime/wire/error_codes.h"

namespace berth::helper {

// `code` stays a member beside the kind it sets (callers read e.code).
struct HelperError : Error {
    HelperError(v1::ErrorCode code, const std::string& message)
        : Error(wire::error_kind(code), message), code(code) {}
    v1::ErrorCode code;
};

}  // namespace berth::helper
