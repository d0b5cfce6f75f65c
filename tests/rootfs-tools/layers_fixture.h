// For the tests that need real image layers (root): a scratch directory with the layers,
// layouts and archives make_layers.py writes, and a read-only overlay of unpacked layers
// to look at them as a sandbox would.
#pragma once

#include <gtest/gtest.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

namespace berth::images::testing {

class LayersFixture : public ::testing::Test {
  protected:
    void SetUp() override {
        if (::geteuid() != 0) GTEST_SKIP() << "needs root (mknod, trusted xattrs, mount)";
        char tmpl[] = "/var/tmp/berth-layers-test.XXXXXX";
        ASSERT_NE(::mkdtemp(tmpl), nullptr);
        dir_ = tmpl;
        const std::string cmd =
            "/usr/bin/python3 " + std::string(SOURCE_DIR) + "/make_layers.py " + dir_;
        ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    }
    void TearDown() override {
        if (mounted_) ::umount2(mounted_->c_str(), MNT_DETACH);
        if (!dir_.empty()) std::filesystem::remove_all(dir_);
    }

    // Mounts `lowers` (top first) read-only at dir_/merged and returns that path. Layers of an
    // ImageStore (format 2: user.overlay.opaque) need `userxattr`, as the helper mounts them.
    std::string mount_lowers(const std::vector<std::string>& lowers, bool userxattr = false) {
        const std::string merged = dir_ + "/merged";
        std::filesystem::create_directory(merged);
        std::string opts = userxattr ? "userxattr,lowerdir=" : "lowerdir=";
        for (size_t i = 0; i < lowers.size(); ++i) opts += (i ? ":" : "") + lowers[i];
        if (::mount("overlay", merged.c_str(), "overlay", MS_RDONLY, opts.c_str()) != 0) {
            ADD_FAILURE() << "mount overlay " << opts << ": " << std::strerror(errno);
            return merged;
        }
        mounted_ = merged;
        return merged;
    }
    static std::string read(const std::string& path) {
        std::ifstream in(path, std::ios::binary);
        return std::string(std::istreambuf_iterator<char>(in), {});
    }

    std::string dir_;

  private:
    std::optional<std::string> mounted_;
};

}  // namespace berth::images::testing
