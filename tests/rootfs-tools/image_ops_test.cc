// What the image service does with the store (root: layers are unpacked with owners):
// imports from an fd (a layout directory read as a client, an OCI layout tar, a
// docker-archive), export as a tar and back, lookup, remove and prune against names and
// live sandboxes, and separate uid and gid shifts.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "base/error.h"
#include "base/unique_fd.h"
#include "rootfs-tools/image_lookup.h"
#include "rootfs-tools/image_store.h"
#include "rootfs-tools/layer.h"
#include "tests/rootfs-tools/layers_fixture.h"

namespace fs = std::filesystem;
using namespace berth;
using namespace berth::images;

namespace {

class ImageOpsTest : public berth::images::testing::LayersFixture {
  protected:
    UniqueFd open_ro(const std::string& path, int extra = 0) {
        UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | extra));
        if (!fd) throw_sys("open", path);
        return fd;
    }
    std::string tar_of(const std::string& dir) {
        const std::string out = dir + ".tar";
        const std::string cmd = "tar -C " + dir + " -cf " + out + " .";
        EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
        return out;
    }
    static std::vector<std::string> entries(const std::string& dir) {
        std::vector<std::string> out;
        for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename());
        std::sort(out.begin(), out.end());
        return out;
    }
};

Caller nobody() {
    Caller c;
    c.uid = 65534;
    c.gid = 65534;
    return c;
}

}  // namespace

TEST_F(ImageOpsTest, LayersTakeSeparateUidAndGidShifts) {
    // /etc/subuid and /etc/subgid ranges need not start at the same id.
    ImageStore store(dir_ + "/store", 200000, 300000);
    const Image im =
        store.import_oci_layout(dir_ + "/layout", parse_reference("test/app:v1"), "v1");
    const std::string bottom = store.lower_dirs(im)[1];
    struct stat st;
    ASSERT_EQ(::lstat((bottom + "/home/user/file").c_str(), &st), 0);
    EXPECT_EQ(st.st_uid, 201000u);
    EXPECT_EQ(st.st_gid, 301000u);
    ASSERT_EQ(::lstat((bottom + "/etc/a").c_str(), &st), 0);
    EXPECT_EQ(st.st_uid, 200000u);
    EXPECT_EQ(st.st_gid, 300000u);
    // Directories a layer needs but does not list: the sandbox root's, in both ranges.
    const std::string top = store.lower_dirs(im)[0];
    ASSERT_EQ(::lstat((top + "/usr/bin").c_str(), &st), 0);
    EXPECT_EQ(st.st_uid, 200000u);
    EXPECT_EQ(st.st_gid, 300000u);
}

TEST_F(ImageOpsTest, ImportsFromAnFdAndTellsTheFormatByContent) {
    ImageStore store(dir_ + "/store", 200000);
    // A layout directory, read as a client who may read it (the files are 0644, the
    // directories 0755).
    const Image from_dir =
        store.import_fd(open_ro(dir_ + "/layout", O_DIRECTORY).get(),
                        parse_reference("test/dir:v1"), {"the layout", nobody(), nullptr});
    EXPECT_EQ(from_dir.name, "docker.io/test/dir:v1");
    // The same layout as a tar: the same manifest.
    const Image from_tar = store.import_fd(open_ro(tar_of(dir_ + "/layout")).get(),
                                           parse_reference("test/tar:v1"), {});
    EXPECT_EQ(from_tar.manifest, from_dir.manifest);
    // A docker-archive, named by its RepoTags when no name is given.
    const Image docker = store.import_fd(open_ro(dir_ + "/image.docker.tar").get(), {}, {});
    EXPECT_EQ(docker.name, "docker.io/test/app:v1");
    EXPECT_EQ(docker.layers, from_dir.layers);
    // A layout whose only tag is "v1" names no image: a name is asked for.
    try {
        store.import_fd(open_ro(dir_ + "/layout", O_DIRECTORY).get(), {}, {"L", nobody(), nullptr});
        ADD_FAILURE() << "imported without a name";
    } catch (const ManifestError& e) {
        EXPECT_NE(std::string(e.what()).find("give one"), std::string::npos) << e.what();
    }
    // Neither format.
    fs::create_directories(dir_ + "/plain/etc");
    std::ofstream(dir_ + "/plain/etc/x") << "x";
    EXPECT_THROW(
        store.import_fd(open_ro(tar_of(dir_ + "/plain")).get(), parse_reference("x:1"), {}),
        ManifestError);
    // An fd that is not for reading, and an O_PATH one.
    UniqueFd path_fd(::open((dir_ + "/layout").c_str(), O_PATH | O_CLOEXEC));
    EXPECT_THROW(store.import_fd(path_fd.get(), parse_reference("x:1"), {}), SysError);
    EXPECT_FALSE(store.find(parse_reference("x:1")));
    EXPECT_TRUE(entries(dir_ + "/store/ingest").empty());
}

TEST_F(ImageOpsTest, ADirectoryIsReadWithTheCallersRights) {
    ImageStore store(dir_ + "/store", 200000);
    const std::string layout = dir_ + "/layout";
    std::string layer_blob;
    for (const auto& e : fs::directory_iterator(layout + "/blobs/sha256"))
        if (fs::file_size(e.path()) > 500) layer_blob = e.path();
    ASSERT_FALSE(layer_blob.empty());
    ASSERT_EQ(::chmod(layer_blob.c_str(), 0640), 0);
    ASSERT_EQ(::chown(layer_blob.c_str(), 0, 4242), 0);
    auto import_as = [&](Caller c) {
        return store.import_fd(open_ro(layout, O_DIRECTORY).get(), parse_reference("p:v1"),
                               {"the layout", c, nullptr});
    };
    try {
        import_as(nobody());
        ADD_FAILURE() << "read a file its caller may not";
    } catch (const SysError& e) {
        EXPECT_EQ(e.code(), EACCES) << e.what();
    }
    EXPECT_FALSE(store.find(parse_reference("p:v1")));
    // By a supplementary group, the group bits apply.
    Caller member = nobody();
    member.groups = {4242};
    EXPECT_NO_THROW(import_as(member));
    // A directory on the way the caller may not search.
    store.remove(*store.find(parse_reference("p:v1")), {}, false);
    ASSERT_EQ(::chmod(layer_blob.c_str(), 0644), 0);
    ASSERT_EQ(::chmod((layout + "/blobs").c_str(), 0700), 0);
    EXPECT_THROW(import_as(nobody()), SysError);
    // Its owner may.
    Caller owner = nobody();
    owner.uid = 0;
    EXPECT_NO_THROW(import_as(owner));
}

TEST_F(ImageOpsTest, SymlinksFifosAndEscapesInALayoutAreRefused) {
    ImageStore store(dir_ + "/store", 200000);
    const std::string layout = dir_ + "/layout";
    std::string blob;
    for (const auto& e : fs::directory_iterator(layout + "/blobs/sha256"))
        if (fs::file_size(e.path()) > 500) blob = e.path();
    const std::string moved = dir_ + "/moved-blob";
    fs::rename(blob, moved);
    fs::create_symlink(moved, blob);
    auto import = [&] {
        return store.import_fd(open_ro(layout, O_DIRECTORY).get(), parse_reference("s:v1"),
                               {"the layout", nobody(), nullptr});
    };
    try {
        import();
        ADD_FAILURE() << "followed a symlink";
    } catch (const SysError& e) {
        EXPECT_EQ(e.code(), ELOOP) << e.what();
    }
    fs::remove(blob);
    ASSERT_EQ(::mkfifo(blob.c_str(), 0644), 0);
    try {
        import();  // must not block on open
        ADD_FAILURE() << "read a fifo";
    } catch (const SysError& e) {
        EXPECT_EQ(e.code(), EINVAL) << e.what();
    }
    fs::remove(blob);
    fs::rename(moved, blob);
    EXPECT_NO_THROW(import());

    // A SourceDir takes no path that leaves it.
    SourceDir src(open_ro(layout, O_DIRECTORY), "L");
    for (const char* bad :
         {"../layout/index.json", "/etc/passwd", "blobs/../index.json", "", "blobs//sha256"})
        EXPECT_THROW(src.open_file(bad), SysError) << bad;
    EXPECT_TRUE(src.has("index.json"));
    EXPECT_FALSE(src.has("nothing"));
    EXPECT_THROW(src.read_file("index.json", 10), SysError);  // EFBIG
}

TEST_F(ImageOpsTest, ExportAsATarImportsToTheSameDigest) {
    ImageStore store(dir_ + "/store", 200000);
    const Image im =
        store.import_docker_archive(dir_ + "/image.docker.tar", parse_reference("test/app:v1"));
    // Through a pipe, read on a thread as a client would.
    int ends[2];
    ASSERT_EQ(::pipe2(ends, O_CLOEXEC), 0);
    UniqueFd r(ends[0]), w(ends[1]);
    const std::string tar = dir_ + "/exported.tar";
    std::thread reader([&] {
        std::ofstream out(tar, std::ios::binary);
        char buf[65536];
        for (ssize_t n; (n = ::read(r.get(), buf, sizeof buf)) > 0;) out.write(buf, n);
    });
    const uint64_t bytes = store.export_oci_archive(im, w.get(), "v1");
    w.reset();
    reader.join();
    EXPECT_GT(bytes, 0u);
    ImageStore other(dir_ + "/other", 200000);
    const Image again = other.import_fd(open_ro(tar).get(), {}, {});
    EXPECT_EQ(again.name, "docker.io/test/app:v1");  // named in full by the export
    EXPECT_EQ(again.manifest, im.manifest);
    EXPECT_EQ(again.layers, im.layers);
    // A reader that goes away stops the export with an error, not a hang. (EPIPE, as in
    // berth-images, which ignores SIGPIPE.)
    ::signal(SIGPIPE, SIG_IGN);
    ASSERT_EQ(::pipe2(ends, O_CLOEXEC), 0);
    UniqueFd r2(ends[0]), w2(ends[1]);
    r2.reset();
    EXPECT_THROW(store.export_oci_archive(im, w2.get(), "v1"), SysError);
    EXPECT_TRUE(entries(dir_ + "/store/ingest").empty());
}

TEST_F(ImageOpsTest, LookupByNameShortNameDigestAndPrefix) {
    ImageStore store(dir_ + "/store", 200000);
    const Image a =
        store.import_oci_layout(dir_ + "/layout", parse_reference("localhost/base:v1"), "v1");
    const Image b =
        store.import_docker_archive(dir_ + "/image.docker.tar", parse_reference("test/app:v1"));
    EXPECT_EQ(lookup_image(store, "base:v1").name, "localhost/base:v1");  // short name
    EXPECT_EQ(lookup_image(store, "localhost/base:v1").name, a.name);
    EXPECT_EQ(lookup_image(store, "test/app:v1").name, b.name);
    EXPECT_EQ(lookup_image(store, "docker.io/test/app:v1").name, b.name);
    EXPECT_EQ(lookup_image(store, a.manifest.str()).name, a.name);
    EXPECT_EQ(lookup_image(store, std::string(b.manifest.hex().substr(0, 8))).name, b.name);
    EXPECT_EQ(lookup_image(store, "test/app@" + b.manifest.str()).name, b.name);
    EXPECT_THROW(lookup_image(store, "test/app:v2"), ImageNotFound);
    EXPECT_THROW(lookup_image(store, "test/app@" + a.manifest.str()), ImageNotFound);
    EXPECT_THROW(lookup_image(store, "sha256:12"), std::invalid_argument);
    EXPECT_THROW(lookup_image(store, "Not A Reference"), std::invalid_argument);
    // A short name that docker.io has too: docker.io's wins.
    store.import_oci_layout(dir_ + "/layout", parse_reference("base:v1"), "v1");
    EXPECT_EQ(lookup_image(store, "base:v1").name, "docker.io/library/base:v1");
}

TEST_F(ImageOpsTest, RemoveAndPruneKeepWhatIsNamedOrInUse) {
    ImageStore store(dir_ + "/store", 200000);
    const Image a = store.import_oci_layout(dir_ + "/layout", parse_reference("test/a:v1"), "v1");
    const Image b =
        store.import_docker_archive(dir_ + "/image.docker.tar", parse_reference("test/b:v1"));
    ASSERT_EQ(a.layers, b.layers);  // the same layers, two manifests
    const auto layers_before = entries(dir_ + "/store/layers");
    ASSERT_EQ(layers_before.size(), 2u);

    // In use by a sandbox: refused, naming it; forced: only the name goes.
    const std::vector<InUse> in_use{{a.manifest, "0123abcd (web)"}};
    try {
        store.remove(a, in_use, false);
        ADD_FAILURE() << "removed an image in use";
    } catch (const ImageInUse& e) {
        EXPECT_NE(std::string(e.what()).find("0123abcd (web)"), std::string::npos);
    }
    RemoveResult r = store.remove(a, in_use, true);
    EXPECT_EQ(r.untagged, std::vector<std::string>{"docker.io/test/a:v1"});
    EXPECT_TRUE(r.deleted.empty());
    EXPECT_TRUE(store.blobs().has(a.manifest));

    // b shares the layers: removing it keeps them for the sandbox (a's manifest, unnamed).
    r = store.remove(b, in_use, false);
    EXPECT_EQ(entries(dir_ + "/store/layers"), layers_before);
    EXPECT_TRUE(store.blobs().has(a.manifest));
    EXPECT_FALSE(store.blobs().has(b.manifest));
    EXPECT_GT(r.freed_bytes, 0u);

    // Leftovers of an interrupted unpack or removal go with the next prune.
    fs::create_directories(dir_ + "/store/layers/.abc.unpacking-1/etc");
    fs::create_directories(dir_ + "/store/layers/.abc.removing-2");
    r = store.prune(in_use);
    EXPECT_EQ(entries(dir_ + "/store/layers"), layers_before);
    EXPECT_TRUE(store.blobs().has(a.manifest));
    for (const auto& l : a.layers) EXPECT_TRUE(fs::exists(store.layer_dir(l)));

    // A sandbox whose manifest is unknown: nothing is removed rather than the wrong thing.
    const Digest unknown = sha256_of("unknown");
    EXPECT_THROW(store.prune({{unknown, "ffff"}}), ManifestError);
    EXPECT_TRUE(store.blobs().has(a.manifest));

    // The sandbox gone: everything goes.
    r = store.prune({});
    EXPECT_TRUE(entries(dir_ + "/store/layers").empty());
    EXPECT_TRUE(store.blobs().list().empty());
    EXPECT_GT(r.freed_bytes, 0u);
    EXPECT_THROW(store.remove(a, {}, false), ImageNotFound);  // no such name any more
}

TEST_F(ImageOpsTest, PruneWaitsForAnImportThatHoldsTheContent) {
    ImageStore store(dir_ + "/store", 200000);
    auto hold = store.hold_content();
    std::atomic<bool> pruned{false};
    std::thread pruner([&] {
        store.prune({});
        pruned = true;
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    EXPECT_FALSE(pruned);  // an import in progress keeps it out
    const Image im = store.import_oci_layout(dir_ + "/layout", parse_reference("test/a:v1"), "v1");
    hold.unlock();
    pruner.join();
    EXPECT_TRUE(pruned);
    for (const auto& l : im.layers) EXPECT_TRUE(fs::exists(store.layer_dir(l)));
}

TEST_F(ImageOpsTest, AStoreOpenedAgainSweepsWhatACrashLeft) {
    {
        ImageStore store(dir_ + "/store", 200000);
        store.import_oci_layout(dir_ + "/layout", parse_reference("test/a:v1"), "v1");
    }
    fs::create_directories(dir_ + "/store/layers/.abc.unpacking-7/usr");
    fs::create_directories(dir_ + "/store/ingest/ingest-import-0123456789abcdef/blobs");
    ImageStore again(dir_ + "/store", 200000);
    EXPECT_EQ(entries(dir_ + "/store/layers").size(), 2u);
    for (const auto& e : entries(dir_ + "/store/layers")) EXPECT_NE(e[0], '.');
    EXPECT_TRUE(entries(dir_ + "/store/ingest").empty());
    EXPECT_TRUE(again.find(parse_reference("test/a:v1")));
}
