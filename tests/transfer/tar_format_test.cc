// The tar encodings, byte for byte.
#include "transfer/tar_format.h"

#include <gtest/gtest.h>

#include <cstring>

namespace berth::transfer::tar {
namespace {

TEST(TarFormat, PaxRecordLengthCountsItself) {
    std::string s;
    append_pax_record(s, "path", "abc");
    EXPECT_EQ(s, "12 path=abc\n");
    // Around the digit boundary: 9 + 1 digit -> 10 needs 2 digits -> 11.
    for (size_t n = 0; n < 200; ++n) {
        std::string r;
        append_pax_record(r, "k", std::string(n, 'v'));
        EXPECT_EQ(std::stoul(r.substr(0, r.find(' '))), r.size()) << n;
        std::vector<PaxRecord> recs;
        ASSERT_TRUE(parse_pax(r, &recs));
        ASSERT_EQ(recs.size(), 1u);
        EXPECT_EQ(recs[0].value.size(), n);
    }
}

TEST(TarFormat, ParsePaxRejectsMalformed) {
    std::vector<PaxRecord> recs;
    EXPECT_FALSE(parse_pax("11 path=abc\n", &recs));  // length off by one
    EXPECT_FALSE(parse_pax("12 path=abc!", &recs));   // no newline
    EXPECT_FALSE(parse_pax("x2 path=abc\n", &recs));  // not a number
    EXPECT_FALSE(parse_pax("10 pathabc\n", &recs));   // no '='
    EXPECT_FALSE(parse_pax("99 path=abc\n", &recs));  // longer than the data
    recs.clear();
    EXPECT_TRUE(parse_pax("12 path=a=c\n", &recs));
    ASSERT_EQ(recs.size(), 1u);
    EXPECT_EQ(recs[0].value, "a=c");
}

TEST(TarFormat, Times) {
    EXPECT_EQ(format_pax_time(1500000000123456789), "1500000000.123456789");
    EXPECT_EQ(format_pax_time(0), "0.000000000");
    EXPECT_EQ(format_pax_time(-1500000000), "-1.500000000");
    int64_t ns;
    ASSERT_TRUE(parse_pax_time("1500000000.123456789", &ns));
    EXPECT_EQ(ns, 1500000000123456789);
    ASSERT_TRUE(parse_pax_time("12.5", &ns));
    EXPECT_EQ(ns, 12500000000);
    ASSERT_TRUE(parse_pax_time("-1.5", &ns));
    EXPECT_EQ(ns, -1500000000);
    ASSERT_TRUE(parse_pax_time("7", &ns));
    EXPECT_EQ(ns, 7000000000);
    EXPECT_FALSE(parse_pax_time("1.2x", &ns));
    EXPECT_FALSE(parse_pax_time("", &ns));
}

TEST(TarFormat, HeaderRoundTripWithBigNumbers) {
    char b[kBlock];
    HeaderFields f;
    std::string name = std::string(120, 'p') + "/" + std::string(90, 'n');
    f.name = name;
    f.type = '0';
    f.mode = 04755;
    f.uid = 3000000;  // over 7 octal digits: base-256
    f.gid = 17;
    f.size = 10ULL << 33;  // over 11 octal digits: base-256
    f.mtime = -5;          // negative: base-256
    encode_header(b, f);
    EXPECT_EQ(static_cast<unsigned char>(b[108]), 0x80);
    Header h;
    ASSERT_EQ(decode_header(b, &h), DecodeResult::ok);
    EXPECT_EQ(h.name, name);
    EXPECT_EQ(h.mode, 04755u);
    EXPECT_EQ(h.uid, 3000000);
    EXPECT_EQ(h.gid, 17);
    EXPECT_EQ(h.size, static_cast<int64_t>(10ULL << 33));
    EXPECT_EQ(h.mtime, -5);
    b[0] ^= 1;
    EXPECT_EQ(decode_header(b, &h), DecodeResult::bad_checksum);
}

TEST(TarFormat, UstarNameFits) {
    EXPECT_TRUE(fits_ustar_name(std::string(100, 'a')));
    EXPECT_FALSE(fits_ustar_name(std::string(101, 'a')));
    EXPECT_TRUE(fits_ustar_name(std::string(155, 'a') + "/" + std::string(100, 'b')));
    EXPECT_FALSE(fits_ustar_name(std::string(156, 'a') + "/" + std::string(100, 'b')));
    EXPECT_FALSE(fits_ustar_name(std::string(10, 'a') + "/" + std::string(101, 'b')));
}

TEST(TarFormat, ParseNumber) {
    int64_t v;
    ASSERT_TRUE(parse_number("0000644\0", 8, &v));
    EXPECT_EQ(v, 0644);
    ASSERT_TRUE(parse_number("   644 \0", 8, &v));
    EXPECT_EQ(v, 0644);
    EXPECT_FALSE(parse_number("00006x4\0", 8, &v));
    const char neg[8] = {'\xff', '\xff', '\xff', '\xff', '\xff', '\xff', '\xff', '\xfe'};
    ASSERT_TRUE(parse_number(neg, 8, &v));
    EXPECT_EQ(v, -2);
}

}  // namespace
}  // namespace berth::transfer::tar
