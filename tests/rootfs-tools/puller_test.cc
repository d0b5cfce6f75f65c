// Pulls from a real registry (Debian's docker-registry on loopback, images pushed with
// skopeo): by tag, by digest, from a manifest list, with basic and bearer-token auth, a
// blob corrupted on the registry's disk, a connection cut or stalled mid-blob by a proxy,
// a repeated pull, two concurrent pulls and a cancelled one. Needs root (layers unpack
// with owners and device nodes, and are looked at through an overlay mount).
#include "rootfs-tools/puller.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "tests/rootfs-tools/layers_fixture.h"
#include "tests/rootfs-tools/registry_fixture.h"

namespace fs = std::filesystem;
using namespace berth::images;
using berth::images::testing::LayersFixture;
using berth::images::testing::LocalRegistry;
using berth::images::testing::Proxy;
using berth::images::testing::slurp;
using berth::images::testing::TokenServer;
using nlohmann::json;

namespace {

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif

std::string error_of(const std::function<void()>& f) {
    try {
        f();
    } catch (const std::exception& e) {
        return e.what();
    }
    return "(no error)";
}

class PullTest : public LayersFixture {
  protected:
    void SetUp() override {
        LayersFixture::SetUp();
        if (IsSkipped() || HasFatalFailure()) return;
        const json index = json::parse(slurp(dir_ + "/layout/index.json"));
        app_manifest_ = Digest::parse(index["manifests"][0]["digest"].get<std::string>());
        const json manifest = json::parse(slurp(blob_path(dir_ + "/layout", app_manifest_)));
        for (const auto& l : manifest["layers"])
            app_layers_.push_back(Digest::parse(l["digest"].get<std::string>()));
        app_config_ = Digest::parse(manifest["config"]["digest"].get<std::string>());
    }

    static std::string blob_path(const std::string& layout, const Digest& d) {
        return layout + "/blobs/sha256/" + std::string(d.hex());
    }
    static Digest put_blob(const std::string& layout, const std::string& bytes) {
        const Digest d = sha256_of(bytes);
        std::ofstream(blob_path(layout, d), std::ios::binary) << bytes;
        return d;
    }

    // A one-layer image whose layer is an uncompressed tar of `mib` MiB of random bytes
    // (made by the library: a rootfs dir imported, then exported as an OCI layout).
    std::string make_big_layout(int mib) {
        const std::string rootfs = dir_ + "/big-rootfs";
        fs::create_directories(rootfs + "/data");
        std::mt19937_64 rng(42);
        std::string bytes(size_t(mib) << 20, '\0');
        for (size_t i = 0; i + 8 <= bytes.size(); i += 8) {
            const uint64_t v = rng();
            std::memcpy(bytes.data() + i, &v, 8);
        }
        std::ofstream(rootfs + "/data/random.bin", std::ios::binary) << bytes;
        big_sha_ = sha256_of(bytes);
        ImageStore maker(dir_ + "/maker", 200000);
        const Image im = maker.import_rootfs_dir(rootfs, parse_reference("big:1"), ImageConfig{});
        big_layer_ =
            Digest::parse(json::parse(slurp(maker.blobs().path(im.manifest)))["layers"][0]["digest"]
                              .get<std::string>());
        const std::string layout = dir_ + "/big-layout";
        maker.export_oci_layout(im, layout, "v1");
        return layout;
    }

    // An OCI index of two manifests: the app image for this host, and a one-layer image for
    // another architecture. Tagged "multi" in its layout.
    std::string make_multi_layout() {
        const std::string layout = dir_ + "/layout";  // adds to the app's layout
        const std::string layer = slurp(dir_ + "/layer2.tar");
        const Digest layer_digest = put_blob(layout, layer);
        const Platform here = host_platform();
        other_arch_ = here.architecture == "riscv64" ? "s390x" : "riscv64";
        const std::string config =
            json{{"architecture", other_arch_},
                 {"os", "linux"},
                 {"rootfs", {{"type", "layers"}, {"diff_ids", {layer_digest.str()}}}}}
                .dump();
        const Digest config_digest = put_blob(layout, config);
        const std::string other = json{{"schemaVersion", 2},
                                       {"mediaType", media::kOciManifest},
                                       {"config",
                                        {{"mediaType", media::kOciConfig},
                                         {"digest", config_digest.str()},
                                         {"size", config.size()}}},
                                       {"layers",
                                        {{{"mediaType", "application/vnd.oci.image.layer.v1.tar"},
                                          {"digest", layer_digest.str()},
                                          {"size", layer.size()}}}}}
                                      .dump();
        const Digest other_digest = put_blob(layout, other);
        const std::string app = slurp(blob_path(layout, app_manifest_));
        json host_platform_json = {{"os", here.os}, {"architecture", here.architecture}};
        if (!here.variant.empty()) host_platform_json["variant"] = here.variant;
        const std::string index =
            json{{"schemaVersion", 2},
                 {"mediaType", media::kOciIndex},
                 {"manifests",
                  {{{"mediaType", media::kOciManifest},
                    {"digest", other_digest.str()},
                    {"size", other.size()},
                    {"platform", {{"os", "linux"}, {"architecture", other_arch_}}}},
                   {{"mediaType", media::kOciManifest},
                    {"digest", app_manifest_.str()},
                    {"size", app.size()},
                    {"platform", host_platform_json}}}}}
                .dump();
        multi_index_ = put_blob(layout, index);
        json top = json::parse(slurp(layout + "/index.json"));
        top["manifests"].push_back(
            {{"mediaType", media::kOciIndex},
             {"digest", multi_index_.str()},
             {"size", index.size()},
             {"annotations", {{"org.opencontainers.image.ref.name", "multi"}}}});
        std::ofstream(layout + "/index.json") << top.dump();
        return layout;
    }

    // The app image's files, as a sandbox sees them.
    void expect_app_files(ImageStore& store, const Image& im) {
        const std::string merged = mount_lowers(store.lower_dirs(im), /*userxattr=*/true);
        EXPECT_EQ(read(merged + "/etc/a"), "a2\n");
        EXPECT_FALSE(fs::exists(merged + "/etc/b"));  // a whiteout
        EXPECT_EQ(read(merged + "/data/new"), "new\n");
        EXPECT_FALSE(fs::exists(merged + "/data/old1"));  // under an opaque dir
        EXPECT_EQ(fs::read_symlink(merged + "/lnk"), "/etc/a");
        ::umount2(merged.c_str(), MNT_DETACH);
    }

    static size_t entries(const std::string& dir) {
        return fs::exists(dir) ? size_t(std::distance(fs::directory_iterator(dir), {})) : 0;
    }

    Digest app_manifest_ = Digest::from_hex(std::string(64, '0'));
    Digest app_config_ = Digest::from_hex(std::string(64, '0'));
    std::vector<Digest> app_layers_;
    Digest big_layer_ = Digest::from_hex(std::string(64, '0'));
    Digest big_sha_ = Digest::from_hex(std::string(64, '0'));
    Digest multi_index_ = Digest::from_hex(std::string(64, '0'));
    std::string other_arch_;
};

// Short timings: a test's retries should not take seconds.
RegistryTimings quick() {
    RegistryTimings t;
    t.retry_base = std::chrono::milliseconds(20);
    t.low_speed_bytes = 1000;
    t.low_speed_time = std::chrono::seconds(1);
    return t;
}

}  // namespace

TEST_F(PullTest, ByTagAndByDigest) {
    LocalRegistry registry(dir_ + "/registry");
    registry.push(dir_ + "/layout", "v1", "test/app:v1");
    ImageStore store(dir_ + "/store", 200000);
    Puller puller(store, {}, {});
    std::vector<PullEvent> events;
    PullOptions o;
    o.progress = [&](const PullEvent& e) { events.push_back(e); };
    const Image im = puller.pull(parse_reference(registry.host() + "/test/app:v1"), o);
    EXPECT_EQ(im.name, registry.host() + "/test/app:v1");
    EXPECT_EQ(im.manifest, app_manifest_);
    EXPECT_EQ(im.config, app_config_);
    ASSERT_EQ(im.layers.size(), 2u);
    EXPECT_EQ(im.created, "2026-11-29T00:00:00Z");
    for (const auto& l : app_layers_) {
        EXPECT_TRUE(store.blobs().has(l)) << l.str();
    }
    EXPECT_TRUE(store.blobs().has(app_manifest_));
    EXPECT_TRUE(store.blobs().has(app_config_));
    EXPECT_EQ(store.find(parse_reference(registry.host() + "/test/app:v1"))->manifest,
              app_manifest_);
    expect_app_files(store, im);
    auto count = [&](PullEvent::Kind k) {
        return std::count_if(events.begin(), events.end(),
                             [&](const PullEvent& e) { return e.kind == k; });
    };
    EXPECT_EQ(count(PullEvent::Kind::resolved), 1);
    EXPECT_EQ(count(PullEvent::Kind::blob_done), 2);
    EXPECT_EQ(count(PullEvent::Kind::layer_unpacked), 2);
    EXPECT_GE(count(PullEvent::Kind::blob_progress), 2);

    // By digest, into another store: recorded as name@digest, found by it.
    ImageStore other(dir_ + "/store2", 200000);
    Puller puller2(other, {}, {});
    const Reference pinned = parse_reference(registry.host() + "/test/app@" + app_manifest_.str());
    const Image by_digest = puller2.pull(pinned);
    EXPECT_EQ(by_digest.name, registry.host() + "/test/app@" + app_manifest_.str());
    EXPECT_EQ(by_digest.manifest, app_manifest_);
    EXPECT_EQ(by_digest.layers, im.layers);
    ASSERT_TRUE(other.find(pinned));
    EXPECT_FALSE(other.find(parse_reference(registry.host() + "/test/app:latest")));

    // What is not there is named.
    const std::string missing_tag =
        error_of([&] { puller.pull(parse_reference(registry.host() + "/test/app:nope")); });
    EXPECT_NE(missing_tag.find("manifest " + registry.host() + "/test/app:nope: not found"),
              std::string::npos)
        << missing_tag;
    const std::string unknown = sha256_of("nothing").str();
    const std::string missing_digest =
        error_of([&] { puller.pull(parse_reference(registry.host() + "/test/app@" + unknown)); });
    EXPECT_NE(missing_digest.find(unknown), std::string::npos) << missing_digest;
    EXPECT_NE(missing_digest.find("not found"), std::string::npos) << missing_digest;
    EXPECT_FALSE(store.find(parse_reference(registry.host() + "/test/app:nope")));
}

TEST_F(PullTest, AManifestListGivesTheHostsPlatform) {
    const std::string layout = make_multi_layout();
    LocalRegistry registry(dir_ + "/registry");
    registry.push(layout, "multi", "test/multi:1", /*all=*/true);
    ImageStore store(dir_ + "/store", 200000);
    Puller puller(store, {}, {});
    const Image im = puller.pull(parse_reference(registry.host() + "/test/multi:1"));
    EXPECT_EQ(im.manifest, multi_index_);  // what the tag resolved to
    EXPECT_EQ(im.config, app_config_);     // this host's image in it
    ASSERT_EQ(im.layers.size(), 2u);
    expect_app_files(store, im);
    EXPECT_TRUE(store.blobs().has(app_manifest_));

    // Exported, the pulled platform's manifest is the layout's image.
    store.export_oci_layout(im, dir_ + "/exported", "x");
    ImageStore again(dir_ + "/again", 200000);
    EXPECT_EQ(again.import_oci_layout(dir_ + "/exported", parse_reference("x:1"), "x").manifest,
              app_manifest_);

    // Another platform, asked for.
    ImageStore other(dir_ + "/other", 200000);
    Puller puller2(other, {}, {});
    PullOptions o;
    o.platform = {"linux", other_arch_, ""};
    const Image foreign = puller2.pull(parse_reference(registry.host() + "/test/multi:1"), o);
    EXPECT_EQ(foreign.manifest, multi_index_);
    EXPECT_EQ(foreign.layers.size(), 1u);
    o.platform = {"linux", "mips64", ""};
    const std::string none =
        error_of([&] { puller2.pull(parse_reference(registry.host() + "/test/multi:1"), o); });
    EXPECT_NE(none.find("no manifest for linux/mips64"), std::string::npos) << none;
}

TEST_F(PullTest, BasicAuth) {
    LocalRegistry registry(dir_ + "/registry",
                           {LocalRegistry::Auth::htpasswd, "alice", "wonder", nullptr});
    registry.push(dir_ + "/layout", "v1", "test/app:v1", false, "alice:wonder");
    const Reference ref = parse_reference(registry.host() + "/test/app:v1");
    ImageStore store(dir_ + "/store", 200000);

    Puller anonymous(store, {}, {});
    const std::string no_creds = error_of([&] { anonymous.pull(ref); });
    EXPECT_EQ(no_creds, "registry " + registry.host() +
                            " requires authentication for test/app: no credentials (berth pull "
                            "--authfile, or /etc/berth/auth.json)");
    EXPECT_THROW(anonymous.pull(ref), RegistryAuthError);

    PullOptions wrong;
    wrong.auth = AuthConfig::parse(R"({"auths": {")" + registry.host() +
                                   R"(": {"username": "alice", "password": "nope"}}})");
    const std::string rejected = error_of([&] { anonymous.pull(ref, wrong); });
    EXPECT_EQ(rejected.rfind(
                  "registry " + registry.host() + " rejected the credentials for user alice", 0),
              0u)
        << rejected;
    EXPECT_FALSE(store.find(ref));
    EXPECT_EQ(store.blobs().list().size(), 0u);

    // The system's credentials, or the client's over them.
    Puller with_system(store, {},
                       AuthConfig::parse(R"({"auths": {")" + registry.host() + R"(": {"auth": ")" +
                                         base64_encode("alice:wonder") + "\"}}}"));
    const Image im = with_system.pull(ref);
    EXPECT_EQ(im.manifest, app_manifest_);
    expect_app_files(store, im);
    EXPECT_THROW(with_system.pull(ref, wrong), RegistryAuthError);  // the client's win
}

TEST_F(PullTest, BearerTokenAuth) {
    TokenServer tokens(dir_, "bob", "builder");
    LocalRegistry registry(dir_ + "/registry", {LocalRegistry::Auth::token, "", "", &tokens});
    registry.push(dir_ + "/layout", "v1", "test/app:v1", false, "bob:builder");
    const Reference ref = parse_reference(registry.host() + "/test/app:v1");
    ImageStore store(dir_ + "/store", 200000);
    Puller puller(store, {}, {});

    const std::string no_creds = error_of([&] { puller.pull(ref); });
    EXPECT_EQ(no_creds, "registry " + registry.host() +
                            " requires authentication for test/app: no credentials (berth pull "
                            "--authfile, or /etc/berth/auth.json)")
        << registry.log();
    PullOptions o;
    o.auth = AuthConfig::parse(R"({"auths": {")" + registry.host() +
                               R"(": {"username": "bob", "password": "wrong"}}})");
    const std::string rejected = error_of([&] { puller.pull(ref, o); });
    EXPECT_EQ(
        rejected.rfind("registry " + registry.host() + " rejected the credentials for user bob", 0),
        0u)
        << rejected;
    EXPECT_FALSE(store.find(ref));

    o.auth = AuthConfig::parse(R"({"auths": {")" + registry.host() +
                               R"(": {"username": "bob", "password": "builder"}}})");
    const int before = tokens.requests();
    const Image im = puller.pull(ref, o);
    EXPECT_EQ(im.manifest, app_manifest_);
    // One token for the pull: the manifest and both blobs (on parallel connections) used it.
    EXPECT_EQ(tokens.requests() - before, 1);
    expect_app_files(store, im);
}

TEST_F(PullTest, ABlobCorruptOnTheRegistryIsRefusedAndNothingStored) {
    LocalRegistry registry(dir_ + "/registry");
    registry.push(dir_ + "/layout", "v1", "test/app:v1");
    // The gzip layer's bytes changed on the registry's disk, its size kept.
    const Digest bad = app_layers_[0];
    {
        std::fstream f(registry.blob_data(bad), std::ios::in | std::ios::out | std::ios::binary);
        ASSERT_TRUE(f) << registry.blob_data(bad);
        f.seekp(100);
        f.put('\x5a');
    }
    ImageStore store(dir_ + "/store", 200000);
    Puller puller(store, {}, {});
    const Reference ref = parse_reference(registry.host() + "/test/app:v1");
    try {
        puller.pull(ref);
        ADD_FAILURE() << "pulled a corrupt blob";
    } catch (const BlobMismatch& e) {
        EXPECT_NE(std::string(e.what()).find(bad.str()), std::string::npos) << e.what();
    }
    EXPECT_FALSE(store.blobs().has(bad));
    EXPECT_FALSE(store.find(ref));
    EXPECT_TRUE(store.list().empty());
    EXPECT_FALSE(store.blobs().has(app_manifest_));
    EXPECT_FALSE(store.blobs().has(app_config_));
    EXPECT_EQ(entries(dir_ + "/store/ingest"), 0u);
    // The layer whose blob was refused is not unpacked (the other may be: it was verified).
    const ImageConfig config = parse_config(slurp(blob_path(dir_ + "/layout", app_config_)));
    EXPECT_FALSE(fs::exists(store.layer_dir(config.diff_ids[0])));
}

TEST_F(PullTest, ADroppedConnectionIsResumedWithRange) {
    const std::string layout = make_big_layout(12);
    LocalRegistry registry(dir_ + "/registry");
    registry.push(layout, "v1", "test/big:v1");
    Proxy proxy(registry.port());
    proxy.fault_once(Proxy::Fault::cut, "/blobs/" + big_layer_.str(), 3 << 20);
    ImageStore store(dir_ + "/store", 200000);
    Puller puller(store, {}, {});
    PullOptions o;
    o.timings = quick();
    std::vector<std::string> retries;
    o.progress = [&](const PullEvent& e) {
        if (e.kind == PullEvent::Kind::retrying) retries.push_back(e.message);
    };
    const Image im = puller.pull(
        parse_reference("127.0.0.1:" + std::to_string(proxy.port()) + "/test/big:v1"), o);
    EXPECT_TRUE(proxy.fault_happened());
    EXPECT_GE(proxy.connections(), 2);
    ASSERT_EQ(retries.size(), 1u);
    // The second request asked for the rest only.
    const auto requests = proxy.requests();
    const auto resumed = std::find_if(requests.begin(), requests.end(), [&](const std::string& r) {
        return r.find("/blobs/" + big_layer_.str() + " range=") != std::string::npos;
    });
    ASSERT_NE(resumed, requests.end()) << ::testing::PrintToString(requests);
    const uint64_t from = std::stoull(resumed->substr(resumed->find("range=") + 6));
    EXPECT_GT(from, 0u);
    EXPECT_LE(from, uint64_t(3) << 20);
    EXPECT_EQ(proxy.count("/blobs/" + big_layer_.str()), 2u);
    ASSERT_EQ(im.layers.size(), 1u);
    EXPECT_EQ(sha256_of(slurp(store.layer_dir(im.layers[0]) + "/data/random.bin")), big_sha_);
}

TEST_F(PullTest, ARegistryThatIgnoresTheRangeGetsTheBlobAgainFromTheStart) {
    const std::string layout = make_big_layout(6);
    LocalRegistry registry(dir_ + "/registry");
    registry.push(layout, "v1", "test/big:v1");
    Proxy proxy(registry.port());
    proxy.strip_range();  // the resumed request gets a 200 with the whole blob
    proxy.fault_once(Proxy::Fault::cut, "/blobs/" + big_layer_.str(), 2 << 20);
    ImageStore store(dir_ + "/store", 200000);
    Puller puller(store, {}, {});
    PullOptions o;
    o.timings = quick();
    const Image im = puller.pull(
        parse_reference("127.0.0.1:" + std::to_string(proxy.port()) + "/test/big:v1"), o);
    EXPECT_TRUE(proxy.fault_happened());
    EXPECT_EQ(proxy.count("/blobs/" + big_layer_.str() + " range="), 1u)
        << ::testing::PrintToString(proxy.requests());
    EXPECT_EQ(sha256_of(slurp(store.layer_dir(im.layers[0]) + "/data/random.bin")), big_sha_);
}

TEST_F(PullTest, ABlobMissingFromTheRegistryIsNamed) {
    LocalRegistry registry(dir_ + "/registry");
    registry.push(dir_ + "/layout", "v1", "test/app:v1");
    fs::remove_all(fs::path(registry.blob_data(app_layers_[1])).parent_path());
    ImageStore store(dir_ + "/store", 200000);
    Puller puller(store, {}, {});
    const Reference ref = parse_reference(registry.host() + "/test/app:v1");
    try {
        puller.pull(ref);
        ADD_FAILURE() << "pulled an image with a missing blob";
    } catch (const RegistryError& e) {
        EXPECT_EQ(e.status(), 404);
        EXPECT_EQ(std::string(e.what()), "blob " + app_layers_[1].str() + " of " + registry.host() +
                                             "/test/app: not found (HTTP 404)");
    }
    EXPECT_FALSE(store.find(ref));
}

TEST_F(PullTest, AStalledConnectionIsNoticedAndResumed) {
    const std::string layout = make_big_layout(4);
    LocalRegistry registry(dir_ + "/registry");
    registry.push(layout, "v1", "test/big:v1");
    Proxy proxy(registry.port());
    proxy.fault_once(Proxy::Fault::stall, "/blobs/" + big_layer_.str(), 1 << 20);
    ImageStore store(dir_ + "/store", 200000);
    Puller puller(store, {}, {});
    PullOptions o;
    o.timings = quick();  // stalled = under 1000 B/s for 1 s
    const auto start = std::chrono::steady_clock::now();
    const Image im = puller.pull(
        parse_reference("127.0.0.1:" + std::to_string(proxy.port()) + "/test/big:v1"), o);
    const auto took = std::chrono::steady_clock::now() - start;
    EXPECT_TRUE(proxy.fault_happened());
    // curl judges the speed over a window of a few seconds: the 1 s stall shows after ~7.
    EXPECT_LT(took, std::chrono::seconds(20));
    EXPECT_EQ(proxy.count("/blobs/" + big_layer_.str() + " range="), 1u)
        << ::testing::PrintToString(proxy.requests());
    EXPECT_EQ(sha256_of(slurp(store.layer_dir(im.layers[0]) + "/data/random.bin")), big_sha_);
}

TEST_F(PullTest, ARepeatedPullTransfersNoLayer) {
    LocalRegistry registry(dir_ + "/registry");
    registry.push(dir_ + "/layout", "v1", "test/app:v1");
    Proxy proxy(registry.port());
    ImageStore store(dir_ + "/store", 200000);
    Puller puller(store, {}, {});
    const Reference via_proxy =
        parse_reference("127.0.0.1:" + std::to_string(proxy.port()) + "/test/app:v1");
    const Image first = puller.pull(via_proxy);
    EXPECT_EQ(proxy.count("/blobs/"), 3u);  // config and two layers
    proxy.clear();
    const Image second = puller.pull(via_proxy);
    EXPECT_EQ(second.manifest, first.manifest);
    EXPECT_EQ(proxy.requests(), std::vector<std::string>{"GET /v2/test/app/manifests/v1"});

    // Another tag of the same image: the manifest and nothing else either (its blobs and
    // layers are there), and a name of its own.
    registry.push(dir_ + "/layout", "v1", "test/app:v2");
    proxy.clear();
    const Image v2 =
        puller.pull(parse_reference("127.0.0.1:" + std::to_string(proxy.port()) + "/test/app:v2"));
    EXPECT_EQ(proxy.count("/blobs/"), 0u) << ::testing::PrintToString(proxy.requests());
    EXPECT_EQ(v2.layers, first.layers);
    EXPECT_EQ(store.list().size(), 2u);

    // A layer that is unpacked needs no blob: with the layer blobs gone from the store, a
    // new name for the image fetches none of them.
    for (const auto& l : app_layers_) store.blobs().remove(l);
    registry.push(dir_ + "/layout", "v1", "test/app:v3");
    proxy.clear();
    const Image v3 =
        puller.pull(parse_reference("127.0.0.1:" + std::to_string(proxy.port()) + "/test/app:v3"));
    EXPECT_EQ(proxy.count("/blobs/"), 0u) << ::testing::PrintToString(proxy.requests());
    EXPECT_EQ(v3.layers, first.layers);
    for (const auto& l : app_layers_) {
        EXPECT_FALSE(store.blobs().has(l));
    }
}

TEST_F(PullTest, RepeatedPullTiming) {
    LocalRegistry registry(dir_ + "/registry");
    registry.push(dir_ + "/layout", "v1", "test/app:v1");
    ImageStore store(dir_ + "/store", 200000);
    Puller puller(store, {}, {});
    const Reference ref = parse_reference(registry.host() + "/test/app:v1");
    puller.pull(ref);
    std::vector<double> ms;
    for (int i = 0; i < 20; ++i) {
        const auto start = std::chrono::steady_clock::now();
        puller.pull(ref);
        ms.push_back(
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                .count());
    }
    std::sort(ms.begin(), ms.end());
    const double median = (ms[9] + ms[10]) / 2;
    std::printf("repeated pull of a present image: median %.2f ms, min %.2f, max %.2f (20 runs)\n",
                median, ms.front(), ms.back());
    if (!kSanitized) {
        EXPECT_LE(median, 50.0);
    }
}

TEST_F(PullTest, TwoConcurrentPullsShareTheWork) {
    const std::string layout = make_big_layout(8);
    LocalRegistry registry(dir_ + "/registry");
    registry.push(layout, "v1", "test/big:v1");
    Proxy proxy(registry.port());
    ImageStore store(dir_ + "/store", 200000);
    Puller puller(store, {}, {});
    const Reference ref =
        parse_reference("127.0.0.1:" + std::to_string(proxy.port()) + "/test/big:v1");
    std::optional<Image> a, b;
    std::string error_a, error_b;
    std::thread ta([&] { error_a = error_of([&] { a = puller.pull(ref); }); });
    std::thread tb([&] { error_b = error_of([&] { b = puller.pull(ref); }); });
    ta.join();
    tb.join();
    ASSERT_TRUE(a && b) << error_a << " / " << error_b;
    EXPECT_EQ(a->manifest, b->manifest);
    // Two manifest requests, one download of the layer.
    EXPECT_EQ(proxy.count("/manifests/v1"), 2u);
    EXPECT_EQ(proxy.count("/blobs/" + big_layer_.str()), 1u)
        << ::testing::PrintToString(proxy.requests());
    EXPECT_EQ(sha256_of(slurp(store.layer_dir(a->layers[0]) + "/data/random.bin")), big_sha_);
    EXPECT_EQ(entries(dir_ + "/store/layers"), 1u);  // no temporary left by a loser
}

TEST_F(PullTest, ACancelledPullLeavesNothing) {
    const std::string layout = make_big_layout(8);
    LocalRegistry registry(dir_ + "/registry");
    registry.push(layout, "v1", "test/big:v1");
    ImageStore store(dir_ + "/store", 200000);
    Puller puller(store, {}, {});
    berth::CancelToken cancel;
    PullOptions o;
    o.cancel = &cancel;
    uint64_t seen = 0;
    o.progress = [&](const PullEvent& e) {
        if (e.kind == PullEvent::Kind::blob_progress) {
            seen = e.done;
            cancel.cancel();  // at the first bytes of the layer
        }
    };
    const Reference ref = parse_reference(registry.host() + "/test/big:v1");
    const auto start = std::chrono::steady_clock::now();
    EXPECT_THROW(puller.pull(ref, o), PullCancelled);
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
    EXPECT_GT(seen, 0u);
    EXPECT_FALSE(store.blobs().has(big_layer_));
    EXPECT_TRUE(store.blobs().list().empty());  // not the manifest, not the config
    EXPECT_EQ(entries(dir_ + "/store/layers"), 0u);
    EXPECT_EQ(entries(dir_ + "/store/ingest"), 0u);
    EXPECT_FALSE(store.find(ref));
    EXPECT_TRUE(store.list().empty());

    // Cancelled before it starts: it stops at once.
    EXPECT_THROW(puller.pull(ref, o), PullCancelled);
    // And the same pull without the token completes.
    o.cancel = nullptr;
    o.progress = nullptr;
    EXPECT_EQ(puller.pull(ref, o).layers.size(), 1u);
}

TEST_F(PullTest, MirrorsAndRewritesFromTheRegistriesConfig) {
    LocalRegistry registry(dir_ + "/registry");
    registry.push(dir_ + "/layout", "v1", "hub/test/app:v1");
    const int dead = berth::images::testing::free_port();  // nothing listens there
    const RegistriesConfig config = RegistriesConfig::parse(
        "[[registry]]\nprefix = \"docker.io\"\nlocation = \"" + registry.host() +
            "/hub\"\n[[registry.mirror]]\nlocation = \"127.0.0.1:" + std::to_string(dead) + "\"\n",
        "test registries.conf");
    ImageStore store(dir_ + "/store", 200000);
    Puller puller(store, config, {});
    std::string endpoint;
    PullOptions o;
    o.progress = [&](const PullEvent& e) {
        if (e.kind == PullEvent::Kind::resolved) endpoint = e.message;
    };
    const Image im = puller.pull(parse_reference("test/app:v1"), o);
    EXPECT_EQ(im.name, "docker.io/test/app:v1");  // the name asked for, not the location's
    EXPECT_EQ(im.manifest, app_manifest_);
    EXPECT_EQ(endpoint, registry.host() + "/hub/test/app");
    EXPECT_TRUE(store.find(parse_reference("test/app:v1")));

    // Nothing anywhere: the registry's error (a 404), with what the mirror said.
    std::string missing;
    try {
        puller.pull(parse_reference("test/none:1"));
    } catch (const RegistryError& e) {
        missing = e.what();
        EXPECT_EQ(e.status(), 404);
    }
    EXPECT_NE(missing.find("manifest " + registry.host() + "/hub/test/none:1: not found"),
              std::string::npos)
        << missing;
    EXPECT_NE(missing.find("mirrors tried first: 127.0.0.1:" + std::to_string(dead)),
              std::string::npos)
        << missing;
}

TEST_F(PullTest, AManifestAnswerCutShortIsRetried) {
    LocalRegistry registry(dir_ + "/registry");
    registry.push(dir_ + "/layout", "v1", "test/app:v1");
    Proxy proxy(registry.port());
    proxy.fault_once(Proxy::Fault::cut, "/manifests/v1", 200);  // inside the headers or body
    ImageStore store(dir_ + "/store", 200000);
    Puller puller(store, {}, {});
    PullOptions o;
    o.timings = quick();
    std::vector<std::string> retries;
    o.progress = [&](const PullEvent& e) {
        if (e.kind == PullEvent::Kind::retrying) retries.push_back(e.message);
    };
    const Image im = puller.pull(
        parse_reference("127.0.0.1:" + std::to_string(proxy.port()) + "/test/app:v1"), o);
    EXPECT_TRUE(proxy.fault_happened());
    EXPECT_EQ(im.manifest, app_manifest_);
    EXPECT_EQ(proxy.count("/manifests/v1"), 2u);
    ASSERT_EQ(retries.size(), 1u);
    EXPECT_NE(retries[0].find("manifest v1"), std::string::npos) << retries[0];
}

TEST_F(PullTest, APruneDuringAPullWaitsForIt) {
    LocalRegistry registry(dir_ + "/registry");
    registry.push(dir_ + "/layout", "v1", "test/app:v1");
    ImageStore store(dir_ + "/store", 200000);
    Puller puller(store, {}, {});
    const Reference ref = parse_reference(registry.host() + "/test/app:v1");
    std::thread pruner;
    std::atomic<bool> named_when_pruned{false};
    PullOptions o;
    o.progress = [&](const PullEvent& e) {
        // A layer stored and unpacked, no name yet: everything is unreferenced right now.
        if (e.kind == PullEvent::Kind::layer_unpacked && !pruner.joinable()) {
            pruner = std::thread([&] {
                store.prune({});
                // It waited for the pull: the image had its name before prune looked.
                named_when_pruned = store.find(ref).has_value();
            });
        }
    };
    std::optional<Image> im;
    const std::string error = error_of([&] { im = puller.pull(ref, o); });
    if (pruner.joinable()) pruner.join();
    ASSERT_TRUE(im) << error;
    EXPECT_TRUE(named_when_pruned);
    for (const auto& l : im->layers) {
        EXPECT_TRUE(fs::exists(store.layer_dir(l))) << l.str();
    }
    for (const auto& b : app_layers_) {
        EXPECT_TRUE(store.blobs().has(b)) << b.str();
    }
    EXPECT_TRUE(store.blobs().has(app_config_));
    expect_app_files(store, *im);
}
