// stat_path, make_dirs, remove_path inside a Root, for both resolvers.
#include "transfer/file_ops.h"

#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/stat.h>

#include "tests/transfer/test_util.h"

namespace berth::transfer {
namespace {

using namespace testing;

static ::testing::Environment* const kMountNs =
    ::testing::AddGlobalTestEnvironment(new PrivateMountNs);

class FileOpsTest : public ::testing::TestWithParam<Resolver> {
  protected:
    void SetUp() override {
        mkdir_p(base / "canary-dir");
        write_file(base / "canary-dir/keep", "keep");
        mkdir_p(base / "root/d");
        root_dir = base / "root";
    }
    Root root() const { return Root::open(root_dir, GetParam()); }

    TempDir base;
    std::string root_dir;
};

TEST_P(FileOpsTest, StatKinds) {
    write_file(base / "root/d/f", "12345", 0640);
    struct timespec ts[2] = {{0, UTIME_OMIT}, {1234567890, 123456789}};
    ASSERT_EQ(::utimensat(AT_FDCWD, (base / "root/d/f").c_str(), ts, 0), 0);
    ASSERT_EQ(::chown((base / "root/d/f").c_str(), 1234, 5678), 0);
    symlink_("/d/f", base / "root/l");

    EntryStat f = stat_path(root(), "d/f");
    EXPECT_EQ(f.type, EntryStat::Type::regular);
    EXPECT_EQ(f.size, 5u);
    EXPECT_EQ(f.mode, 0640u);
    EXPECT_EQ(f.uid, 1234u);
    EXPECT_EQ(f.gid, 5678u);
    EXPECT_EQ(f.mtime_ns, 1234567890123456789);

    EXPECT_EQ(stat_path(root(), "/d").type, EntryStat::Type::directory);
    EntryStat l = stat_path(root(), "l");
    EXPECT_EQ(l.type, EntryStat::Type::symlink);
    EXPECT_EQ(l.link_target, "/d/f");
    EntryStat lf = stat_path(root(), "l", true);
    EXPECT_EQ(lf.type, EntryStat::Type::regular);
    EXPECT_EQ(lf.size, 5u);

    EXPECT_EQ(stat_path(root(), "missing").type, EntryStat::Type::missing);
    EXPECT_EQ(stat_path(root(), "missing/deeper").type, EntryStat::Type::missing);
    EXPECT_EQ(error_of([&] { stat_path(root(), "d/f/x"); }), ENOTDIR);
    // A dangling symlink followed is missing, not followed out of the root.
    symlink_("../../canary-dir", base / "root/out");
    EXPECT_EQ(stat_path(root(), "out", true).type, EntryStat::Type::missing);
}

TEST_P(FileOpsTest, MakeDirsExactModeAndOwner) {
    mode_t old = ::umask(077);
    Ownership owner{1000, 2000};
    EXPECT_TRUE(make_dirs(root(), "x/y/z", 0755, owner));
    ::umask(old);
    for (auto p : {"x", "x/y", "x/y/z"}) {
        struct stat st;
        ASSERT_EQ(::stat((base / "root/" + p).c_str(), &st), 0) << p;
        EXPECT_EQ(st.st_mode & 07777, 0755u) << p;
        EXPECT_EQ(st.st_uid, 1000u) << p;
        EXPECT_EQ(st.st_gid, 2000u) << p;
    }
    EXPECT_FALSE(make_dirs(root(), "x/y/z", 0700, {}));
    EXPECT_FALSE(make_dirs(root(), "d", 0700, {}));
    EXPECT_TRUE(make_dirs(root(), "d/new", 02750, {}));
    struct stat st;
    ASSERT_EQ(::stat((base / "root/d/new").c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 07777, 02750u);
}

TEST_P(FileOpsTest, MakeDirsWithAFileInTheWay) {
    write_file(base / "root/d/file", "");
    std::string what;
    EXPECT_EQ(error_of([&] { make_dirs(root(), "d/file/sub", 0755, {}); }, &what), ENOTDIR);
    EXPECT_NE(what.find("d/file"), std::string::npos) << what;
    EXPECT_EQ(error_of([&] { make_dirs(root(), "d/file", 0755, {}); }), ENOTDIR);
}

TEST_P(FileOpsTest, MakeDirsThroughEscapingSymlinkStaysInside) {
    symlink_("../../..", base / "root/up");
    EXPECT_TRUE(make_dirs(root(), "up/made", 0755, {}));
    EXPECT_TRUE(exists(base / "root/made"));
    EXPECT_FALSE(exists(base / "made"));
}

TEST_P(FileOpsTest, RemoveTreeNeverFollowsSymlinks) {
    mkdir_p(base / "root/t/sub/deeper");
    write_file(base / "root/t/sub/deeper/f", "x");
    write_file(base / "root/t/f", "x");
    symlink_(base / "canary-dir", base / "root/t/abs-link");
    symlink_("../../../canary-dir", base / "root/t/sub/rel-link");
    ASSERT_EQ(::chmod((base / "root/t/sub/deeper").c_str(), 0555), 0);
    remove_path(root(), "t", true);
    EXPECT_FALSE(exists(base / "root/t"));
    EXPECT_EQ(read_file_or(base / "canary-dir/keep"), "keep");
    EXPECT_TRUE(exists(base / "root/d"));
}

TEST_P(FileOpsTest, RemoveSymlinkRemovesTheLinkOnly) {
    symlink_(base / "canary-dir", base / "root/link");
    remove_path(root(), "link", false);
    EXPECT_FALSE(exists(base / "root/link"));
    EXPECT_EQ(read_file_or(base / "canary-dir/keep"), "keep");
    // Also recursive on a symlink to a directory: only the link.
    symlink_("/d", base / "root/link2");
    write_file(base / "root/d/inner", "x");
    remove_path(root(), "link2", true);
    EXPECT_FALSE(exists(base / "root/link2"));
    EXPECT_TRUE(exists(base / "root/d/inner"));
}

TEST_P(FileOpsTest, RemoveRefusals) {
    EXPECT_EQ(error_of([&] { remove_path(root(), "/", true); }), EBUSY);
    EXPECT_EQ(error_of([&] { remove_path(root(), ".", true); }), EBUSY);
    EXPECT_EQ(error_of([&] { remove_path(root(), "d/..", true); }), EBUSY);
    EXPECT_EQ(error_of([&] { remove_path(root(), "../..", true); }), EBUSY);
    EXPECT_EQ(error_of([&] { remove_path(root(), "missing", true); }), ENOENT);
    EXPECT_EQ(error_of([&] { remove_path(root(), "d", false); }), EISDIR);
    EXPECT_TRUE(exists(base / "root/d"));
    write_file(base / "root/f", "");
    remove_path(root(), "f", false);
    EXPECT_FALSE(exists(base / "root/f"));
}

TEST_P(FileOpsTest, RemoveDoesNotCrossMounts) {
    if (!PrivateMountNs::available) GTEST_SKIP() << "no private mount namespace";
    mkdir_p(base / "root/t/mnt");
    ASSERT_EQ(::mount("tmpfs", (base / "root/t/mnt").c_str(), "tmpfs", 0, "size=1m"), 0);
    write_file(base / "root/t/mnt/inside-mount", "x");
    std::string what;
    EXPECT_EQ(error_of([&] { remove_path(root(), "t", true); }, &what), EXDEV);
    EXPECT_NE(what.find("t/mnt"), std::string::npos) << what;
    EXPECT_TRUE(exists(base / "root/t/mnt/inside-mount"));
    ::umount2((base / "root/t/mnt").c_str(), MNT_DETACH);
}

INSTANTIATE_TEST_SUITE_P(Resolvers, FileOpsTest, ::testing::ValuesIn(resolvers()), resolver_name);

}  // namespace
}  // namespace berth::transfer
