// The JSON an image brings (manifests, indexes, configs, an OCI layout's oci-layout and
// index.json, a docker-archive's manifest.json), parsed strictly into the structures the
// store works with. A stranger wrote every byte of it, digest-verified or not, so the store
// parses nothing itself: it asks its DocumentParser. LocalDocumentParser runs the parsers in
// this process (tests, tools); berth-images gives its store one that asks an unprivileged
// parse worker (src/runtime/images/fetcher.h).
#pragma once

#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "rootfs-tools/manifest.h"

namespace berth::images {

using Document = std::variant<Manifest, Index>;

// An OCI layout's index.json: an index, and the names its entries' annotations give.
struct LayoutIndex {
    Index index;
    struct Names {
        std::string ref_name;    // org.opencontainers.image.ref.name ("" when none)
        std::string image_name;  // io.containerd.image.name ("" when none)
    };
    std::vector<Names> names;  // one per index.manifests entry, in order
};

// One image of a docker-archive's manifest.json. Paths are as the archive says (the caller
// checks that they stay inside it).
struct DockerArchiveEntry {
    std::string config;
    std::vector<std::string> layers;
    std::vector<std::string> repo_tags;
};

class DocumentParser {
  public:
    virtual ~DocumentParser() = default;
    // ManifestError (what, which field) for anything that is not what it must be.
    virtual Document document(const std::string& bytes, const std::string& media_type) = 0;
    virtual ImageConfig config(const std::string& bytes) = 0;
    // `where` names the file in messages.
    virtual void check_oci_layout(const std::string& bytes, const std::string& where) = 0;
    virtual LayoutIndex layout_index(const std::string& bytes, const std::string& where) = 0;
    virtual std::vector<DockerArchiveEntry> docker_manifest(const std::string& bytes,
                                                            const std::string& where) = 0;
};

// The parsers themselves (what LocalDocumentParser calls).
void parse_oci_layout(const std::string& bytes, const std::string& where);
LayoutIndex parse_layout_index(const std::string& bytes, const std::string& where);
std::vector<DockerArchiveEntry> parse_docker_manifest(const std::string& bytes,
                                                      const std::string& where);

class LocalDocumentParser : public DocumentParser {
  public:
    Document document(const std::string& bytes, const std::string& media_type) override {
        return parse_manifest_or_index(bytes, media_type);
    }
    ImageConfig config(const std::string& bytes) override { return parse_config(bytes); }
    void check_oci_layout(const std::string& bytes, const std::string& where) override {
        parse_oci_layout(bytes, where);
    }
    LayoutIndex layout_index(const std::string& bytes, const std::string& where) override {
        return parse_layout_index(bytes, where);
    }
    std::vector<DockerArchiveEntry> docker_manifest(const std::string& bytes,
                                                    const std::string& where) override {
        return parse_docker_manifest(bytes, where);
    }
};

}  // namespace berth::images
