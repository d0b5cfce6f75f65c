// Errors that say what failed: the system call, the thing it acted on, and errno.
#pragma once

#include <cerrno>
#include <stdexcept>
#include <string>
#include <string_view>

namespace berth {

// A failed system call. what() reads like "open /run/berth/x: Permission denied (errno 13)".
class SysError : public std::runtime_error {
  public:
    SysError(std::string_view call, std::string_view subject, int err);
    // One that another process raised and described (its what() and errno, relayed).
    static SysError relayed(const std::string& what, int err) { return SysError(what, err); }
    int code() const { return err_; }

  private:
    SysError(const std::string& what, int err) : std::runtime_error(what), err_(err) {}
    int err_;
};

// Throws SysError for `call` on `subject` with the current errno (or `err`).
[[noreturn]] void throw_sys(std::string_view call, std::string_view subject = {}, int err = errno);

// Calls a syscall-like function, retrying on EINTR; throws SysError on -1.
template <typename F>
auto check_sys(std::string_view call, std::string_view subject, F&& f) {
    for (;;) {
        auto r = f();
        if (r != -1) return r;
        if (errno != EINTR) throw_sys(call, subject);
    }
}

}  // namespace berth
