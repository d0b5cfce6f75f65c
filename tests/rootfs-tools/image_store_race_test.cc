// Two unpacks of one layer at the same moment (two pulls of an image in one process, or two
// processes sharing the store): both succeed, one directory results, no temporary is left.
// Needs root (layers unpack with owners and device nodes).
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "rootfs-tools/image_store.h"
#include "tests/rootfs-tools/layers_fixture.h"

namespace fs = std::filesystem;
using namespace berth::images;

namespace {
class ImageStoreRaceTest : public berth::images::testing::LayersFixture {};
}  // namespace

TEST_F(ImageStoreRaceTest, ConcurrentUnpacksOfOneLayerBothSucceed) {
    // The app layout's blobs into a store, then its layers unpacked by two stores (as two
    // processes would be) on several threads at once.
    ImageStore seed(dir_ + "/store", 200000);
    const Image im = seed.import_oci_layout(dir_ + "/layout", parse_reference("x:1"), "v1");
    auto doc = parse_manifest_or_index(
        berth::images::testing::LayersFixture::read(seed.blobs().path(Digest::parse(
            nlohmann::json::parse(read(dir_ + "/layout/index.json"))["manifests"][0]["digest"]
                .get<std::string>()))));
    const Manifest manifest = std::get<Manifest>(doc);
    for (int round = 0; round < 5; ++round) {
        for (const auto& l : im.layers) fs::remove_all(seed.layer_dir(l));
        ImageStore a(dir_ + "/store", 200000), b(dir_ + "/store", 200000);
        std::vector<std::thread> threads;
        std::vector<std::string> errors(4);
        for (int t = 0; t < 4; ++t) {
            threads.emplace_back([&, t] {
                ImageStore& s = t % 2 ? a : b;
                try {
                    for (size_t i = 0; i < manifest.layers.size(); ++i)
                        s.ensure_layer(manifest.layers[i], im.layers[i]);
                } catch (const std::exception& e) {
                    errors[t] = e.what();
                }
            });
        }
        for (auto& t : threads) t.join();
        for (const auto& e : errors) EXPECT_EQ(e, "") << "round " << round;
        EXPECT_EQ(std::distance(fs::directory_iterator(dir_ + "/store/layers"), {}), 2)
            << "round " << round;
    }
    const std::string merged = mount_lowers(seed.lower_dirs(im), /*userxattr=*/true);
    EXPECT_EQ(read(merged + "/etc/a"), "a2\n");
}
