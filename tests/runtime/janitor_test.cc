#include "runtime/helper/janitor.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

namespace fs = std::filesystem;
using berth::helper::Janitor;

namespace {

class JanitorTest : public ::testing::Test {
  protected:
    void SetUp() override {
        char tmpl[] = "/tmp/berth-janitor-test.XXXXXX";
        ASSERT_NE(::mkdtemp(tmpl), nullptr);
        root_ = tmpl;
        trash_ = root_ / "trash";
    }
    void TearDown() override { fs::remove_all(root_); }

    // A small tree like a sandbox's: nested directories, files, a symlink
    // that points out of it (must be removed, not followed).
    fs::path make_tree(const std::string& name) {
        fs::path top = root_ / name;
        fs::create_directories(top / "upper/a/b");
        fs::create_directories(top / "work/work");
        std::ofstream(top / "upper/a/b/file") << "data";
        fs::create_symlink(root_ / "keep", top / "upper/escape");
        return top;
    }

    static bool eventually(const std::function<bool()>& done) {
        for (int i = 0; i < 500; ++i) {
            if (done()) return true;
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        return done();
    }

    static void reap(pid_t pid) {
        int status;
        ::waitpid(pid, &status, 0);
    }

    fs::path root_, trash_;
};

TEST_F(JanitorTest, DiscardMovesAtOnceAndRemovesSoon) {
    std::ofstream(root_ / "keep") << "outside";
    fs::path tree = make_tree("sandbox");
    pid_t pid;
    {
        Janitor janitor({trash_.string()});
        pid = janitor.pid();
        janitor.discard(tree.string(), 0, "id1");
        EXPECT_FALSE(fs::exists(tree));  // out of sight before discard returns
        EXPECT_TRUE(eventually([&] { return fs::is_empty(trash_); }));
        janitor.discard((root_ / "absent").string(), 0, "id2");  // nothing to do
    }
    reap(pid);
    EXPECT_TRUE(fs::exists(root_ / "keep"));  // the symlink was not followed
    EXPECT_TRUE(fs::is_empty(trash_));
    EXPECT_EQ(fs::status(trash_).permissions(), fs::perms::owner_all);
}

TEST_F(JanitorTest, SweepsWhatAnEarlierJanitorLeft) {
    fs::create_directories(trash_);
    fs::rename(make_tree("left1"), trash_ / "left1");
    fs::rename(make_tree("left2"), trash_ / "left2");
    pid_t pid;
    {
        Janitor janitor({trash_.string()});
        pid = janitor.pid();
        EXPECT_TRUE(eventually([&] { return fs::is_empty(trash_); }));
    }
    reap(pid);
}

// Issue 12: a janitor that died was never replaced. The next discard reaps it and starts
// another, which sweeps the trash (this discard's tree included).
TEST_F(JanitorTest, ADeadJanitorIsReplacedAtTheNextDiscard) {
    pid_t first, second;
    {
        Janitor janitor({trash_.string()});
        first = janitor.pid();
        ASSERT_EQ(::kill(first, SIGKILL), 0);
        siginfo_t info;  // dead, not reaped: the discard must reap it
        ASSERT_EQ(::waitid(P_PID, first, &info, WEXITED | WNOWAIT), 0);
        fs::path tree = make_tree("sandbox");
        janitor.discard(tree.string(), 0, "id1");
        EXPECT_FALSE(fs::exists(tree));
        second = janitor.pid();
        EXPECT_NE(second, first);
        EXPECT_TRUE(eventually([&] { return fs::is_empty(trash_); }));
        janitor.discard(make_tree("again").string(), 0, "id2");
        EXPECT_EQ(janitor.pid(), second);
        EXPECT_TRUE(eventually([&] { return fs::is_empty(trash_); }));
    }
    reap(second);  // it exits once the Janitor is gone
    EXPECT_EQ(::waitpid(first, nullptr, WNOHANG), -1) << "the dead janitor was not reaped";
}

TEST_F(JanitorTest, JanitorExitsWhenTheHelperCloses) {
    pid_t pid;
    {
        Janitor janitor({trash_.string()});
        pid = janitor.pid();
    }
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

}  // namespace
