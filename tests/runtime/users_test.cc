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
