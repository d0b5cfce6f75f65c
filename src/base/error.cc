#include "base/error.h"

#include <cstring>

namespace berth {

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
    : std::runtime_error(describe(call, subject, err)), err_(err) {}

void throw_sys(std::string_view call, std::string_view subject, int err) {
    throw SysError(call, subject, err);
}

}  // namespace berth
