#include "runtime/wire/error_codes.h"

#include <cerrno>

namespace berth::wire {

v1::ErrorCode error_code_for_errno(int err, v1::ErrorCode otherwise) {
    switch (err) {
        case ENOENT:
            return v1::NOT_FOUND;
        case EACCES:
        case EPERM:
        case EROFS:
            return v1::PERMISSION_DENIED;
        case ENOSPC:
        case EDQUOT:
        case EMFILE:
        case ENFILE:
        case ENOMEM:
        case EFBIG:
            return v1::RESOURCE_EXHAUSTED;
        case EEXIST:
        case ENOTEMPTY:
            return v1::ALREADY_EXISTS;
        case EPIPE:
            return v1::UNAVAILABLE;
        case ECANCELED:
            return v1::CANCELED;
        case ENOTDIR:
        case EISDIR:
        case EINVAL:
        case ENAMETOOLONG:
        case ELOOP:
        case EXDEV:
        case EBUSY:
        case EBADMSG:
            return v1::INVALID_ARGUMENT;
        default:
            return otherwise;
    }
}

v1::ErrorCode error_code_from_peer(v1::ErrorCode code) {
    if (code == v1::ERROR_CODE_UNSPECIFIED || !v1::ErrorCode_IsValid(code)) return v1::INTERNAL;
    return code;
}

}  // namespace berth::wire
