// What berthd refuses of a client's fields before it acts (src/runtime/daemon/validate.h).
#include "runtime/daemon/validate.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

using namespace berth::daemon;

namespace {

bool starts_with(const std::string& s, const std::string& prefix) {
    return s.compare(0, prefix.size(), prefix) == 0;
}

}  // namespace

TEST(Validate, NamesThatCouldBeIdPrefixesAreRefused) {
    EXPECT_EQ(check_sandbox_name("web-1"), "");
    EXPECT_EQ(check_sandbox_name("abc"), "");       // too short to be a prefix
    EXPECT_EQ(check_sandbox_name("cafe-1"), "");    // not all hex
    EXPECT_EQ(check_sandbox_name("Deadbeef"), "");  // ids are lowercase
    EXPECT_NE(check_sandbox_name("dead"), "");
    EXPECT_NE(check_sandbox_name("0123456789ab"), "");  // somebody's short id
    EXPECT_NE(check_sandbox_name(std::string(32, 'a')), "");
    EXPECT_TRUE(starts_with(check_sandbox_name("beef"), "name 'beef' could be read as"));
}

TEST(Validate, NameCharacters) {
    EXPECT_NE(check_sandbox_name(""), "");
    EXPECT_NE(check_sandbox_name("-x"), "");
    EXPECT_NE(check_sandbox_name(".x"), "");
    EXPECT_NE(check_sandbox_name("a/b"), "");
    EXPECT_NE(check_sandbox_name(std::string("a\0b", 3)), "");
    EXPECT_NE(check_sandbox_name(std::string(65, 'x')), "");
    EXPECT_EQ(check_sandbox_name(std::string(64, 'x')), "");
}

TEST(Validate, UserSpecs) {
    for (const char* ok :
         {"", "root", "0", "1000", "alice:staff", "1000:1000", "4294967294", "www-data", "a.b_c"}) {
        EXPECT_EQ(check_user_spec("user", ok), "") << ok;
    }
    // (uid_t)-1 is "leave unchanged" to setresuid: it would keep root.
    EXPECT_NE(check_user_spec("user", "4294967295"), "");
    EXPECT_NE(check_user_spec("user", "0:4294967295"), "");
    EXPECT_NE(check_user_spec("user", "99999999999999999999"), "");
    EXPECT_NE(check_user_spec("user", ":0"), "");
    EXPECT_NE(check_user_spec("user", "0:"), "");
    EXPECT_NE(check_user_spec("user", "a:b:c"), "");
    EXPECT_NE(check_user_spec("user", "bad name"), "");
    EXPECT_NE(check_user_spec("user", std::string("root\0x", 6)), "");
    EXPECT_NE(check_user_spec("user", std::string(33, 'u')), "");
    EXPECT_TRUE(starts_with(check_user_spec("user", "4294967295"), "user: "));
}

TEST(Validate, ResourcesRefuseNanInfinityAndAbsurdValues) {
    berth::v1::Resources r;
    EXPECT_EQ(check_resources(r), "");
    r.set_cpus(1.5);
    EXPECT_EQ(check_resources(r), "");
    for (double bad : {std::nan(""), std::numeric_limits<double>::infinity(), -1.0, 1025.0}) {
        r.set_cpus(bad);
        EXPECT_TRUE(starts_with(check_resources(r), "cpus: ")) << bad;
    }
    r.set_cpus(0);
    r.set_memory_bytes(1);
    EXPECT_TRUE(starts_with(check_resources(r), "memory: "));
    r.set_memory_bytes(uint64_t{1} << 62);
    EXPECT_TRUE(starts_with(check_resources(r), "memory: "));
    r.set_memory_bytes(0);
    r.set_pids(uint64_t{1} << 40);
    EXPECT_TRUE(starts_with(check_resources(r), "pids: "));
}

TEST(Validate, CreateFields) {
    berth::v1::CreateSandbox c;
    EXPECT_NE(check_create(c), "");  // neither image nor rootfs
    c.set_image("busybox");
    EXPECT_EQ(check_create(c), "");
    c.set_rootfs("/srv/root");
    EXPECT_NE(check_create(c), "");  // both
    {
        berth::v1::CreateSandbox g;
        g.set_image("busybox");
        for (const std::string& ok :
             {std::string(), std::string("g1"), std::string("a.b_c-D"), std::string(64, 'x')}) {
            g.set_peer_group(ok);
            EXPECT_EQ(check_create(g), "") << ok;
        }
        for (const std::string& bad :
             {std::string("a/b"), std::string(65, 'x'), std::string("0:g"), std::string("sp ace"),
              std::string("semi;colon"), std::string("nul\0x", 5)}) {
            g.set_peer_group(bad);
            EXPECT_NE(check_create(g).find("peer_group"), std::string::npos) << bad;
        }
    }
    c.clear_image();
    EXPECT_EQ(check_create(c), "");
    c.set_rootfs(std::string("/srv/root\0/etc", 14));
    EXPECT_TRUE(starts_with(check_create(c), "rootfs: contains a NUL"));
    c.set_rootfs("relative/dir");
    EXPECT_EQ(check_create(c),
              "rootfs: 'relative/dir' is not an absolute path (a directory on the host)");
    c.set_rootfs("/srv/root");
    c.set_hostname("bad host");
    EXPECT_TRUE(starts_with(check_create(c), "hostname: "));
    c.set_hostname("ok-host.example");
    c.set_workdir("relative");
    EXPECT_TRUE(starts_with(check_create(c), "workdir: "));
    c.set_workdir("/work");
    c.mutable_resources()->set_cpus(std::nan(""));
    EXPECT_TRUE(starts_with(check_create(c), "cpus: "));
}

TEST(Validate, ExecFields) {
    berth::v1::Exec e;
    EXPECT_TRUE(starts_with(check_exec(e), "argv: "));
    e.add_argv("true");
    EXPECT_EQ(check_exec(e), "");
    e.add_argv(std::string("a\0b", 3));
    EXPECT_TRUE(starts_with(check_exec(e), "argv: "));
    e.mutable_argv()->RemoveLast();
    e.add_env("NOEQUALS");
    EXPECT_TRUE(starts_with(check_exec(e), "env: "));
    e.clear_env();
    e.add_env("=value");
    EXPECT_TRUE(starts_with(check_exec(e), "env: "));
    e.clear_env();
    e.add_env("K=v=w");  // '=' in the value is fine
    EXPECT_EQ(check_exec(e), "");
    e.set_user("4294967295");
    EXPECT_TRUE(starts_with(check_exec(e), "user: "));
    e.set_user("alice");
    e.set_cwd(std::string("/tmp\0x", 6));
    EXPECT_TRUE(starts_with(check_exec(e), "cwd: "));
    e.set_cwd("rel/ok");
    EXPECT_EQ(check_exec(e), "");
    e.set_timeout_ms(uint64_t{1} << 60);
    EXPECT_TRUE(starts_with(check_exec(e), "timeout: "));
}
