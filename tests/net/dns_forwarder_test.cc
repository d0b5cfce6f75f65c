// DnsForwarder against a real upstream: a dnsmasq the test starts on loopback, answering
// from a hosts file with addresses of 198.18.0.0/15 (the benchmarking range: never a real
// host). Sandboxes are played by sockets bound to other loopback addresses (127.0.0.2 and
// on), so the forwarder sees them as distinct sources. The test drives the forwarder's poll
// loop itself, on its own thread, between sending a query and reading the answer.
#include "net/dns_forwarder.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "base/child_process.h"
#include "base/error.h"
#include "base/unique_fd.h"
#include "net/dns_message.h"
#include "tests/net/dnsmasq.h"

namespace berth::net {
namespace {

using testing::addr;
using testing::port_of;
using testing::udp_socket;

using namespace std::chrono_literals;
using Bytes = std::vector<uint8_t>;
using Clock = std::chrono::steady_clock;

const char* const kSandboxA = "127.0.0.2";
const char* const kSandboxB = "127.0.0.3";
const char* const kStranger = "127.0.0.9";

const char* const kHosts = R"(198.18.0.10 api.example.com
2001:db8::10 api.example.com
198.18.0.11 a.example.com
198.18.0.12 b.a.example.com
198.18.0.13 example.com
198.18.0.14 other.test
198.18.0.15 multi.test
198.18.0.16 multi.test
)";

Bytes query(const std::string& name, uint16_t qtype = dns::kTypeA, uint16_t id = 0x4242) {
    return testing::dns_query(name, qtype, id);
}

struct Answer {
    uint16_t id = 0;
    int rcode = -1;
    bool tc = false;
    std::vector<std::string> addresses;
};

// What `reply` says to the query for `name`.
Answer read_answer(const Bytes& reply, const std::string& name, uint16_t qtype = dns::kTypeA) {
    Answer a;
    const dns::QueryParse q = dns::parse_query(query(name, qtype));
    const uint16_t id = reply.size() >= 2 ? static_cast<uint16_t>(reply[0] << 8 | reply[1]) : 0;
    const dns::ResponseParse r = dns::parse_response(reply, id, q.query->question);
    EXPECT_TRUE(r.response) << r.error;
    if (!r.response) return a;
    a.id = id;
    a.rcode = r.response->header.rcode;
    a.tc = r.response->header.tc;
    for (const dns::Address& ad : r.response->addresses) {
        in_addr in{htonl(ad.ipv4)};
        a.addresses.push_back(::inet_ntoa(in));
    }
    return a;
}

struct Learned {
    std::string source, address;
    std::chrono::seconds ttl;
    std::vector<DnsPortRule> ports;
    bool answer_already_sent;
};

class DnsForwarderTest : public ::testing::Test {
  protected:
    void SetUp() override {
        if (!testing::Dnsmasq::available()) GTEST_SKIP() << "no dnsmasq";
        dnsmasq_.emplace(dir_.path(), kHosts,
                         std::vector<std::string>{"--cname=www.example.com,api.example.com",
                                                  "--cname=alias.test,www.example.com"});
        upstream_port_ = dnsmasq_->port();
    }

    DnsForwarderConfig config() {
        DnsForwarderConfig c;
        c.listen_address = "127.0.0.1";
        c.port = 0;
        c.upstreams = {{"127.0.0.1", upstream_port_}};
        return c;
    }

    void start(DnsForwarderConfig c) {
        forwarder_.emplace(std::move(c),
                           [this](const std::string& source, const std::string& address,
                                  std::chrono::seconds ttl, const std::vector<DnsPortRule>& ports) {
                               // Whether the client's socket already holds an answer: it must not.
                               bool sent = false;
                               for (int fd : clients_) {
                                   pollfd p{fd, POLLIN, 0};
                                   sent = sent || ::poll(&p, 1, 0) == 1;
                               }
                               learned_.push_back({source, address, ttl, ports, sent});
                           });
    }
    void start() { start(config()); }

    // One pass of the forwarder's loop, waiting at most `max` for it to have work.
    void pump(std::chrono::milliseconds max) {
        int timeout = forwarder_->next_timeout_ms();
        if (timeout < 0 || timeout > max.count()) timeout = static_cast<int>(max.count());
        pollfd p{forwarder_->fd(), POLLIN, 0};
        ::poll(&p, 1, timeout);
        forwarder_->service();
    }

    // Runs the forwarder until `fd` is readable or `timeout` passed.
    bool pump_until_readable(int fd, std::chrono::milliseconds timeout = 5s) {
        const auto until = Clock::now() + timeout;
        while (Clock::now() < until) {
            pollfd p{fd, POLLIN, 0};
            if (::poll(&p, 1, 0) == 1) return true;
            pump(10ms);
        }
        return false;
    }

    UniqueFd client(const char* source) {
        UniqueFd s = udp_socket(source);
        const sockaddr_in to = addr("127.0.0.1", forwarder_->port());
        ::connect(s.get(), reinterpret_cast<const sockaddr*>(&to), sizeof to);
        clients_.push_back(s.get());
        return s;
    }

    // Sends `q` from `source` over UDP; the reply, or nullopt after `timeout`.
    std::optional<Bytes> ask_udp(const char* source, const Bytes& q,
                                 std::chrono::milliseconds timeout = 5s) {
        UniqueFd s = client(source);
        ::send(s.get(), q.data(), q.size(), 0);
        const bool ready = pump_until_readable(s.get(), timeout);
        clients_.pop_back();
        if (!ready) return std::nullopt;
        Bytes buf(65536);
        const ssize_t n = ::recv(s.get(), buf.data(), buf.size(), 0);
        if (n < 0) return std::nullopt;
        buf.resize(static_cast<size_t>(n));
        return buf;
    }

    Answer ask(const char* source, const std::string& name, uint16_t qtype = dns::kTypeA) {
        const std::optional<Bytes> reply = ask_udp(source, query(name, qtype));
        EXPECT_TRUE(reply) << "no answer for " << name;
        if (!reply) return {};
        return read_answer(*reply, name, qtype);
    }

    UniqueFd tcp_client(const char* source) {
        UniqueFd s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
        const sockaddr_in from = addr(source, 0);
        ::bind(s.get(), reinterpret_cast<const sockaddr*>(&from), sizeof from);
        const sockaddr_in to = addr("127.0.0.1", forwarder_->port());
        if (::connect(s.get(), reinterpret_cast<const sockaddr*>(&to), sizeof to) != 0)
            throw_sys("connect", "forwarder tcp");
        return s;
    }

    // Reads one length-prefixed message from a TCP client, running the forwarder meanwhile.
    std::optional<Bytes> read_tcp(int fd, std::chrono::milliseconds timeout = 5s) {
        Bytes got;
        const auto until = Clock::now() + timeout;
        while (Clock::now() < until) {
            if (got.size() >= 2 && got.size() >= 2u + (got[0] << 8 | got[1]))
                return Bytes(got.begin() + 2, got.begin() + 2 + (got[0] << 8 | got[1]));
            if (!pump_until_readable(
                    fd, until - Clock::now() > 0ms
                            ? std::chrono::ceil<std::chrono::milliseconds>(until - Clock::now())
                            : 0ms))
                break;
            uint8_t buf[4096];
            const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
            if (n <= 0) return std::nullopt;  // closed
            got.insert(got.end(), buf, buf + n);
        }
        return std::nullopt;
    }

    std::string upstream_log() { return dnsmasq_->log(); }

    static DnsPolicy allowlist(std::vector<DnsNamePattern> names) {
        return {DnsPolicy::Kind::allowlist, std::move(names)};
    }

    testing::TempDir dir_;
    std::optional<testing::Dnsmasq> dnsmasq_;
    uint16_t upstream_port_ = 0;
    std::optional<DnsForwarder> forwarder_;
    std::vector<Learned> learned_;
    std::vector<int> clients_;
};

constexpr int kNoError = 0, kServfail = 2, kNxdomain = 3, kRefused = 5;

TEST(DnsPattern, Matching) {
    const std::vector<DnsNamePattern> names = {{"Api.Example.com.", {}}, {"*.example.org", {}}};
    EXPECT_EQ(match_dns_name(names, "api.example.com"), &names[0]);
    EXPECT_EQ(match_dns_name(names, "x.api.example.com"), nullptr);
    EXPECT_EQ(match_dns_name(names, "a.example.org"), &names[1]);
    EXPECT_EQ(match_dns_name(names, "b.a.example.org"), &names[1]);
    EXPECT_EQ(match_dns_name(names, "example.org"), nullptr);
    EXPECT_EQ(match_dns_name(names, "xexample.org"), nullptr);
    EXPECT_EQ(match_dns_name(names, "a\\046example.org"), nullptr);
    EXPECT_NO_THROW(check_dns_pattern("*.example.com"));
    EXPECT_NO_THROW(check_dns_pattern("_srv._tcp.example.com."));
    EXPECT_THROW(check_dns_pattern(""), Error);
    EXPECT_THROW(check_dns_pattern("*"), Error);
    EXPECT_THROW(check_dns_pattern("a.*.example.com"), Error);
    EXPECT_THROW(check_dns_pattern("a..example.com"), Error);
    EXPECT_THROW(check_dns_pattern("a b.example.com"), Error);
    EXPECT_THROW(check_dns_pattern(std::string(64, 'a') + ".com"), Error);
}

TEST_F(DnsForwarderTest, FreeBindListensBeforeTheAddressExists) {
    DnsForwarderConfig c = config();
    c.listen_address = "192.0.2.1";  // TEST-NET-1: on no interface here
    c.free_bind = true;
    EXPECT_NO_THROW(start(c));
    c.free_bind = false;
    EXPECT_THROW(start(c), SysError);
}

TEST_F(DnsForwarderTest, AllowedExactNameIsAnsweredAndLearnedFirst) {
    start();
    const std::vector<DnsPortRule> ports = {{"tcp", 443, 443}};
    forwarder_->set_policy(kSandboxA, allowlist({{"api.example.com", ports}}));
    const Answer a = ask(kSandboxA, "api.example.com");
    EXPECT_EQ(a.rcode, kNoError);
    EXPECT_EQ(a.id, 0x4242);  // the client's, not the one sent upstream
    EXPECT_EQ(a.addresses, std::vector<std::string>{"198.18.0.10"});
    ASSERT_EQ(learned_.size(), 1u);
    EXPECT_EQ(learned_[0].source, kSandboxA);
    EXPECT_EQ(learned_[0].address, "198.18.0.10");
    EXPECT_EQ(learned_[0].ttl, 1s);
    ASSERT_EQ(learned_[0].ports.size(), 1u);
    EXPECT_EQ(learned_[0].ports[0].proto, "tcp");
    EXPECT_EQ(learned_[0].ports[0].port_from, 443);
    EXPECT_FALSE(learned_[0].answer_already_sent);

    // Case and a final dot do not matter.
    learned_.clear();
    EXPECT_EQ(ask(kSandboxA, "API.Example.COM").rcode, kNoError);
    EXPECT_EQ(learned_.size(), 1u);
    // AAAA passes, and nothing is learned of it.
    learned_.clear();
    EXPECT_EQ(ask(kSandboxA, "api.example.com", dns::kTypeAaaa).rcode, kNoError);
    EXPECT_TRUE(learned_.empty());
}

TEST_F(DnsForwarderTest, EveryAddressOfAnAnswerIsLearned) {
    start();
    forwarder_->set_policy(kSandboxA, allowlist({{"multi.test", {}}}));
    const Answer a = ask(kSandboxA, "multi.test");
    EXPECT_EQ(a.addresses.size(), 2u);
    ASSERT_EQ(learned_.size(), 2u);
}

TEST_F(DnsForwarderTest, CnameChainsAreFollowedToTheirAddresses) {
    start();
    // Only the name asked for needs to be on the list: where its chain leads is its answer.
    forwarder_->set_policy(kSandboxA, allowlist({{"alias.test", {{"tcp", 443, 443}}}}));
    const Answer a = ask(kSandboxA, "alias.test");
    EXPECT_EQ(a.rcode, kNoError);
    EXPECT_EQ(a.addresses, std::vector<std::string>{"198.18.0.10"});
    ASSERT_EQ(learned_.size(), 1u);
    EXPECT_EQ(learned_[0].address, "198.18.0.10");
}

TEST_F(DnsForwarderTest, WhatLearnedThrowsIsServfail) {
    DnsForwarderConfig c = config();
    forwarder_.emplace(c, [](const std::string&, const std::string&, std::chrono::seconds,
                             const std::vector<DnsPortRule>&) {
        throw Error(Error::Kind::internal, "the table is gone");
    });
    forwarder_->set_policy(kSandboxA, allowlist({{"api.example.com", {}}}));
    EXPECT_EQ(ask(kSandboxA, "api.example.com").rcode, kServfail);
    EXPECT_EQ(forwarder_->stats().servfail, 1u);
}

TEST_F(DnsForwarderTest, WildcardsMatchStrictlyBelow) {
    start();
    forwarder_->set_policy(kSandboxA, allowlist({{"*.example.com", {}}}));
    EXPECT_EQ(ask(kSandboxA, "a.example.com").addresses, std::vector<std::string>{"198.18.0.11"});
    EXPECT_EQ(ask(kSandboxA, "b.a.example.com").addresses, std::vector<std::string>{"198.18.0.12"});
    EXPECT_EQ(ask(kSandboxA, "example.com").rcode, kNxdomain);
    EXPECT_EQ(learned_.size(), 2u);
}

TEST_F(DnsForwarderTest, UnlistedNameIsNxdomainWithoutAskingUpstream) {
    start();
    forwarder_->set_policy(kSandboxA, allowlist({{"api.example.com", {}}}));
    const Answer a = ask(kSandboxA, "other.test");
    EXPECT_EQ(a.rcode, kNxdomain);
    EXPECT_TRUE(a.addresses.empty());
    EXPECT_TRUE(learned_.empty());
    EXPECT_EQ(forwarder_->stats().forwarded, 0u);
    EXPECT_EQ(upstream_log().find("query[A] other.test from 127.0.0.1 ("), std::string::npos);
    // (The log does show what was forwarded.)
    ask(kSandboxA, "api.example.com");
    EXPECT_NE(upstream_log().find("api.example.com"), std::string::npos);
}

TEST_F(DnsForwarderTest, RefusedAndUnknownSources) {
    start();
    forwarder_->set_policy(kSandboxA, {DnsPolicy::Kind::refuse, {}});
    EXPECT_EQ(ask(kSandboxA, "other.test").rcode, kRefused);
    EXPECT_EQ(ask(kStranger, "other.test").rcode, kRefused);
    forwarder_->set_policy(kSandboxB, {DnsPolicy::Kind::forward, {}});
    EXPECT_EQ(ask(kSandboxB, "other.test").rcode, kNoError);
    forwarder_->forget(kSandboxB);
    EXPECT_EQ(ask(kSandboxB, "other.test").rcode, kRefused);
    EXPECT_EQ(forwarder_->stats().forwarded, 1u);
}

TEST_F(DnsForwarderTest, PublicModeForwardsEverythingAndLearnsNothing) {
    start();
    forwarder_->set_policy(kSandboxA, {DnsPolicy::Kind::forward, {}});
    EXPECT_EQ(ask(kSandboxA, "other.test").addresses, std::vector<std::string>{"198.18.0.14"});
    EXPECT_EQ(ask(kSandboxA, "api.example.com").addresses, std::vector<std::string>{"198.18.0.10"});
    EXPECT_TRUE(learned_.empty());
}

TEST_F(DnsForwarderTest, TcpQueriesPipelined) {
    start();
    forwarder_->set_policy(kSandboxA, allowlist({{"*.example.com", {}}}));
    UniqueFd s = tcp_client(kSandboxA);
    Bytes out;
    for (const char* name : {"a.example.com", "other.test"}) {
        const Bytes q = query(name);
        out.push_back(static_cast<uint8_t>(q.size() >> 8));
        out.push_back(static_cast<uint8_t>(q.size()));
        out.insert(out.end(), q.begin(), q.end());
    }
    // Written a byte at a time: framing does not depend on how the bytes arrive.
    for (uint8_t b : out) {
        ASSERT_EQ(::send(s.get(), &b, 1, 0), 1);
        pump(0ms);
    }
    std::vector<Answer> answers;
    for (int i = 0; i < 2; ++i) {
        const std::optional<Bytes> r = read_tcp(s.get());
        ASSERT_TRUE(r);
        const uint16_t rcode = (*r)[3] & 0x0f;
        answers.push_back(read_answer(*r, rcode == kNxdomain ? "other.test" : "a.example.com"));
    }
    // (In either order: the NXDOMAIN is answered at once, the other when upstream answers.)
    if (answers[0].rcode != kNxdomain) std::swap(answers[0], answers[1]);
    EXPECT_EQ(answers[0].rcode, kNxdomain);
    EXPECT_EQ(answers[1].addresses, std::vector<std::string>{"198.18.0.11"});
    EXPECT_EQ(learned_.size(), 1u);
}

TEST_F(DnsForwarderTest, TcpClientThatHalfClosesIsAnsweredThenClosed) {
    start();
    forwarder_->set_policy(kSandboxA, {DnsPolicy::Kind::forward, {}});
    UniqueFd s = tcp_client(kSandboxA);
    const Bytes q = query("other.test");
    Bytes framed = {0, static_cast<uint8_t>(q.size())};
    framed.insert(framed.end(), q.begin(), q.end());
    ASSERT_EQ(::send(s.get(), framed.data(), framed.size(), 0),
              static_cast<ssize_t>(framed.size()));
    ::shutdown(s.get(), SHUT_WR);
    const std::optional<Bytes> r = read_tcp(s.get());
    ASSERT_TRUE(r);
    EXPECT_EQ(read_answer(*r, "other.test").addresses, std::vector<std::string>{"198.18.0.14"});
    EXPECT_FALSE(read_tcp(s.get(), 1s));  // then EOF
}

TEST_F(DnsForwarderTest, UpstreamDownIsServfailSoon) {
    // Nothing listens on the port: the ICMP error ends the wait at once.
    DnsForwarderConfig c = config();
    const uint16_t closed = port_of(udp_socket("127.0.0.1").get());
    c.upstreams = {{"127.0.0.1", closed}};
    start(c);
    forwarder_->set_policy(kSandboxA, {DnsPolicy::Kind::forward, {}});
    auto t0 = Clock::now();
    EXPECT_EQ(ask(kSandboxA, "other.test").rcode, kServfail);
    EXPECT_LT(Clock::now() - t0, 1s);

    // One that takes the query and never answers: the timeout, then SERVFAIL.
    UniqueFd sink = udp_socket("127.0.0.1");
    c.upstreams = {{"127.0.0.1", port_of(sink.get())}};
    c.upstream_timeout = 300ms;
    start(c);
    forwarder_->set_policy(kSandboxA, {DnsPolicy::Kind::forward, {}});
    t0 = Clock::now();
    EXPECT_EQ(ask(kSandboxA, "other.test").rcode, kServfail);
    EXPECT_GE(Clock::now() - t0, 300ms);
    EXPECT_LT(Clock::now() - t0, 1500ms);

    // The next upstream answers when the first does not.
    c.upstreams = {{"127.0.0.1", port_of(sink.get())}, {"127.0.0.1", upstream_port_}};
    start(c);
    forwarder_->set_policy(kSandboxA, allowlist({{"other.test", {}}}));
    EXPECT_EQ(ask(kSandboxA, "other.test").addresses, std::vector<std::string>{"198.18.0.14"});
    EXPECT_EQ(learned_.size(), 1u);
}

TEST_F(DnsForwarderTest, SpoofedRepliesAreIgnored) {
    // The "upstream" is the test: it answers first with the wrong id, then with the wrong
    // question, then rightly.
    UniqueFd up = udp_socket("127.0.0.1");
    DnsForwarderConfig c = config();
    c.upstreams = {{"127.0.0.1", port_of(up.get())}};
    start(c);
    forwarder_->set_policy(kSandboxA, allowlist({{"other.test", {}}}));
    UniqueFd s = client(kSandboxA);
    const Bytes q = query("other.test");
    ::send(s.get(), q.data(), q.size(), 0);
    ASSERT_TRUE(pump_until_readable(up.get()));
    Bytes got(4096);
    sockaddr_in from{};
    socklen_t len = sizeof from;
    const ssize_t n =
        ::recvfrom(up.get(), got.data(), got.size(), 0, reinterpret_cast<sockaddr*>(&from), &len);
    ASSERT_GT(n, 0);
    got.resize(static_cast<size_t>(n));
    const dns::Query sent = *dns::parse_query(got).query;
    const auto reply = [&](uint16_t id, const std::string& name, uint8_t last_octet) {
        Bytes r = query(name, dns::kTypeA, id);
        r[2] = 0x81;
        r[3] = 0x80;
        r[7] = 1;
        r.insert(r.end(), {0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4, 198, 18, 1, last_octet});
        ::sendto(up.get(), r.data(), r.size(), 0, reinterpret_cast<sockaddr*>(&from), len);
    };
    reply(static_cast<uint16_t>(sent.header.id + 1), "other.test", 1);
    reply(sent.header.id, "another.test", 2);
    for (int i = 0; i < 5; ++i) pump(10ms);
    EXPECT_EQ(forwarder_->stats().spoofed, 2u);
    reply(sent.header.id, "other.test", 3);
    ASSERT_TRUE(pump_until_readable(s.get()));
    Bytes buf(4096);
    buf.resize(static_cast<size_t>(::recv(s.get(), buf.data(), buf.size(), 0)));
    EXPECT_EQ(read_answer(buf, "other.test").addresses, std::vector<std::string>{"198.18.1.3"});
    ASSERT_EQ(learned_.size(), 1u);
    EXPECT_EQ(learned_[0].address, "198.18.1.3");
    EXPECT_EQ(learned_[0].ttl, 60s);
}

TEST_F(DnsForwarderTest, PolicyChangedInFlightIsJudgedAtTheAnswer) {
    UniqueFd sink = udp_socket("127.0.0.1");
    DnsForwarderConfig c = config();
    c.upstreams = {{"127.0.0.1", port_of(sink.get())}, {"127.0.0.1", upstream_port_}};
    c.upstream_timeout = 200ms;
    start(c);
    forwarder_->set_policy(kSandboxA, allowlist({{"other.test", {}}}));
    UniqueFd s = client(kSandboxA);
    const Bytes q = query("other.test");
    ::send(s.get(), q.data(), q.size(), 0);
    pump(50ms);
    forwarder_->set_policy(kSandboxA, allowlist({{"api.example.com", {}}}));
    ASSERT_TRUE(pump_until_readable(s.get()));
    Bytes buf(4096);
    buf.resize(static_cast<size_t>(::recv(s.get(), buf.data(), buf.size(), 0)));
    EXPECT_EQ(read_answer(buf, "other.test").rcode, kNxdomain);
    EXPECT_TRUE(learned_.empty());
}

TEST_F(DnsForwarderTest, AFloodFromOneSourceStaysBoundedAndOthersAreAnswered) {
    // Every query waits on an upstream that never answers first.
    UniqueFd sink = udp_socket("127.0.0.1");
    DnsForwarderConfig c = config();
    c.upstreams = {{"127.0.0.1", port_of(sink.get())}, {"127.0.0.1", upstream_port_}};
    c.upstream_timeout = 500ms;
    start(c);
    forwarder_->set_policy(kSandboxA, {DnsPolicy::Kind::forward, {}});
    forwarder_->set_policy(kSandboxB, {DnsPolicy::Kind::forward, {}});
    UniqueFd flood = client(kSandboxA);
    clients_.pop_back();
    for (int i = 0; i < 500; ++i) {
        const Bytes q = query("other.test", dns::kTypeA, static_cast<uint16_t>(i));
        ::send(flood.get(), q.data(), q.size(), 0);
        if (i % 50 == 0) pump(0ms);
    }
    for (int i = 0; i < 20; ++i) pump(0ms);
    EXPECT_EQ(forwarder_->stats().forwarded, c.max_in_flight_per_source);
    // (The kernel may have dropped some of the 500 itself, when the socket's buffer was full.)
    EXPECT_GT(forwarder_->stats().dropped, 400u);
    const auto t0 = Clock::now();
    EXPECT_EQ(ask(kSandboxB, "other.test").addresses, std::vector<std::string>{"198.18.0.14"});
    EXPECT_LT(Clock::now() - t0, 2s);
}

TEST_F(DnsForwarderTest, TcpQueryOverTheLimitIsServfailNotSilence) {
    UniqueFd sink = udp_socket("127.0.0.1");
    DnsForwarderConfig c = config();
    c.upstreams = {{"127.0.0.1", port_of(sink.get())}};
    c.max_in_flight_per_source = 1;
    start(c);
    forwarder_->set_policy(kSandboxA, {DnsPolicy::Kind::forward, {}});
    UniqueFd s = tcp_client(kSandboxA);
    Bytes framed;
    for (uint16_t id : {1, 2}) {
        const Bytes q = query("other.test", dns::kTypeA, id);
        framed.insert(framed.end(), {0, static_cast<uint8_t>(q.size())});
        framed.insert(framed.end(), q.begin(), q.end());
    }
    ::send(s.get(), framed.data(), framed.size(), 0);
    const std::optional<Bytes> r = read_tcp(s.get(), 1s);  // well before the upstream timeout
    ASSERT_TRUE(r);
    const Answer a = read_answer(*r, "other.test");
    EXPECT_EQ(a.id, 2);
    EXPECT_EQ(a.rcode, kServfail);
}

TEST_F(DnsForwarderTest, TcpConnectionsAreBoundedAndIdleOnesClosed) {
    DnsForwarderConfig c = config();
    c.tcp_idle_timeout = 300ms;
    start(c);
    forwarder_->set_policy(kSandboxA, {DnsPolicy::Kind::forward, {}});
    forwarder_->set_policy(kSandboxB, {DnsPolicy::Kind::forward, {}});
    std::vector<UniqueFd> idle;
    for (size_t i = 0; i < c.max_tcp_per_source + 4; ++i) {
        idle.push_back(tcp_client(kSandboxA));
        pump(0ms);
    }
    // Those over the bound are closed at once: they read EOF.
    size_t closed = 0;
    for (const UniqueFd& s : idle) {
        pollfd p{s.get(), POLLIN, 0};
        if (::poll(&p, 1, 0) == 1) ++closed;
    }
    EXPECT_EQ(closed, 4u);
    // Another source still gets in and is answered.
    UniqueFd other = tcp_client(kSandboxB);
    const Bytes q = query("other.test");
    Bytes framed = {0, static_cast<uint8_t>(q.size())};
    framed.insert(framed.end(), q.begin(), q.end());
    ::send(other.get(), framed.data(), framed.size(), 0);
    const std::optional<Bytes> r = read_tcp(other.get());
    ASSERT_TRUE(r);
    EXPECT_EQ(read_answer(*r, "other.test").rcode, kNoError);
    // A huge length: closed. Idle ones (and a half-sent message): closed after the timeout.
    UniqueFd huge = tcp_client(kSandboxB);
    ::send(huge.get(), "\xff\xff", 2, 0);
    EXPECT_FALSE(read_tcp(huge.get(), 1s));
    const auto t0 = Clock::now();
    while (Clock::now() - t0 < 600ms) pump(50ms);
    for (size_t i = 0; i < c.max_tcp_per_source; ++i) {
        pollfd p{idle[i].get(), POLLIN, 0};
        EXPECT_EQ(::poll(&p, 1, 0), 1);
        uint8_t b;
        EXPECT_EQ(::recv(idle[i].get(), &b, 1, 0), 0);
    }
    // The source's slots are free again.
    UniqueFd again = tcp_client(kSandboxA);
    ::send(again.get(), framed.data(), framed.size(), 0);
    EXPECT_TRUE(read_tcp(again.get()));
}

TEST_F(DnsForwarderTest, WhenEveryTcpSlotIsTakenAHogGivesOneUp) {
    DnsForwarderConfig c = config();
    c.max_tcp_connections = 4;
    c.max_tcp_per_source = 4;
    start(c);
    forwarder_->set_policy(kSandboxB, {DnsPolicy::Kind::forward, {}});
    std::vector<UniqueFd> hog;
    for (int i = 0; i < 4; ++i) {
        hog.push_back(tcp_client(kSandboxA));
        pump(0ms);
    }
    UniqueFd other = tcp_client(kSandboxB);
    const Bytes q = query("other.test");
    Bytes framed = {0, static_cast<uint8_t>(q.size())};
    framed.insert(framed.end(), q.begin(), q.end());
    ::send(other.get(), framed.data(), framed.size(), 0);
    ASSERT_TRUE(read_tcp(other.get()));
    // The hog's first (longest idle) connection went.
    uint8_t b;
    EXPECT_EQ(::recv(hog[0].get(), &b, 1, MSG_DONTWAIT), 0);
}

TEST_F(DnsForwarderTest, MalformedInputDoesNotStopIt) {
    start();
    forwarder_->set_policy(kSandboxA, allowlist({{"other.test", {}}}));
    UniqueFd s = client(kSandboxA);
    clients_.pop_back();
    const std::vector<Bytes> junk = {
        {},
        {1, 2, 3},
        Bytes(12, 0xff),
        Bytes(3000, 0x41),
    };
    for (const Bytes& j : junk) ::send(s.get(), j.data(), j.size(), 0);
    Bytes response = query("other.test");
    response[2] |= 0x80;  // a response: dropped, never answered
    ::send(s.get(), response.data(), response.size(), 0);
    for (int i = 0; i < 10; ++i) pump(10ms);
    // Two questions: FORMERR.
    Bytes two = query("other.test");
    two[5] = 2;
    const std::optional<Bytes> formerr = ask_udp(kSandboxA, two);
    ASSERT_TRUE(formerr);
    EXPECT_EQ((*formerr)[3] & 0x0f, 1);
    EXPECT_EQ(ask(kSandboxA, "other.test").addresses, std::vector<std::string>{"198.18.0.14"});
    EXPECT_GE(forwarder_->stats().malformed, 5u);
}

}  // namespace
}  // namespace berth::net
