// The blocking frame reader (wire::read_frame) of berth-helper, berth-init's control
// socket and the CLI: any byte stream, cut into any writes, with fds passed now and then,
// gives frames of the declared lengths, or eof, too_large, malformed or a SysError; passed
// fds are owned (closed) whatever happens. A crash or sanitizer report is a finding.
//
// Input: byte 0 is the largest frame accepted (in KiB, 0 = 64 bytes), byte 1 how the rest
// is cut into writes and which of them carry an fd.
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "base/error.h"
#include "berth.pb.h"
#include "runtime/wire/frame.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size < 2) return 0;
    const uint32_t max_frame = data[0] ? uint32_t{data[0]} << 10 : 64;
    const uint8_t cut = data[1];
    data += 2;
    size -= 2;
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) std::abort();
    berth::UniqueFd reader(sv[0]), writer(sv[1]);
    std::thread send_all([&] {
        const size_t chunk = size_t{1} << (cut & 7);
        int null = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
        for (size_t off = 0, i = 0; off < size; ++i) {
            const size_t n = std::min(chunk, size - off);
            iovec iov{const_cast<uint8_t*>(data + off), n};
            msghdr mh{};
            mh.msg_iov = &iov;
            mh.msg_iovlen = 1;
            alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
            if ((cut >> 3) && i % (cut >> 3) == 0) {
                mh.msg_control = control;
                mh.msg_controllen = sizeof control;
                cmsghdr* c = CMSG_FIRSTHDR(&mh);
                c->cmsg_level = SOL_SOCKET;
                c->cmsg_type = SCM_RIGHTS;
                c->cmsg_len = CMSG_LEN(sizeof(int));
                std::memcpy(CMSG_DATA(c), &null, sizeof null);
            }
            ssize_t w = ::sendmsg(writer.get(), &mh, MSG_NOSIGNAL);
            if (w <= 0) break;
            off += static_cast<size_t>(w);
        }
        ::close(null);
        ::shutdown(writer.get(), SHUT_WR);
    });
    std::vector<berth::UniqueFd> fds;
    for (;;) {
        berth::v1::ClientMessage msg;
        berth::wire::ReadStatus status;
        try {
            status = berth::wire::read_frame(reader.get(), msg, max_frame, &fds);
        } catch (const berth::SysError&) {
            break;  // truncated frame: EPIPE
        }
        if (status != berth::wire::ReadStatus::ok && status != berth::wire::ReadStatus::malformed)
            break;
        if (fds.size() > 64) fds.clear();
    }
    reader.reset();  // the sender may be blocked on a full socket
    send_all.join();
    return 0;
}
