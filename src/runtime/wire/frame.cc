#include "runtime/wire/frame.h"

#include <sys/socket.h>
#include <sys/uio.h>

#include <cstring>

#include "base/error.h"

namespace berth::wire {

std::string encode_frame(const google::protobuf::MessageLite& msg) {
    const size_t size = msg.ByteSizeLong();
    std::string out(4 + size, '\0');
    out[0] = static_cast<char>((size >> 24) & 0xff);
    out[1] = static_cast<char>((size >> 16) & 0xff);
    out[2] = static_cast<char>((size >> 8) & 0xff);
    out[3] = static_cast<char>(size & 0xff);
    msg.SerializeWithCachedSizesToArray(reinterpret_cast<uint8_t*>(out.data() + 4));
    return out;
}

uint32_t decode_length(const unsigned char h[4]) {
    return (uint32_t{h[0]} << 24) | (uint32_t{h[1]} << 16) | (uint32_t{h[2]} << 8) | h[3];
}

// Receives exactly `len` bytes (or EOF at offset 0), collecting any passed fds.
static bool recv_exact(int fd, char* buf, size_t len, std::vector<UniqueFd>* fds) {
    size_t got = 0;
    while (got < len) {
        iovec iov{buf + got, len - got};
        alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 8)];
        msghdr mh{};
        mh.msg_iov = &iov;
        mh.msg_iovlen = 1;
        mh.msg_control = control;
        mh.msg_controllen = sizeof control;
        ssize_t n = ::recvmsg(fd, &mh, MSG_CMSG_CLOEXEC);
        if (n < 0) {
            if (errno == EINTR) continue;
            // A non-socket (pipe, file) is read plainly.
            if (errno == ENOTSOCK) {
                n = ::read(fd, buf + got, len - got);
                if (n < 0 && errno == EINTR) continue;
                if (n < 0) throw_sys("read", "frame");
            } else {
                throw_sys("recvmsg", "frame");
            }
        }
        for (cmsghdr* c = CMSG_FIRSTHDR(&mh); n > 0 && c; c = CMSG_NXTHDR(&mh, c)) {
            if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
            size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
            for (size_t i = 0; i < count; ++i) {
                int received;
                std::memcpy(&received, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
                UniqueFd owned(received);
                if (fds) fds->push_back(std::move(owned));
            }
        }
        if (n == 0) {
            if (got == 0) return false;
            throw_sys("recvmsg", "frame (truncated)", EPIPE);
        }
        got += static_cast<size_t>(n);
    }
    return true;
}

ReadStatus read_frame(int fd, google::protobuf::MessageLite& msg, uint32_t max_bytes,
                      std::vector<UniqueFd>* fds) {
    unsigned char header[4];
    if (!recv_exact(fd, reinterpret_cast<char*>(header), 4, fds)) return ReadStatus::eof;
    uint32_t len = decode_length(header);
    if (len > max_bytes) return ReadStatus::too_large;
    std::string body(len, '\0');
    if (len > 0 && !recv_exact(fd, body.data(), len, fds)) {
        throw_sys("recvmsg", "frame (truncated)", EPIPE);
    }
    return msg.ParseFromString(body) ? ReadStatus::ok : ReadStatus::malformed;
}

void write_frame(int fd, const google::protobuf::MessageLite& msg, const std::vector<int>& fds) {
    std::string bytes = encode_frame(msg);
    size_t off = 0;
    bool first = true;
    while (off < bytes.size()) {
        iovec iov{bytes.data() + off, bytes.size() - off};
        msghdr mh{};
        mh.msg_iov = &iov;
        mh.msg_iovlen = 1;
        alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 8)];
        if (first && !fds.empty()) {
            if (fds.size() > 8) throw_sys("sendmsg", "too many fds", EINVAL);
            const size_t payload = sizeof(int) * fds.size();
            mh.msg_control = control;
            mh.msg_controllen = CMSG_SPACE(payload);
            cmsghdr* c = CMSG_FIRSTHDR(&mh);
            c->cmsg_level = SOL_SOCKET;
            c->cmsg_type = SCM_RIGHTS;
            c->cmsg_len = CMSG_LEN(payload);
            std::memcpy(CMSG_DATA(c), fds.data(), payload);
        }
        ssize_t n = ::sendmsg(fd, &mh, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno == ENOTSOCK && fds.empty()) {
                n = ::write(fd, bytes.data() + off, bytes.size() - off);
                if (n < 0 && errno == EINTR) continue;
                if (n < 0) throw_sys("write", "frame");
            } else {
                throw_sys("sendmsg", "frame");
            }
        }
        first = false;
        off += static_cast<size_t>(n);
    }
}

}  // namespace berth::wire
