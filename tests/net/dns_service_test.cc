// The DNS child as berth-helper runs it: forked, told policies over its control channel by
// DnsControl, serving queries from a dnsmasq upstream, and adding what allowlisted names
// resolve to into a real berth nftables table. Each case runs in a network namespace of its
// own (lo up, a fresh ruleset), so the host's is never touched. Needs root.
#include "net/dns_service.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "base/child_process.h"
#include "base/error.h"
#include "base/unique_fd.h"
#include "tests/net/dnsmasq.h"

namespace berth::net {
namespace {

using namespace std::chrono_literals;
using testing::addr;
using testing::udp_socket;

// Sandboxes are loopback addresses here: the table's subnet is 127/8 (the table does not
// care that no bridge of that name exists).
const char* const kSandbox = "127.0.0.2";

TableConfig table_config() {
    return {.table = "berth_dns_t",
            .bridge = "berth-dns0",
            .subnet_cidr = "127.0.0.0/8",
            .gateway = "127.0.0.1",
            .host_address = ""};
}

class DnsServiceTest : public ::testing::Test {
  protected:
    void SetUp() override {
        if (::geteuid() != 0) GTEST_SKIP() << "needs root (a network namespace, nftables)";
        if (!testing::Dnsmasq::available()) GTEST_SKIP() << "no dnsmasq";
        ASSERT_EQ(::unshare(CLONE_NEWNET), 0) << std::strerror(errno);
        ASSERT_EQ(std::system("ip link set lo up"), 0);
        dnsmasq_.emplace(dir_.path(), "198.18.0.10 api.example.com\n198.18.0.14 other.test\n");
        table_.emplace(table_config());
        table_->create();
        // Its masquerade (127/8 leaving by an interface that is not the bridge: lo, here)
        // would rewrite the sources the test's sandboxes are known by.
        ASSERT_EQ(std::system("nft flush chain inet berth_dns_t postrouting"), 0);

        port_ = testing::free_port();
        DnsServiceConfig config;
        config.forwarder.listen_address = "127.0.0.1";
        config.forwarder.port = port_;
        config.forwarder.upstreams = {{"127.0.0.1", dnsmasq_->port()}};
        config.table = table_config();
        int sv[2];
        ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
        UniqueFd ours(sv[0]), theirs(sv[1]);
        service_ = ChildProcess::fork("dns service", {theirs.get()},
                                      [&] { return run_dns_service(std::move(theirs), config); });
        theirs.reset();
        control_.emplace(std::move(ours));
    }

    // The rcode and the raw reply of a query from `source`, or nullopt after 5 s.
    std::optional<int> ask(const char* source, const std::string& name) {
        UniqueFd s = udp_socket(source);
        const sockaddr_in to = addr("127.0.0.1", port_);
        const std::vector<uint8_t> q = testing::dns_query(name);
        // The child may still be binding: asked again until it answers.
        for (int i = 0; i < 50; ++i) {
            ::sendto(s.get(), q.data(), q.size(), 0, reinterpret_cast<const sockaddr*>(&to),
                     sizeof to);
            pollfd p{s.get(), POLLIN, 0};
            if (::poll(&p, 1, 100) == 1) {
                uint8_t buf[1500];
                const ssize_t n = ::recv(s.get(), buf, sizeof buf, 0);
                if (n >= 4) return buf[3] & 0x0f;
            }
        }
        return std::nullopt;
    }

    testing::TempDir dir_;
    std::optional<testing::Dnsmasq> dnsmasq_;
    std::optional<NftTable> table_;
    uint16_t port_ = 0;
    ChildProcess service_;
    std::optional<DnsControl> control_;
};

TEST(DnsServiceRules, TtlIsClampedAndPortsBecomeRules) {
    DnsServiceConfig config;
    std::vector<AllowRule> r = learned_rules("198.18.0.1", 0s, {}, config);
    ASSERT_EQ(r.size(), 1u);
    EXPECT_EQ(r[0].cidr, "198.18.0.1");
    EXPECT_EQ(r[0].proto, "");
    EXPECT_EQ(r[0].port_from, 0);
    EXPECT_EQ(r[0].port_to, 65535);
    EXPECT_EQ(r[0].timeout, 5s);
    r = learned_rules("198.18.0.1", 3600s * 24 * 365, {{"tcp", 443, 443}, {"udp", 53, 54}}, config);
    ASSERT_EQ(r.size(), 2u);
    EXPECT_EQ(r[0].timeout, 24h);
    EXPECT_EQ(r[1].proto, "udp");
    EXPECT_EQ(r[1].port_to, 54);
    EXPECT_EQ(learned_rules("198.18.0.1", 300s, {}, config)[0].timeout, 300s);
}

TEST(DnsServiceRules, NonGlobalAddressesAreNotOpened) {
    DnsServiceConfig config;
    config.table.subnet_cidr = "10.88.0.0/16";
    for (const char* a : {"169.254.169.254", "127.0.0.53", "0.0.0.0", "224.0.0.251",
                          "255.255.255.255", "10.88.0.3", "not-an-address"}) {
        EXPECT_FALSE(learnable_address(a, config.table.subnet_cidr)) << a;
        EXPECT_TRUE(learned_rules(a, 60s, {}, config).empty()) << a;
    }
    for (const char* a : {"198.18.0.1", "10.89.0.1", "192.168.1.1", "1.1.1.1"})
        EXPECT_TRUE(learnable_address(a, config.table.subnet_cidr)) << a;
}

TEST(DnsControlClient, AChildThatDoesNotAnswerIsADeadline) {
    int sv[2];
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    UniqueFd peer(sv[1]);
    DnsControl control(UniqueFd(sv[0]), 200ms);
    try {
        control.forget("127.0.0.2");
        ADD_FAILURE() << "no error";
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), Error::Kind::deadline_exceeded) << e.what();
    }
    peer.reset();  // and one that is gone: EPIPE
    EXPECT_THROW(control.forget("127.0.0.2"), SysError);
}

TEST_F(DnsServiceTest, AllowlistedAnswersOpenTheTable) {
    control_->set_policy(kSandbox,
                         {DnsPolicy::Kind::allowlist, {{"api.example.com", {{"tcp", 443, 443}}}}});
    EXPECT_EQ(ask(kSandbox, "api.example.com"), 0);
    const std::string listed = table_->list();
    EXPECT_NE(listed.find("127.0.0.2 . 198.18.0.10 . tcp . 443 timeout 5s"), std::string::npos)
        << listed;
    // Not listed: NXDOMAIN, and nothing added.
    EXPECT_EQ(ask(kSandbox, "other.test"), 3);
    EXPECT_EQ(table_->list().find("198.18.0.14"), std::string::npos);
    // Asked again: the entry is there again (not an error).
    EXPECT_EQ(ask(kSandbox, "api.example.com"), 0);
}

TEST_F(DnsServiceTest, PolicyChangesAreInForceWhenTheCallReturns) {
    EXPECT_EQ(ask(kSandbox, "other.test"), 5);  // unknown: REFUSED
    control_->set_policy(kSandbox, {DnsPolicy::Kind::forward, {}});
    EXPECT_EQ(ask(kSandbox, "other.test"), 0);
    control_->forget(kSandbox);
    EXPECT_EQ(ask(kSandbox, "other.test"), 5);
}

TEST_F(DnsServiceTest, BadRequestsAreRefusedAndItGoesOn) {
    try {
        control_->set_policy(kSandbox, {DnsPolicy::Kind::allowlist, {{"a..example", {}}}});
        ADD_FAILURE() << "no error";
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), Error::Kind::invalid_argument);
        EXPECT_NE(std::string(e.what()).find("a..example"), std::string::npos) << e.what();
    }
    EXPECT_THROW(control_->forget("not-an-address"), Error);
    control_->set_policy(kSandbox, {DnsPolicy::Kind::forward, {}});
    EXPECT_EQ(ask(kSandbox, "other.test"), 0);
}

TEST_F(DnsServiceTest, ExitsWhenTheHelperCloses) {
    control_.reset();
    const std::optional<int> status = service_.wait(5000ms);
    ASSERT_TRUE(status);
    EXPECT_TRUE(WIFEXITED(*status));
    EXPECT_EQ(WEXITSTATUS(*status), 0);
}

}  // namespace
}  // namespace berth::net
