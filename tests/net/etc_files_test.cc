#include "net/etc_files.h"

#include <gtest/gtest.h>

namespace berth::net {
namespace {

TEST(EtcFiles, HostsNamesLocalhostAndTheSandbox) {
    NameSettings s{.hostname = "abc123", .address = {}, .host_address = {}, .nameservers = {}};
    const std::string hosts = hosts_file(s);
    EXPECT_NE(hosts.find("127.0.0.1\tlocalhost\n"), std::string::npos);
    EXPECT_NE(hosts.find("::1\tlocalhost"), std::string::npos);
    EXPECT_NE(hosts.find("127.0.1.1\tabc123\n"), std::string::npos);
    EXPECT_EQ(hosts.find(kHostAlias), std::string::npos);
}

TEST(EtcFiles, WithAnAddressTheNameIsItsAndTheHostAliasIsListed) {
    NameSettings s{.hostname = "box",
                   .address = "10.89.0.5",
                   .host_address = "10.89.0.1",
                   .nameservers = {"10.89.0.1"}};
    const std::string hosts = hosts_file(s);
    EXPECT_NE(hosts.find("10.89.0.5\tbox\n"), std::string::npos);
    EXPECT_EQ(hosts.find("127.0.1.1"), std::string::npos);
    EXPECT_NE(hosts.find("10.89.0.1\thost.berth.internal\n"), std::string::npos);
}

TEST(EtcFiles, ResolvConfNamesNoServerWithoutANetwork) {
    NameSettings none{.hostname = "h", .address = {}, .host_address = {}, .nameservers = {}};
    EXPECT_EQ(resolv_conf(none).find("nameserver"), std::string::npos);
    NameSettings pub{
        .hostname = "h", .address = {}, .host_address = {}, .nameservers = {"10.89.0.1"}};
    EXPECT_NE(resolv_conf(pub).find("nameserver 10.89.0.1\n"), std::string::npos);
    EXPECT_EQ(hostname_file(pub), "h\n");
}

}  // namespace
}  // namespace berth::net
