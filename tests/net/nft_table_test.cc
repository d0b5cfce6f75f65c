// NftTable against the kernel: every case first moves the test process into a network
// namespace of its own (nftables rulesets are per namespace), so the host's ruleset is never
// read or touched, and each case starts from an empty one. Needs root.
#include "net/nft_table.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <nftables/libnftables.h>
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/unique_fd.h"

namespace berth::net {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;
using Set = std::set<std::string>;

const char* const kSandboxA = "10.88.0.2";
const char* const kSandboxB = "10.88.0.3";

TableConfig test_config() {
    return {.table = "berth_t",
            .bridge = "berth-br0",
            .subnet_cidr = "10.88.0.0/16",
            .gateway = "10.88.0.1",
            .host_address = ""};
}

// libnftables used directly, as another program of the host would: to build tables that
// are not berth's and to read sets back.
std::string nft(const std::string& commands, bool json_output = false) {
    nft_ctx* ctx = nft_ctx_new(NFT_CTX_DEFAULT);
    nft_ctx_buffer_output(ctx);
    nft_ctx_buffer_error(ctx);
    if (json_output) nft_ctx_output_set_flags(ctx, NFT_CTX_OUTPUT_JSON);
    const int rc = nft_run_cmd_from_buffer(ctx, commands.c_str());
    std::string out = nft_ctx_get_output_buffer(ctx);
    std::string err = nft_ctx_get_error_buffer(ctx);
    nft_ctx_free(ctx);
    if (rc != 0) ADD_FAILURE() << "nft " << commands << ": " << err;
    return out;
}

// A JSON key as nft writes it in text: 10.88.0.2 . 1.2.3.0/24 . tcp . 0-65535.
std::string key_text(const json& v) {
    if (v.is_string()) return v.get<std::string>();
    if (v.is_number()) return std::to_string(v.get<long>());
    if (v.contains("prefix"))
        return v["prefix"]["addr"].get<std::string>() + "/" + key_text(v["prefix"]["len"]);
    if (v.contains("range")) return key_text(v["range"][0]) + "-" + key_text(v["range"][1]);
    std::string s;
    for (const json& f : v["concat"]) s += (s.empty() ? "" : " . ") + key_text(f);
    return s;
}

// The set's elements as text; an element with a timeout gets " timeout Ns".
Set elements(const std::string& set) {
    Set out;
    const json listing = json::parse(nft("list set inet berth_t " + set, true));
    for (const json& item : listing["nftables"]) {
        if (!item.contains("set") || !item["set"].contains("elem")) continue;
        for (const json& e : item["set"]["elem"]) {
            if (e.is_object() && e.contains("elem"))
                out.insert(key_text(e["elem"]["val"]) + " timeout " +
                           std::to_string(e["elem"]["timeout"].get<int>()) + "s");
            else
                out.insert(key_text(e));
        }
    }
    return out;
}

Set table_names() {
    Set out;
    const json listing = json::parse(nft("list tables", true));
    for (const json& item : listing["nftables"])
        if (item.contains("table"))
            out.insert(item["table"]["family"].get<std::string>() + " " +
                       item["table"]["name"].get<std::string>());
    return out;
}

// A table of another program's, with a set and a base chain of its own.
const char* const kOtherTable =
    "table inet other {\n"
    "  set s { type ipv4_addr; elements = { 192.0.2.1 } }\n"
    "  chain c { type filter hook forward priority 0; policy accept; }\n"
    "}";

class NftTableTest : public ::testing::Test {
  protected:
    void SetUp() override {
        if (::geteuid() != 0) GTEST_SKIP() << "needs root (a network namespace, nftables)";
        // A fresh namespace per case; the previous case's goes away with its last user.
        ASSERT_EQ(::unshare(CLONE_NEWNET), 0) << std::strerror(errno);
    }
};

// Runs `f`, expects berth::Error of kind `kind`, returns its message.
template <typename F>
std::string error_of(F f, Error::Kind kind = Error::Kind::invalid_argument) {
    try {
        f();
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), kind) << e.what();
        return e.what();
    }
    ADD_FAILURE() << "no error";
    return {};
}

TEST_F(NftTableTest, CreateTwiceReplacesTheTable) {
    NftTable table(test_config());
    EXPECT_FALSE(table.exists());
    table.create();
    EXPECT_TRUE(table.exists());
    const std::string fresh = table.list();
    table.set_public(kSandboxA, true);
    table.create();
    EXPECT_EQ(table.list(), fresh);  // the same table again, its sets empty
    EXPECT_EQ(table_names(), (Set{"bridge berth_t", "inet berth_t"}));
}

TEST_F(NftTableTest, ListShowsTheChainsAndSets) {
    NftTable table(test_config());
    table.create();
    const std::string text = table.list();
    for (const char* want : {
             "set public4",
             "set allow4",
             "type ipv4_addr . ipv4_addr . inet_proto . inet_service",
             "flags interval,timeout",
             "set hostports4",
             "type filter hook forward priority filter - 10; policy accept;",
             "oifname \"berth-br0\" jump to_sandbox",
             "iifname \"berth-br0\" jump from_sandbox",
             "ip saddr . ip daddr . meta l4proto . th dport @allow4 accept",
             "meta l4proto tcp reject with tcp reset",
             "reject with icmpx admin-prohibited",
             "type filter hook input priority filter - 10; policy accept;",
             "ip daddr 10.88.0.1 udp dport 53 accept",
             "ip daddr 10.88.0.1 tcp dport 53 accept",
             "type nat hook prerouting priority dstnat; policy accept;",
             "iifname \"berth-br0\" ip daddr 10.88.0.1 ip saddr . tcp dport @hostports4 dnat ip "
             "to 127.0.0.1",
             "type filter hook prerouting priority dstnat - 10; policy accept;",
             "iifname \"berth-br0\" ct direction original ct status dnat ip daddr 10.88.0.1 ip "
             "saddr . tcp dport != @hostports4 reject with tcp reset",
             "map published4",
             "iifname != \"berth-br0\" dnat ip to ip daddr . tcp dport map @published4",
             "type nat hook output priority -100; policy accept;",
             "oifname \"berth-br0\" ct status dnat ip saddr 127.0.0.0/8 masquerade",
             "set listed4",
             "ip saddr @listed4 ct state established,related accept",
             "type nat hook postrouting priority srcnat; policy accept;",
             "ip saddr 10.88.0.0/16 oifname != \"berth-br0\" masquerade",
         })
        EXPECT_NE(text.find(want), std::string::npos) << want << "\nin:\n" << text;
}

TEST_F(NftTableTest, HostAddressIsConfigurable) {
    TableConfig config = test_config();
    config.host_address = "10.88.255.254";
    NftTable table(config);
    table.create();
    const std::string text = table.list();
    EXPECT_NE(text.find("ip daddr 10.88.255.254 ip saddr . tcp dport @hostports4 dnat"),
              std::string::npos)
        << text;
    EXPECT_NE(text.find("ct status dnat ip daddr 10.88.255.254 ip saddr . tcp dport != "),
              std::string::npos)
        << text;
}

TEST_F(NftTableTest, SetPublicChangesOnlyThatSandbox) {
    NftTable table(test_config());
    table.create();
    table.set_public(kSandboxA, true);
    table.set_public(kSandboxB, true);
    table.set_public(kSandboxA, true);  // again: no error
    EXPECT_EQ(elements("public4"), (Set{kSandboxA, kSandboxB}));
    table.set_public(kSandboxA, false);
    table.set_public(kSandboxA, false);  // absent: no error
    EXPECT_EQ(elements("public4"), Set{kSandboxB});
}

TEST_F(NftTableTest, AddAllowedAndClearAllowed) {
    NftTable table(test_config());
    table.create();
    table.add_allowed(
        kSandboxA,
        {{.cidr = "1.2.3.0/24", .proto = "tcp"},
         {.cidr = "8.8.8.8", .proto = "", .port_from = 53, .port_to = 53},
         {.cidr = "9.9.9.9", .proto = "tcp", .port_from = 443, .port_to = 443, .timeout = 30s}});
    table.add_allowed(kSandboxB,
                      {{.cidr = "1.2.3.0/24", .proto = "udp", .port_from = 80, .port_to = 90}});
    table.add_allowed(kSandboxB, {});  // nothing: no command
    const Set b{"10.88.0.3 . 1.2.3.0/24 . udp . 80-90"};
    Set all = b;
    all.insert({"10.88.0.2 . 1.2.3.0/24 . tcp . 0-65535", "10.88.0.2 . 8.8.8.8 . tcp . 53",
                "10.88.0.2 . 8.8.8.8 . udp . 53", "10.88.0.2 . 9.9.9.9 . tcp . 443 timeout 30s"});
    EXPECT_EQ(elements("allow4"), all);

    table.clear_allowed(kSandboxA);
    EXPECT_EQ(elements("allow4"), b);
    table.clear_allowed(kSandboxA);  // none left: no error
    EXPECT_EQ(elements("allow4"), b);
}

TEST_F(NftTableTest, AddAllowedIsOneTransaction) {
    NftTable table(test_config());
    table.create();
    table.add_allowed(kSandboxA, {{.cidr = "1.2.3.0/24", .proto = "tcp"}});
    // The second entry starts inside the first, which the kernel refuses: neither is added.
    const std::string message = error_of(
        [&] {
            table.add_allowed(
                kSandboxA, {{.cidr = "5.5.5.5", .proto = "tcp"},
                            {.cidr = "1.2.3.4", .proto = "tcp", .port_from = 80, .port_to = 80}});
        },
        Error::Kind::internal);
    EXPECT_NE(message.find("File exists"), std::string::npos) << message;
    EXPECT_EQ(elements("allow4"), Set{"10.88.0.2 . 1.2.3.0/24 . tcp . 0-65535"});
}

TEST_F(NftTableTest, SetHostPortsReplacesThatSandboxsPorts) {
    NftTable table(test_config());
    table.create();
    table.set_host_ports(kSandboxA, {8080, 22, 8080});
    table.set_host_ports(kSandboxB, {22});
    EXPECT_EQ(elements("hostports4"),
              (Set{"10.88.0.2 . 22", "10.88.0.2 . 8080", "10.88.0.3 . 22"}));
    table.set_host_ports(kSandboxA, {22, 9000});
    EXPECT_EQ(elements("hostports4"),
              (Set{"10.88.0.2 . 22", "10.88.0.2 . 9000", "10.88.0.3 . 22"}));
    table.set_host_ports(kSandboxA, {});
    EXPECT_EQ(elements("hostports4"), Set{"10.88.0.3 . 22"});
}

TEST_F(NftTableTest, ForgetRemovesThatSandboxFromEverySet) {
    NftTable table(test_config());
    table.create();
    for (const char* ip : {kSandboxA, kSandboxB}) {
        table.set_public(ip, true);
        table.add_allowed(ip, {{.cidr = "1.2.3.4", .proto = "tcp", .timeout = 60s},
                               {.cidr = "10.0.0.0/8", .proto = "udp"}});
        table.set_host_ports(ip, {8080});
    }
    table.forget(kSandboxA);
    EXPECT_EQ(elements("public4"), Set{kSandboxB});
    EXPECT_EQ(elements("allow4"), (Set{"10.88.0.3 . 1.2.3.4 . tcp . 0-65535 timeout 60s",
                                       "10.88.0.3 . 10.0.0.0/8 . udp . 0-65535"}));
    EXPECT_EQ(elements("hostports4"), Set{"10.88.0.3 . 8080"});
    table.forget(kSandboxA);  // nothing left of it: no error
    table.forget(kSandboxB);
    EXPECT_EQ(elements("public4"), Set{});
    EXPECT_EQ(elements("allow4"), Set{});
    EXPECT_EQ(elements("hostports4"), Set{});
}

TEST_F(NftTableTest, AddSandboxIsOneTransactionOfAdditions) {
    NftTable table(test_config());
    table.create();
    table.add_sandbox(kSandboxA, "bhaaaa", {8080, 22}, {{"127.0.0.1", 9000, 80}}, false, true,
                      {{.cidr = "1.2.3.0/24", .proto = "tcp", .port_from = 443, .port_to = 443}});
    EXPECT_EQ(elements("public4"), Set{});
    EXPECT_EQ(elements("listed4"), Set{kSandboxA});
    EXPECT_EQ(elements("hostports4"), (Set{"10.88.0.2 . 22", "10.88.0.2 . 8080"}));
    EXPECT_EQ(elements("allow4"), Set{"10.88.0.2 . 1.2.3.0/24 . tcp . 443"});
    const std::string bridge = nft("list table bridge berth_t");
    EXPECT_NE(bridge.find("\"bhaaaa\" . 10.88.0.2"), std::string::npos) << bridge;
    // A bad part refuses the whole: nothing of B is added.
    const std::string before = table.list();
    error_of([&] { table.add_sandbox(kSandboxB, "bhbbbb", {0}, {}, true, false, {}); });
    error_of([&] { table.add_sandbox(kSandboxB, "bh\" accept", {}, {}, true, false, {}); });
    EXPECT_EQ(table.list(), before);
    table.forget(kSandboxA);
    EXPECT_EQ(elements("listed4"), Set{});
    EXPECT_EQ(elements("allow4"), Set{});
}

TEST_F(NftTableTest, SetPeersAddsAndRemovesBothDirections) {
    NftTable table(test_config());
    table.create();
    table.set_peers("bhaaaa", kSandboxA, "bhbbbb", kSandboxB, true);
    table.set_peers("bhaaaa", kSandboxA, "bhbbbb", kSandboxB, true);  // again: no error
    EXPECT_EQ(elements("peers4"), (Set{"10.88.0.2 . 10.88.0.3", "10.88.0.3 . 10.88.0.2"}));
    const std::string bridge = nft("list set bridge berth_t peers");
    EXPECT_NE(bridge.find("\"bhaaaa\" . \"bhbbbb\""), std::string::npos) << bridge;
    EXPECT_NE(bridge.find("\"bhbbbb\" . \"bhaaaa\""), std::string::npos) << bridge;
    table.set_peers("bhaaaa", kSandboxA, "bhbbbb", kSandboxB, false);
    table.set_peers("bhaaaa", kSandboxA, "bhbbbb", kSandboxB, false);  // gone: no error
    EXPECT_EQ(elements("peers4"), Set{});
    EXPECT_EQ(nft("list set bridge berth_t peers").find("bhaaaa"), std::string::npos);
    // Validated before any command.
    error_of([&] { table.set_peers("bhaaaa", kSandboxA, "bhaaaa", kSandboxB, true); });
    error_of([&] { table.set_peers("bhaaaa", kSandboxA, "bhbbbb", kSandboxA, true); });
    error_of([&] { table.set_peers("bh\" }", kSandboxA, "bhbbbb", kSandboxB, true); });
    error_of([&] { table.set_peers("bhaaaa", "10.99.0.2", "bhbbbb", kSandboxB, true); });
    EXPECT_EQ(elements("peers4"), Set{});
}

TEST_F(NftTableTest, ConfigIsValidated) {
    auto make = [](auto edit) {
        return [edit] {
            TableConfig c = test_config();
            edit(c);
            NftTable table(c);
        };
    };
    for (const char* name : {"", "1.2.3.4; flush ruleset", "berth;", "0berth", "-berth",
                             "berth berth", "sixteen_chars_xx", "b\"t"})
        error_of(make([&](TableConfig& c) { c.table = name; }));
    for (const char* name : {"", "br0\" accept", "br0 ", "sixteen_chars_xx", "br0;"})
        error_of(make([&](TableConfig& c) { c.bridge = name; }));
    for (const char* cidr : {"", "10.88.0.0/33", "10.88.0.1/16", "10.88.0.0/", "10.88.0.0/1a",
                             "10.88.0.0/16; flush ruleset", "10.88/16", "10.88.0.0/016"})
        error_of(make([&](TableConfig& c) { c.subnet_cidr = cidr; }));
    // A bare address is a /32: valid, but then the gateway is outside it.
    error_of(make([&](TableConfig& c) { c.subnet_cidr = "10.88.0.0"; }));
    for (const char* addr : {"", "10.99.0.1", "10.88.0.1; flush ruleset", "10.88.0.256", "::1"})
        error_of(make([&](TableConfig& c) { c.gateway = addr; }));
    error_of(make([&](TableConfig& c) { c.host_address = "127.0.0.1 accept"; }));
}

TEST_F(NftTableTest, ArgumentsAreValidatedBeforeAnyCommand) {
    nft(kOtherTable);
    NftTable table(test_config());
    table.create();
    table.set_public(kSandboxB, true);
    const std::string before = table.list();

    for (const char* ip : {"1.2.3.4; flush ruleset", "10.88.0.2; flush ruleset", "10.88.0.2 ",
                           " 10.88.0.2", "010.88.0.2", "10.88.2", "0x0a.88.0.2", "10.88.0.2/32",
                           "10.99.0.2", "", "::1", "10.88.0.2\n"}) {
        SCOPED_TRACE(ip);
        error_of([&] { table.set_public(ip, true); });
        error_of([&] { table.add_allowed(ip, {{.cidr = "1.1.1.1"}}); });
        error_of([&] { table.clear_allowed(ip); });
        error_of([&] { table.set_host_ports(ip, {80}); });
        error_of([&] { table.forget(ip); });
    }
    error_of([&] { table.set_public(std::string("10.88.0.2\0; flush ruleset", 25), true); });
    for (const char* cidr :
         {"1.2.3.4; flush ruleset", "1.2.3.0/24 . tcp . 1", "1.2.3.4/", "1.2.3.4/-1", "1.2.3.4/1a",
          "1.2.3.4/033", "1.2.3.256", "1.2.3.4/24", "1.2.3.0/24 }", "::1", "example.com", ""}) {
        SCOPED_TRACE(cidr);
        error_of([&] { table.add_allowed(kSandboxA, {{.cidr = cidr}}); });
    }
    for (const char* proto : {"icmp", "TCP", "tcp; flush ruleset", "tcp . 1.2.3.4", "6"}) {
        SCOPED_TRACE(proto);
        error_of([&] { table.add_allowed(kSandboxA, {{.cidr = "1.1.1.1", .proto = proto}}); });
    }
    error_of([&] {
        table.add_allowed(kSandboxA, {{.cidr = "1.1.1.1", .port_from = 90, .port_to = 80}});
    });
    error_of([&] { table.add_allowed(kSandboxA, {{.cidr = "1.1.1.1", .timeout = 0s}}); });
    // One bad rule among good ones: nothing is added.
    error_of([&] {
        table.add_allowed(kSandboxA, {{.cidr = "1.1.1.1"}, {.cidr = "1.1.1.1; flush ruleset"}});
    });
    error_of([&] { table.set_host_ports(kSandboxA, {80, 0}); });

    EXPECT_EQ(table.list(), before);
    EXPECT_EQ(table_names(), (Set{"bridge berth_t", "inet berth_t", "inet other"}));
    EXPECT_NE(nft("list table inet other").find("192.0.2.1"), std::string::npos);
}

TEST_F(NftTableTest, DestroyRemovesOnlyItsTable) {
    nft(kOtherTable);
    nft("table ip berth_t");  // the same name in another family
    const std::string other_before = nft("list table inet other");
    NftTable table(test_config());
    table.destroy();  // absent: no error
    table.create();
    EXPECT_EQ(table_names(), (Set{"bridge berth_t", "inet berth_t", "inet other", "ip berth_t"}));
    table.destroy();
    EXPECT_FALSE(table.exists());
    EXPECT_EQ(table_names(), (Set{"inet other", "ip berth_t"}));
    EXPECT_EQ(nft("list table inet other"), other_before);
    table.destroy();
}

TEST_F(NftTableTest, ErrorsCarryLibnftablesText) {
    NftTable table(test_config());  // never created
    const std::string message =
        error_of([&] { table.set_public(kSandboxA, true); }, Error::Kind::not_found);
    EXPECT_NE(message.find("No such file or directory"), std::string::npos) << message;
    EXPECT_NE(message.find("berth_t"), std::string::npos) << message;
    error_of([&] { table.clear_allowed(kSandboxA); }, Error::Kind::not_found);
    error_of([&] { (void)table.list(); }, Error::Kind::not_found);
}

// --- Real packets: a sandbox namespace on a veth port of the bridge. ---

void sh(const std::string& command) {
    ASSERT_EQ(std::system(command.c_str()), 0) << command;
}

UniqueFd open_netns() {
    return UniqueFd(check_sys("open", "/proc/self/ns/net",
                              [] { return ::open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC); }));
}

void enter(const UniqueFd& netns) {
    check_sys("setns", "net", [&] { return ::setns(netns.get(), CLONE_NEWNET); });
}

sockaddr_in address(const char* ip, uint16_t port) {
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(port);
    inet_pton(AF_INET, ip, &sa.sin_addr);
    return sa;
}

UniqueFd listener(const char* ip, uint16_t port) {
    UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    const int one = 1;
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    const sockaddr_in sa = address(ip, port);
    EXPECT_EQ(::bind(fd.get(), reinterpret_cast<const sockaddr*>(&sa), sizeof sa), 0);
    EXPECT_EQ(::listen(fd.get(), 8), 0);
    return fd;
}

class NftPacketTest : public NftTableTest {
  protected:
    void SetUp() override {
        NftTableTest::SetUp();
        if (IsSkipped() || HasFatalFailure()) return;
        host_ = open_netns();
        ASSERT_EQ(::unshare(CLONE_NEWNET), 0) << std::strerror(errno);
        sandbox_ = open_netns();
        enter(host_);
        // The host: the bridge with the gateway's address, the sandbox's veth on it, and an
        // "outside" network behind another veth (a static neighbour: packets let out leave
        // and vanish, so an allowed connect stays pending rather than being refused).
        sh("ip link set lo up && ip link add berth-br0 type bridge && "
           "ip addr add 10.88.0.1/16 dev berth-br0 && ip link set berth-br0 up && "
           "ip link add bhtest0 type veth peer name veth-s netns /proc/" +
           std::to_string(::getpid()) + "/fd/" + std::to_string(sandbox_.get()) +
           " && ip link set bhtest0 master berth-br0 up && "
           "ip link add out-h type veth peer name out-x && ip link set out-x up && "
           "ip addr add 192.0.2.1/24 dev out-h && ip link set out-h up && "
           "ip neigh add 192.0.2.9 lladdr 02:00:00:00:00:09 dev out-h && "
           "echo 1 > /proc/sys/net/ipv4/ip_forward && "
           "echo 1 > /proc/sys/net/ipv4/conf/berth-br0/route_localnet");
        enter(sandbox_);
        sh("ip link set lo up && ip addr add 10.88.0.2/16 dev veth-s && ip link set veth-s up && "
           "ip route add default via 10.88.0.1");
        enter(host_);
    }

    // A TCP connect from the sandbox: 0 when it connects, its errno when it fails, and
    // EINPROGRESS when neither has happened within `wait`.
    int connect_from_sandbox(const char* ip, uint16_t port, std::chrono::milliseconds wait,
                             UniqueFd* keep = nullptr, const char* source = nullptr) {
        enter(sandbox_);
        UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
        enter(host_);
        if (source) {
            const sockaddr_in from = address(source, 0);
            if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&from), sizeof from) != 0)
                return errno;
        }
        const sockaddr_in sa = address(ip, port);
        if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&sa), sizeof sa) == 0) return 0;
        if (errno != EINPROGRESS) return errno;
        pollfd p{fd.get(), POLLOUT, 0};
        if (::poll(&p, 1, static_cast<int>(wait.count())) == 0) return EINPROGRESS;
        int err = 0;
        socklen_t len = sizeof err;
        ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
        if (keep) *keep = std::move(fd);
        return err;
    }

    UniqueFd host_, sandbox_;
};

TEST_F(NftPacketTest, RefusedAtOnceAndAllowedBySet) {
    UniqueFd service = listener("0.0.0.0", 7000);     // a host service on every address
    UniqueFd loopback = listener("127.0.0.1", 7001);  // a host loopback port
    // Without the table the host's service answers (so the refusals below are the table's).
    EXPECT_EQ(connect_from_sandbox("10.88.0.1", 7000, 2s), 0);

    NftTable table(test_config());
    table.create();
    table.set_port(kSandboxA, "bhtest0");
    const auto start = std::chrono::steady_clock::now();
    EXPECT_EQ(connect_from_sandbox("192.0.2.9", 80, 2s), ECONNREFUSED);  // a reset, not a drop
    EXPECT_EQ(connect_from_sandbox("10.88.0.1", 7000, 2s), ECONNREFUSED);
    EXPECT_EQ(connect_from_sandbox("10.88.0.1", 7001, 2s), ECONNREFUSED);
    EXPECT_LT(std::chrono::steady_clock::now() - start, 1s);

    table.add_allowed(kSandboxA,
                      {{.cidr = "192.0.2.0/24", .proto = "tcp", .port_from = 80, .port_to = 80}});
    EXPECT_EQ(connect_from_sandbox("192.0.2.9", 80, 300ms), EINPROGRESS);  // let out
    EXPECT_EQ(connect_from_sandbox("192.0.2.9", 81, 2s), ECONNREFUSED);
    table.clear_allowed(kSandboxA);
    EXPECT_EQ(connect_from_sandbox("192.0.2.9", 80, 2s), ECONNREFUSED);

    table.set_public(kSandboxA, true);
    EXPECT_EQ(connect_from_sandbox("192.0.2.9", 81, 300ms), EINPROGRESS);
    EXPECT_EQ(connect_from_sandbox("10.88.0.1", 7000, 2s), ECONNREFUSED);  // not the host
    table.set_public(kSandboxA, false);

    // A host port: the gateway's 7001 is the host's 127.0.0.1:7001 ...
    table.set_host_ports(kSandboxA, {7001});
    UniqueFd conn;
    ASSERT_EQ(connect_from_sandbox("10.88.0.1", 7001, 2s, &conn), 0);
    ASSERT_EQ(::send(conn.get(), "a", 1, MSG_NOSIGNAL), 1);
    // ... and taking it away cuts the open connection: its next segment is answered with a
    // reset.
    table.set_host_ports(kSandboxA, {});
    ASSERT_EQ(::send(conn.get(), "b", 1, MSG_NOSIGNAL), 1);
    pollfd p{conn.get(), POLLIN, 0};
    ASSERT_EQ(::poll(&p, 1, 2000), 1);
    char c;
    const ssize_t n = ::recv(conn.get(), &c, 1, 0);
    const int err = errno;
    EXPECT_EQ(n, -1);
    EXPECT_EQ(err, ECONNRESET) << std::strerror(err);
}

TEST_F(NftPacketTest, ASandboxPortSpeaksOnlyWithItsOwnAddress) {
    UniqueFd service = listener("0.0.0.0", 7000);
    NftTable table(test_config());
    table.create();
    table.set_port(kSandboxA, "bhtest0");
    EXPECT_EQ(connect_from_sandbox("192.0.2.9", 80, 2s), ECONNREFUSED);  // A's own: routed
    // B is public; A's root takes B's address as a second one on its own link: its frames
    // still come in by A's port, and are dropped there (no reset either: nothing answers).
    table.set_public(kSandboxB, true);
    enter(sandbox_);
    sh("ip addr add 10.88.0.3/16 dev veth-s");
    enter(host_);
    EXPECT_EQ(connect_from_sandbox("192.0.2.9", 81, 500ms, nullptr, kSandboxB), EINPROGRESS);
    EXPECT_EQ(connect_from_sandbox("10.88.0.1", 7000, 500ms, nullptr, kSandboxB), EINPROGRESS);
    // Were B's address this port's, its public egress would pass (the set decides).
    table.set_port(kSandboxB, "bhtest0");
    EXPECT_EQ(connect_from_sandbox("192.0.2.9", 81, 300ms, nullptr, kSandboxB), EINPROGRESS);
    EXPECT_EQ(connect_from_sandbox("10.88.0.1", 7000, 2s, nullptr, kSandboxB), ECONNREFUSED);
    table.forget(kSandboxB);
    std::string listed = nft("list set bridge berth_t ports4", false);
    EXPECT_EQ(listed.find("10.88.0.3"), std::string::npos) << listed;
    EXPECT_NE(listed.find("10.88.0.2"), std::string::npos) << listed;
    table.forget(kSandboxA);
    listed = nft("list table bridge berth_t", false);
    EXPECT_EQ(listed.find("bhtest0"), std::string::npos) << listed;
}

}  // namespace
}  // namespace berth::net
