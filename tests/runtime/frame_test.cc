#include "runtime/wire/frame.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include "berth.pb.h"

using namespace berth;

TEST(Frame, RoundTripWithFds) {
    int sv[2];
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    UniqueFd a(sv[0]), b(sv[1]);
    v1::ClientMessage msg;
    msg.set_id(42);
    msg.mutable_exec()->add_argv("true");
    int p[2];
    ASSERT_EQ(::pipe(p), 0);
    UniqueFd pr(p[0]), pw(p[1]);
    wire::write_frame(a.get(), msg, {pw.get()});
    v1::ClientMessage got;
    std::vector<UniqueFd> fds;
    ASSERT_EQ(wire::read_frame(b.get(), got, 1024, &fds), wire::ReadStatus::ok);
    EXPECT_EQ(got.id(), 42u);
    EXPECT_EQ(got.exec().argv(0), "true");
    ASSERT_EQ(fds.size(), 1u);
    ASSERT_EQ(::write(fds[0].get(), "x", 1), 1);  // the passed fd is the pipe's write end
    char c;
    ASSERT_EQ(::read(pr.get(), &c, 1), 1);
    EXPECT_EQ(c, 'x');
}

TEST(Frame, OversizeAndMalformedAreReported) {
    int sv[2];
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    UniqueFd a(sv[0]), b(sv[1]);
    const unsigned char huge[4] = {0x7f, 0xff, 0xff, 0xff};
    ASSERT_EQ(::write(a.get(), huge, 4), 4);
    v1::ClientMessage got;
    EXPECT_EQ(wire::read_frame(b.get(), got, 1024), wire::ReadStatus::too_large);

    int sv2[2];
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv2), 0);
    UniqueFd c(sv2[0]), d(sv2[1]);
    const unsigned char bad[7] = {0, 0, 0, 3, 0xff, 0xff, 0xff};
    ASSERT_EQ(::write(c.get(), bad, 7), 7);
    EXPECT_EQ(wire::read_frame(d.get(), got, 1024), wire::ReadStatus::malformed);
    c.reset();
    EXPECT_EQ(wire::read_frame(d.get(), got, 1024), wire::ReadStatus::eof);
}
