// Path resolution inside a Root, for both resolvers: nothing may lead out of the root.
#include "transfer/root.h"

#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <climits>

#include "tests/transfer/test_util.h"

namespace berth::transfer {
namespace {

using namespace testing;

static ::testing::Environment* const kMountNs =
    ::testing::AddGlobalTestEnvironment(new PrivateMountNs);

// base/secret            the canary outside the root
// base/root/secret       the file every escape attempt must land on instead
// base/root/a/b/file
// base/root/a/abs -> /a/b  (absolute symlink in the middle of a path)
// base/root/slash -> /
// base/root/up -> ../../..
// base/root/a/up2 -> ../../../../..
class RootTest : public ::testing::TestWithParam<Resolver> {
  protected:
    void SetUp() override {
        write_file(base / "secret", "outside");
        mkdir_p(base / "root/a/b");
        write_file(base / "root/secret", "inside");
        write_file(base / "root/a/b/file", "file");
        symlink_("/a/b", base / "root/a/abs");
        symlink_("/", base / "root/slash");
        symlink_("../../..", base / "root/up");
        symlink_("../../../../..", base / "root/a/up2");
        symlink_("/proc/self/root", base / "root/proc-root");
        symlink_("/proc/self/cwd", base / "root/proc-cwd");
        root_dir = base / "root";
    }
    Root root() const { return Root::open(root_dir, GetParam()); }
    std::string read(std::string_view path, int flags = O_RDONLY) const {
        UniqueFd fd = root().open_at(path, flags);
        return fd_content(fd.get());
    }
    void expect_canary() const { EXPECT_EQ(read_file_or(base / "secret"), "outside"); }

    TempDir base;
    std::string root_dir;
};

TEST_P(RootTest, ResolverIsTheOneAsked) {
    EXPECT_EQ(root().resolver(), GetParam());
}

TEST_P(RootTest, PlainPaths) {
    EXPECT_EQ(read("a/b/file"), "file");
    EXPECT_EQ(read("/a/b/file"), "file");
    EXPECT_EQ(read("./a//b/./file"), "file");
    EXPECT_EQ(read("secret"), "inside");
}

TEST_P(RootTest, DotDotStaysAtTheRoot) {
    EXPECT_EQ(read("../secret"), "inside");
    EXPECT_EQ(read("../../../../secret"), "inside");
    EXPECT_EQ(read("/../secret"), "inside");
    EXPECT_EQ(read("a/../../../secret"), "inside");
    EXPECT_EQ(read("a/b/../../secret"), "inside");
    expect_canary();
}

TEST_P(RootTest, SymlinkToSlashIsTheRoot) {
    EXPECT_EQ(read("slash/secret"), "inside");
    EXPECT_EQ(read("slash/slash/a/b/file"), "file");
    EXPECT_EQ(read("slash/../secret"), "inside");
}

TEST_P(RootTest, RelativeSymlinkUpwardsStaysInside) {
    EXPECT_EQ(read("up/secret"), "inside");
    EXPECT_EQ(read("a/up2/secret"), "inside");
    EXPECT_EQ(read("a/up2/../secret"), "inside");
    expect_canary();
}

TEST_P(RootTest, AbsoluteSymlinkInTheMiddle) {
    EXPECT_EQ(read("a/abs/file"), "file");
    EXPECT_EQ(read("a/abs/../../secret"), "inside");
}

TEST_P(RootTest, LastComponentSymlink) {
    symlink_("/a/b/file", base / "root/flink");
    EXPECT_EQ(read("flink"), "file");
    // O_NOFOLLOW: the link itself with O_PATH, ELOOP otherwise.
    UniqueFd l = root().open_at("flink", O_PATH | O_NOFOLLOW);
    struct stat st;
    ASSERT_EQ(::fstat(l.get(), &st), 0);
    EXPECT_TRUE(S_ISLNK(st.st_mode));
    EXPECT_EQ(error_of([&] { root().open_at("flink", O_RDONLY | O_NOFOLLOW); }), ELOOP);
    // A directory symlink with O_DIRECTORY.
    UniqueFd d = root().open_at("a/abs", O_PATH | O_DIRECTORY);
    ASSERT_EQ(::fstat(d.get(), &st), 0);
    EXPECT_TRUE(S_ISDIR(st.st_mode));
}

TEST_P(RootTest, CreateThroughEscapingLinksLandsInside) {
    symlink_("/../../new-inside", base / "root/dangling");
    { UniqueFd fd = root().open_at("up/created", O_WRONLY | O_CREAT | O_EXCL, 0600); }
    EXPECT_TRUE(exists(base / "root/created"));
    EXPECT_FALSE(exists(base / "created"));
    { UniqueFd fd = root().open_at("dangling", O_WRONLY | O_CREAT, 0600); }
    EXPECT_TRUE(exists(base / "root/new-inside"));
    EXPECT_FALSE(exists(base / "new-inside"));
    EXPECT_FALSE(exists("/new-inside"));
    {
        UniqueFd fd = root().open_at("slash/../secret", O_WRONLY | O_TRUNC);
        ASSERT_EQ(::write(fd.get(), "x", 1), 1);
    }
    EXPECT_EQ(read_file_or(base / "root/secret"), "x");
    expect_canary();
    // O_CREAT|O_EXCL on a symlink does not follow it.
    EXPECT_EQ(error_of([&] { root().open_at("dangling", O_WRONLY | O_CREAT | O_EXCL, 0600); }),
              EEXIST);
}

TEST_P(RootTest, SymlinkLoopsAreELOOP) {
    symlink_("loop-b", base / "root/loop-a");
    symlink_("loop-a", base / "root/loop-b");
    symlink_("self", base / "root/self");
    EXPECT_EQ(error_of([&] { root().open_at("loop-a", O_RDONLY); }), ELOOP);
    EXPECT_EQ(error_of([&] { root().open_at("self/x", O_RDONLY); }), ELOOP);
    EXPECT_EQ(error_of([&] { root().open_at("loop-a/x", O_PATH); }), ELOOP);
    // A chain of 30 links resolves; one of 45 exceeds the budget of 40.
    write_file(base / "root/end", "end");
    std::string prev = "end";
    for (int i = 0; i < 45; ++i) {
        std::string name = "chain" + std::to_string(i);
        symlink_(prev, base / "root/" + name);
        prev = name;
    }
    EXPECT_EQ(read("chain29"), "end");
    EXPECT_EQ(error_of([&] { root().open_at("chain44", O_RDONLY); }), ELOOP);
}

TEST_P(RootTest, ErrorsNameThePath) {
    std::string what;
    EXPECT_EQ(error_of([&] { root().open_at("a/b/file/x", O_RDONLY); }, &what), ENOTDIR);
    EXPECT_NE(what.find("a/b/file/x"), std::string::npos) << what;
    EXPECT_EQ(error_of([&] { root().open_at("missing/x", O_RDONLY); }), ENOENT);
    EXPECT_EQ(error_of([&] { root().open_at("a/b/file", O_RDONLY | O_DIRECTORY); }), ENOTDIR);
}

TEST_P(RootTest, MagicLinkSymlinksDoNotReachTheHost) {
    // Without a procfs in the root, "/proc/self/root" resolves inside it and is not there.
    EXPECT_NE(error_of([&] { root().open_at("proc-root/secret", O_RDONLY); }), 0);
    EXPECT_NE(error_of([&] { root().open_at("proc-root" + root_dir + "/../secret", O_RDONLY); }),
              0);
    EXPECT_NE(error_of([&] { root().open_at("proc-cwd", O_RDONLY); }), 0);
    EXPECT_NE(error_of([&] { root().open_at("proc-root/etc/passwd", O_RDONLY); }), 0);
}

// With a real procfs mounted at <root>/proc: /proc/self is a plain symlink and works, the
// magic links (root, cwd, fd/N, exe) are refused.
TEST_P(RootTest, MagicLinksInAMountedProcAreRefused) {
    if (!PrivateMountNs::available) GTEST_SKIP() << "no private mount namespace";
    mkdir_p(base / "root/proc");
    ASSERT_EQ(::mount("proc", (base / "root/proc").c_str(), "proc", 0, nullptr), 0)
        << strerror(errno);
    // A file the fd/N link would reach: the outside canary, held open.
    UniqueFd held(::open((base / "secret").c_str(), O_RDONLY | O_CLOEXEC));
    ASSERT_TRUE(held);
    std::string fdpath = "proc/self/fd/" + std::to_string(held.get());

    EXPECT_NE(read("proc/self/status").find("Name:"), std::string::npos);
    EXPECT_EQ(error_of([&] { root().open_at("proc/self/root/etc/passwd", O_RDONLY); }), ELOOP);
    EXPECT_EQ(error_of([&] { root().open_at("proc/self/root", O_PATH); }), ELOOP);
    EXPECT_EQ(error_of([&] { root().open_at("proc/self/cwd", O_PATH | O_DIRECTORY); }), ELOOP);
    EXPECT_EQ(error_of([&] { root().open_at(fdpath, O_RDONLY); }), ELOOP);
    EXPECT_EQ(error_of([&] { root().open_at("proc/self/exe", O_RDONLY); }), ELOOP);
    EXPECT_EQ(error_of([&] { root().open_at("proc-root/etc/passwd", O_RDONLY); }), ELOOP);
    EXPECT_EQ(error_of([&] { root().open_at("proc/thread-self/root/secret", O_RDONLY); }), ELOOP);
    // The link itself (not followed) may be looked at.
    UniqueFd l = root().open_at("proc/self/root", O_PATH | O_NOFOLLOW);
    EXPECT_TRUE(l);
    ::umount2((base / "root/proc").c_str(), MNT_DETACH);
    expect_canary();
}

TEST_P(RootTest, OpenParent) {
    Root r = root();
    auto p = r.open_parent("a/b/file");
    EXPECT_EQ(p.name, "file");
    struct stat st, want;
    ASSERT_EQ(::fstat(p.dir.get(), &st), 0);
    ASSERT_EQ(::stat((base / "root/a/b").c_str(), &want), 0);
    EXPECT_EQ(st.st_ino, want.st_ino);
    auto q = r.open_parent("/top/");
    EXPECT_EQ(q.name, "top");
    auto s = r.open_parent("up/secret");  // the parent resolved inside
    ASSERT_EQ(::fstat(s.dir.get(), &st), 0);
    ASSERT_EQ(::stat(root_dir.c_str(), &want), 0);
    EXPECT_EQ(st.st_ino, want.st_ino);
    EXPECT_EQ(error_of([&] { r.open_parent("/"); }), EINVAL);
    EXPECT_EQ(error_of([&] { r.open_parent(""); }), EINVAL);
    EXPECT_EQ(error_of([&] { r.open_parent("a/.."); }), EINVAL);
    EXPECT_EQ(error_of([&] { r.open_parent("a/."); }), EINVAL);
}

TEST(CheckPath, Rejects) {
    EXPECT_EQ(error_of([] { check_path(""); }), EINVAL);
    EXPECT_EQ(error_of([] { check_path(std::string("a\0b", 3)); }), EINVAL);
    EXPECT_EQ(error_of([] { check_path(std::string(PATH_MAX, 'a')); }), ENAMETOOLONG);
    EXPECT_EQ(error_of([] { check_path("x/" + std::string(NAME_MAX + 1, 'a')); }), ENAMETOOLONG);
    EXPECT_EQ(error_of([] { check_path("x/" + std::string(NAME_MAX, 'a')); }), 0);
    EXPECT_EQ(error_of([] { check_path("/"); }), 0);
}

INSTANTIATE_TEST_SUITE_P(Resolvers, RootTest, ::testing::ValuesIn(resolvers()), resolver_name);

}  // namespace
}  // namespace berth::transfer
