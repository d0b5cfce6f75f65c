#include "base/child_process.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/error.h"
#include "base/pipe.h"

namespace berth {
namespace {

using std::chrono::milliseconds;

bool alive(pid_t pid) {
    return ::kill(pid, 0) == 0;
}

TEST(ChildProcess, ReportsItsExitStatus) {
    auto child = ChildProcess::fork("test child", {}, [] { return 7; });
    auto status = child.wait(milliseconds(10'000));
    ASSERT_TRUE(status);
    EXPECT_TRUE(WIFEXITED(*status));
    EXPECT_EQ(WEXITSTATUS(*status), 7);
}

TEST(ChildProcess, AThrowingBodyExitsWithStatusOne) {
    auto child = ChildProcess::fork(
        "test child", {}, []() -> int { throw std::runtime_error("expected in a test"); });
    auto status = child.wait(milliseconds(10'000));
    ASSERT_TRUE(status);
    EXPECT_EQ(WEXITSTATUS(*status), 1);
}

// berth-helper ignores SIGCHLD, so the kernel reaps a child the moment it exits: a child
// that exits at once must still be had by its pidfd (a delete's reaper of a sandbox with
// nothing left to kill once failed here with "pidfd_open: No such process").
TEST(ChildProcess, AQuickChildOfAParentIgnoringSigchldIsStillHad) {
    struct sigaction old {};
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    ASSERT_EQ(::sigaction(SIGCHLD, &ignore, &old), 0);
    int failures = 0;
    for (int i = 0; i < 300; ++i) {
        try {
            auto child = ChildProcess::fork("quick child", {}, [] { return 0; });
            EXPECT_TRUE(child.wait(milliseconds(10'000)));
        } catch (const SysError& e) {
            ++failures;
            ADD_FAILURE() << e.what();
            if (failures > 3) break;
        }
    }
    ::sigaction(SIGCHLD, &old, nullptr);
}

TEST(ChildProcess, WaitTimesOutWhileItRuns) {
    auto child = ChildProcess::fork("test child", {}, [] {
        ::pause();
        return 0;
    });
    EXPECT_FALSE(child.wait(milliseconds(50)));
    EXPECT_TRUE(alive(child.pid()));
    EXPECT_TRUE(child.kill_and_wait());
    EXPECT_FALSE(alive(child.pid()));
}

// The point of an owner: an error path that drops it leaves no process behind.
TEST(ChildProcess, GoingOutOfScopeKillsAndReapsIt) {
    pid_t pid;
    {
        auto child = ChildProcess::fork("test child", {}, [] {
            ::pause();
            return 0;
        });
        pid = child.pid();
        ASSERT_TRUE(alive(pid));
    }
    // Reaped too: no zombie is left for the pid to stay taken.
    EXPECT_FALSE(alive(pid));
    EXPECT_EQ(::waitpid(pid, nullptr, WNOHANG), -1);
    EXPECT_EQ(errno, ECHILD);
}

TEST(ChildProcess, MovingHandsOverOwnership) {
    ChildProcess outer;
    {
        auto child = ChildProcess::fork("test child", {}, [] {
            ::pause();
            return 0;
        });
        outer = std::move(child);
    }
    EXPECT_TRUE(alive(outer.pid()));
    EXPECT_TRUE(outer.kill_and_wait());
}

TEST(ChildProcess, ReleasedProcessesLiveOn) {
    Pipe p = make_pipe("test");
    pid_t pid;
    {
        const int w = p.write.get();
        auto child = ChildProcess::fork("test child", {w}, [w] {
            // Ends when the test closes its read end (EPIPE on write) or after 10 s.
            for (int i = 0; i < 1000; ++i) {
                if (::write(w, "x", 1) != 1) return 0;
                ::usleep(10'000);
            }
            return 0;
        });
        pid = child.pid();
        child.release();
    }
    EXPECT_TRUE(alive(pid));
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
}

// Only the fds it is told to keep reach the child (and stdio).
TEST(ChildProcess, TheChildHoldsOnlyTheFdsItKeeps) {
    Pipe kept = make_pipe("kept"), dropped = make_pipe("dropped");
    const int k = kept.write.get(), d = dropped.write.get();
    auto child = ChildProcess::fork("test child", {k}, [k, d] {
        const bool k_open = ::fcntl(k, F_GETFD) >= 0;
        const bool d_open = ::fcntl(d, F_GETFD) >= 0;
        return k_open && !d_open ? 0 : 3;
    });
    auto status = child.wait(milliseconds(10'000));
    ASSERT_TRUE(status);
    EXPECT_EQ(WEXITSTATUS(*status), 0);
    // The dropped pipe's write end is ours alone: closing it gives its reader EOF.
    dropped.write.reset();
    char c;
    EXPECT_EQ(::read(dropped.read.get(), &c, 1), 0);
}

TEST(MakePipe, BothEndsAreCloseOnExec) {
    Pipe p = make_pipe("test");
    EXPECT_TRUE(::fcntl(p.read.get(), F_GETFD) & FD_CLOEXEC);
    EXPECT_TRUE(::fcntl(p.write.get(), F_GETFD) & FD_CLOEXEC);
    ASSERT_EQ(::write(p.write.get(), "a", 1), 1);
    char c = 0;
    ASSERT_EQ(::read(p.read.get(), &c, 1), 1);
    EXPECT_EQ(c, 'a');
}

TEST(MakePipe, FailureNamesWhatItWasFor) {
    try {
        make_pipe("the test's pipe", -1);  // invalid flags: EINVAL
        FAIL() << "pipe2 with bad flags succeeded";
    } catch (const SysError& e) {
        EXPECT_EQ(e.code(), EINVAL);
        EXPECT_NE(std::string(e.what()).find("pipe2 the test's pipe"), std::string::npos)
            << e.what();
    }
}

}  // namespace
}  // namespace berth
