#include "runtime/init/users.h"

#include <gtest/gtest.h>

using berth::init::resolve_user;

namespace {
const char* kPasswd =
    "root:x:0:0:root:/root:/bin/sh\n"
    "daemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin\n"
    "alice:x:1000:1000::/home/alice:/bin/sh\n"
    "broken line\n";
const char* kGroup =
    "root:x:0:\n"
    "wheel:x:10:alice,bob\n"
    "alice:x:1000:\n"
    "docker:x:999:bob,alice\n"
    "staff:x:50:\n";
}  // namespace

TEST(Users, EmptyIsRoot) {
    std::string err;
    auto u = resolve_user("", kPasswd, kGroup, &err);
    ASSERT_TRUE(u);
    EXPECT_EQ(u->uid, 0u);
    EXPECT_EQ(u->home, "/root");
}

TEST(Users, NameGetsPrimaryAndSupplementaryGroups) {
    std::string err;
    auto u = resolve_user("alice", kPasswd, kGroup, &err);
    ASSERT_TRUE(u);
    EXPECT_EQ(u->uid, 1000u);
    EXPECT_EQ(u->gid, 1000u);
    EXPECT_EQ(u->groups, (std::vector<gid_t>{10, 999}));
    EXPECT_EQ(u->home, "/home/alice");
}

TEST(Users, NumericUidNeedNotExist) {
    std::string err;
    auto u = resolve_user("4242:50", kPasswd, kGroup, &err);
    ASSERT_TRUE(u);
    EXPECT_EQ(u->uid, 4242u);
    EXPECT_EQ(u->gid, 50u);
    EXPECT_TRUE(u->groups.empty());
}

TEST(Users, GroupByName) {
    std::string err;
    auto u = resolve_user("daemon:staff", kPasswd, kGroup, &err);
    ASSERT_TRUE(u);
    EXPECT_EQ(u->uid, 1u);
    EXPECT_EQ(u->gid, 50u);
}

TEST(Users, UnknownNamesAreErrors) {
    std::string err;
    EXPECT_FALSE(resolve_user("mallory", kPasswd, kGroup, &err));
    EXPECT_NE(err.find("user 'mallory' not found"), std::string::npos);
    EXPECT_FALSE(resolve_user("alice:nogroup", kPasswd, kGroup, &err));
    EXPECT_NE(err.find("group 'nogroup' not found"), std::string::npos);
}

TEST(Users, IdMapsParseAndBound) {
    using berth::init::IdRanges;
    auto uids = IdRanges::parse("         0     200000      65536\n");
    EXPECT_TRUE(uids.contains(0));
    EXPECT_TRUE(uids.contains(65535));
    EXPECT_FALSE(uids.contains(65536));
    EXPECT_FALSE(uids.contains(4294967295u));
    auto two = IdRanges::parse("0 1000 1\n1 100000 65536\n");
    EXPECT_TRUE(two.contains(65536));
    EXPECT_FALSE(two.contains(65537));
    EXPECT_FALSE(IdRanges::parse("").contains(0));
    EXPECT_FALSE(IdRanges::parse("garbage\n").contains(0));
}

TEST(Users, UnmappedIdsAreNamed) {
    using berth::init::IdRanges;
    auto map = IdRanges::parse("0 200000 65536\n");
    std::string err;
    // An image's passwd entry can say anything: 4294967295 is (uid_t)-1 to setresuid.
    auto u = resolve_user("evil", "evil:x:4294967295:0::/:/bin/sh\n", kGroup, &err);
    ASSERT_TRUE(u);
    EXPECT_EQ(berth::init::check_mapped(*u, map, map),
              "user: uid 4294967295 is not mapped in the sandbox (ids 0-65535)");
    u = resolve_user("70000:0", kPasswd, kGroup, &err);
    ASSERT_TRUE(u);
    EXPECT_NE(berth::init::check_mapped(*u, map, map), "");
    u = resolve_user("0:70000", kPasswd, kGroup, &err);
    ASSERT_TRUE(u);
    EXPECT_EQ(berth::init::check_mapped(*u, map, map),
              "user: gid 70000 is not mapped in the sandbox (ids 0-65535)");
    u = resolve_user("alice", kPasswd, kGroup, &err);
    ASSERT_TRUE(u);
    EXPECT_EQ(berth::init::check_mapped(*u, map, map), "");
}
