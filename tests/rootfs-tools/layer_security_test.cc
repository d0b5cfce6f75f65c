// What a hostile layer can do to the host, tried as an attacker would and now getting
// nothing: device nodes (a real loop device the test makes), file capabilities and setuid
// bits (run by an unprivileged host user, and in a user namespace rooted at the sandboxes'
// root, where a namespaced capability must still work), other xattrs, and layers that
// expand past the store's bounds (zeros, a sparse file, many entries). Needs root.
#include <fcntl.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <linux/capability.h>
#include <sched.h>
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
#include "rootfs-tools/image_store.h"
#include "rootfs-tools/layer.h"
#include "tests/rootfs-tools/layers_fixture.h"
#include "transfer/file_caps.h"

namespace fs = std::filesystem;
using namespace berth;
using namespace berth::images;

namespace {

constexpr uint32_t kShift = 200000;
constexpr uid_t kNobody = 65534;

// The program a capability is put on: tries to become uid 0 and says what it is then.
constexpr const char* kSetuidProgram = R"(
#include <stdio.h>
#include <unistd.h>
int main(void) {
    int rc = setuid(0);
    printf("setuid=%d uid=%d euid=%d\n", rc, (int)getuid(), (int)geteuid());
    return 0;
}
)";

bool has_warning(const UnpackResult& r, const std::string& part) {
    return std::any_of(r.warnings.begin(), r.warnings.end(),
                       [&](const std::string& w) { return w.find(part) != std::string::npos; });
}

std::string run_capture(const std::string& cmd) {
    std::string out;
    FILE* p = ::popen(cmd.c_str(), "r");
    if (!p) return out;
    char buf[4096];
    for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
    ::pclose(p);
    return out;
}

class LayerSecurityTest : public berth::images::testing::LayersFixture {
  protected:
    std::string hostile(const std::string& name, const std::string& args) {
        const std::string out = dir_ + "/" + name;
        const std::string cmd = "/usr/bin/python3 " + std::string(SOURCE_DIR) +
                                "/hostile_layers.py " + out + " " + args;
        EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
        return out;
    }
    UnpackResult unpack(const std::string& blob, const std::string& dest,
                        UnpackOptions o = defaults(), Compression c = Compression::none) {
        UniqueFd fd(::open(blob.c_str(), O_RDONLY | O_CLOEXEC));
        if (!fd) throw_sys("open", blob);
        return unpack_layer(fd.get(), c, dir_ + "/" + dest, o);
    }
    static UnpackOptions defaults() {
        UnpackOptions o;
        o.uid_shift = kShift;
        o.gid_shift = kShift;
        return o;
    }
    std::string xattr(const std::string& path, const char* name) {
        char buf[256];
        ssize_t n = ::lgetxattr(path.c_str(), name, buf, sizeof buf);
        return n < 0 ? std::string("<none>") : std::string(buf, static_cast<size_t>(n));
    }
    // Nothing of a refused layer: neither its name nor a temporary beside it.
    void expect_nothing_left(const std::string& dest) {
        EXPECT_FALSE(fs::exists(fs::symlink_status(dir_ + "/" + dest))) << dest;
        for (const auto& e : fs::directory_iterator(dir_))
            EXPECT_EQ(e.path().filename().string().find(".unpacking-"), std::string::npos)
                << e.path();
    }
    // Runs `path` as the host user nobody (no capability, outside any namespace).
    std::string run_as_nobody(const std::string& path) {
        return run_capture("setpriv --reuid=" + std::to_string(kNobody) + " --regid=" +
                           std::to_string(kNobody) + " --clear-groups " + path + " 2>&1");
    }
    // Runs `path` as uid `inside` of a user namespace whose 0 is the host's kShift (a
    // sandbox's), with no no_new_privs: where a namespaced file capability must work.
    std::string run_in_sandbox_userns(const std::string& path, uid_t inside) {
        int to_parent[2], go[2], out[2];
        if (::pipe(to_parent) || ::pipe(go) || ::pipe(out)) return "pipe failed";
        const pid_t child = ::fork();
        if (child == 0) {
            ::close(to_parent[0]);
            ::close(go[1]);
            ::close(out[0]);
            if (::unshare(CLONE_NEWUSER) != 0) _exit(10);
            (void)!::write(to_parent[1], "u", 1);
            char c;
            if (::read(go[0], &c, 1) != 1) _exit(11);
            if (::setgroups(0, nullptr) != 0 && errno != EPERM) _exit(12);
            if (::setresgid(inside, inside, inside) != 0) _exit(13);
            if (::setresuid(inside, inside, inside) != 0) _exit(14);
            ::dup2(out[1], 1);
            ::dup2(out[1], 2);
            ::execl(path.c_str(), path.c_str(), nullptr);
            _exit(15);
        }
        ::close(to_parent[1]);
        ::close(go[0]);
        ::close(out[1]);
        char c;
        if (::read(to_parent[0], &c, 1) != 1) return "child did not unshare";
        const std::string proc = "/proc/" + std::to_string(child);
        const std::string map = "0 " + std::to_string(kShift) + " 65536\n";
        std::ofstream(proc + "/uid_map") << map;
        std::ofstream(proc + "/gid_map") << map;
        (void)!::write(go[1], "g", 1);
        ::close(go[1]);
        std::string text;
        char buf[1024];
        for (ssize_t n; (n = ::read(out[0], buf, sizeof buf)) > 0;) text.append(buf, n);
        ::close(out[0]);
        ::close(to_parent[0]);
        int status = 0;
        ::waitpid(child, &status, 0);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
            text += "exit status " + std::to_string(status);
        return text;
    }
};

// A loop device on a small file, detached at the end.
struct LoopDevice {
    std::string backing, dev;
    explicit LoopDevice(const std::string& file) : backing(file) {
        std::ofstream(file, std::ios::binary) << std::string(1 << 20, 'L');
        dev = run_capture("losetup --find --show " + file);
        while (!dev.empty() && dev.back() == '\n') dev.pop_back();
    }
    ~LoopDevice() {
        if (!dev.empty()) (void)!std::system(("losetup -d " + dev).c_str());
    }
};

}  // namespace

// A layer's block device (a real loop device), /dev/mem and /dev/null: none is made, each
// is a warning; whiteouts (the OCI .wh. form and overlay's own 0/0 device) and fifos are.
// And through an overlay of the layer, writing where the device was reaches no device.
TEST_F(LayerSecurityTest, NoDeviceComesOutOfALayerButWhiteouts) {
    LoopDevice loop(dir_ + "/loop-backing");
    ASSERT_FALSE(loop.dev.empty()) << "losetup failed";
    struct stat dev {};
    ASSERT_EQ(::stat(loop.dev.c_str(), &dev), 0) << loop.dev;
    ASSERT_TRUE(S_ISBLK(dev.st_mode));
    const std::string tar = hostile("devices.tar", "devices " + std::to_string(major(dev.st_rdev)) +
                                                       " " + std::to_string(minor(dev.st_rdev)));
    const UnpackResult r = unpack(tar, "l");
    const std::string l = dir_ + "/l";
    for (const char* gone : {"/nodes/blk", "/nodes/mem", "/nodes/null"})
        EXPECT_FALSE(fs::exists(fs::symlink_status(l + gone))) << gone;
    EXPECT_TRUE(has_warning(r, "nodes/blk: block device " + std::to_string(major(dev.st_rdev))))
        << ::testing::PrintToString(r.warnings);
    EXPECT_TRUE(has_warning(r, "nodes/mem: character device 1:1"));
    EXPECT_TRUE(has_warning(r, "nodes/null: character device 1:3"));
    struct stat st {};
    ASSERT_EQ(::lstat((l + "/nodes/zero-wh").c_str(), &st), 0);
    EXPECT_TRUE(S_ISCHR(st.st_mode) && st.st_rdev == makedev(0, 0));
    ASSERT_EQ(::lstat((l + "/etc/gone").c_str(), &st), 0);
    EXPECT_TRUE(S_ISCHR(st.st_mode) && st.st_rdev == makedev(0, 0));
    ASSERT_EQ(::lstat((l + "/nodes/fifo").c_str(), &st), 0);
    EXPECT_TRUE(S_ISFIFO(st.st_mode));
    // No device node anywhere in the layer but 0/0 ones.
    for (const auto& e : fs::recursive_directory_iterator(l)) {
        ASSERT_EQ(::lstat(e.path().c_str(), &st), 0);
        if (S_ISBLK(st.st_mode) || S_ISCHR(st.st_mode)) {
            EXPECT_EQ(st.st_rdev, makedev(0, 0)) << e.path();
        }
    }

    // As a sandbox would write it: into a writable overlay of the layer.
    const std::string upper = dir_ + "/upper", work = dir_ + "/work", merged = dir_ + "/m";
    for (const auto& d : {upper, work, merged}) fs::create_directory(d);
    const std::string opts = "lowerdir=" + l + ",upperdir=" + upper + ",workdir=" + work;
    ASSERT_EQ(::mount("overlay", merged.c_str(), "overlay", 0, opts.c_str()), 0)
        << std::strerror(errno);
    { std::ofstream(merged + "/nodes/blk") << "written from the sandbox"; }
    ::umount2(merged.c_str(), MNT_DETACH);
    EXPECT_EQ(read(loop.backing), std::string(1 << 20, 'L')) << "the loop file was written";
    EXPECT_EQ(read(upper + "/nodes/blk"), "written from the sandbox");
}

// security.capability v2 (cap_setuid+ep) and a v3 naming the host's root: stored as v3
// with rootid = the sandboxes' root. Run by an unprivileged host user it gives nothing;
// in a user namespace rooted at the sandboxes' root it still works. A setuid-root file is
// setuid to the sandboxes' root uid, not the host's. Other security.* and trusted.* are
// dropped, user.* kept.
TEST_F(LayerSecurityTest, FileCapabilitiesAreNamespacedAndSetuidIsShifted) {
    const std::string src = dir_ + "/setuid0.c", bin = dir_ + "/setuid0";
    std::ofstream(src) << kSetuidProgram;
    ASSERT_EQ(std::system(("cc -O1 -o " + bin + " " + src).c_str()), 0);
    const std::string tar = hostile("caps.tar", "caps " + bin);
    const UnpackResult r = unpack(tar, "l");
    const std::string l = dir_ + "/l";

    for (const char* name : {"/bin/capped", "/bin/capped3"}) {
        char raw[64];
        const ssize_t n = ::lgetxattr((l + name).c_str(), "security.capability", raw, sizeof raw);
        ASSERT_EQ(n, static_cast<ssize_t>(XATTR_CAPS_SZ_3)) << name;
        const std::string value(raw, static_cast<size_t>(n));
        EXPECT_EQ(transfer::file_caps_rootid(value), kShift) << name;
        uint32_t magic, permitted;
        std::memcpy(&magic, raw, 4);
        std::memcpy(&permitted, raw + 4, 4);
        EXPECT_EQ(magic, VFS_CAP_REVISION_3 | VFS_CAP_FLAGS_EFFECTIVE) << name;
        EXPECT_EQ(permitted, (1u << CAP_SETUID) | (1u << CAP_SETGID)) << name;
        // getcap reads it as the kernel gives it to the host: namespaced to kShift.
        const std::string getcap = run_capture("getcap -n " + l + name);
        EXPECT_NE(getcap.find("[rootid=" + std::to_string(kShift) + "]"), std::string::npos)
            << getcap;
    }
    struct stat st {};
    ASSERT_EQ(::lstat((l + "/bin/suid").c_str(), &st), 0);
    EXPECT_EQ(st.st_uid, kShift);
    EXPECT_EQ(st.st_mode & 07777, 04755u);
    EXPECT_EQ(xattr(l + "/etc/xattrs", "user.ok"), "fine");
    for (const char* dropped :
         {"security.selinux", "security.ima", "trusted.berth.evil", "trusted.overlay.opaque"}) {
        EXPECT_EQ(xattr(l + "/etc/xattrs", dropped), "<none>") << dropped;
        EXPECT_TRUE(has_warning(r, std::string("xattr ") + dropped)) << dropped;
    }

    // A reachable copy with every xattr (the store itself is 0700: ImageStore's test), run
    // by the host's nobody: setuid(0) fails.
    const std::string open_dir = "/var/tmp/berth-caps-" + std::to_string(::getpid());
    fs::create_directories(open_dir);
    ::chmod(open_dir.c_str(), 0755);
    struct RemoveDir {
        std::string d;
        ~RemoveDir() { fs::remove_all(d); }
    } remove_open{open_dir};
    for (const char* name : {"capped", "capped3", "suid"}) {
        const std::string copy = open_dir + "/" + name;
        ASSERT_EQ(std::system(("cp -a " + l + "/bin/" + name + " " + copy).c_str()), 0);
        EXPECT_EQ(::lgetxattr(copy.c_str(), "security.capability", nullptr, 0) > 0,
                  std::string(name) != "suid")
            << name;
        // The setuid one runs as its owner, the sandboxes' root uid: never the host's root
        // (which is why the store must be unreachable: that uid owns the sandboxes' files).
        const std::string want = std::string(name) == "suid"
                                     ? "setuid=-1 uid=65534 euid=" + std::to_string(kShift)
                                     : "setuid=-1 uid=65534 euid=65534";
        const std::string out = run_as_nobody(copy);
        EXPECT_NE(out.find(want), std::string::npos) << name << ": " << out;
    }
    // The control: the same binary with a host-wide v2 capability does become root (what
    // the store used to make of such a layer), so the runs above can fail.
    const std::string control = open_dir + "/control";
    ASSERT_EQ(
        std::system(("cp " + bin + " " + control + " && setcap cap_setuid+ep " + control).c_str()),
        0);
    EXPECT_NE(run_as_nobody(control).find("setuid=0 uid=0"), std::string::npos);

    // Where it is meant to work: uid 1000 of a sandbox's user namespace (no no_new_privs
    // here; berth's sandboxes set it, so there it is inert too).
    const std::string inside = run_in_sandbox_userns(open_dir + "/capped", 1000);
    EXPECT_NE(inside.find("setuid=0 uid=0 euid=0"), std::string::npos) << inside;
    // The suid copy is owned by the sandboxes' root: inside, it is root's setuid file.
    const std::string suid_inside = run_in_sandbox_userns(open_dir + "/suid", 1000);
    EXPECT_NE(suid_inside.find("euid=0"), std::string::npos) << suid_inside;
}

// With no uid shift the sandboxes' root would be the host's: capabilities are dropped.
TEST_F(LayerSecurityTest, WithoutAShiftCapabilitiesAreDropped) {
    const std::string tar = hostile("caps.tar", "caps /bin/true");
    UnpackOptions o;
    const UnpackResult r = unpack(tar, "l", o);
    EXPECT_EQ(::lgetxattr((dir_ + "/l/bin/capped").c_str(), "security.capability", nullptr, 0), -1);
    EXPECT_TRUE(has_warning(r, "security.capability skipped"));
}

TEST(FileCaps, ConvertsEachRevisionToV3AndRefusesMalformedOnes) {
    auto le = [](std::initializer_list<uint32_t> words) {
        std::string s;
        for (uint32_t w : words)
            for (int i = 0; i < 4; ++i) s.push_back(static_cast<char>((w >> (8 * i)) & 0xff));
        return s;
    };
    const std::string v3 = le({VFS_CAP_REVISION_3 | 1, 0x80, 0x4, 0x1, 0x2, 42});
    EXPECT_EQ(transfer::namespaced_file_caps(le({VFS_CAP_REVISION_2 | 1, 0x80, 0x4, 0x1, 0x2}), 42),
              v3);
    EXPECT_EQ(
        transfer::namespaced_file_caps(le({VFS_CAP_REVISION_3 | 1, 0x80, 0x4, 0x1, 0x2, 0}), 42),
        v3);
    EXPECT_EQ(transfer::namespaced_file_caps(le({VFS_CAP_REVISION_1, 0x80, 0x4}), 7),
              le({VFS_CAP_REVISION_3, 0x80, 0x4, 0, 0, 7}));
    EXPECT_EQ(transfer::file_caps_rootid(v3), 42u);
    EXPECT_FALSE(transfer::namespaced_file_caps("", 1));
    EXPECT_FALSE(transfer::namespaced_file_caps(le({VFS_CAP_REVISION_2 | 1, 0x80}), 1));
    EXPECT_FALSE(transfer::namespaced_file_caps(le({VFS_CAP_REVISION_3, 1, 2, 3, 4}), 1));
    EXPECT_FALSE(transfer::namespaced_file_caps(le({0x04000000, 1, 2, 3, 4}), 1));
    EXPECT_FALSE(transfer::namespaced_file_caps(le({VFS_CAP_REVISION_2 | 2, 1, 2, 3, 4}), 1));
}

// Layers that expand past the bounds: refused while unpacking, with a message naming the
// layer and the limit, and nothing left. Sparse files count at their apparent size.
TEST_F(LayerSecurityTest, LayersPastTheBoundsAreRefusedAndLeaveNothing) {
    UnpackOptions o = defaults();
    o.max_bytes = 1 << 20;
    o.max_entries = 1000;
    o.limit_hint = "the test's bound";
    o.diff_id = Digest::from_hex(std::string(64, 'a'));  // refused before it is checked

    // 64 MiB of zeros, gzip'd (64 KiB): refused at the file, before its data is written.
    const std::string zeros = hostile("zeros.tar", "zeros " + std::to_string(64 << 20));
    ASSERT_EQ(std::system(("gzip -1 -k " + zeros).c_str()), 0);
    try {
        unpack(zeros + ".gz", "z", o, Compression::gzip);
        ADD_FAILURE() << "64 MiB of zeros unpacked under a 1 MiB bound";
    } catch (const LayerTooLarge& e) {
        const std::string what = e.what();
        EXPECT_NE(what.find("layer sha256:aaaa"), std::string::npos) << what;
        EXPECT_NE(what.find("more than 1048576 bytes"), std::string::npos) << what;
        EXPECT_NE(what.find("zeros"), std::string::npos) << what;
        EXPECT_NE(what.find("the test's bound"), std::string::npos) << what;
    }
    expect_nothing_left("z");

    // 1 TB of holes.
    const std::string sparse = hostile("sparse.tar", "sparse 1000000000000");
    EXPECT_THROW(unpack(sparse, "s", o), LayerTooLarge);
    expect_nothing_left("s");
    // Under a bound it fits, it unpacks with its apparent size (and its blocks are few).
    UnpackOptions roomy = defaults();
    roomy.max_bytes = 2000000000000;
    const UnpackResult fits = unpack(sparse, "s2", roomy);
    EXPECT_EQ(fits.bytes, 1000000000000u);
    struct stat st {};
    ASSERT_EQ(::stat((dir_ + "/s2/sparse").c_str(), &st), 0);
    EXPECT_EQ(static_cast<uint64_t>(st.st_size), 1000000000000u);
    const std::optional<UnpackedSize> recorded = unpacked_size(dir_ + "/s2");
    ASSERT_TRUE(recorded);
    EXPECT_EQ(recorded->bytes, 1000000000000u);
    EXPECT_EQ(recorded->entries, fits.entries);

    // 5000 empty files under a bound of 1000 entries.
    const std::string many = hostile("many.tar", "many 5000");
    try {
        unpack(many, "n", o);
        ADD_FAILURE() << "5000 entries under a bound of 1000";
    } catch (const LayerTooLarge& e) {
        EXPECT_NE(std::string(e.what()).find("more than 1000 entries"), std::string::npos)
            << e.what();
    }
    expect_nothing_left("n");
}

// The store's modes at every open, and the bound over an image's layers together.
TEST_F(LayerSecurityTest, StoreIsRootsAloneAndBoundsTheImageTotal) {
    const std::string root = dir_ + "/store";
    { ImageStore store(root, kShift); }
    for (const std::string& d : {root, root + "/layers"}) {
        struct stat st {};
        ASSERT_EQ(::stat(d.c_str(), &st), 0);
        EXPECT_EQ(st.st_mode & 07777, 0700u) << d;
        ASSERT_EQ(::chmod(d.c_str(), 0755), 0);  // as an older berth left it
    }
    ImageStore store(root, kShift);
    for (const std::string& d : {root, root + "/layers"}) {
        struct stat st {};
        ASSERT_EQ(::stat(d.c_str(), &st), 0);
        EXPECT_EQ(st.st_mode & 07777, 0700u) << d << " was not made 0700 again";
    }

    // Two layers of 600 KiB each under a bound of 1 MiB: the second is refused while it
    // unpacks, the image gets no name, and the second layer no directory.
    store.set_limits({1 << 20, 1000});
    std::vector<Layer> layers;
    std::vector<Digest> diff_ids;
    for (int i = 0; i < 2; ++i) {
        // (Sizes one byte apart: two layers, not one shared.)
        const std::string tar =
            hostile("z" + std::to_string(i) + ".tar", "zeros " + std::to_string((600 << 10) + i));
        const std::string bytes = read(tar);
        const Digest d = store.blobs().put_bytes(bytes);
        layers.push_back(
            {{"application/vnd.oci.image.layer.v1.tar", d, bytes.size(), {}}, Compression::none});
        diff_ids.push_back(d);
    }
    ImageConfig config;
    config.diff_ids = diff_ids;
    const Manifest manifest{std::string(media::kOciManifest),
                            {std::string(media::kOciConfig), store.blobs().put_bytes("{}"), 2, {}},
                            layers};
    try {
        store.add_image(parse_reference("it/too-big:1"), store.blobs().put_bytes("m"), manifest,
                        config);
        ADD_FAILURE() << "an image of 1.2 MiB under a bound of 1 MiB";
    } catch (const LayerTooLarge& e) {
        EXPECT_NE(std::string(e.what()).find(diff_ids[1].str()), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("--max-image-size"), std::string::npos) << e.what();
    }
    EXPECT_TRUE(fs::exists(store.layer_dir(diff_ids[0])));
    EXPECT_FALSE(fs::exists(store.layer_dir(diff_ids[1])));
    EXPECT_TRUE(store.list().empty());
    for (const auto& e : fs::directory_iterator(root + "/layers"))
        EXPECT_NE(e.path().filename().string()[0], '.') << e.path();
}
