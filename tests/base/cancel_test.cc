#include "base/cancel.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <unistd.h>

#include <thread>

#include "base/error.h"

namespace berth {
namespace {

bool readable(int fd, int timeout_ms = 0) {
    pollfd p{fd, POLLIN, 0};
    return ::poll(&p, 1, timeout_ms) > 0 && p.revents;
}

TEST(CancelToken, AnOwnedTokenIsAPollableEventfd) {
    CancelToken t;
    ASSERT_GE(t.fd(), 0);
    EXPECT_FALSE(t.cancelled());
    EXPECT_FALSE(readable(t.fd()));
    EXPECT_NO_THROW(t.throw_if_cancelled("pull"));
    t.cancel();
    t.cancel();  // idempotent
    EXPECT_TRUE(t.cancelled());
    EXPECT_TRUE(readable(t.fd()));
    try {
        t.throw_if_cancelled("pull of x");
        FAIL() << "nothing thrown";
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), Error::Kind::cancelled);
        EXPECT_STREQ(e.what(), "pull of x: cancelled");
    }
}

TEST(CancelToken, CancelFromAnotherThreadWakesAPoller) {
    CancelToken t;
    std::thread canceller([&] {
        ::usleep(20000);
        t.cancel();
    });
    EXPECT_TRUE(readable(t.fd(), 5000));
    canceller.join();
    EXPECT_TRUE(t.cancelled());
}

TEST(CancelToken, AWatchedFdCancelsWhenReadable) {
    int p[2];
    ASSERT_EQ(::pipe2(p, O_CLOEXEC), 0);
    const CancelToken t = CancelToken::watching(p[0]);
    EXPECT_EQ(t.fd(), p[0]);
    EXPECT_FALSE(t.cancelled());
    ASSERT_EQ(::write(p[1], "x", 1), 1);
    EXPECT_TRUE(t.cancelled());
    char c;
    ASSERT_EQ(::read(p[0], &c, 1), 1);
    EXPECT_TRUE(t.cancelled());  // a cancel once seen stays
    ::close(p[0]);
    ::close(p[1]);
}

TEST(CancelToken, AWatchedFdCancelsWhenHungUp) {
    int p[2];
    ASSERT_EQ(::pipe2(p, O_CLOEXEC), 0);
    const CancelToken t = CancelToken::watching(p[0]);
    EXPECT_FALSE(t.cancelled());
    ::close(p[1]);
    EXPECT_TRUE(t.cancelled());
    ::close(p[0]);
}

TEST(CancelToken, CancelOnAWatchingTokenSetsItsFlag) {
    int p[2];
    ASSERT_EQ(::pipe2(p, O_CLOEXEC), 0);
    CancelToken t = CancelToken::watching(p[0]);
    t.cancel();
    EXPECT_TRUE(t.cancelled());
    EXPECT_FALSE(readable(t.fd()));  // the watched fd is its owner's to signal
    ::close(p[0]);
    ::close(p[1]);
}

}  // namespace
}  // namespace berth
