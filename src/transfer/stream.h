// The byte movers under the archive writer and reader. File data goes fd to fd (splice,
// sendfile, copy_file_range) where the kinds of fds allow; headers and small files are
// batched through one buffer. When a cancel token is given, the stream fd is made
// non-blocking for the transfer and every wait polls it together with the token's fd.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string_view>

#include "base/cancel.h"

namespace berth::transfer::internal {

enum class FdKind { pipe, socket, file, other };
FdKind fd_kind(int fd);

// Waits until `fd` has `events` (POLLIN/POLLOUT); SysError ECANCELED if `cancel` (when
// given) is cancelled first.
void wait_fd(int fd, short events, const CancelToken* cancel);

// Copies `n` bytes from the start of the regular file `in` to the start of the regular file
// `out` in the kernel (copy_file_range, or sendfile across filesystems), in chunks with a
// look at `cancel` between them. Returns the bytes copied: fewer if `in` is shorter.
uint64_t copy_file_to_file(int in, int out, uint64_t n, const CancelToken* cancel,
                           std::string_view subject);

// Sets O_NONBLOCK on `fd` while alive (when `enable`), then restores the flags.
class NonBlockGuard {
  public:
    NonBlockGuard(int fd, bool enable);
    ~NonBlockGuard();
    NonBlockGuard(const NonBlockGuard&) = delete;
    NonBlockGuard& operator=(const NonBlockGuard&) = delete;

  private:
    int fd_ = -1;
    int old_flags_ = -1;
};

class OutputStream {
  public:
    static constexpr size_t kCapacity = 1 << 20;
    static constexpr size_t kSmallFile = 64 << 10;

    OutputStream(int fd, const CancelToken* cancel);
    // Room for `n` (<= kCapacity) bytes at the end of the buffer; commit() what was used.
    char* reserve(size_t n);
    void commit(size_t n) { len_ += n; }
    void append(const void* data, size_t n);
    void append_zeros(uint64_t n);
    // Sends `len` bytes of the file `fd` from `offset`; returns fewer only when the file
    // ended early. Errors name `subject`.
    uint64_t send_file(int fd, uint64_t offset, uint64_t len, std::string_view subject);
    void flush();

  private:
    void write_all(const char* p, size_t n);

    int fd_;
    const CancelToken* cancel_;
    FdKind kind_;
    std::unique_ptr<char[]> buf_;
    size_t len_ = 0;
    bool splice_ok_ = true;
    bool sendfile_ok_ = true;
    bool copy_range_ok_ = true;
};

class InputStream {
  public:
    static constexpr size_t kCapacity = 1 << 20;

    InputStream(int fd, const CancelToken* cancel);
    // Reads until `n` bytes or end of stream; returns how many.
    size_t read_upto(void* dst, size_t n);
    // Exactly `n` bytes or SysError EIO (truncated) naming `subject`.
    void read_exact(void* dst, size_t n, std::string_view subject);
    void skip(uint64_t n, std::string_view subject);
    // Moves `n` bytes of the stream into the file `out` at `offset`. Errors on the file
    // side are SysError("write", subject, errno); a short stream is EIO.
    void copy_to_file(int out, uint64_t offset, uint64_t n, std::string_view subject);
    // A scratch buffer of kCapacity bytes callers may use between calls.
    char* scratch() { return buf_.get(); }

  private:
    int fd_;
    const CancelToken* cancel_;
    FdKind kind_;
    std::unique_ptr<char[]> buf_;
    bool splice_ok_ = true;
    bool copy_range_ok_ = true;
};

[[noreturn]] void throw_truncated(std::string_view subject);

}  // namespace berth::transfer::internal
