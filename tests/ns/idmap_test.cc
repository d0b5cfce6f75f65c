#include "ns/idmap.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>

using namespace berth::ns;

namespace {

std::string write_temp(const std::string& text) {
    char path[] = "/tmp/berth-idmap-XXXXXX";
    int fd = ::mkstemp(path);
    EXPECT_GE(fd, 0);
    ::close(fd);
    std::ofstream(path) << text;
    return path;
}

}  // namespace

TEST(IdMap, FindsRangeByNameOrUid) {
    auto file = write_temp("# comment\nalice:100000:65536\nbad line\n1001:300000:1000\n");
    auto a = find_subordinate_range(file, "alice", 1000);
    ASSERT_TRUE(a);
    EXPECT_EQ(a->host_start, 100000u);
    EXPECT_EQ(a->count, 65536u);
    auto b = find_subordinate_range(file, "bob", 1001);
    ASSERT_TRUE(b);
    EXPECT_EQ(b->host_start, 300000u);
    EXPECT_FALSE(find_subordinate_range(file, "carol", 1002));
    ::unlink(file.c_str());
}

TEST(IdMap, RejectsMalformedAndEmptyRanges) {
    auto file = write_temp("alice:abc:65536\nalice:5:0\nalice:4294967295:2\n");
    EXPECT_FALSE(find_subordinate_range(file, "alice", 1000));
    ::unlink(file.c_str());
}

TEST(IdMap, MissingUserErrorSaysHowToFix) {
    auto file = write_temp("alice:100000:65536\n");
    try {
        mapping_for_user("nobody-here", 4242, file, file);
        FAIL() << "expected an error";
    } catch (const std::runtime_error& e) {
        EXPECT_NE(std::string(e.what()).find("usermod --add-subuids"), std::string::npos);
    }
    ::unlink(file.c_str());
}

TEST(IdMap, MapLineCapsAt65536) {
    auto file = write_temp("alice:100000:1000000\n");
    auto m = mapping_for_user("alice", 1000, file, file);
    EXPECT_EQ(map_line(m.uids), "0 100000 65536\n");
    ::unlink(file.c_str());
}

TEST(IdMap, OwnerRangeIsWhatTheMappingLeaves) {
    const IdMapping mapping{{200000, 65536}, {200000, 65536}};
    // A second range of the user's, apart from the mapped one.
    auto two = write_temp("berth:200000:65536\nberth:265536:1024\n");
    auto r = owner_range_for_user("berth", 999, mapping, two);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->host_start, 265536u);
    EXPECT_EQ(r->count, 1024u);
    // One longer range: its part past the 65536 mapped.
    auto longer = write_temp("berth:200000:66560\n");
    r = owner_range_for_user("berth", 999, mapping, longer);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->host_start, 265536u);
    EXPECT_EQ(r->count, 1024u);
    // Only the mapped range, or one overlapping it: none (no uid that could be a file's).
    auto only = write_temp("berth:200000:65536\nberth:265000:1024\n");
    EXPECT_FALSE(owner_range_for_user("berth", 999, mapping, only));
    for (const auto& f : {two, longer, only}) ::unlink(f.c_str());
}
