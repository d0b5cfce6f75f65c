// The allowlist entries of task files: strictly parsed, canonical, clear errors.
#include "net/allow_entry.h"

#include <gtest/gtest.h>

#include "base/error.h"

namespace berth::net {
namespace {

using Kind = AllowEntry::Kind;

std::string error_of(const std::string& text) {
    try {
        parse_allow_entry(text);
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), Error::Kind::invalid_argument) << text;
        return e.what();
    }
    ADD_FAILURE() << "accepted: " << text;
    return {};
}

TEST(AllowEntry, HostnamesAreLowercasedWithoutTheTrailingDot) {
    const AllowEntry e = parse_allow_entry("API.Example.COM.");
    EXPECT_EQ(e.kind, Kind::hostname);
    EXPECT_EQ(e.value, "api.example.com");
    EXPECT_EQ(e.port_from, 0);
    EXPECT_EQ(e.port_to, 65535);
    EXPECT_EQ(e.text(), "api.example.com");
    EXPECT_TRUE(e.matches("api.example.com"));
    EXPECT_FALSE(e.matches("x.api.example.com"));
    EXPECT_FALSE(e.matches("example.com"));
}

TEST(AllowEntry, WildcardsMatchStrictlyBelowTheirDomain) {
    const AllowEntry e = parse_allow_entry("*.example.com:443");
    EXPECT_EQ(e.kind, Kind::wildcard);
    EXPECT_EQ(e.value, "example.com");
    EXPECT_EQ(e.port_from, 443);
    EXPECT_EQ(e.port_to, 443);
    EXPECT_EQ(e.text(), "*.example.com:443");
    EXPECT_TRUE(e.matches("a.example.com"));
    EXPECT_TRUE(e.matches("b.a.example.com"));
    EXPECT_FALSE(e.matches("example.com"));
    EXPECT_FALSE(e.matches("badexample.com"));
    EXPECT_FALSE(e.matches("example.com.evil.net"));
}

TEST(AllowEntry, AddressesAndNetworksAreCanonical) {
    AllowEntry e = parse_allow_entry("198.18.7.2");
    EXPECT_EQ(e.kind, Kind::cidr);
    EXPECT_EQ(e.value, "198.18.7.2");
    e = parse_allow_entry("198.18.0.0/15:8000-8100");
    EXPECT_EQ(e.value, "198.18.0.0/15");
    EXPECT_EQ(e.port_from, 8000);
    EXPECT_EQ(e.port_to, 8100);
    EXPECT_EQ(e.text(), "198.18.0.0/15:8000-8100");
    EXPECT_EQ(parse_allow_entry("10.1.2.3/32").text(), "10.1.2.3");
    EXPECT_FALSE(e.matches("198.18.0.0"));
}

TEST(AllowEntry, MalformedEntriesAreRefusedSayingWhy) {
    EXPECT_NE(error_of("").find("empty"), std::string::npos);
    EXPECT_NE(error_of("10.0.0.1/24").find("host bits"), std::string::npos);
    EXPECT_NE(error_of("10.0.0.0/33").find("prefix"), std::string::npos);
    EXPECT_NE(error_of("256.1.1.1").find("IPv4"), std::string::npos);
    EXPECT_NE(error_of("010.1.1.1").find("IPv4"), std::string::npos);
    EXPECT_NE(error_of("0.0.0.0/0").find("public"), std::string::npos);
    EXPECT_NE(error_of("a.com:0").find("port"), std::string::npos);
    EXPECT_NE(error_of("a.com:65536").find("port"), std::string::npos);
    EXPECT_NE(error_of("a.com:99-10").find("reversed"), std::string::npos);
    EXPECT_NE(error_of("a.com:").find("port"), std::string::npos);
    EXPECT_NE(error_of(":80").find("no host"), std::string::npos);
    EXPECT_NE(error_of("*.com").find("two labels"), std::string::npos);
    EXPECT_NE(error_of("a.*.com").find("wildcard"), std::string::npos);
    EXPECT_NE(error_of("*").find("wildcard"), std::string::npos);
    EXPECT_NE(error_of("exa mple.com").find("hostname"), std::string::npos);
    EXPECT_NE(error_of("-a.com").find("hostname"), std::string::npos);
    EXPECT_NE(error_of("a..com").find("hostname"), std::string::npos);
    EXPECT_NE(error_of(std::string(64, 'a') + ".com").find("hostname"), std::string::npos);
    EXPECT_NE(error_of("a.com;flush ruleset").find("hostname"), std::string::npos);
    EXPECT_NE(error_of(std::string("a.com\0b", 7)).find("hostname"), std::string::npos);
    EXPECT_NE(error_of("2001:db8::1").find("IPv6"), std::string::npos);
    EXPECT_NE(error_of("[2001:db8::1]:443").find("IPv6"), std::string::npos);
    // Shown bounded and printable.
    const std::string e = error_of(std::string(500, 'x') + "\n");
    EXPECT_LT(e.size(), 300u);
}

TEST(AllowEntry, ListsAreDeduplicatedAndBounded) {
    const auto entries = parse_allow_entries({"a.com", "A.com.", "1.2.3.4", "a.com:80"});
    ASSERT_EQ(entries.size(), 3u);
    EXPECT_EQ(entries[2].text(), "a.com:80");
    std::vector<std::string> many(10000, "a.com");
    try {
        parse_allow_entries(many);
        FAIL() << "10,000 entries accepted";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("10000 entries"), std::string::npos) << e.what();
    }
}

}  // namespace
}  // namespace berth::net
