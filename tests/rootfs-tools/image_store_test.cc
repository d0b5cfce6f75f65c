// An OCI layout imported into the image store: blobs verified as copied, layers unpacked
// once and shared, the name recorded last. Needs root (layer unpacking, mount).
#include "rootfs-tools/image_store.h"

#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "tests/rootfs-tools/layers_fixture.h"

namespace fs = std::filesystem;
using namespace berth::images;

namespace {

class ImageStoreTest : public berth::images::testing::LayersFixture {};

}  // namespace

TEST_F(ImageStoreTest, ImportsAnOciLayoutOnceAndSharesItsLayers) {
    ImageStore store(dir_ + "/store", 200000);
    const Image im =
        store.import_oci_layout(dir_ + "/layout", parse_reference("test/app:v1"), "v1");
    EXPECT_EQ(im.name, "docker.io/test/app:v1");
    ASSERT_EQ(im.layers.size(), 2u);
    EXPECT_EQ(im.created, "2026-11-29T00:00:00Z");
    auto found = store.find(parse_reference("test/app:v1"));
    ASSERT_TRUE(found);
    EXPECT_EQ(found->manifest, im.manifest);
    EXPECT_TRUE(store.find(parse_reference("test/app@" + im.manifest.str())));
    EXPECT_FALSE(store.find(parse_reference("test/app:v2")));

    // The lowers, top first, give the image's files.
    const auto lowers = store.lower_dirs(im);
    const std::string merged = mount_lowers(lowers, /*userxattr=*/true);
    EXPECT_EQ(read(merged + "/etc/a"), "a2\n");
    EXPECT_FALSE(fs::exists(merged + "/etc/b"));

    // A second import under another name unpacks nothing again.
    struct stat before;
    ASSERT_EQ(::stat(lowers[1].c_str(), &before), 0);
    store.import_oci_layout(dir_ + "/layout", parse_reference("test/copy:1"), "v1");
    struct stat after;
    ASSERT_EQ(::stat(lowers[1].c_str(), &after), 0);
    EXPECT_EQ(before.st_ino, after.st_ino);
    EXPECT_EQ(store.list().size(), 2u);
    EXPECT_EQ(std::distance(fs::directory_iterator(dir_ + "/store/layers"), {}), 2);
}

TEST_F(ImageStoreTest, ATamperedBlobIsRefusedAndNothingNamed) {
    ImageStore store(dir_ + "/store", 200000);
    EXPECT_THROW(store.import_oci_layout(dir_ + "/layout-bad", parse_reference("bad:1"), "v1"),
                 BlobMismatch);
    EXPECT_TRUE(store.list().empty());
    EXPECT_FALSE(store.find(parse_reference("bad:1")));
    EXPECT_THROW(store.import_oci_layout(dir_ + "/layout", parse_reference("x:1"), "nope"),
                 ManifestError);
    EXPECT_THROW(store.import_oci_layout(dir_ + "/nowhere", parse_reference("x:1")),
                 std::exception);
}

TEST_F(ImageStoreTest, ImportsADockerArchiveToTheSameLayers) {
    ImageStore store(dir_ + "/store", 200000);
    const Image from_layout =
        store.import_oci_layout(dir_ + "/layout", parse_reference("test/app:v1"), "v1");
    const Image im =
        store.import_docker_archive(dir_ + "/image.docker.tar", parse_reference("test/app:v1"));
    // The same layers (by diff_id), so nothing new unpacked; the manifest is berth's own.
    EXPECT_EQ(im.layers, from_layout.layers);
    EXPECT_EQ(std::distance(fs::directory_iterator(dir_ + "/store/layers"), {}), 2);
    EXPECT_TRUE(store.blobs().has(im.manifest));
    EXPECT_EQ(store.find(parse_reference("test/app:v1"))->manifest, im.manifest);
    // Nothing of the unpacked archive stays behind.
    EXPECT_EQ(std::distance(fs::directory_iterator(dir_ + "/store/ingest"), {}), 0);

    EXPECT_THROW(store.import_docker_archive(dir_ + "/bad.docker.tar", parse_reference("bad:1")),
                 ManifestError);
    // Its only image, under the name asked for (docker load, then tag).
    const Image other =
        store.import_docker_archive(dir_ + "/image.docker.tar", parse_reference("other:1"));
    EXPECT_EQ(other.name, "docker.io/library/other:1");
    EXPECT_EQ(other.manifest, im.manifest);
}

TEST_F(ImageStoreTest, ExportThenImportGivesTheSameDigest) {
    ImageStore store(dir_ + "/store", 200000);
    for (const Image& im :
         {store.import_oci_layout(dir_ + "/layout", parse_reference("test/app:v1"), "v1"),
          store.import_docker_archive(dir_ + "/image.docker.tar", parse_reference("d:1"))}) {
        const std::string out = dir_ + "/export-" + im.manifest.str().substr(7, 12);
        store.export_oci_layout(im, out, "exported");
        ImageStore other(dir_ + "/other-" + im.manifest.str().substr(7, 12), 200000);
        const Image again =
            other.import_oci_layout(out, parse_reference("again:1"), std::string("exported"));
        EXPECT_EQ(again.manifest, im.manifest) << im.name;
        EXPECT_EQ(again.layers, im.layers) << im.name;
        EXPECT_THROW(store.export_oci_layout(im, out, "x"), std::exception) << "overwrote " << out;
    }
}

TEST_F(ImageStoreTest, ARootfsDirectoryBecomesAOneLayerImage) {
    const std::string rootfs = dir_ + "/rootfs";
    fs::create_directories(rootfs + "/etc");
    fs::create_directories(rootfs + "/home/u");
    std::ofstream(rootfs + "/etc/hostname") << "base\n";
    std::ofstream(rootfs + "/home/u/f") << "u\n";
    ASSERT_EQ(::chown((rootfs + "/home/u/f").c_str(), 1000, 1000), 0);
    fs::create_symlink("/etc/hostname", rootfs + "/name");
    ImageStore store(dir_ + "/store", 200000);
    ImageConfig config;
    config.cmd = {"/bin/sh"};
    config.working_dir = "/home/u";
    const Image im = store.import_rootfs_dir(rootfs, parse_reference("base:1"), config);
    ASSERT_EQ(im.layers.size(), 1u);
    const std::string layer = store.lower_dirs(im)[0];
    EXPECT_EQ(read(layer + "/etc/hostname"), "base\n");
    EXPECT_EQ(fs::read_symlink(layer + "/name"), "/etc/hostname");
    struct stat st;
    ASSERT_EQ(::stat((layer + "/home/u/f").c_str(), &st), 0);
    EXPECT_EQ(st.st_uid, 201000u);
    ASSERT_EQ(::stat((layer + "/etc/hostname").c_str(), &st), 0);
    EXPECT_EQ(st.st_uid, 200000u);
    // The config keeps the run settings; the same tree gives the same image.
    const ImageConfig stored = parse_config(read(store.blobs().path(im.config)));
    EXPECT_EQ(stored.working_dir, "/home/u");
    EXPECT_EQ(stored.cmd, std::vector<std::string>{"/bin/sh"});
    EXPECT_EQ(store.import_rootfs_dir(rootfs, parse_reference("base:2"), config).manifest,
              im.manifest);
    EXPECT_THROW(store.import_rootfs_dir(dir_ + "/nowhere", parse_reference("x:1"), config),
                 std::exception);
    EXPECT_FALSE(store.find(parse_reference("x:1")));
}

// A store of format 1 (opaque dirs as trusted.overlay.opaque, written as root) is converted
// when it is opened: the user.overlay form that the userxattr overlay reads; a store of an
// unknown format is refused by name.
TEST_F(ImageStoreTest, AFormatOneStoreIsConvertedAndAnUnknownOneRefused) {
    const std::string root = dir_ + "/old-store";
    const std::string opaque = root + "/layers/" + std::string(64, 'a') + "/data";
    fs::create_directories(opaque);
    fs::create_directories(root + "/layers/" + std::string(64, 'b') + "/plain");
    ASSERT_EQ(::setxattr(opaque.c_str(), "trusted.overlay.opaque", "y", 1, 0), 0);
    { ImageStore store(root, 200000); }
    char v[8] = {};
    EXPECT_EQ(::getxattr(opaque.c_str(), "user.overlay.opaque", v, sizeof(v)), 1);
    EXPECT_EQ(std::string(v, 1), "y");
    EXPECT_LT(::getxattr(opaque.c_str(), "trusted.overlay.opaque", v, sizeof(v)), 0);
    EXPECT_EQ(read(root + "/format"), "2\n");
    { ImageStore again(root, 200000); }  // opens as it is

    std::ofstream(root + "/format") << "7\n";
    try {
        ImageStore refused(root, 200000);
        ADD_FAILURE() << "a store of format 7 was opened";
    } catch (const std::runtime_error& e) {
        EXPECT_NE(std::string(e.what()).find("format '7'"), std::string::npos) << e.what();
    }
}
