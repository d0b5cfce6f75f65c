#include "rootfs-tools/image_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/files.h"
#include "base/unique_fd.h"
#include "rootfs-tools/layer.h"
#include "rootfs-tools/pipe_through.h"
#include "transfer/archive.h"
#include "transfer/root.h"

namespace berth::images {

using nlohmann::json;

namespace {

json read_json(const std::string& path, const char* what) {
    try {
        return json::parse(read_file(path));
    } catch (const json::parse_error& e) {
        throw ManifestError(std::string(what) + " " + path + ": not JSON (" + e.what() + ")");
    }
}

Image image_from_json(const json& j) {
    Image im;
    im.name = j.at("name").get<std::string>();
    im.manifest = Digest::parse(j.at("manifest").get<std::string>());
    im.config = Digest::parse(j.at("config").get<std::string>());
    for (const auto& l : j.at("layers")) im.layers.push_back(Digest::parse(l.get<std::string>()));
    im.size = j.value("size", uint64_t{0});
    im.created = j.value("created", std::string());
    return im;
}

json image_to_json(const Image& im) {
    json layers = json::array();
    for (const auto& l : im.layers) layers.push_back(l.str());
    return {{"name", im.name},           {"manifest", im.manifest.str()},
            {"config", im.config.str()}, {"layers", layers},
            {"size", im.size},           {"created", im.created}};
}

}  // namespace

ImageStore::ImageStore(std::string root, uint32_t id_shift)
    : root_(std::move(root)), id_shift_(id_shift), blobs_(root_) {
    make_dirs(root_ + "/layers", 0755);
}

std::string ImageStore::layer_dir(const Digest& diff_id) const {
    return root_ + "/layers/" + std::string(diff_id.hex());
}

void ImageStore::ensure_layer(const Layer& layer, const Digest& diff_id) {
    const std::string dest = layer_dir(diff_id);
    struct stat st;
    if (::stat(dest.c_str(), &st) == 0) return;  // unpacked (and verified) before
    UniqueFd blob = blobs_.open(layer.blob.digest);
    UnpackOptions o;
    o.id_shift = id_shift_;
    o.diff_id = diff_id;
    try {
        unpack_layer(blob.get(), layer.compression, dest, o);
    } catch (const SysError& e) {
        // Another import unpacked the same layer meanwhile: the same bytes, by its name.
        // (unpack_layer renames without replacing, and has removed its own copy.)
        if (e.code() != EEXIST && e.code() != ENOTEMPTY) throw;
    }
}

Image ImageStore::import_oci_layout(const std::string& dir, const Reference& name,
                                    std::optional<std::string> tag) {
    const json layout = read_json(dir + "/oci-layout", "OCI layout");
    if (layout.value("imageLayoutVersion", std::string()) != "1.0.0")
        throw ManifestError(dir + ": not an OCI image layout 1.0.0 (oci-layout)");
    auto copy_blob = [&](const Descriptor& d) {
        if (blobs_.has(d.digest)) return;
        const std::string path = dir + "/blobs/sha256/" + std::string(d.digest.hex());
        UniqueFd fd(::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
        if (!fd) throw_sys("open", path);
        blobs_.put(d.digest, fd.get(), d.size);  // verified as it is copied
    };
    auto load = [&](const Descriptor& d) {
        copy_blob(d);
        return read_file(blobs_.path(d.digest));
    };

    // index.json is an index itself (not content addressed): pick the entry.
    const std::string index_text = read_file(dir + "/index.json");
    auto top = parse_manifest_or_index(index_text, media::kOciIndex);
    if (!std::holds_alternative<Index>(top)) throw ManifestError(dir + "/index.json: not an index");
    const json index_json = json::parse(index_text);
    const Index& index = std::get<Index>(top);
    const Descriptor* chosen = nullptr;
    for (size_t i = 0; i < index.manifests.size(); ++i) {
        const json& entry = index_json["manifests"][i];
        std::string ref_name;
        if (entry.contains("annotations"))
            ref_name = entry["annotations"].value("org.opencontainers.image.ref.name", "");
        if (tag ? ref_name == *tag : index.manifests.size() == 1) chosen = &index.manifests[i];
    }
    if (!chosen) {
        throw ManifestError(
            dir + "/index.json: " +
            (tag ? "no manifest named " + *tag
                 : std::to_string(index.manifests.size()) + " manifests and no tag to choose one"));
    }
    Descriptor manifest_desc = *chosen;
    auto doc = parse_manifest_or_index(load(manifest_desc), manifest_desc.media_type);
    if (std::holds_alternative<Index>(doc)) {  // a multi-platform image
        manifest_desc = select_manifest(std::get<Index>(doc));
        doc = parse_manifest_or_index(load(manifest_desc), manifest_desc.media_type);
        if (!std::holds_alternative<Manifest>(doc))
            throw ManifestError(dir + ": an index inside an index inside an index");
    }
    const Manifest& manifest = std::get<Manifest>(doc);
    const ImageConfig config = parse_config(load(manifest.config));
    if (config.diff_ids.size() != manifest.layers.size()) {
        throw ManifestError(dir + ": the manifest has " + std::to_string(manifest.layers.size()) +
                            " layers, its config " + std::to_string(config.diff_ids.size()));
    }
    for (const auto& layer : manifest.layers) copy_blob(layer.blob);
    return add_image(name, manifest_desc.digest, manifest, config);
}

Image ImageStore::add_image(const Reference& name, const Digest& manifest_digest,
                            const Manifest& manifest, const ImageConfig& config) {
    if (config.diff_ids.size() != manifest.layers.size()) {
        throw ManifestError(name.str() + ": the manifest has " +
                            std::to_string(manifest.layers.size()) + " layers, its config " +
                            std::to_string(config.diff_ids.size()));
    }
    Image image;
    image.name = name.tag      ? name.name() + ":" + *name.tag
                 : name.digest ? name.name() + "@" + name.digest->str()
                               : name.name() + ":latest";
    image.manifest = manifest_digest;
    image.config = manifest.config.digest;
    image.created = config.created;
    for (size_t i = 0; i < manifest.layers.size(); ++i) {
        ensure_layer(manifest.layers[i], config.diff_ids[i]);
        image.layers.push_back(config.diff_ids[i]);
        image.size += manifest.layers[i].blob.size;
    }
    record(image);  // last: the name appears only once everything it needs is there
    return image;
}

Image ImageStore::import_docker_archive(const std::string& archive, const Reference& name) {
    // The archive is unpacked, by the same strict extractor as any untrusted tar, into a
    // scratch directory of the store (swept on open, should this one be left).
    const std::string dir = blobs_.make_scratch_dir("docker-archive");
    const std::string scratch_rel = dir.substr(root_.size() + 1);
    struct Scratch {
        std::string path;
        ~Scratch() { remove_tree(path); }
    } scratch{dir};
    {
        UniqueFd in(::open(archive.c_str(), O_RDONLY | O_CLOEXEC));
        if (!in) throw_sys("open", archive);
        transfer::extract_archive(in.get(), transfer::Root::open(root_), scratch_rel, {});
    }
    // Paths named by manifest.json stay inside the archive.
    auto member = [&](const json& v, const char* what) {
        if (!v.is_string())
            throw ManifestError(archive + ": manifest.json " + what + " is not a path");
        const std::string rel = v.get<std::string>();
        if (rel.empty() || rel[0] == '/' || ("/" + rel + "/").find("/../") != std::string::npos)
            throw ManifestError(archive + ": manifest.json names " + rel + " outside the archive");
        return dir + "/" + rel;
    };
    const json list = read_json(dir + "/manifest.json", "docker-archive manifest");
    if (!list.is_array() || list.empty())
        throw ManifestError(archive + ": manifest.json lists no image");
    const json* entry = list.size() == 1 ? &list[0] : nullptr;
    const std::string wanted = name.familiar();
    for (const auto& e : list) {
        for (const auto& t : e.value("RepoTags", json::array()))
            if (t.is_string() &&
                (t.get<std::string>() == wanted || parse_reference(t.get<std::string>()) == name))
                entry = &e;
    }
    if (!entry) throw ManifestError(archive + ": holds several images and none is " + wanted);

    const std::string config_text = read_file(member(entry->value("Config", json()), "Config"));
    const ImageConfig config = parse_config(config_text);
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
    for (const auto& l : entry->value("Layers", json::array())) {
        const std::string path = member(l, "Layers");
        // docker save writes plain tars; other tools gzip or zstd them: the magic says.
        Sha256 hash;
        uint64_t size = 0;
        unsigned char magic[4] = {};
        {
            UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
            if (!fd) throw_sys("open", path);
            std::vector<char> buf(1 << 20);
            for (;;) {
                ssize_t n = ::read(fd.get(), buf.data(), buf.size());
                if (n < 0 && errno == EINTR) continue;
                if (n < 0) throw_sys("read", path);
                if (n == 0) break;
                if (size == 0) std::memcpy(magic, buf.data(), std::min<size_t>(4, n));
                hash.update(buf.data(), static_cast<size_t>(n));
                size += static_cast<uint64_t>(n);
            }
        }
        const Digest digest = hash.finish();
        const Compression c =
            magic[0] == 0x1f && magic[1] == 0x8b ? Compression::gzip
            : magic[0] == 0x28 && magic[1] == 0xb5 && magic[2] == 0x2f && magic[3] == 0xfd
                ? Compression::zstd
                : Compression::none;
        const char* type =
            c == Compression::gzip   ? "application/vnd.docker.image.rootfs.diff.tar.gzip"
            : c == Compression::zstd ? "application/vnd.oci.image.layer.v1.tar+zstd"
                                     : "application/vnd.docker.image.rootfs.diff.tar";
        UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
        if (!fd) throw_sys("open", path);
        blobs_.put(digest, fd.get(), size);
        manifest.layers.push_back({{type, digest, size, std::nullopt}, c});
        manifest_json["layers"].push_back(
            {{"mediaType", type}, {"size", size}, {"digest", digest.str()}});
    }
    const Digest manifest_digest = blobs_.put_bytes(manifest_json.dump());
    return add_image(name, manifest_digest, manifest, config);
}

Image ImageStore::import_rootfs_dir(const std::string& dir, const Reference& name,
                                    const ImageConfig& defaults) {
    // The tree's tar: written by transfer's archive writer on a thread, hashed and stored
    // by this one.
    Digest layer_digest = Digest::from_hex(std::string(64, '0'));
    uint64_t layer_size = 0;
    pipe_through(
        [&](int out) {
            transfer::WriteOptions w;
            w.contents_only = true;
            w.name = ".";
            transfer::write_archive(transfer::Root::open(dir), ".", out, w);
        },
        [&](int in) {
            BlobWriter blob = blobs_.writer_for_new();
            std::vector<char> buf(1 << 20);
            for (;;) {
                const ssize_t n = check_sys("read", "the tar of " + dir,
                                            [&] { return ::read(in, buf.data(), buf.size()); });
                if (n == 0) break;
                blob.write(buf.data(), static_cast<size_t>(n));
            }
            layer_size = blob.written();
            layer_digest = blob.commit();
        },
        dir);

    ImageConfig config = defaults;
    config.diff_ids = {layer_digest};  // an uncompressed layer is its own diff_id
    if (config.platform.os.empty()) config.platform = host_platform();
    json config_json = {{"architecture", config.platform.architecture},
                        {"os", config.platform.os},
                        {"config",
                         {{"Env", config.env},
                          {"Cmd", config.cmd},
                          {"Entrypoint", config.entrypoint},
                          {"WorkingDir", config.working_dir},
                          {"User", config.user}}},
                        {"rootfs", {{"type", "layers"}, {"diff_ids", {layer_digest.str()}}}}};
    if (!config.created.empty()) config_json["created"] = config.created;
    const std::string config_text = config_json.dump();
    Manifest manifest{
        std::string(media::kOciManifest),
        {std::string(media::kOciConfig), blobs_.put_bytes(config_text), config_text.size(),
         std::nullopt},
        {{{"application/vnd.oci.image.layer.v1.tar", layer_digest, layer_size, std::nullopt},
          Compression::none}}};
    const json manifest_json = {{"schemaVersion", 2},
                                {"mediaType", media::kOciManifest},
                                {"config",
                                 {{"mediaType", media::kOciConfig},
                                  {"size", config_text.size()},
                                  {"digest", manifest.config.digest.str()}}},
                                {"layers",
                                 {{{"mediaType", "application/vnd.oci.image.layer.v1.tar"},
                                   {"size", layer_size},
                                   {"digest", layer_digest.str()}}}}};
    return add_image(name, blobs_.put_bytes(manifest_json.dump()), manifest, config);
}

void ImageStore::export_oci_layout(const Image& image, const std::string& dir,
                                   const std::string& tag) {
    if (::mkdir(dir.c_str(), 0755) != 0) throw_sys("mkdir", dir);
    make_dirs(dir + "/blobs/sha256", 0755);
    auto put = [&](const Digest& d) {
        const std::string to = dir + "/blobs/sha256/" + std::string(d.hex());
        if (::link(blobs_.path(d).c_str(), to.c_str()) == 0 || errno == EEXIST) return;
        if (errno != EXDEV && errno != EPERM) throw_sys("link", to);
        UniqueFd src = blobs_.open(d);
        UniqueFd dst(::open(to.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
        if (!dst) throw_sys("create", to);
        for (;;) {
            ssize_t n = ::copy_file_range(src.get(), nullptr, dst.get(), nullptr, 1 << 30, 0);
            if (n < 0 && errno == EINTR) continue;
            if (n < 0) throw_sys("copy_file_range", to);
            if (n == 0) break;
        }
    };
    // A pulled multi-platform image is recorded by its index: the layout gets the manifest
    // of the platform that was pulled (the one whose config is the image's).
    Digest manifest_digest = image.manifest;
    std::string manifest_text = read_file(blobs_.path(manifest_digest));
    auto doc = parse_manifest_or_index(manifest_text);
    if (const Index* index = std::get_if<Index>(&doc)) {
        for (const auto& d : index->manifests) {
            if (!blobs_.has(d.digest)) continue;
            std::string text = read_file(blobs_.path(d.digest));
            auto m = parse_manifest_or_index(text, d.media_type);
            if (std::holds_alternative<Manifest>(m) &&
                std::get<Manifest>(m).config.digest == image.config) {
                manifest_digest = d.digest;
                manifest_text = std::move(text);
                doc = std::move(m);
                break;
            }
        }
    }
    if (!std::holds_alternative<Manifest>(doc))
        throw ManifestError(image.name + ": its manifest blob is not a manifest");
    const Manifest& manifest = std::get<Manifest>(doc);
    put(manifest_digest);
    put(manifest.config.digest);
    for (const auto& l : manifest.layers) put(l.blob.digest);
    const json index = {{"schemaVersion", 2},
                        {"mediaType", media::kOciIndex},
                        {"manifests",
                         {{{"mediaType", manifest.media_type},
                           {"digest", manifest_digest.str()},
                           {"size", manifest_text.size()},
                           {"annotations", {{"org.opencontainers.image.ref.name", tag}}}}}}};
    write_file_atomic(dir + "/index.json", index.dump() + "\n");
    write_file_atomic(dir + "/oci-layout", "{\"imageLayoutVersion\": \"1.0.0\"}\n");
}

void ImageStore::record(const Image& image) {
    std::lock_guard lock(mu_);
    const std::string path = root_ + "/images.json";
    json all = json::object();
    struct stat st;
    if (::stat(path.c_str(), &st) == 0) all = read_json(path, "image list");
    all[image.name] = image_to_json(image);
    write_file_atomic(path, all.dump(1) + "\n");
}

std::vector<Image> ImageStore::list() const {
    std::lock_guard lock(mu_);
    const std::string path = root_ + "/images.json";
    std::vector<Image> out;
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) return out;
    const json all =
        read_json(path, "image list");  // (a named object: GCC's -Wmaybe-uninitialized)
    for (auto it = all.begin(); it != all.end(); ++it) out.push_back(image_from_json(*it));
    return out;
}

std::optional<Image> ImageStore::find(const Reference& ref) const {
    for (auto& im : list()) {
        const bool found = ref.digest ? im.manifest == *ref.digest &&
                                            (im.name.rfind(ref.name() + ":", 0) == 0 ||
                                             im.name == ref.name() + "@" + ref.digest->str())
                                      : im.name == ref.name() + ":" + ref.tag.value_or("latest");
        if (found) return im;
    }
    return std::nullopt;
}

std::vector<std::string> ImageStore::lower_dirs(const Image& image) const {
    std::vector<std::string> dirs;
    for (auto it = image.layers.rbegin(); it != image.layers.rend(); ++it)
        dirs.push_back(layer_dir(*it));
    return dirs;
}

}  // namespace berth::images
