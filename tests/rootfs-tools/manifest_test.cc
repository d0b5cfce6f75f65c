#include "rootfs-tools/manifest.h"

#include <gtest/gtest.h>

using namespace berth::images;

namespace {

std::string digest(char c) {
    return "sha256:" + std::string(64, c);
}

// A Docker schema 2 manifest as registries serve it (two gzip layers).
std::string docker_manifest() {
    return R"({"schemaVersion":2,"mediaType":"application/vnd.docker.distribution.manifest.v2+json",
      "config":{"mediaType":"application/vnd.docker.container.image.v1+json","size":1469,
                "digest":")" +
           digest('c') + R"("},
      "layers":[{"mediaType":"application/vnd.docker.image.rootfs.diff.tar.gzip","size":2,
                 "digest":")" +
           digest('1') + R"("},
                {"mediaType":"application/vnd.oci.image.layer.v1.tar+zstd","size":3,
                 "digest":")" +
           digest('2') + R"("}]})";
}

std::string index_of(const std::string& entries) {
    return R"({"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json",
               "manifests":[)" +
           entries + "]}";
}

std::string entry(char c, const char* os, const char* arch, const char* variant = nullptr) {
    std::string p = std::string(R"({"os":")") + os + R"(","architecture":")" + arch + "\"";
    if (variant) p += std::string(R"(,"variant":")") + variant + "\"";
    return R"({"mediaType":"application/vnd.oci.image.manifest.v1+json","size":7,"digest":")" +
           digest(c) + R"(","platform":)" + p + "}}";
}

}  // namespace

TEST(Manifest, DockerSchema2WithItsLayers) {
    auto doc = parse_manifest_or_index(docker_manifest());
    ASSERT_TRUE(std::holds_alternative<Manifest>(doc));
    const Manifest& m = std::get<Manifest>(doc);
    EXPECT_EQ(m.config.digest.str(), digest('c'));
    EXPECT_EQ(m.config.size, 1469u);
    ASSERT_EQ(m.layers.size(), 2u);
    EXPECT_EQ(m.layers[0].compression, Compression::gzip);
    EXPECT_EQ(m.layers[1].compression, Compression::zstd);
    EXPECT_EQ(m.layers[1].blob.digest.str(), digest('2'));
}

TEST(Manifest, OciDocumentsWithoutMediaTypeAreToldApart) {
    std::string manifest = docker_manifest();
    manifest.replace(
        manifest.find(R"("mediaType":"application/vnd.docker.distribution)"),
        std::string(R"("mediaType":"application/vnd.docker.distribution.manifest.v2+json",)")
            .size(),
        "");
    EXPECT_TRUE(std::holds_alternative<Manifest>(parse_manifest_or_index(manifest)));
    std::string index = R"({"schemaVersion":2,"manifests":[)" + entry('a', "linux", "amd64") + "]}";
    EXPECT_TRUE(std::holds_alternative<Index>(parse_manifest_or_index(index)));
}

TEST(Manifest, PicksThePlatform) {
    Index idx = std::get<Index>(parse_manifest_or_index(
        index_of(entry('a', "linux", "amd64") + "," + entry('b', "linux", "arm64", "v8") + "," +
                 entry('c', "linux", "arm", "v7") + "," + entry('d', "unknown", "unknown"))));
    EXPECT_EQ(select_manifest(idx, {"linux", "amd64", ""}).digest.str(), digest('a'));
    EXPECT_EQ(select_manifest(idx, {"linux", "arm64", ""}).digest.str(), digest('b'));
    EXPECT_EQ(select_manifest(idx, {"linux", "arm", "v7"}).digest.str(), digest('c'));
    try {
        select_manifest(idx, {"linux", "s390x", ""});
        FAIL();
    } catch (const ManifestError& e) {
        EXPECT_NE(std::string(e.what()).find("linux/amd64, linux/arm64/v8, linux/arm/v7"),
                  std::string::npos)
            << e.what();
    }
    EXPECT_FALSE(host_platform().architecture.empty());
}

TEST(Manifest, RefusesWhatIsNotAnImage) {
    for (std::string bad : {
             std::string("[]"),
             std::string("not json"),
             std::string(R"({"schemaVersion":1})"),
             std::string(R"({"schemaVersion":2,"mediaType":"text/plain"})"),
             // (found by tests/fuzz/manifest: json's out_of_range, not a parse_error)
             std::string(R"({"schemaVersion":2,"size":1e999})"),
             index_of(R"({"mediaType":"x","size":1,"digest":"sha256:abc"})"),
             index_of(R"({"mediaType":"x","size":-1,"digest":")" + digest('a') + "\"}"),
             index_of(R"({"mediaType":"x","digest":")" + digest('a') + "\"}"),
         }) {
        EXPECT_THROW(parse_manifest_or_index(bad), ManifestError) << bad;
    }
    std::string foreign = docker_manifest();
    foreign.replace(foreign.find("application/vnd.docker.image.rootfs.diff.tar.gzip"),
                    std::string("application/vnd.docker.image.rootfs.diff.tar.gzip").size(),
                    "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip");
    EXPECT_THROW(parse_manifest_or_index(foreign), ManifestError);
    std::string artifact = docker_manifest();
    artifact.replace(artifact.find("application/vnd.docker.container.image.v1+json"),
                     std::string("application/vnd.docker.container.image.v1+json").size(),
                     "application/vnd.cncf.helm.config.v1+json");
    EXPECT_THROW(parse_manifest_or_index(artifact), ManifestError);
}

TEST(Manifest, ConfigRunSettings) {
    ImageConfig c = parse_config(R"({"architecture":"amd64","os":"linux",
        "created":"2026-01-01T00:00:00Z",
        "config":{"Env":["PATH=/usr/bin","A=b c"],"Entrypoint":["/bin/sh","-c"],
                  "Cmd":["echo hi"],"WorkingDir":"/app","User":"1000:1000"},
        "rootfs":{"type":"layers","diff_ids":[")" +
                                 digest('1') + R"(",")" + digest('2') + R"("]}})");
    EXPECT_EQ(c.platform.str(), "linux/amd64");
    EXPECT_EQ(c.env, (std::vector<std::string>{"PATH=/usr/bin", "A=b c"}));
    EXPECT_EQ(c.entrypoint, (std::vector<std::string>{"/bin/sh", "-c"}));
    EXPECT_EQ(c.cmd, (std::vector<std::string>{"echo hi"}));
    EXPECT_EQ(c.working_dir, "/app");
    EXPECT_EQ(c.user, "1000:1000");
    ASSERT_EQ(c.diff_ids.size(), 2u);
    EXPECT_EQ(c.diff_ids[1].str(), digest('2'));
    // Null Entrypoint/Cmd (what docker writes when unset) are empty, not errors.
    ImageConfig bare = parse_config(R"({"architecture":"amd64","os":"linux",
        "config":{"Entrypoint":null,"Cmd":null},"rootfs":{"type":"layers","diff_ids":[]}})");
    EXPECT_TRUE(bare.entrypoint.empty() && bare.cmd.empty());
    EXPECT_THROW(parse_config(R"({"architecture":"amd64","os":"linux"})"), ManifestError);
    EXPECT_THROW(parse_config(R"({"architecture":"amd64","os":"linux",
        "rootfs":{"type":"layers","diff_ids":["sha256:x"]}})"),
                 ManifestError);
}
