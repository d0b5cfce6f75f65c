// remove_tree / remove_contents (base/remove_tree.h) on trees a sandbox could make: a
// 50,000-level chain with files at every level under a 256-fd limit (issue 12: the janitor
// ran out of fds and left the layer in the trash for good), with the fds held before and
// after the same; and a mount inside the tree, which same_mount refuses rather than enters.
#include "base/remove_tree.h"

#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "base/error.h"
#include "base/files.h"
#include "base/unique_fd.h"

namespace berth {
namespace {

std::string make_temp_dir() {
    char tmpl[] = "/tmp/berth-remove-tree-XXXXXX";
    if (!::mkdtemp(tmpl)) throw_sys("mkdtemp", tmpl);
    return tmpl;
}

size_t open_fds() {
    size_t n = 0;
    DIR* d = ::opendir("/proc/self/fd");
    while (dirent* e = ::readdir(d)) n += e->d_name[0] != '.';
    ::closedir(d);
    return n;
}

// A chain `depth` levels deep below `top`, each level holding a file and a symlink out.
void make_chain(const std::string& top, int depth) {
    UniqueFd cur(::open(top.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    ASSERT_TRUE(cur);
    for (int i = 0; i < depth; ++i) {
        UniqueFd f(::openat(cur.get(), "f", O_WRONLY | O_CREAT | O_CLOEXEC, 0644));
        ASSERT_TRUE(f);
        ASSERT_EQ(::symlinkat("/etc", cur.get(), "out"), 0);
        ASSERT_EQ(::mkdirat(cur.get(), "d", 0755), 0);
        UniqueFd next(::openat(cur.get(), "d", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
        ASSERT_TRUE(next);
        cur = std::move(next);
    }
}

struct FdLimit {
    rlimit saved{};
    explicit FdLimit(rlim_t n) {
        ::getrlimit(RLIMIT_NOFILE, &saved);
        rlimit low{n, saved.rlim_max};
        ::setrlimit(RLIMIT_NOFILE, &low);
    }
    ~FdLimit() { ::setrlimit(RLIMIT_NOFILE, &saved); }
};

TEST(RemoveTreeTest, AChainOf50000LevelsGoesWithAFewFds) {
    const std::string top = make_temp_dir();
    make_chain(top + "", 50000);
    const size_t before = open_fds();
    {
        FdLimit limit(256);
        EXPECT_NO_THROW(remove_tree(top));
    }
    EXPECT_EQ(open_fds(), before);
    struct stat st;
    EXPECT_NE(::lstat(top.c_str(), &st), 0);
    EXPECT_TRUE(::lstat("/etc", &st) == 0 && S_ISDIR(st.st_mode));  // (links not followed)
}

TEST(RemoveTreeTest, WideLevelsAndTheTopStays) {
    const std::string top = make_temp_dir();
    for (int i = 0; i < 50; ++i) {
        const std::string d = top + "/w" + std::to_string(i);
        ASSERT_EQ(::mkdir(d.c_str(), 0755), 0);
        make_chain(d, 100);
    }
    UniqueFd fd(::open(top.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    {
        FdLimit limit(256);
        remove_contents(fd.get(), top, /*same_mount=*/true);
    }
    DIR* d = ::opendir(top.c_str());
    int left = 0;
    while (dirent* e = ::readdir(d)) left += e->d_name[0] != '.';
    ::closedir(d);
    EXPECT_EQ(left, 0);
    EXPECT_EQ(::rmdir(top.c_str()), 0);
}

TEST(RemoveTreeTest, AMountInsideIsRefusedNotEntered) {
    const std::string top = make_temp_dir();
    make_chain(top, 3);
    const std::string mnt = top + "/d/d/m";
    ASSERT_EQ(::mkdir(mnt.c_str(), 0755), 0);
    ASSERT_EQ(::mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=64k"), 0) << std::strerror(errno);
    { UniqueFd f(::open((mnt + "/keep").c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644)); }
    UniqueFd fd(::open(top.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    try {
        remove_contents(fd.get(), top, /*same_mount=*/true);
        ADD_FAILURE() << "entered a mount";
    } catch (const SysError& e) {
        EXPECT_EQ(e.code(), EXDEV) << e.what();
        EXPECT_LT(std::string(e.what()).size(), 600u) << e.what();
    }
    struct stat st;
    EXPECT_EQ(::stat((mnt + "/keep").c_str(), &st), 0);
    ASSERT_EQ(::umount2(mnt.c_str(), MNT_DETACH), 0);
    remove_tree(top);
}

}  // namespace
}  // namespace berth
