#include "rootfs-tools/reference.h"

#include <gtest/gtest.h>

using namespace berth::images;

namespace {
const std::string kDigest = "sha256:" + std::string(64, 'a');
}

TEST(Reference, NormalizesLikeDocker) {
    struct Case {
        const char* text;
        const char* full;
        const char* familiar;
    } cases[] = {
        {"debian", "docker.io/library/debian:latest", "debian:latest"},
        {"debian:bookworm", "docker.io/library/debian:bookworm", "debian:bookworm"},
        {"library/debian:12", "docker.io/library/debian:12", "debian:12"},
        {"docker.io/library/busybox", "docker.io/library/busybox:latest", "busybox:latest"},
        {"org/app:v1.2-rc_3", "docker.io/org/app:v1.2-rc_3", "org/app:v1.2-rc_3"},
        {"ghcr.io/org/team/app:1", "ghcr.io/org/team/app:1", "ghcr.io/org/team/app:1"},
        {"localhost:5000/x", "localhost:5000/x:latest", "localhost:5000/x:latest"},
        {"localhost/x:y", "localhost/x:y", "localhost/x:y"},
        {"127.0.0.1:5000/a/b:c", "127.0.0.1:5000/a/b:c", "127.0.0.1:5000/a/b:c"},
        {"[::1]:5000/a:b", "[::1]:5000/a:b", "[::1]:5000/a:b"},
        {"a.b-c_d__e---f", "docker.io/library/a.b-c_d__e---f:latest", "a.b-c_d__e---f:latest"},
        {"Registry.Example.COM/x", "Registry.Example.COM/x:latest",
         "Registry.Example.COM/x:latest"},
        // (found by tests/fuzz/reference) Short, these would name a registry foo.bar or
        // localhost: they keep docker.io.
        {"docker.io/foo.bar/x", "docker.io/foo.bar/x:latest", "docker.io/foo.bar/x:latest"},
        {"docker.io/localhost/x:1", "docker.io/localhost/x:1", "docker.io/localhost/x:1"},
    };
    for (const auto& c : cases) {
        Reference r = parse_reference(c.text);
        EXPECT_EQ(r.str(), c.full) << c.text;
        EXPECT_EQ(r.familiar(), c.familiar) << c.text;
        EXPECT_EQ(parse_reference(r.str()), r) << "round trip of " << c.text;
        EXPECT_EQ(parse_reference(r.familiar()), r) << "familiar round trip of " << c.text;
    }
}

TEST(Reference, DigestPinsWithOrWithoutTag) {
    Reference r = parse_reference("busybox@" + kDigest);
    EXPECT_EQ(r.repository, "library/busybox");
    EXPECT_FALSE(r.tag);  // a digest alone does not mean :latest
    ASSERT_TRUE(r.digest);
    EXPECT_EQ(r.digest->str(), kDigest);
    EXPECT_EQ(r.str(), "docker.io/library/busybox@" + kDigest);
    Reference both = parse_reference("localhost:5000/x:1@" + kDigest);
    EXPECT_EQ(both.registry, "localhost:5000");
    EXPECT_EQ(both.tag, "1");
    EXPECT_EQ(both.str(), "localhost:5000/x:1@" + kDigest);
}

TEST(Reference, RefusesWhatIsNotAReference) {
    for (std::string bad : {std::string(""),
                            std::string(":tag"),
                            std::string("Debian"),
                            std::string("debian:"),
                            std::string("debian:-x"),
                            std::string("debian:a/b"),
                            std::string("/debian"),
                            std::string("debian/"),
                            std::string("a//b"),
                            std::string("a/../b"),
                            std::string("a..b"),
                            std::string("-a"),
                            std::string("a-"),
                            std::string("a b"),
                            std::string("a@sha256:abc"),
                            std::string("a@md5:" + std::string(32, 'a')),
                            std::string("bad_host.:5000/x"),
                            std::string("host:port/x"),
                            std::string("host:123456/x"),
                            std::string("[::1/x"),
                            std::string("x:" + std::string(129, 't')),
                            std::string("r.io/" + std::string(260, 'a'))}) {
        EXPECT_THROW(parse_reference(bad), std::invalid_argument) << "'" << bad << "'";
    }
    try {
        parse_reference("Debian:12");
        FAIL();
    } catch (const std::invalid_argument& e) {
        EXPECT_NE(std::string(e.what()).find("'Debian'"), std::string::npos) << e.what();
    }
}
