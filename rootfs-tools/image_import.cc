// The image store's importers: an OCI image layout (a directory, or a tar of one) and a
// docker-archive tar. Everything is read through a SourceDir (never a path joined from
// what an archive says, never through a symlink), every blob is verified as it is copied,
// and the name is recorded last.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/files.h"
#include "base/unique_fd.h"
#include "rootfs-tools/image_store.h"
#include "rootfs-tools/source_dir.h"
#include "transfer/archive.h"
#include "transfer/root.h"

namespace berth::images {

using nlohmann::json;

namespace {

// Manifests and configs are small; a descriptor that says otherwise is not loaded into
// memory on its word.
constexpr uint64_t kMaxDocument = 16u << 20;

// A tar extracted into one of the store's scratch directories, removed with this object
// (or, after a crash, by the next BlobStore's sweep).
class ScratchArchive {
  public:
    ScratchArchive(BlobStore& blobs, const std::string& store_root,
                   const ArchiveExtractor& extractor, int in, const CancelToken* cancel,
                   const std::string& label)
        : dir_(blobs.make_scratch_dir("import")) {
        const std::string dest = dir_.path + "/archive";
        if (extractor) {
            extractor(in, cancel, dest);
        } else {
            transfer::ExtractOptions x;
            x.cancel = cancel;
            transfer::extract_archive(in, transfer::Root::open(store_root),
                                      dest.substr(store_root.size() + 1), x);
        }
        UniqueFd dir(::open(dest.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
        if (!dir) throw_sys("open", dest);
        source_.emplace(std::move(dir), label);
    }
    const SourceDir& source() const { return *source_; }

  private:
    // A member of its own: removed also when the constructor throws (a bad archive).
    struct Dir {
        explicit Dir(std::string p) : path(std::move(p)) {}
        ~Dir() { remove_tree(path); }
        Dir(const Dir&) = delete;
        Dir& operator=(const Dir&) = delete;
        std::string path;
    } dir_;
    std::optional<SourceDir> source_;
};

Compression sniff_compression(const unsigned char* m, size_t n) {
    if (n >= 2 && m[0] == 0x1f && m[1] == 0x8b) return Compression::gzip;
    if (n >= 4 && m[0] == 0x28 && m[1] == 0xb5 && m[2] == 0x2f && m[3] == 0xfd)
        return Compression::zstd;
    return Compression::none;
}

}  // namespace

Image ImageStore::import_oci_layout(const std::string& dir, const Reference& name,
                                    std::optional<std::string> tag) {
    UniqueFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!fd) throw_sys("open", dir);
    return import_layout_from(SourceDir(std::move(fd), dir), name, std::move(tag));
}

Image ImageStore::import_docker_archive(const std::string& archive, const Reference& name) {
    UniqueFd in(::open(archive.c_str(), O_RDONLY | O_CLOEXEC));
    if (!in) throw_sys("open", archive);
    ScratchArchive scratch(blobs_, root_, archive_extractor_, in.get(), nullptr, archive);
    return import_docker_from(scratch.source(), name);
}

Image ImageStore::import_fd(int fd, const std::optional<Reference>& name,
                            const ImportOptions& options) {
    struct stat st;
    if (::fstat(fd, &st) != 0) throw_sys("stat", options.label);
    const int flags = ::fcntl(fd, F_GETFL);
    if (flags < 0) throw_sys("fcntl", options.label);
    if ((flags & O_PATH) || (flags & O_ACCMODE) == O_WRONLY)
        throw_sys("read", options.label + " (the fd is not open for reading)", EBADF);
    if (S_ISDIR(st.st_mode)) {
        // Our own descriptor of the same open directory (the caller keeps theirs).
        UniqueFd dir(::fcntl(fd, F_DUPFD_CLOEXEC, 0));
        if (!dir) throw_sys("dup", options.label);
        return import_layout_from(SourceDir(std::move(dir), options.label, options.caller), name,
                                  std::nullopt);
    }
    if (!S_ISREG(st.st_mode) && !S_ISFIFO(st.st_mode))
        throw_sys("read", options.label + " (neither a tar file nor a directory)", EINVAL);
    ScratchArchive scratch(blobs_, root_, archive_extractor_, fd, options.cancel, options.label);
    if (scratch.source().has("oci-layout"))
        return import_layout_from(scratch.source(), name, std::nullopt);
    if (scratch.source().has("manifest.json")) return import_docker_from(scratch.source(), name);
    throw ManifestError(options.label +
                        ": neither an OCI image layout (no oci-layout file) nor a docker-archive "
                        "(no manifest.json)");
}

Image ImageStore::import_layout_from(const SourceDir& src, const std::optional<Reference>& name,
                                     std::optional<std::string> tag) {
    // Every document here is parsed by the store's parser (document_parser.h), not here.
    parser_->check_oci_layout(src.read_file("oci-layout"), src.where("oci-layout"));
    auto copy_blob = [&](const Descriptor& d) {
        if (blobs_.has(d.digest)) return;
        UniqueFd fd = src.open_file("blobs/sha256/" + std::string(d.digest.hex()));
        blobs_.put(d.digest, fd.get(), d.size);  // verified as it is copied
    };
    auto load = [&](const Descriptor& d) {
        if (d.size > kMaxDocument)
            throw ManifestError(src.label() + ": " + d.digest.str() + " claims " +
                                std::to_string(d.size) + " bytes, too many for a manifest");
        copy_blob(d);
        return berth::read_file(blobs_.path(d.digest));
    };

    // index.json is an index itself (not content addressed): pick the entry.
    const LayoutIndex layout =
        parser_->layout_index(src.read_file("index.json"), src.where("index.json"));
    const Index& index = layout.index;
    if (layout.names.size() != index.manifests.size())
        throw ManifestError(src.where("index.json") + ": the parser lost its entries' names");
    const Descriptor* chosen = nullptr;
    std::optional<Reference> recorded;  // the name the layout gives the chosen manifest
    std::string names;                  // what it has, for the message when none fits
    for (size_t i = 0; i < index.manifests.size(); ++i) {
        const std::string& ref_name = layout.names[i].ref_name;
        if (!ref_name.empty()) names += (names.empty() ? "" : ", ") + ref_name;
        const std::string& full_name = layout.names[i].image_name;
        // A full reference in either annotation names the image; a bare tag only tags it.
        std::optional<Reference> named;
        for (const std::string& text : {full_name, ref_name}) {
            if (named || text.find_first_of("/:@") == std::string::npos) continue;
            try {
                named = parse_reference(text);
            } catch (const std::invalid_argument&) {
            }
        }
        bool match;
        if (tag) {
            match = ref_name == *tag;
        } else if (index.manifests.size() == 1) {
            match = true;
        } else if (name) {
            match = (named && *named == *name) || ref_name == name->tag.value_or("latest");
        } else {
            match = false;
        }
        if (match) {
            chosen = &index.manifests[i];
            recorded = named;
        }
    }
    if (!chosen) {
        throw ManifestError(src.where("index.json") + ": " +
                            (tag    ? "no manifest named " + *tag
                             : name ? "none of its " + std::to_string(index.manifests.size()) +
                                          " manifests is named " + name->familiar() +
                                          " or tagged " + name->tag.value_or("latest")
                                    : std::to_string(index.manifests.size()) +
                                          " manifests and no name to choose one by") +
                            (names.empty() ? "" : " (it has: " + names + ")"));
    }
    if (!name && !recorded) {
        throw ManifestError(src.where("index.json") +
                            ": the image has no full name (org.opencontainers.image.ref.name is "
                            "at most a tag): give one to record it under");
    }
    Descriptor manifest_desc = *chosen;
    auto doc = parser_->document(load(manifest_desc), manifest_desc.media_type);
    if (std::holds_alternative<Index>(doc)) {  // a multi-platform image
        manifest_desc = select_manifest(std::get<Index>(doc));
        doc = parser_->document(load(manifest_desc), manifest_desc.media_type);
        if (!std::holds_alternative<Manifest>(doc))
            throw ManifestError(src.label() + ": an index inside an index inside an index");
    }
    const Manifest& manifest = std::get<Manifest>(doc);
    const ImageConfig config = parser_->config(load(manifest.config));
    if (config.diff_ids.size() != manifest.layers.size()) {
        throw ManifestError(src.label() + ": the manifest has " +
                            std::to_string(manifest.layers.size()) + " layers, its config " +
                            std::to_string(config.diff_ids.size()));
    }
    for (const auto& layer : manifest.layers) copy_blob(layer.blob);
    return add_image(name ? *name : *recorded, manifest_desc.digest, manifest, config);
}

Image ImageStore::import_docker_from(const SourceDir& src, const std::optional<Reference>& name) {
    const std::vector<DockerArchiveEntry> list =
        parser_->docker_manifest(src.read_file("manifest.json"), src.where("manifest.json"));
    const DockerArchiveEntry* entry = list.size() == 1 ? &list[0] : nullptr;
    if (name) {
        for (const auto& e : list) {
            for (const auto& t : e.repo_tags) {
                try {
                    if (t == name->familiar() || parse_reference(t) == *name) entry = &e;
                } catch (const std::invalid_argument&) {
                }
            }
        }
    }
    if (!entry) {
        throw ManifestError(src.label() + ": holds " + std::to_string(list.size()) +
                            " images and " +
                            (name ? "none is " + name->familiar() : "no name to choose one by"));
    }
    std::optional<Reference> recorded = name;
    if (!recorded) {
        if (entry->repo_tags.empty())
            throw ManifestError(src.label() +
                                ": the image has no RepoTags: give a name to record it under");
        try {
            recorded = parse_reference(entry->repo_tags.front());
        } catch (const std::invalid_argument& e) {
            throw ManifestError(src.label() + ": its RepoTags name " + entry->repo_tags.front() +
                                ": " + e.what());
        }
    }
    // Paths named by manifest.json are read beneath the archive, never through a symlink.
    auto member = [&](const std::string& rel, const char* what) {
        if (rel.empty() || rel[0] == '/' || ("/" + rel + "/").find("/../") != std::string::npos)
            throw ManifestError(src.where("manifest.json") + ": " + what + " names " + rel +
                                " outside the archive");
        return rel;
    };

    const std::string config_text = src.read_file(member(entry->config, "Config"), kMaxDocument);
    const ImageConfig config = parser_->config(config_text);
    Manifest manifest{std::string(media::kDockerManifest),
                      {std::string(media::kDockerConfig), blobs_.put_bytes(config_text),
                       config_text.size(), std::nullopt},
                      {}};
    json manifest_json = {{"schemaVersion", 2},
                          {"mediaType", media::kDockerManifest},
                          {"config",
                           {{"mediaType", media::kDockerConfig},
                            {"size", config_text.size()},
                            {"digest", manifest.config.digest.str()}}},
                          {"layers", json::array()}};
    for (const auto& l : entry->layers) {
        const std::string rel = member(l, "Layers");
        // docker save writes plain tars; other tools gzip or zstd them: the magic says. One
        // pass: the blob is named by what it hashes to.
        UniqueFd fd = src.open_file(rel);
        BlobWriter blob = blobs_.writer_for_new();
        unsigned char magic[4] = {};
        size_t magic_len = 0;
        std::vector<char> buf(1 << 20);
        for (;;) {
            const ssize_t n = check_sys("read", src.where(rel),
                                        [&] { return ::read(fd.get(), buf.data(), buf.size()); });
            if (n == 0) break;
            while (magic_len < sizeof magic &&
                   magic_len < blob.written() + static_cast<size_t>(n)) {
                magic[magic_len] = static_cast<unsigned char>(buf[magic_len - blob.written()]);
                ++magic_len;
            }
            blob.write(buf.data(), static_cast<size_t>(n));
        }
        const uint64_t size = blob.written();
        const Digest digest = blob.commit();
        const Compression c = sniff_compression(magic, magic_len);
        const char* type =
            c == Compression::gzip   ? "application/vnd.docker.image.rootfs.diff.tar.gzip"
            : c == Compression::zstd ? "application/vnd.oci.image.layer.v1.tar+zstd"
                                     : "application/vnd.docker.image.rootfs.diff.tar";
        manifest.layers.push_back({{type, digest, size, std::nullopt}, c});
        manifest_json["layers"].push_back(
            {{"mediaType", type}, {"size", size}, {"digest", digest.str()}});
    }
    const Digest manifest_digest = blobs_.put_bytes(manifest_json.dump());
    return add_image(*recorded, manifest_digest, manifest, config);
}

}  // namespace berth::images
