// Pure parts of the image service's inputs: which names a short reference may mean, which
// Debian mirror the host's apt uses, which suites a bootstrap takes.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>

#include "rootfs-tools/bootstrap.h"
#include "rootfs-tools/image_lookup.h"

namespace fs = std::filesystem;
using namespace berth::images;

TEST(CandidateNames, AShortNameIsDockerHubsThenLocal) {
    auto names = candidate_names("debian:bookworm");
    ASSERT_EQ(names.size(), 2u);
    EXPECT_EQ(names[0].str(), "docker.io/library/debian:bookworm");
    EXPECT_EQ(names[1].str(), "localhost/debian:bookworm");
    names = candidate_names("org/app");
    ASSERT_EQ(names.size(), 2u);
    EXPECT_EQ(names[0].str(), "docker.io/org/app:latest");
    EXPECT_EQ(names[1].str(), "localhost/org/app:latest");
    // A registry typed: that one only.
    for (const char* full : {"docker.io/library/debian:12", "localhost/debian:12",
                             "127.0.0.1:5000/x/y:1", "ghcr.io/org/app:1", "[::1]:5000/a:b"}) {
        EXPECT_EQ(candidate_names(full).size(), 1u) << full;
    }
    EXPECT_THROW(candidate_names("UPPER/case"), std::invalid_argument);
}

class MirrorTest : public ::testing::Test {
  protected:
    void SetUp() override {
        char tmpl[] = "/tmp/berth-apt-test.XXXXXX";
        ASSERT_NE(::mkdtemp(tmpl), nullptr);
        dir_ = tmpl;
        fs::create_directories(dir_ + "/sources.list.d");
    }
    void TearDown() override { fs::remove_all(dir_); }
    void write(const std::string& rel, const std::string& text) {
        std::ofstream(dir_ + "/" + rel) << text;
    }
    std::string dir_;
};

TEST_F(MirrorTest, NoSourcesNoMirror) {
    EXPECT_FALSE(host_debian_mirror(dir_));
}

TEST_F(MirrorTest, OneLineFormatSkipsSecurityAndOptions) {
    write("sources.list",
          "# comment\n"
          "deb http://security.debian.org/debian-security bookworm-security main\n"
          "deb-src http://deb.example.org/debian bookworm main\n"
          "deb [arch=amd64 signed-by=/k.gpg] http://mirror.example.org/debian bookworm main\n");
    EXPECT_EQ(host_debian_mirror(dir_), "http://mirror.example.org/debian");
}

TEST_F(MirrorTest, Deb822FilesInOrderAndOnlyAptsSuffixes) {
    write("sources.list.d/a.list.disabled", "deb http://wrong.example.org/debian bookworm main\n");
    write("sources.list.d/b.sources",
          "Types: deb\n"
          "URIs: http://deb.debian.org/debian-security\n"
          "Suites: bookworm-security\n"
          "\n"
          "Types: deb deb-src\n"
          "URIs: http://deb.debian.org/debian\n"
          "Suites: bookworm bookworm-updates\n"
          "Components: main\n");
    write("sources.list.d/c.list", "deb https://packages.cloud.google.com/apt cloud-sdk main\n");
    EXPECT_EQ(host_debian_mirror(dir_), "http://deb.debian.org/debian");
    write("sources.list.d/a.sources",
          "Enabled: no\nTypes: deb\nURIs: http://off.example.org/debian\nSuites: bookworm\n");
    EXPECT_EQ(host_debian_mirror(dir_), "http://deb.debian.org/debian");
}

TEST(DebianSuite, OnlyDebianSuitesDebootstrapKnows) {
    if (fs::exists("/usr/share/debootstrap/scripts/bookworm")) {
        EXPECT_EQ(debian_suite("debian:bookworm"), "bookworm");
    }
    for (const char* bad : {"debian", "debian:", "ubuntu:noble", "debian:../../etc",
                            "debian:Bookworm", "debian:no-such-suite", "debian:nosuchsuite"}) {
        EXPECT_THROW(debian_suite(bad), std::invalid_argument) << bad;
    }
}
