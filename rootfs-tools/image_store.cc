#include "rootfs-tools/image_store.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/files.h"
#include "base/unique_fd.h"
#include "rootfs-tools/layer.h"

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
        if (e.code() != EEXIST) throw;
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
    Image image;
    image.name = name.name() + ":" + (name.tag ? *name.tag : std::string("latest"));
    image.manifest = manifest_desc.digest;
    image.config = manifest.config.digest;
    image.created = config.created;
    for (size_t i = 0; i < manifest.layers.size(); ++i) {
        copy_blob(manifest.layers[i].blob);
        ensure_layer(manifest.layers[i], config.diff_ids[i]);
        image.layers.push_back(config.diff_ids[i]);
        image.size += manifest.layers[i].blob.size;
    }
    record(image);  // last: the name appears only once everything it needs is there
    return image;
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
        if (ref.digest ? im.manifest == *ref.digest && im.name.rfind(ref.name() + ":", 0) == 0
                       : im.name == ref.name() + ":" + ref.tag.value_or("latest"))
            return im;
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
