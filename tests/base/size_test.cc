#include "base/size.h"

#include <gtest/gtest.h>

namespace berth {
namespace {

uint64_t ok(const char* text) {
    std::string error;
    auto v = parse_size(text, &error);
    EXPECT_TRUE(v) << text << ": " << error;
    return v.value_or(0);
}

std::string bad(const char* text) {
    std::string error;
    auto v = parse_size(text, &error);
    EXPECT_FALSE(v) << text << " parsed as " << v.value_or(0);
    EXPECT_NE(error.find(text), std::string::npos) << error;
    return error;
}

TEST(ParseSize, UnitsAndFractions) {
    EXPECT_EQ(ok("0"), 0u);
    EXPECT_EQ(ok("4096"), 4096u);
    EXPECT_EQ(ok("12b"), 12u);
    EXPECT_EQ(ok("1k"), 1024u);
    EXPECT_EQ(ok("512m"), 512ull << 20);
    EXPECT_EQ(ok("512M"), 512ull << 20);
    EXPECT_EQ(ok("64MiB"), 64ull << 20);
    EXPECT_EQ(ok("10g"), 10ull << 30);
    EXPECT_EQ(ok("10GB"), 10ull << 30);
    EXPECT_EQ(ok("1.5g"), 3ull << 29);
    EXPECT_EQ(ok("2t"), 2ull << 40);
    EXPECT_EQ(ok("16777215t"), 16777215ull << 40);
}

TEST(ParseSize, RefusesWhatIsNotASize) {
    for (const char* text :
         {"",   "-1", "-64m", "+5", "nan", "NaN", "inf",   "infinity", "1e9", "0x10",
          " 5", "5 ", "m",    ".",  "5mm", "5x",  "5kib2", "1,5g",     "5p",  "abc"})
        bad(text);
    EXPECT_NE(bad("5x").find("unit"), std::string::npos);
    EXPECT_NE(bad("16777216t").find("too large"), std::string::npos);
    EXPECT_NE(bad("99999999999999999999").find("too large"), std::string::npos);
}

TEST(FormatSize, Readable) {
    EXPECT_EQ(format_size(0), "0 B");
    EXPECT_EQ(format_size(512), "512 B");
    EXPECT_EQ(format_size(64ull << 20), "64 MiB");
    EXPECT_EQ(format_size(3ull << 29), "1.5 GiB");
}

}  // namespace
}  // namespace berth
