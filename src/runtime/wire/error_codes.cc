#include "runtime/wire/error_codes.h"

namespace berth::wire {

namespace {

using K = Error::Kind;
constexpr bool same(K k, v1::ErrorCode c) {
    return static_cast<int>(k) == static_cast<int>(c);
}
static_assert(same(K::unspecified, v1::ERROR_CODE_UNSPECIFIED));
static_assert(same(K::invalid_argument, v1::INVALID_ARGUMENT));
static_assert(same(K::not_found, v1::NOT_FOUND));
static_assert(same(K::permission_denied, v1::PERMISSION_DENIED));
static_assert(same(K::resource_exhausted, v1::RESOURCE_EXHAUSTED));
static_assert(same(K::deadline_exceeded, v1::DEADLINE_EXCEEDED));
static_assert(same(K::unavailable, v1::UNAVAILABLE));
static_assert(same(K::internal, v1::INTERNAL));
static_assert(same(K::already_exists, v1::ALREADY_EXISTS));
static_assert(same(K::cancelled, v1::CANCELED));
static_assert(same(K::failed_precondition, v1::FAILED_PRECONDITION));
// A code added to the protocol needs a Kind too.
static_assert(v1::ErrorCode_MAX == v1::FAILED_PRECONDITION);

}  // namespace

v1::ErrorCode error_code(Error::Kind kind) {
    return static_cast<v1::ErrorCode>(kind);
}

Error::Kind error_kind(v1::ErrorCode code) {
    if (!v1::ErrorCode_IsValid(code)) return K::internal;
    return static_cast<K>(code);
}

v1::ErrorCode error_code_for_errno(int err, v1::ErrorCode otherwise) {
    return error_code(kind_for_errno(err, error_kind(otherwise)));
}

v1::ErrorCode error_code_from_peer(v1::ErrorCode code) {
    if (code == v1::ERROR_CODE_UNSPECIFIED || !v1::ErrorCode_IsValid(code)) return v1::INTERNAL;
    return code;
}

}  // namespace berth::wire
