// net/netlink against the kernel. Every test works in throwaway network namespaces (the test
// process unshares one, keeps an fd to it and goes back), so the host's links are never
// touched; what the kernel did is read back with ip(8), which shares no code with the client.
// Needs root (CAP_SYS_ADMIN for the namespaces, CAP_NET_ADMIN in them).
#include "net/netlink.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <seccomp.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "base/child_process.h"
#include "base/error.h"
#include "base/pipe.h"
#include "base/unique_fd.h"

namespace berth::net {
namespace {

using Kind = Error::Kind;
using nlohmann::json;

ino_t current_netns() {
    struct stat st {};
    if (::stat("/proc/thread-self/ns/net", &st) != 0) throw_sys("stat", "/proc/thread-self/ns/net");
    return st.st_ino;
}

UniqueFd open_own_netns() {
    return UniqueFd(check_sys("open", "/proc/thread-self/ns/net", [] {
        return ::open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
    }));
}

// A new, empty network namespace (only a down lo), alive as long as the fd.
UniqueFd throwaway_netns() {
    UniqueFd home = open_own_netns();
    check_sys("unshare", "CLONE_NEWNET", [] { return ::unshare(CLONE_NEWNET); });
    UniqueFd made = open_own_netns();
    if (::setns(home.get(), CLONE_NEWNET) != 0) {
        std::perror("netlink_test: setns home");  // the rest would run in the wrong one
        std::abort();
    }
    return made;
}

// What `ip -j ARGS` prints inside `netns_fd`'s namespace, parsed.
json ip_json(int netns_fd, const std::vector<std::string>& args) {
    std::vector<std::string> words{"ip", "-j"};
    words.insert(words.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& w : words) argv.push_back(w.data());
    argv.push_back(nullptr);
    Pipe out = make_pipe("ip output");
    const int w = out.write.get();
    auto child = ChildProcess::fork("ip", {w, netns_fd}, [&] {
        if (::setns(netns_fd, CLONE_NEWNET) != 0 || ::dup2(w, 1) < 0) return 125;
        ::execvp("ip", argv.data());
        ::execv("/usr/sbin/ip", argv.data());  // (a PATH without sbin)
        return 127;
    });
    out.write.reset();
    std::string text;
    char buf[4096];
    for (ssize_t n; (n = ::read(out.read.get(), buf, sizeof buf)) != 0;) {
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) throw_sys("read", "ip output");
        text.append(buf, static_cast<size_t>(n));
    }
    const int status = child.wait();
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "ip status " << status;
    if (text.empty()) return json::array();
    return json::parse(text);
}

std::set<std::string> link_names(int netns_fd) {
    std::set<std::string> names;
    for (const auto& l : ip_json(netns_fd, {"link", "show"})) names.insert(l.at("ifname"));
    return names;
}

json link_info(int netns_fd, const std::string& name) {
    for (const auto& l : ip_json(netns_fd, {"link", "show"}))
        if (l.at("ifname") == name) return l;
    return nullptr;
}

bool has_flag(const json& link, const std::string& flag) {
    const auto& flags = link.at("flags");
    return std::find(flags.begin(), flags.end(), flag) != flags.end();
}

// Runs `f`, expecting a berth::Error of `kind`; returns it (what() empty if none was thrown).
template <typename F>
Error expect_error(Kind kind, F&& f) {
    try {
        f();
    } catch (const Error& e) {
        EXPECT_EQ(static_cast<int>(e.kind()), static_cast<int>(kind)) << e.what();
        return e;
    }
    ADD_FAILURE() << "no error thrown";
    return Error(Kind::unspecified, "");
}

class NetlinkTest : public ::testing::Test {
  protected:
    void SetUp() override {
        if (::geteuid() != 0) GTEST_SKIP() << "needs root";
        home_ = current_netns();
        a_ = throwaway_netns();
        b_ = throwaway_netns();
    }
    void TearDown() override {
        // Whatever a test did, the test process itself stays where it was.
        if (home_ != 0) {
            EXPECT_EQ(current_netns(), home_);
        }
    }
    ino_t home_ = 0;
    UniqueFd a_, b_;
};

TEST_F(NetlinkTest, InNetnsActsThereAndReturns) {
    {
        Netlink nl = Netlink::in_netns(a_.get());
        EXPECT_EQ(current_netns(), home_);
        // The socket stays in a's namespace however the thread moves.
        nl.add_bridge("bt0");
    }
    EXPECT_TRUE(link_names(a_.get()).contains("bt0"));
    EXPECT_FALSE(link_names(b_.get()).contains("bt0"));

    // An fd that names no network namespace: setns refuses, the thread has not moved.
    UniqueFd devnull(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    ASSERT_TRUE(devnull);
    Error e = expect_error(Kind::invalid_argument, [&] { Netlink::in_netns(devnull.get()); });
    EXPECT_EQ(e.err(), EINVAL);
    EXPECT_NE(std::string(e.what()).find("setns"), std::string::npos) << e.what();
}

// A failure after the thread entered the namespace (here: no fd left for the socket) still
// brings it back. In a child, for the rlimit.
TEST_F(NetlinkTest, InNetnsReturnsWhenOpeningTheSocketThereFails) {
    const int ns = a_.get();
    auto child = ChildProcess::fork("rlimit child", {ns}, [ns] {
        const ino_t before = current_netns();
        // The next fd in_netns opens (its way back) fits under the limit; the socket does not.
        const int lowest = ::open("/dev/null", O_RDONLY);
        ::close(lowest);
        const rlimit lim{static_cast<rlim_t>(lowest + 1), static_cast<rlim_t>(lowest + 1)};
        if (::setrlimit(RLIMIT_NOFILE, &lim) != 0) return 2;
        try {
            Netlink::in_netns(ns);
            std::fprintf(stderr, "in_netns succeeded under the fd limit\n");
            return 3;
        } catch (const SysError& e) {
            if (e.err() != EMFILE) {
                std::fprintf(stderr, "unexpected: %s\n", e.what());
                return 4;
            }
        }
        return current_netns() == before ? 0 : 5;
    });
    EXPECT_EQ(child.wait(), 0);
}

TEST_F(NetlinkTest, VethPeerIsCreatedInItsOwnNamespaceOnly) {
    Netlink nl = Netlink::in_netns(a_.get());
    nl.add_bridge("br-t");
    nl.add_veth("vh-t", "eth-t", b_.get());

    const auto in_a = link_names(a_.get());
    const auto in_b = link_names(b_.get());
    EXPECT_TRUE(in_a.contains("br-t"));
    EXPECT_TRUE(in_a.contains("vh-t"));
    EXPECT_FALSE(in_a.contains("eth-t"));
    EXPECT_TRUE(in_b.contains("eth-t"));
    EXPECT_FALSE(in_b.contains("vh-t"));
    const json bridge = link_info(a_.get(), "br-t");
    EXPECT_EQ(bridge.value("link_type", ""), "ether");

    // The same seen through the client: ifindex finds each name on its own side only.
    Netlink nl_b = Netlink::in_netns(b_.get());
    EXPECT_GT(nl_b.ifindex("eth-t"), 0);
    EXPECT_GT(nl.ifindex("vh-t"), 0);
    expect_error(Kind::not_found, [&] { nl.ifindex("eth-t"); });
    expect_error(Kind::not_found, [&] { nl_b.ifindex("vh-t"); });
}

TEST_F(NetlinkTest, AVethWhosePeerNameIsTakenThereIsNotCreated) {
    Netlink nl_b = Netlink::in_netns(b_.get());
    nl_b.add_bridge("eth-t");  // the name the peer wants, taken in b
    Netlink nl = Netlink::in_netns(a_.get());
    Error e = expect_error(Kind::already_exists, [&] { nl.add_veth("vh-t", "eth-t", b_.get()); });
    EXPECT_EQ(e.err(), EEXIST);
    EXPECT_FALSE(link_names(a_.get()).contains("vh-t"));  // nothing half made
}

TEST_F(NetlinkTest, SetMasterAndUp) {
    Netlink nl = Netlink::in_netns(a_.get());
    nl.add_bridge("br-t");
    nl.add_veth("vh-t", "eth-t", b_.get());
    EXPECT_FALSE(has_flag(link_info(a_.get(), "vh-t"), "UP"));
    EXPECT_FALSE(link_info(a_.get(), "vh-t").contains("master"));

    nl.set_master("vh-t", "br-t");
    nl.set_up("vh-t");
    nl.set_up("br-t");
    const json veth = link_info(a_.get(), "vh-t");
    EXPECT_EQ(veth.value("master", ""), "br-t");
    EXPECT_TRUE(has_flag(veth, "UP"));
    EXPECT_TRUE(has_flag(link_info(a_.get(), "br-t"), "UP"));
    // The peer's state is its own.
    EXPECT_FALSE(has_flag(link_info(b_.get(), "eth-t"), "UP"));

    expect_error(Kind::not_found, [&] { nl.set_master("vh-t", "br-none"); });
    expect_error(Kind::not_found, [&] { nl.set_master("vh-none", "br-t"); });
    expect_error(Kind::not_found, [&] { nl.set_up("vh-none"); });
}

TEST_F(NetlinkTest, AddressesAndDefaultRoutes) {
    Netlink nl = Netlink::in_netns(a_.get());
    nl.add_veth("vh-t", "eth-t", b_.get());
    Netlink nl_b = Netlink::in_netns(b_.get());
    nl_b.add_address("eth-t", "10.250.0.2", 24);
    nl_b.add_address("eth-t", "fd00:be27::2", 64);

    // A gateway with no route to it (the link is down: no prefix route yet) is refused.
    Error e = expect_error(Kind::internal, [&] { nl_b.add_default_route("10.250.0.1"); });
    EXPECT_EQ(e.err(), ENETUNREACH);

    nl_b.set_up("eth-t");
    nl_b.add_default_route("10.250.0.1");
    nl_b.add_default_route("fd00:be27::1");

    std::set<std::string> addrs;
    for (const auto& l : ip_json(b_.get(), {"addr", "show", "dev", "eth-t"}))
        for (const auto& a : l.at("addr_info"))
            addrs.insert(a.at("local").get<std::string>() + "/" +
                         std::to_string(a.at("prefixlen").get<int>()) +
                         (a.value("tentative", false) ? " tentative" : ""));
    EXPECT_TRUE(addrs.contains("10.250.0.2/24")) << json(addrs).dump();
    EXPECT_TRUE(addrs.contains("fd00:be27::2/64")) << json(addrs).dump();  // no DAD

    auto default_route = [&](const std::string& family) {
        for (const auto& r : ip_json(b_.get(), {family, "route", "show", "default"}))
            if (r.value("dst", "") == "default") return r;
        return json(nullptr);
    };
    const json v4 = default_route("-4");
    ASSERT_TRUE(v4.is_object());
    EXPECT_EQ(v4.value("gateway", ""), "10.250.0.1");
    EXPECT_EQ(v4.value("dev", ""), "eth-t");
    const json v6 = default_route("-6");
    ASSERT_TRUE(v6.is_object());
    EXPECT_EQ(v6.value("gateway", ""), "fd00:be27::1");
    EXPECT_EQ(v6.value("dev", ""), "eth-t");
    // Nothing of it in a.
    bool a_has_default = false;
    for (const auto& r : ip_json(a_.get(), {"-4", "route", "show"}))
        if (r.value("dst", "") == "default") a_has_default = true;
    EXPECT_FALSE(a_has_default);

    expect_error(Kind::already_exists, [&] { nl_b.add_default_route("10.250.0.1"); });
    expect_error(Kind::already_exists, [&] { nl_b.add_address("eth-t", "10.250.0.2", 24); });
    expect_error(Kind::not_found, [&] { nl_b.add_address("eth-none", "10.250.0.3", 24); });
}

TEST_F(NetlinkTest, DeleteLinkAndNotFound) {
    Netlink nl = Netlink::in_netns(a_.get());
    nl.add_bridge("br-t");
    nl.add_veth("vh-t", "eth-t", b_.get());
    nl.delete_link("br-t");
    EXPECT_FALSE(link_names(a_.get()).contains("br-t"));
    // Deleting one end of a veth takes the other, in the other namespace, with it.
    nl.delete_link("vh-t");
    EXPECT_FALSE(link_names(a_.get()).contains("vh-t"));
    EXPECT_FALSE(link_names(b_.get()).contains("eth-t"));

    Error e = expect_error(Kind::not_found, [&] { nl.delete_link("br-t"); });
    EXPECT_EQ(e.err(), ENODEV);
    EXPECT_NE(std::string(e.what()).find("RTM_DELLINK br-t in net:["), std::string::npos)
        << e.what();
    expect_error(Kind::not_found, [&] { nl.ifindex("br-t"); });
}

TEST_F(NetlinkTest, ADuplicateBridgeIsAlreadyExistsAndSaysWhich) {
    Netlink nl = Netlink::in_netns(a_.get());
    nl.add_bridge("br-t");
    Error e = expect_error(Kind::already_exists, [&] { nl.add_bridge("br-t"); });
    EXPECT_EQ(e.err(), EEXIST);
    const std::string what = e.what();
    EXPECT_NE(what.find("RTM_NEWLINK bridge br-t in net:["), std::string::npos) << what;
    EXPECT_NE(what.find("errno 17"), std::string::npos) << what;
    // The socket is still good for the next request (the refusal was read in full).
    EXPECT_GT(nl.ifindex("br-t"), 0);
}

TEST_F(NetlinkTest, RenameLink) {
    Netlink nl = Netlink::in_netns(a_.get());
    nl.add_veth("vh-t", "eth-t", b_.get());
    const int index = nl.ifindex("vh-t");
    nl.rename("vh-t", "vh-renamed");
    EXPECT_EQ(nl.ifindex("vh-renamed"), index);
    const auto names = link_names(a_.get());
    EXPECT_TRUE(names.contains("vh-renamed"));
    EXPECT_FALSE(names.contains("vh-t"));
    expect_error(Kind::not_found, [&] { nl.rename("vh-t", "vh-other"); });
    nl.add_bridge("br-t");
    expect_error(Kind::already_exists, [&] { nl.rename("vh-renamed", "br-t"); });
}

// Enough links that the dump spans several reads (each reply buffer holds a few dozen).
TEST_F(NetlinkTest, LinksWithPrefixFindsThemAllAndOnlyThem) {
    Netlink nl = Netlink::in_netns(a_.get());
    std::vector<std::string> want;
    for (int i = 0; i < 80; ++i) {
        want.push_back("bs-" + std::to_string(i));
        nl.add_bridge(want.back());
    }
    nl.add_bridge("bx-1");
    nl.add_bridge("b");
    nl.add_veth("bs-veth", "bs-peer", b_.get());  // its peer is in b: not listed
    want.push_back("bs-veth");
    std::sort(want.begin(), want.end());

    auto got = nl.links_with_prefix("bs-");
    std::sort(got.begin(), got.end());
    EXPECT_EQ(got, want);
    EXPECT_EQ(nl.links_with_prefix("bz").size(), 0u);
    EXPECT_EQ(nl.links_with_prefix("").size(), want.size() + 3);  // and bx-1, b, lo
    const auto in_b = Netlink::in_netns(b_.get()).links_with_prefix("bs-");
    EXPECT_EQ(in_b, std::vector<std::string>{"bs-peer"});
}

TEST_F(NetlinkTest, ALongestNameIsAccepted) {
    Netlink nl = Netlink::in_netns(a_.get());
    nl.add_bridge("abcdefghijklmno");  // 15 bytes, IFNAMSIZ less the NUL
    EXPECT_TRUE(link_names(a_.get()).contains("abcdefghijklmno"));
}

// Bad names and addresses are refused by the client itself: in a child whose seccomp filter
// fails every send, receive and setns, any request that reached the socket would fail with
// that filter's errno instead.
TEST_F(NetlinkTest, InvalidArgumentsAreRefusedBeforeAnythingIsSent) {
    const int ns = a_.get();
    const int other = b_.get();
    auto child = ChildProcess::fork("seccomp child", {ns, other}, [ns, other] {
        Netlink nl = Netlink::in_netns(ns);
        nl.add_bridge("br-ok");
        scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
        if (!ctx) return 2;
        for (int sc : {SCMP_SYS(sendto), SCMP_SYS(sendmsg), SCMP_SYS(recvfrom), SCMP_SYS(recvmsg),
                       SCMP_SYS(setns), SCMP_SYS(socket)}) {
            if (seccomp_rule_add(ctx, SCMP_ACT_ERRNO(ENOTSUP), sc, 0) != 0) return 3;
        }
        if (seccomp_load(ctx) != 0) return 4;
        seccomp_release(ctx);

        int failures = 0;
        auto refused = [&](const char* what, const std::function<void()>& f) {
            try {
                f();
                std::fprintf(stderr, "%s: accepted\n", what);
                ++failures;
            } catch (const Error& e) {
                if (e.kind() != Kind::invalid_argument || e.err() != 0) {
                    std::fprintf(stderr, "%s: %s\n", what, e.what());
                    ++failures;
                }
            }
        };
        const std::vector<std::string> bad = {
            "",   "abcdefghijklmnop",    "a/b", "a b", "a\tb", "a\nb", "a:b", ".",
            "..", std::string("a\0b", 3)};
        for (const auto& n : bad) {
            refused("add_bridge", [&] { nl.add_bridge(n); });
            refused("add_veth host", [&] { nl.add_veth(n, "ok", other); });
            refused("add_veth peer", [&] { nl.add_veth("ok", n, other); });
            refused("set_master link", [&] { nl.set_master(n, "br-ok"); });
            refused("set_master bridge", [&] { nl.set_master("br-ok", n); });
            refused("set_up", [&] { nl.set_up(n); });
            refused("rename from", [&] { nl.rename(n, "ok"); });
            refused("rename to", [&] { nl.rename("br-ok", n); });
            refused("delete_link", [&] { nl.delete_link(n); });
            refused("ifindex", [&] { nl.ifindex(n); });
            refused("add_address", [&] { nl.add_address(n, "10.0.0.1", 24); });
            if (!n.empty()) refused("links_with_prefix", [&] { nl.links_with_prefix(n); });
        }
        refused("add_veth fd", [&] { nl.add_veth("ok", "ok2", -1); });
        refused("address", [&] { nl.add_address("br-ok", "10.0.0.256", 24); });
        refused("address", [&] { nl.add_address("br-ok", "10.0.0.1/24", 24); });
        refused("prefix", [&] { nl.add_address("br-ok", "10.0.0.1", 33); });
        refused("prefix", [&] { nl.add_address("br-ok", "10.0.0.1", -1); });
        refused("prefix", [&] { nl.add_address("br-ok", "fd00::1", 129); });
        refused("gateway", [&] { nl.add_default_route("gateway"); });
        // And the filter does bite: a valid request fails, with its errno.
        try {
            nl.set_up("br-ok");
            std::fprintf(stderr, "a valid request got through the filter\n");
            ++failures;
        } catch (const SysError& e) {
            if (e.err() != ENOTSUP) ++failures;
        }
        return failures == 0 ? 0 : 10;
    });
    EXPECT_EQ(child.wait(), 0);
    // Nothing reached a's kernel state.
    EXPECT_EQ(link_names(a_.get()), (std::set<std::string>{"lo", "br-ok"}));
}

}  // namespace
}  // namespace berth::net
