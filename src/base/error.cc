#include "base/error.h"

#include <cstring>

namespace berth {

Error& Error::wrap(std::string_view context) {
    std::string s(context);
    s += ": ";
    s += message_;
    message_ = std::move(s);
    return *this;
}

Error::Kind kind_for_errno(int err, Error::Kind otherwise) {
    using K = Error::Kind;
    switch (err) {
        case ENOENT:
            return K::not_found;
        case EACCES:
        case EPERM:
        case EROFS:
            return K::permission_denied;
        case ENOSPC:
        case EDQUOT:
        case EMFILE:
        case ENFILE:
        case ENOMEM:
        case EFBIG:
            return K::resource_exhausted;
        case EEXIST:
        case ENOTEMPTY:
            return K::already_exists;
        case EPIPE:
            return K::unavailable;
        case ECANCELED:
            return K::cancelled;
        case ENOTDIR:
        case EISDIR:
        case EINVAL:
        case ENAMETOOLONG:
        case ELOOP:
        case EXDEV:
        case EBUSY:
        case EBADMSG:
            return K::invalid_argument;
        default:
            return otherwise;
    }
}

static std::string describe(std::string_view call, std::string_view subject, int err) {
    std::string s(call);
    if (!subject.empty()) {
        s += ' ';
        s += subject;
    }
    s += ": ";
    s += std::strerror(err);
    s += " (errno ";
    s += std::to_string(err);
    s += ')';
    return s;
}

SysError::SysError(std::string_view call, std::string_view subject, int err)
    : Error(kind_for_errno(err), describe(call, subject, err), err) {}

void throw_sys(std::string_view call, std::string_view subject, int err) {
    throw SysError(call, subject, err);
}

}  // namespace berth
