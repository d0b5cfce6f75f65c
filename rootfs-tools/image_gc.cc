// Removing images and what nothing uses any more. What an image needs is found from its
// manifest blob (an index's present manifests, their configs and layer blobs) and its
// layers (diff_ids); everything a name or a live sandbox needs is kept, the rest of the
// candidates go. A layer directory is first renamed out of its name (so no one can start
// using half of it), then removed.
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <unordered_set>

#include "base/error.h"
#include "base/files.h"
#include "rootfs-tools/image_lookup.h"
#include "rootfs-tools/image_store.h"

namespace berth::images {

using nlohmann::json;

namespace {

// Disk blocks under `path` (not following symlinks), each inode counted once: what removing
// it gives back.
uint64_t disk_usage(int dirfd, const char* name, std::set<std::pair<dev_t, ino_t>>& seen) {
    struct stat st;
    if (::fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) return 0;
    uint64_t total = 0;
    if (seen.insert({st.st_dev, st.st_ino}).second)
        total += static_cast<uint64_t>(st.st_blocks) * 512;
    if (!S_ISDIR(st.st_mode)) return total;
    const int fd = ::openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return total;
    DIR* d = ::fdopendir(fd);
    if (!d) {
        ::close(fd);
        return total;
    }
    while (dirent* e = ::readdir(d)) {
        if (std::strcmp(e->d_name, ".") == 0 || std::strcmp(e->d_name, "..") == 0) continue;
        total += disk_usage(::dirfd(d), e->d_name, seen);
    }
    ::closedir(d);
    return total;
}

uint64_t disk_usage(const std::string& path) {
    std::set<std::pair<dev_t, ino_t>> seen;
    return disk_usage(AT_FDCWD, path.c_str(), seen);
}

std::vector<std::string> dir_entries(const std::string& dir) {
    std::vector<std::string> out;
    DIR* d = ::opendir(dir.c_str());
    if (!d) throw_sys("opendir", dir);
    while (dirent* e = ::readdir(d)) {
        if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0)
            out.emplace_back(e->d_name);
    }
    ::closedir(d);
    return out;
}

bool is_hex64(const std::string& s) {
    return s.size() == 64 && s.find_first_not_of("0123456789abcdef") == std::string::npos;
}

struct Needed {
    std::unordered_set<std::string> blobs;   // digests
    std::unordered_set<std::string> layers;  // diff_id digests
};

}  // namespace

bool ImageStore::forget(const std::string& name) {
    std::lock_guard lock(mu_);
    const std::string path = root_ + "/images.json";
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) return false;
    json all;
    try {
        all = json::parse(berth::read_file(path));
    } catch (const json::parse_error& e) {
        throw ManifestError("image list " + path + ": not JSON (" + e.what() + ")");
    }
    if (!all.is_object() || all.erase(name) == 0) return false;
    write_file_atomic(path, all.dump(1) + "\n");
    return true;
}

void ImageStore::sweep_layers(RemoveResult* result) {
    const std::string dir = root_ + "/layers";
    for (const auto& name : dir_entries(dir)) {
        if (name[0] != '.' || (name.find(".unpacking-") == std::string::npos &&
                               name.find(".removing-") == std::string::npos))
            continue;
        const std::string path = dir + "/" + name;
        if (result) result->freed_bytes += disk_usage(path);
        remove_tree(path);
    }
}

void ImageStore::collect(const std::vector<Digest>* blob_candidates,
                         const std::vector<Digest>* layer_candidates,
                         const std::vector<InUse>& in_use, RemoveResult& result) {
    // What every name and every sandbox needs.
    Needed needed;
    auto need_manifest = [&](const Digest& digest, bool* known) {
        // A manifest, or an index and those of its manifests that are here; with their
        // configs (and the config's diff_ids: the layers) and layer blobs.
        std::vector<Digest> todo{digest};
        for (size_t i = 0; i < todo.size() && i < 64; ++i) {
            const Digest d = todo[i];
            needed.blobs.insert(d.str());
            if (!blobs_.has(d)) continue;
            auto doc = parser_->document(berth::read_file(blobs_.path(d)), "");
            if (const Index* index = std::get_if<Index>(&doc)) {
                for (const auto& m : index->manifests)
                    if (blobs_.has(m.digest)) todo.push_back(m.digest);
                continue;
            }
            const Manifest& m = std::get<Manifest>(doc);
            needed.blobs.insert(m.config.digest.str());
            for (const auto& l : m.layers) needed.blobs.insert(l.blob.digest.str());
            if (blobs_.has(m.config.digest)) {
                for (const auto& diff_id :
                     parser_->config(berth::read_file(blobs_.path(m.config.digest))).diff_ids)
                    needed.layers.insert(diff_id.str());
                if (known) *known = true;
            }
        }
    };
    const auto images = list();
    for (const auto& im : images) {
        need_manifest(im.manifest, nullptr);
        needed.blobs.insert(im.config.str());
        for (const auto& l : im.layers) needed.layers.insert(l.str());
    }
    for (const auto& use : in_use) {
        bool known = false;
        for (const auto& im : images) {
            if (im.manifest == use.manifest) known = true;  // its name's layers are kept
        }
        need_manifest(use.manifest, &known);
        if (!known) {
            // Its layers cannot be told: deleting anything could take one from under it.
            throw ManifestError("cannot tell which layers sandbox " + use.sandbox + " uses (" +
                                use.manifest.str() +
                                " is neither named nor in the store): nothing removed");
        }
    }

    const std::vector<Digest> all_blobs = blob_candidates ? std::vector<Digest>{} : blobs_.list();
    for (const auto& d : blob_candidates ? *blob_candidates : all_blobs) {
        if (needed.blobs.count(d.str()) || !blobs_.has(d)) continue;
        result.freed_bytes += disk_usage(blobs_.path(d));
        blobs_.remove(d);
        result.deleted.push_back(d.str());
    }
    std::vector<Digest> all_layers;
    if (!layer_candidates) {
        for (const auto& name : dir_entries(root_ + "/layers"))
            if (is_hex64(name)) all_layers.push_back(Digest::from_hex(name));
    }
    std::random_device rd;
    for (const auto& diff_id : layer_candidates ? *layer_candidates : all_layers) {
        if (needed.layers.count(diff_id.str())) continue;
        const std::string dir = layer_dir(diff_id);
        // Out of its name first: from here on nobody finds it, and a crash leaves a
        // ".removing-" directory for the next sweep rather than half a layer.
        const std::string doomed =
            root_ + "/layers/." + std::string(diff_id.hex()) + ".removing-" + std::to_string(rd());
        if (::rename(dir.c_str(), doomed.c_str()) != 0) {
            if (errno == ENOENT) continue;
            throw_sys("rename", dir);
        }
        result.freed_bytes += disk_usage(doomed);
        remove_tree(doomed);
        result.deleted.push_back("layer " + diff_id.str());
    }
}

RemoveResult ImageStore::remove(const Image& image, const std::vector<InUse>& in_use, bool force) {
    RemoveResult result;
    for (const auto& use : in_use) {
        if (use.manifest != image.manifest) continue;
        if (!force) {
            throw ImageInUse("image " + image.name + " is used by sandbox " + use.sandbox +
                             " (delete the sandbox first, or force to remove only the name)");
        }
        if (!forget(image.name)) throw ImageNotFound("no image named " + image.name);
        result.untagged.push_back(image.name);
        return result;
    }
    // The content goes under the exclusive lock, so no import that will need it is half way.
    std::unique_lock lock(content_mu_);
    if (!forget(image.name)) throw ImageNotFound("no image named " + image.name);
    result.untagged.push_back(image.name);
    std::vector<Digest> blobs{image.manifest, image.config};
    if (blobs_.has(image.manifest)) {
        auto doc = parser_->document(berth::read_file(blobs_.path(image.manifest)), "");
        std::vector<Manifest> manifests;
        if (const Index* index = std::get_if<Index>(&doc)) {
            for (const auto& m : index->manifests) {
                if (!blobs_.has(m.digest)) continue;
                blobs.push_back(m.digest);
                auto child =
                    parser_->document(berth::read_file(blobs_.path(m.digest)), m.media_type);
                if (const Manifest* cm = std::get_if<Manifest>(&child)) manifests.push_back(*cm);
            }
        } else {
            manifests.push_back(std::get<Manifest>(doc));
        }
        for (const auto& m : manifests) {
            blobs.push_back(m.config.digest);
            for (const auto& l : m.layers) blobs.push_back(l.blob.digest);
        }
    }
    collect(&blobs, &image.layers, in_use, result);
    return result;
}

RemoveResult ImageStore::prune(const std::vector<InUse>& in_use) {
    std::unique_lock lock(content_mu_);
    RemoveResult result;
    sweep_layers(&result);  // no unpack runs now: what is there was left by a crash
    collect(nullptr, nullptr, in_use, result);
    return result;
}

}  // namespace berth::images
