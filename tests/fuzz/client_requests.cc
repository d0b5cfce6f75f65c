// berthd's side of a client connection, end to end in one process: the bytes a client
// sends go through FramedSocket (framing, fds, limits) and Server's dispatch and checks
// (validate.cc, find_or_reply, the file and image handlers), as root would reach them.
// berth-helper is a socket that never answers (creates and deletes stay pending) and there
// is no image service, so no sandbox comes to exist: what is fuzzed is what a hostile
// client's bytes reach before any privileged process acts. Every reply must parse as a
// ServerMessage; a crash, a sanitizer report or an unparsable reply is a finding.
//
// Input: byte 0 chooses how the rest is cut into writes (and whether a valid Hello goes
// first, so that most inputs get past it); the rest is the client's byte stream.
#include <sys/socket.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "berth.pb.h"
#include "runtime/daemon/server.h"
#include "runtime/wire/frame.h"

namespace bd = berth::daemon;
namespace v1 = berth::v1;

namespace {

const std::string& runtime_dir() {
    static const std::string dir = [] {
        char path[] = "/tmp/berth-fuzz-requests-XXXXXX";
        if (!::mkdtemp(path)) std::abort();
        return std::string(path);
    }();
    return dir;
}

// Reads what is there without blocking; appends to `out`.
void drain(int fd, std::string* out) {
    char buf[65536];
    for (;;) {
        ssize_t n = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
        if (n <= 0) return;
        if (out) out->append(buf, static_cast<size_t>(n));
    }
}

void check_replies(const std::string& bytes) {
    size_t pos = 0;
    while (bytes.size() - pos >= 4) {
        const uint32_t len =
            berth::wire::decode_length(reinterpret_cast<const unsigned char*>(bytes.data() + pos));
        if (bytes.size() - pos - 4 < len) break;  // cut short by the close: fine
        v1::ServerMessage msg;
        if (!msg.ParseFromArray(bytes.data() + pos + 4, static_cast<int>(len))) std::abort();
        pos += 4 + len;
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size < 1) return 0;
    const uint8_t mode = data[0];
    ++data;
    --size;

    boost::asio::io_context io;
    int helper_pair[2], client_pair[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, helper_pair) != 0) std::abort();
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, client_pair) != 0) std::abort();
    berth::UniqueFd helper_peer(helper_pair[1]), client(client_pair[1]);
    auto helper = std::make_shared<bd::FramedSocket>(
        bd::UnixSocket(io, boost::asio::local::stream_protocol(), helper_pair[0]),
        berth::wire::kDefaultMaxFrame);

    bd::ServerConfig config;
    config.runtime_dir = runtime_dir();
    config.socket_path = runtime_dir() + "/unused.sock";
    config.max_frame = 1u << 16;  // small: inputs reach the too-large path
    config.cgroup_driver = "v1";
    std::string replies;
    {
        bd::Server server(io, config, helper, nullptr);
        server.serve(bd::UnixSocket(io, boost::asio::local::stream_protocol(), client_pair[0]));
        std::string stream;
        if (mode & 1) {
            v1::ClientMessage hello;
            hello.set_id(1);
            hello.mutable_hello()->set_protocol_version(berth::wire::kProtocolVersion);
            stream = berth::wire::encode_frame(hello);
        }
        stream.append(reinterpret_cast<const char*>(data), size);
        // Cut into writes of 1 << (mode >> 4) bytes (1 B .. 32 KiB), serving between them.
        const size_t chunk = size_t{1} << ((mode >> 4) & 15);
        int stalled = 0;
        for (size_t off = 0; off < stream.size();) {
            const size_t n = std::min(chunk, stream.size() - off);
            ssize_t w = ::send(client.get(), stream.data() + off, n, MSG_DONTWAIT | MSG_NOSIGNAL);
            const int send_errno = errno;
            if (w > 0) off += static_cast<size_t>(w);
            while (io.poll() > 0) {
            }
            io.restart();
            drain(client.get(), &replies);
            drain(helper_peer.get(), nullptr);
            if (w < 0 && send_errno != EAGAIN) break;  // closed by berthd (EPIPE)
            // Not read for a while (berthd holds it, or waits for what it cannot get
            // here): the rest would only wait too.
            stalled = w < 0 ? stalled + 1 : 0;
            if (stalled > 64) break;
        }
        ::shutdown(client.get(), SHUT_WR);
        for (int i = 0; i < 64; ++i) {
            if (io.poll() == 0) break;
            io.restart();
            drain(client.get(), &replies);
            drain(helper_peer.get(), nullptr);
        }
        drain(client.get(), &replies);
    }
    // The server and its sessions are gone; what they posted runs and frees itself.
    io.restart();
    io.poll();
    check_replies(replies);
    return 0;
}
