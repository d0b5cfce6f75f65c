#include "transfer/stream.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "base/error.h"

namespace berth::transfer::internal {

namespace {
constexpr size_t kChunk = 1 << 30;  // per splice/sendfile/copy_file_range call
}

FdKind fd_kind(int fd) {
    struct stat st;
    if (::fstat(fd, &st) != 0) throw_sys("fstat", "archive stream");
    if (S_ISFIFO(st.st_mode)) return FdKind::pipe;
    if (S_ISSOCK(st.st_mode)) return FdKind::socket;
    if (S_ISREG(st.st_mode)) return FdKind::file;
    return FdKind::other;
}

void wait_fd(int fd, short events, const CancelToken* cancel) {
    pollfd p[2] = {{fd, events, 0}, {cancel ? cancel->fd() : -1, POLLIN, 0}};
    nfds_t n = cancel ? 2 : 1;
    for (;;) {
        int r = ::poll(p, n, -1);
        if (r < 0) {
            if (errno == EINTR) continue;
            throw_sys("poll", "archive stream");
        }
        if (n == 2 && p[1].revents) throw_sys("transfer", "cancelled", ECANCELED);
        if (p[0].revents) return;
    }
}

uint64_t copy_file_to_file(int in, int out, uint64_t n, const CancelToken* cancel,
                           std::string_view subject) {
    constexpr uint64_t kChunk = 64u << 20;
    loff_t in_off = 0, out_off = 0;
    bool use_cfr = true;
    uint64_t done = 0;
    while (done < n) {
        if (cancel && cancel->cancelled()) throw_sys("transfer", "cancelled", ECANCELED);
        const size_t chunk = static_cast<size_t>(std::min(kChunk, n - done));
        ssize_t r;
        if (use_cfr) {
            r = ::copy_file_range(in, &in_off, out, &out_off, chunk, 0);
            if (r < 0 &&
                (errno == EXDEV || errno == EINVAL || errno == EOPNOTSUPP || errno == ENOSYS)) {
                use_cfr = false;  // another filesystem: sendfile splices in the kernel
                continue;
            }
        } else {
            if (::lseek(out, out_off, SEEK_SET) < 0) throw_sys("lseek", subject);
            r = ::sendfile(out, in, &in_off, chunk);
            if (r > 0) out_off += r;
        }
        if (r < 0) {
            if (errno == EINTR) continue;
            throw_sys(use_cfr ? "copy_file_range" : "sendfile", subject);
        }
        if (r == 0) break;
        done += static_cast<uint64_t>(r);
    }
    return done;
}

void throw_truncated(std::string_view subject) {
    throw_sys("read (archive ends early)", subject, EIO);
}

NonBlockGuard::NonBlockGuard(int fd, bool enable) {
    if (!enable) return;
    int flags = ::fcntl(fd, F_GETFL);
    if (flags < 0 || (flags & O_NONBLOCK)) return;
    if (::fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0) return;
    fd_ = fd;
    old_flags_ = flags;
}

NonBlockGuard::~NonBlockGuard() {
    if (fd_ >= 0) ::fcntl(fd_, F_SETFL, old_flags_);
}

// ---- output ----

OutputStream::OutputStream(int fd, const CancelToken* cancel)
    : fd_(fd), cancel_(cancel), kind_(fd_kind(fd)), buf_(new char[kCapacity]) {}

char* OutputStream::reserve(size_t n) {
    if (len_ + n > kCapacity) flush();
    return buf_.get() + len_;
}

void OutputStream::append(const void* data, size_t n) {
    auto p = static_cast<const char*>(data);
    while (n > 0) {
        if (len_ == kCapacity) flush();
        size_t k = std::min(n, kCapacity - len_);
        std::memcpy(buf_.get() + len_, p, k);
        len_ += k;
        p += k;
        n -= k;
    }
}

void OutputStream::append_zeros(uint64_t n) {
    while (n > 0) {
        if (len_ == kCapacity) flush();
        size_t k = static_cast<size_t>(std::min<uint64_t>(n, kCapacity - len_));
        std::memset(buf_.get() + len_, 0, k);
        len_ += k;
        n -= k;
    }
}

void OutputStream::flush() {
    write_all(buf_.get(), len_);
    len_ = 0;
}

void OutputStream::write_all(const char* p, size_t n) {
    while (n > 0) {
        ssize_t r = kind_ == FdKind::socket ? ::send(fd_, p, n, MSG_NOSIGNAL) : ::write(fd_, p, n);
        if (r < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN) {
                wait_fd(fd_, POLLOUT, cancel_);
                continue;
            }
            throw_sys("write", "archive stream");
        }
        p += r;
        n -= static_cast<size_t>(r);
    }
}

uint64_t OutputStream::send_file(int fd, uint64_t offset, uint64_t len, std::string_view subject) {
    if (len <= kSmallFile) {
        char* p = reserve(static_cast<size_t>(len));
        size_t got = 0;
        while (got < len) {
            ssize_t r = ::pread(fd, p + got, static_cast<size_t>(len) - got,
                                static_cast<off_t>(offset + got));
            if (r < 0) {
                if (errno == EINTR) continue;
                throw_sys("read", subject);
            }
            if (r == 0) break;
            got += static_cast<size_t>(r);
        }
        commit(got);
        return got;
    }
    flush();
    uint64_t sent = 0;
    while (sent < len) {
        size_t chunk = static_cast<size_t>(std::min<uint64_t>(len - sent, kChunk));
        ssize_t r;
        const char* call;
        if (kind_ == FdKind::pipe && splice_ok_) {
            call = "splice";
            // A blocking splice into a pipe only waits while the pipe is full: poll first
            // so that a cancel is seen.
            if (cancel_) wait_fd(fd_, POLLOUT, cancel_);
            loff_t off = static_cast<loff_t>(offset + sent);
            r = ::splice(fd, &off, fd_, nullptr, chunk, SPLICE_F_MOVE | SPLICE_F_MORE);
            if (r < 0 && (errno == EINVAL || errno == ENOSYS)) {
                splice_ok_ = false;
                continue;
            }
        } else if (kind_ == FdKind::socket && sendfile_ok_) {
            call = "sendfile";
            off_t off = static_cast<off_t>(offset + sent);
            r = ::sendfile(fd_, fd, &off, chunk);
            if (r < 0 && (errno == EINVAL || errno == ENOSYS)) {
                sendfile_ok_ = false;
                continue;
            }
        } else if (kind_ == FdKind::file && copy_range_ok_) {
            call = "copy_file_range";
            loff_t off = static_cast<loff_t>(offset + sent);
            r = ::copy_file_range(fd, &off, fd_, nullptr, chunk, 0);
            if (r < 0 && (errno == EXDEV || errno == EINVAL || errno == ENOSYS ||
                          errno == EOPNOTSUPP || errno == EBADF)) {
                copy_range_ok_ = false;
                continue;
            }
        } else {
            call = "read";
            size_t k = std::min(chunk, kCapacity);
            r = ::pread(fd, buf_.get(), k, static_cast<off_t>(offset + sent));
            if (r > 0) write_all(buf_.get(), static_cast<size_t>(r));
        }
        if (r == 0) break;
        if (r < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN) {
                wait_fd(fd_, POLLOUT, cancel_);
                continue;
            }
            throw_sys(call, subject);
        }
        sent += static_cast<uint64_t>(r);
    }
    return sent;
}

// ---- input ----

InputStream::InputStream(int fd, const CancelToken* cancel)
    : fd_(fd), cancel_(cancel), kind_(fd_kind(fd)), buf_(new char[kCapacity]) {}

size_t InputStream::read_upto(void* dst, size_t n) {
    auto p = static_cast<char*>(dst);
    size_t got = 0;
    while (got < n) {
        ssize_t r = ::read(fd_, p + got, n - got);
        if (r < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN) {
                wait_fd(fd_, POLLIN, cancel_);
                continue;
            }
            throw_sys("read", "archive stream");
        }
        if (r == 0) break;
        got += static_cast<size_t>(r);
    }
    return got;
}

void InputStream::read_exact(void* dst, size_t n, std::string_view subject) {
    if (read_upto(dst, n) != n) throw_truncated(subject);
}

void InputStream::skip(uint64_t n, std::string_view subject) {
    while (n > 0) {
        size_t k = static_cast<size_t>(std::min<uint64_t>(n, kCapacity));
        read_exact(buf_.get(), k, subject);
        n -= k;
    }
}

void InputStream::copy_to_file(int out, uint64_t offset, uint64_t n, std::string_view subject) {
    while (n > 0) {
        size_t chunk = static_cast<size_t>(std::min<uint64_t>(n, kChunk));
        ssize_t r;
        if (kind_ == FdKind::pipe && splice_ok_ && n > 16384) {
            // A blocking splice from a pipe only waits while the pipe is empty.
            if (cancel_) wait_fd(fd_, POLLIN, cancel_);
            loff_t off = static_cast<loff_t>(offset);
            r = ::splice(fd_, nullptr, out, &off, chunk, SPLICE_F_MOVE);
            if (r < 0 && (errno == EINVAL || errno == ENOSYS)) {
                splice_ok_ = false;
                continue;
            }
        } else if (kind_ == FdKind::file && copy_range_ok_) {
            loff_t off = static_cast<loff_t>(offset);
            r = ::copy_file_range(fd_, nullptr, out, &off, chunk, 0);
            if (r < 0 && (errno == EXDEV || errno == EINVAL || errno == ENOSYS ||
                          errno == EOPNOTSUPP || errno == EBADF)) {
                copy_range_ok_ = false;
                continue;
            }
        } else {
            size_t k = std::min(chunk, kCapacity);
            size_t got = read_upto(buf_.get(), k);
            if (got == 0) throw_truncated(subject);
            size_t done = 0;
            while (done < got) {
                ssize_t w =
                    ::pwrite(out, buf_.get() + done, got - done, static_cast<off_t>(offset + done));
                if (w < 0) {
                    if (errno == EINTR) continue;
                    throw_sys("write", subject);
                }
                done += static_cast<size_t>(w);
            }
            r = static_cast<ssize_t>(got);
        }
        if (r == 0) throw_truncated(subject);
        if (r < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN) {
                wait_fd(fd_, POLLIN, cancel_);
                continue;
            }
            throw_sys("write", subject);
        }
        offset += static_cast<uint64_t>(r);
        n -= static_cast<uint64_t>(r);
    }
}

}  // namespace berth::transfer::internal
