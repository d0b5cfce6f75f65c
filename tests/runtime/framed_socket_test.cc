// berthd's FramedSocket: frames arrive whole and in order, and fds passed with a frame are
// given to that frame only, however the frames are packed into reads.
#include "runtime/daemon/framed_socket.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <thread>

#include "berth.pb.h"
#include "runtime/wire/frame.h"

using namespace berth;
using namespace berth::daemon;

namespace {

struct Received {
    uint64_t id;
    std::vector<UniqueFd> fds;
};

v1::ClientMessage message(uint64_t id, size_t padding = 0) {
    v1::ClientMessage m;
    m.set_id(id);
    m.mutable_hello()->set_client(std::string(padding, 'x'));
    return m;
}

// Writes `frames` (id, with a pipe fd or not) to one end before the FramedSocket reads any,
// then collects what it delivers.
std::vector<Received> exchange(const std::vector<std::pair<uint64_t, bool>>& frames,
                               size_t padding) {
    int sv[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    UniqueFd writer(sv[0]);
    asio::io_context io;
    auto socket = std::make_shared<FramedSocket>(
        UnixSocket(io, asio::local::stream_protocol(), sv[1]), 16u << 20);
    std::vector<Received> got;
    std::thread sender([&] {
        for (auto [id, with_fd] : frames) {
            int p[2];
            EXPECT_EQ(::pipe2(p, O_CLOEXEC), 0);
            UniqueFd r(p[0]), w(p[1]);
            if (with_fd)
                wire::write_frame(writer.get(), message(id, padding), {r.get()});
            else
                wire::write_frame(writer.get(), message(id, padding));
        }
        writer.reset();
    });
    socket->start([&](FramedSocket::Event event, std::string&& payload) {
        if (event != FramedSocket::Event::frame) return;
        v1::ClientMessage m;
        ASSERT_TRUE(m.ParseFromString(payload));
        got.push_back({m.id(), socket->take_fds()});
    });
    io.run();
    sender.join();
    return got;
}

void expect_fds_on(const std::vector<Received>& got, const std::vector<uint64_t>& with_fd,
                   size_t total) {
    ASSERT_EQ(got.size(), total);
    for (size_t i = 0; i < got.size(); ++i) {
        EXPECT_EQ(got[i].id, i + 1);
        const bool want = std::find(with_fd.begin(), with_fd.end(), got[i].id) != with_fd.end();
        ASSERT_EQ(got[i].fds.size(), want ? 1u : 0u) << "frame " << got[i].id;
        if (want) {
            struct stat st;
            ASSERT_EQ(::fstat(got[i].fds[0].get(), &st), 0);
            EXPECT_TRUE(S_ISFIFO(st.st_mode));
        }
    }
}

}  // namespace

TEST(FramedSocket, FdsBelongToTheirFrameInSmallPackedFrames) {
    // Small frames written back to back land in one read: the fd must still go to frame 3.
    auto got = exchange({{1, false}, {2, false}, {3, true}, {4, false}, {5, true}}, 10);
    expect_fds_on(got, {3, 5}, 5);
}

TEST(FramedSocket, FdsBelongToTheirFrameInLargeFrames) {
    // Frames larger than one read: the fd comes with the first part of its frame.
    auto got = exchange({{1, true}, {2, false}, {3, true}, {4, false}}, 200'000);
    expect_fds_on(got, {1, 3}, 4);
}

TEST(FramedSocket, SendsFdsWithTheirFrame) {
    // How berthd hands a client's fd on to berth-images: queued frames, some with an fd,
    // small and larger than the socket takes at once; each fd arrives with its frame.
    int sv[2];
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    UniqueFd reader(sv[0]);
    asio::io_context io;
    auto socket = std::make_shared<FramedSocket>(
        UnixSocket(io, asio::local::stream_protocol(), sv[1]), 16u << 20);
    socket->start([](FramedSocket::Event, std::string&&) {});
    const std::vector<std::pair<size_t, bool>> frames = {
        {10, false}, {10, true}, {1'000'000, true}, {10, false}, {300'000, true}, {10, true}};
    for (size_t i = 0; i < frames.size(); ++i) {
        std::vector<UniqueFd> fds;
        if (frames[i].second) {
            int p[2];
            ASSERT_EQ(::pipe2(p, O_CLOEXEC), 0);
            fds.emplace_back(p[0]);
            ::close(p[1]);
        }
        socket->send(wire::encode_frame(message(i + 1, frames[i].first)), std::move(fds));
    }
    std::vector<Received> got;
    std::thread receiver([&] {
        for (size_t i = 0; i < frames.size(); ++i) {
            v1::ClientMessage m;
            std::vector<UniqueFd> fds;
            ASSERT_EQ(wire::read_frame(reader.get(), m, 16u << 20, &fds), wire::ReadStatus::ok);
            got.push_back({m.id(), std::move(fds)});
        }
        io.stop();
    });
    io.run();
    receiver.join();
    expect_fds_on(got, {2, 3, 5, 6}, frames.size());
}
