// Layers unpacked into overlayfs's on-disk form, then mounted as the lower layers of a real
// overlay: what a sandbox would see must be exactly the image's files. Needs root (mknod,
// trusted.* xattrs, chown, mount).
#include "rootfs-tools/layer.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "base/error.h"
#include "base/unique_fd.h"
#include "rootfs-tools/decompress.h"
#include "tests/rootfs-tools/layers_fixture.h"

namespace fs = std::filesystem;
using namespace berth;
using namespace berth::images;

namespace {

constexpr uint32_t kShift = 200000;

class LayerTest : public berth::images::testing::LayersFixture {
  protected:
    UnpackResult unpack(const std::string& blob, Compression c, const std::string& dest,
                        std::optional<Digest> diff_id = {}) {
        UniqueFd fd(::open((dir_ + "/" + blob).c_str(), O_RDONLY | O_CLOEXEC));
        if (!fd) throw_sys("open", blob);
        UnpackOptions o;
        o.uid_shift = kShift;
        o.gid_shift = kShift;
        o.diff_id = diff_id;
        return unpack_layer(fd.get(), c, dir_ + "/" + dest, o);
    }
    struct stat lstat_of(const std::string& path) {
        struct stat st {};
        EXPECT_EQ(::lstat(path.c_str(), &st), 0) << path;
        return st;
    }
    std::string xattr(const std::string& path, const char* name) {
        char buf[256];
        ssize_t n = ::lgetxattr(path.c_str(), name, buf, sizeof buf);
        return n < 0 ? std::string("<none>") : std::string(buf, static_cast<size_t>(n));
    }
};

}  // namespace

TEST_F(LayerTest, UnpacksIntoOverlayFormAndMountsToTheImage) {
    const UnpackResult r1 = unpack("layer1.tar.gz", Compression::gzip, "l1");
    const std::string l1 = dir_ + "/l1";
    EXPECT_EQ(r1.diff_id, sha256_of(read(dir_ + "/layer1.tar")));
    // Owners shifted into the sandboxes' range; setuid kept; hardlink kept.
    struct stat tool = lstat_of(l1 + "/usr/bin/tool");
    EXPECT_EQ(tool.st_uid, kShift);
    EXPECT_EQ(tool.st_mode & 07777, 04755u);
    EXPECT_EQ(lstat_of(l1 + "/usr/bin/tool2").st_ino, tool.st_ino);
    EXPECT_EQ(lstat_of(l1 + "/home/user/file").st_uid, kShift + 1000);
    EXPECT_EQ(lstat_of(l1).st_uid, kShift);
    EXPECT_EQ(lstat_of(l1).st_mode & 07777, 0755u);
    EXPECT_EQ(fs::read_symlink(l1 + "/lnk"), "/etc/a");
    // xattrs: user.* applied, an overlay one refused (it would steer overlayfs).
    EXPECT_EQ(xattr(l1 + "/etc/xattr", "user.test"), "hello");
    EXPECT_EQ(xattr(l1 + "/etc/xattr", "trusted.overlay.redirect"), "<none>");
    EXPECT_NE(std::find_if(r1.warnings.begin(), r1.warnings.end(),
                           [](const std::string& w) {
                               return w.find("trusted.overlay.redirect") != std::string::npos;
                           }),
              r1.warnings.end());
    // No device node but whiteouts comes out of a layer (HostileLayers has the rest).
    EXPECT_FALSE(fs::exists(fs::symlink_status(l1 + "/dev/null")));
    EXPECT_TRUE(S_ISFIFO(lstat_of(l1 + "/dev/fifo").st_mode));
    EXPECT_EQ(read(l1 + "/data/" + std::string(150, 'n')), "long name\n");

    const UnpackResult r2 =
        unpack("layer2.tar.zst", Compression::zstd, "l2", sha256_of(read(dir_ + "/layer2.tar")));
    const std::string l2 = dir_ + "/l2";
    struct stat wh = lstat_of(l2 + "/etc/b");
    EXPECT_TRUE(S_ISCHR(wh.st_mode) && wh.st_rdev == makedev(0, 0)) << "etc/b is no whiteout";
    EXPECT_EQ(xattr(l2 + "/data", "trusted.overlay.opaque"), "y");
    // usr/ and usr/bin/ are not in layer 2's tar (only a whiteout inside them): made for
    // it, they belong to the sandboxes' root, like every other directory of the image.
    EXPECT_EQ(lstat_of(l2 + "/usr/bin").st_uid, kShift);
    EXPECT_EQ(lstat_of(l2 + "/usr").st_mode & 07777, 0755u);

    // What a sandbox sees.
    const std::string merged = mount_lowers({l2, l1});
    EXPECT_EQ(read(merged + "/etc/a"), "a2\n");
    EXPECT_FALSE(fs::exists(fs::symlink_status(merged + "/etc/b")));
    std::vector<std::string> data;
    for (const auto& e : fs::directory_iterator(merged + "/data"))
        data.push_back(e.path().filename().string());
    EXPECT_EQ(data, std::vector<std::string>{"new"});
    EXPECT_TRUE(fs::exists(merged + "/usr/bin/tool"));
    EXPECT_FALSE(fs::exists(fs::symlink_status(merged + "/usr/bin/tool2")));
    EXPECT_EQ(read(merged + "/home/user/file"), "mine\n");
}

TEST_F(LayerTest, HostileOrWrongLayersLeaveNothing) {
    for (const char* bad :
         {"bad-dotdot.tar", "bad-absolute.tar", "bad-whiteout.tar", "bad-hardlink.tar"}) {
        EXPECT_THROW(unpack(bad, Compression::none, "bad"), SysError) << bad;
        EXPECT_FALSE(fs::exists(dir_ + "/bad")) << bad;
    }
    EXPECT_FALSE(fs::exists(dir_ + "/escape"));
    // A diff_id that does not match: refused, nothing under the name.
    EXPECT_THROW(unpack("layer2.tar", Compression::none, "l2", sha256_of("other")), ManifestError);
    EXPECT_FALSE(fs::exists(dir_ + "/l2"));
    // A corrupt blob: the decompressor's error, nothing under the name.
    std::string gz = read(dir_ + "/layer1.tar.gz");
    gz.resize(gz.size() / 2);
    std::ofstream(dir_ + "/cut.gz", std::ios::binary) << gz;
    EXPECT_THROW(unpack("cut.gz", Compression::gzip, "cut"), DecompressError);
    EXPECT_FALSE(fs::exists(dir_ + "/cut"));
    // Nor any temporary beside it.
    for (const auto& e : fs::directory_iterator(dir_))
        EXPECT_EQ(e.path().filename().string().find(".unpacking-"), std::string::npos) << e.path();
    // An existing destination is never overwritten.
    unpack("layer2.tar", Compression::none, "l2");
    EXPECT_THROW(unpack("layer2.tar", Compression::none, "l2"), SysError);
}

// umoci 0.4.7's `insert` writes layers without the end-of-archive blocks. A layer that
// stops cleanly after an entry unpacks (its diff_id vouches for its bytes); one that stops
// inside an entry, or after a pax header with no entry, is still truncated.
TEST_F(LayerTest, ALayerWithoutTheEndMarkerUnpacksButACutOneDoesNot) {
    std::string tar = read(dir_ + "/layer1.tar");
    size_t end = tar.size();
    while (end >= 512 && tar.find_first_not_of('\0', end - 512) >= end) end -= 512;
    ASSERT_LT(end, tar.size());
    const std::string unterminated = tar.substr(0, end);
    std::ofstream(dir_ + "/unterminated.tar", std::ios::binary) << unterminated;
    const UnpackResult r =
        unpack("unterminated.tar", Compression::none, "u", sha256_of(unterminated));
    EXPECT_EQ(r.entries, unpack("layer1.tar", Compression::none, "full").entries);

    // Cut in the middle of the last entry's data (not on a header boundary).
    std::ofstream(dir_ + "/cut.tar", std::ios::binary) << unterminated.substr(0, end - 100);
    EXPECT_THROW(unpack("cut.tar", Compression::none, "cut"), SysError);
    EXPECT_FALSE(fs::exists(dir_ + "/cut"));
    // A pax header whose entry never comes.
    std::string pax_only = unterminated;
    std::string body = "30 path=a-name-never-written\n";
    char header[512] = {};
    std::snprintf(header, 100, "PaxHeaders/x");
    std::snprintf(header + 100, 8, "%07o", 0644);
    std::snprintf(header + 108, 8, "%07o", 0);
    std::snprintf(header + 116, 8, "%07o", 0);
    std::snprintf(header + 124, 12, "%011o", static_cast<unsigned>(body.size()));
    std::snprintf(header + 136, 12, "%011o", 0);
    header[156] = 'x';
    std::memcpy(header + 257, "ustar", 6);
    std::memcpy(header + 263, "00", 2);
    std::memset(header + 148, ' ', 8);
    unsigned sum = 0;
    for (unsigned char c : header) sum += c;
    std::snprintf(header + 148, 8, "%06o", sum);
    pax_only.append(header, 512);
    body.resize(512, '\0');
    pax_only += body;
    std::ofstream(dir_ + "/pax-only.tar", std::ios::binary) << pax_only;
    EXPECT_THROW(unpack("pax-only.tar", Compression::none, "pax"), SysError);
    EXPECT_FALSE(fs::exists(dir_ + "/pax"));
}

// Rootless: the unpacking user is root only in a user namespace of its own (uids 0-65535
// mapped to 300000-365535 here, as newuidmap would map a user's subordinate ids), with no
// capability on the host. Opaque dirs get user.overlay.opaque (trusted.* is out of reach),
// devices are skipped with a warning, whiteouts are still made (Linux >= 5.8 lets anyone
// make a 0/0 char device), owners are the image's own inside the namespace, and an overlay
// mounted there with `userxattr` shows the image.
TEST_F(LayerTest, RootlessUnpackUsesUserXattrsAndSkipsDevices) {
    constexpr uid_t kOutside = 300000;
    const std::string work = dir_ + "/rootless";
    // The unprivileged user must reach the blobs (the fixture's dir is root's, 0700).
    ASSERT_EQ(::chmod(dir_.c_str(), 0755), 0);
    fs::create_directory(work);
    ASSERT_EQ(::chown(work.c_str(), kOutside, kOutside), 0);
    int report[2], go[2];
    ASSERT_EQ(::pipe(report), 0);
    ASSERT_EQ(::pipe(go), 0);
    pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
        ::close(report[0]);
        ::close(go[1]);
        std::string out;
        auto say = [&](const std::string& k, const std::string& v) { out += k + "=" + v + "\n"; };
        try {
            if (::unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0) throw_sys("unshare", "userns");
            (void)!::write(report[1], "u", 1);  // now our maps can be written
            char c;
            if (::read(go[0], &c, 1) != 1) _exit(3);  // the parent wrote our id maps
            if (::setresgid(0, 0, 0) != 0 || ::setresuid(0, 0, 0) != 0) throw_sys("setresuid", "0");
            UnpackOptions o;
            o.rootless = true;
            auto unpack_as_user = [&](const char* blob, Compression comp, const char* dest) {
                UniqueFd fd(::open((dir_ + "/" + blob).c_str(), O_RDONLY | O_CLOEXEC));
                return unpack_layer(fd.get(), comp, work + "/" + dest, o);
            };
            const UnpackResult r1 = unpack_as_user("layer1.tar.gz", Compression::gzip, "l1");
            unpack_as_user("layer2.tar.zst", Compression::zstd, "l2");
            say("dev_null",
                fs::exists(fs::symlink_status(work + "/l1/dev/null")) ? "present" : "absent");
            bool warned = false;
            for (const auto& w : r1.warnings) warned |= w.find("dev/null") != std::string::npos;
            say("device_warning", warned ? "yes" : "no");
            say("user_opaque", xattr(work + "/l2/data", "user.overlay.opaque"));
            struct stat wh {};
            ::lstat((work + "/l2/etc/b").c_str(), &wh);
            say("whiteout", S_ISCHR(wh.st_mode) && wh.st_rdev == makedev(0, 0) ? "yes" : "no");
            const std::string merged = work + "/merged";
            fs::create_directory(merged);
            const std::string opts = "userxattr,lowerdir=" + work + "/l2:" + work + "/l1";
            if (::mount("overlay", merged.c_str(), "overlay", MS_RDONLY, opts.c_str()) != 0)
                throw_sys("mount overlay (userxattr)", merged);
            say("merged_b",
                fs::exists(fs::symlink_status(merged + "/etc/b")) ? "present" : "absent");
            std::string data;
            for (const auto& e : fs::directory_iterator(merged + "/data"))
                data += e.path().filename().string() + ",";
            say("merged_data", data);
            say("merged_a", read(merged + "/etc/a"));
        } catch (const std::exception& e) {
            say("error", e.what());
        }
        (void)!::write(report[1], out.data(), out.size());
        _exit(0);
    }
    ::close(report[1]);
    ::close(go[0]);
    char unshared = 0;
    ASSERT_EQ(::read(report[0], &unshared, 1), 1);
    const std::string map = "0 " + std::to_string(kOutside) + " 65536\n";
    const std::string proc = "/proc/" + std::to_string(child);
    std::ofstream(proc + "/uid_map") << map;
    std::ofstream(proc + "/gid_map") << map;
    ASSERT_EQ(::write(go[1], "g", 1), 1);
    ::close(go[1]);
    std::string text;
    char buf[4096];
    for (ssize_t n; (n = ::read(report[0], buf, sizeof buf)) > 0;) text.append(buf, n);
    ::close(report[0]);
    int status = 0;
    ::waitpid(child, &status, 0);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
    EXPECT_EQ(text.find("error="), std::string::npos) << text;
    EXPECT_NE(text.find("dev_null=absent\n"), std::string::npos) << text;
    EXPECT_NE(text.find("device_warning=yes\n"), std::string::npos) << text;
    EXPECT_NE(text.find("user_opaque=y\n"), std::string::npos) << text;
    EXPECT_NE(text.find("whiteout=yes\n"), std::string::npos) << text;
    EXPECT_NE(text.find("merged_b=absent\n"), std::string::npos) << text;
    EXPECT_NE(text.find("merged_data=new,\n"), std::string::npos) << text;
    EXPECT_NE(text.find("merged_a=a2\n"), std::string::npos) << text;
    // Seen from the host: the image's ids inside the namespace, shifted by its map.
    EXPECT_EQ(lstat_of(work + "/l1/usr/bin/tool").st_uid, kOutside);
    EXPECT_EQ(lstat_of(work + "/l1/home/user/file").st_uid, kOutside + 1000);
    EXPECT_EQ(xattr(work + "/l2/data", "trusted.overlay.opaque"), "<none>");
}
