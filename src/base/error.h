// Errors that say what failed, of what kind, and where they passed on the way up.
//
// Every error berth throws on purpose is a berth::Error: a Kind (what the protocol's
// berth.v1.ErrorCode calls it; runtime/wire/error_codes.h converts), the message, and the
// errno when a system call failed. As it propagates, a caller that knows more says so with
// wrap() or with_context(), the way crun's crun_error_wrap does: "importing x.tar: open
// x.tar/blobs: Permission denied (errno 13)". Classes derived from it (SysError, the image
// store's, the registry client's) exist to be caught by type; their kind is what a boundary
// that turns errors into codes reports for them.
#pragma once

#include <cerrno>
#include <exception>
#include <stdexcept>  // (not used here: what many includers have long taken from it)
#include <string>
#include <string_view>
#include <utility>

namespace berth {

class Error : public std::exception {
  public:
    // berth.v1.ErrorCode's values, one for one (the wire mapping static_asserts it), so that
    // this library needs no protobuf.
    enum class Kind {
        unspecified = 0,  // never thrown on purpose: a peer's unset code
        invalid_argument = 1,
        not_found = 2,
        permission_denied = 3,
        resource_exhausted = 4,
        deadline_exceeded = 5,
        unavailable = 6,
        internal = 7,
        already_exists = 8,
        cancelled = 9,
        failed_precondition = 10,
    };

    Error(Kind kind, std::string message, int err = 0)
        : kind_(kind), err_(err), message_(std::move(message)) {}

    const char* what() const noexcept override { return message_.c_str(); }
    Kind kind() const noexcept { return kind_; }
    int err() const noexcept { return err_; }  // the errno of a failed call; 0: none

    // Puts "context: " before the message. Call it on the exception being propagated
    // (catch by non-const reference, wrap, `throw;`), so its type and kind survive.
    Error& wrap(std::string_view context);

  private:
    Kind kind_;
    int err_;
    std::string message_;
};

// What a failed call's errno says of the failure: ENOENT -> not_found; EACCES, EPERM, EROFS
// -> permission_denied; ENOSPC, EDQUOT, EMFILE, ENFILE, ENOMEM, EFBIG -> resource_exhausted;
// EEXIST, ENOTEMPTY -> already_exists; EPIPE -> unavailable (the peer closed its end);
// ECANCELED -> cancelled; ENOTDIR, EISDIR, EINVAL, ENAMETOOLONG, ELOOP, EXDEV, EBUSY,
// EBADMSG -> invalid_argument; anything else `otherwise`.
Error::Kind kind_for_errno(int err, Error::Kind otherwise = Error::Kind::internal);

// Runs `f`; a berth::Error it throws leaves wrapped in `context`.
template <typename F>
decltype(auto) with_context(std::string_view context, F&& f) {
    try {
        return std::forward<F>(f)();
    } catch (Error& e) {
        e.wrap(context);
        throw;
    }
}

// A failed system call. what() reads like "open /run/berth/x: Permission denied (errno 13)";
// its kind follows from errno (kind_for_errno).
class SysError : public Error {
  public:
    SysError(std::string_view call, std::string_view subject, int err);
    // One that another process raised and described (its what() and errno, relayed).
    static SysError relayed(const std::string& what, int err) { return SysError(what, err); }
    int code() const { return err(); }

  private:
    SysError(const std::string& what, int err) : Error(kind_for_errno(err), what, err) {}
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
