#include "rootfs-tools/image_store.h"

#include <fcntl.h>
#include <ftw.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
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

ImageStore::ImageStore(std::string root, uint32_t uid_shift, uint32_t gid_shift)
    : root_(std::move(root)), uid_shift_(uid_shift), gid_shift_(gid_shift), blobs_(root_) {
    // The store is root's alone, and so made again at every open (a store an older berth
    // made was 0755): its layers hold the images' setuid files (owned by the sandboxes'
    // root uid) and whatever else a stranger's image brings, which no host user may run
    // or read. Nothing but root walks it: the helper mounts the layers as root, and the
    // overlay looks up lower layers with the mounter's credentials, not the sandbox's.
    make_dirs(root_ + "/layers", 0700);
    for (const std::string& dir : {root_, root_ + "/layers"})
        check_sys("chmod", dir, [&] { return ::chmod(dir.c_str(), 0700); });
    sweep_layers(nullptr);
    check_format();
}

namespace {

// Format 1 -> 2: every directory of every layer marked opaque with the trusted.* form gets
// the user.* form instead. The trees are the store's own (unpacked and verified before), and
// nftw with FTW_PHYS never follows a symlink in them.
int convert_opaque(const char* path, const struct stat* st, int type, struct FTW*) {
    if (type != FTW_D || !S_ISDIR(st->st_mode)) return 0;
    char value[8];
    const ssize_t n = ::lgetxattr(path, "trusted.overlay.opaque", value, sizeof(value));
    if (n < 0) return errno == ENODATA ? 0 : -1;
    if (::lsetxattr(path, "user.overlay.opaque", value, static_cast<size_t>(n), 0) != 0) return -1;
    return ::lremovexattr(path, "trusted.overlay.opaque");
}

}  // namespace

void ImageStore::check_format() {
    const std::string file = root_ + "/format";
    struct stat st;
    if (::stat(file.c_str(), &st) == 0) {
        const std::string have = berth::read_file(file);
        if (have != std::to_string(kStoreFormat) + "\n") {
            throw std::runtime_error("the image store " + root_ + " has format '" +
                                     have.substr(0, have.find('\n')) + "'; this berth reads " +
                                     std::to_string(kStoreFormat) +
                                     " (remove the store, or use the berth that made it)");
        }
        return;
    }
    const std::string layers = root_ + "/layers";
    for (const auto& entry : std::filesystem::directory_iterator(layers)) {
        if (entry.path().filename().string()[0] == '.') continue;
        const std::string dir = entry.path().string();
        if (::nftw(dir.c_str(), convert_opaque, 64, FTW_PHYS | FTW_MOUNT) != 0)
            throw_sys("convert layer to user.overlay xattrs", dir);
    }
    write_file_atomic(file, std::to_string(kStoreFormat) + "\n", 0644);
}

std::string ImageStore::layer_dir(const Digest& diff_id) const {
    return root_ + "/layers/" + std::string(diff_id.hex());
}

UnpackedSize ImageStore::ensure_layer(const Layer& layer, const Digest& diff_id,
                                      const UnpackedSize& used) {
    const std::string dest = layer_dir(diff_id);
    struct stat st;
    if (::stat(dest.c_str(), &st) == 0)  // unpacked (and verified) before
        return unpacked_size(dest).value_or(UnpackedSize{});
    UniqueFd blob = blobs_.open(layer.blob.digest);
    UnpackOptions o;
    o.uid_shift = uid_shift_;
    o.gid_shift = gid_shift_;
    o.diff_id = diff_id;
    // Format 2: what an unpacker in a user namespace can write (kStoreFormat).
    o.rootless = true;
    o.max_bytes = limits_.max_bytes - std::min(used.bytes, limits_.max_bytes);
    o.max_entries = limits_.max_entries - std::min(used.entries, limits_.max_entries);
    o.limit_hint = "an image unpacks to at most " + std::to_string(limits_.max_bytes) +
                   " bytes of files and " + std::to_string(limits_.max_entries) +
                   " entries, its layers together, and the layers below this one take " +
                   std::to_string(used.bytes) + " and " + std::to_string(used.entries) +
                   ": berthd --max-image-size, --max-image-entries";
    try {
        const UnpackResult r = unpacker_ ? unpacker_(blob.get(), layer.compression, dest, o)
                                         : unpack_layer(blob.get(), layer.compression, dest, o);
        return {r.bytes, r.entries};
    } catch (const SysError& e) {
        // Another import unpacked the same layer meanwhile: the same bytes, by its name.
        // (unpack_layer renames without replacing, and has removed its own copy.)
        if (e.code() != EEXIST && e.code() != ENOTEMPTY) throw;
        return unpacked_size(dest).value_or(UnpackedSize{});
    }
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
    UnpackedSize used;
    for (size_t i = 0; i < manifest.layers.size(); ++i) {
        const UnpackedSize got = ensure_layer(manifest.layers[i], config.diff_ids[i], used);
        used.bytes += got.bytes;
        used.entries += got.entries;
        // Layers unpacked before (by another image, or by a parallel pull, which bounds
        // each layer alone) count here: the image is refused, its name never written.
        if (used.bytes > limits_.max_bytes || used.entries > limits_.max_entries) {
            throw LayerTooLarge(image.name + ": its layers unpack to more than the limit (" +
                                std::to_string(used.bytes) + " bytes of files, " +
                                std::to_string(used.entries) + " entries; at most " +
                                std::to_string(limits_.max_bytes) + " and " +
                                std::to_string(limits_.max_entries) +
                                ": berthd --max-image-size, --max-image-entries)");
        }
        image.layers.push_back(config.diff_ids[i]);
        image.size += manifest.layers[i].blob.size;
    }
    record(image);  // last: the name appears only once everything it needs is there
    return image;
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
    auto doc = parser_->document(manifest_text, "");
    if (const Index* index = std::get_if<Index>(&doc)) {
        for (const auto& d : index->manifests) {
            if (!blobs_.has(d.digest)) continue;
            std::string text = read_file(blobs_.path(d.digest));
            auto m = parser_->document(text, d.media_type);
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
