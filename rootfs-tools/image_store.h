// Images on disk: the blob store, every layer unpacked once (layers/<diff_id hex>, shared
// by all images and sandboxes that use it), and the names (images.json: reference → the
// manifest it resolved to). Imports verify every blob they copy and write the names last,
// so an interrupted import leaves nothing a later one trusts.
#pragma once

#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "rootfs-tools/blob_store.h"
#include "rootfs-tools/manifest.h"
#include "rootfs-tools/reference.h"

namespace berth::images {

struct Image {
    std::string name;  // a full reference without digest: "docker.io/library/debian:12"
    Digest manifest = Digest::from_hex(std::string(64, '0'));
    Digest config = Digest::from_hex(std::string(64, '0'));
    std::vector<Digest> layers;  // diff_ids, bottom first
    uint64_t size = 0;           // compressed bytes of the layers, as a registry counts
    std::string created;
};

class ImageStore {
  public:
    // `id_shift`: the sandboxes' root uid/gid outside, given to unpacked layers' owners.
    ImageStore(std::string root, uint32_t id_shift);

    // Imports an OCI image layout directory: the manifest named `tag` in its index.json
    // (org.opencontainers.image.ref.name), or its only one; an index inside is resolved
    // to this host's platform. The image is recorded under `name`.
    Image import_oci_layout(const std::string& dir, const Reference& name,
                            std::optional<std::string> tag = {});

    // Imports a `docker save` / `skopeo copy ... docker-archive:` tar: the image tagged
    // `name` in it, or its only one. Its layers become blobs as they are (plain tars, or
    // gzip/zstd as found) under a Docker schema 2 manifest made here.
    Image import_docker_archive(const std::string& archive, const Reference& name);

    // Makes a one-layer image of a root filesystem directory (what debootstrap leaves):
    // its tree as an uncompressed layer tar (owners as they are there: root's files
    // belong to the sandboxes' root once unpacked), `config` for the run settings.
    Image import_rootfs_dir(const std::string& dir, const Reference& name,
                            const ImageConfig& config);

    // Writes `image` as an OCI image layout into `dir` (made; it must not exist), its
    // manifest named by `tag` in index.json. Blobs are hard links where the filesystem
    // allows (they are immutable), else copies. Importing it again gives the same digest.
    void export_oci_layout(const Image& image, const std::string& dir, const std::string& tag);

    std::vector<Image> list() const;
    std::optional<Image> find(const Reference& ref) const;
    // The overlay lower directories of `image`, top layer first (overlayfs's order).
    std::vector<std::string> lower_dirs(const Image& image) const;
    std::string layer_dir(const Digest& diff_id) const;

    BlobStore& blobs() { return blobs_; }

    // Unpacks the layer's blob unless layers/<diff_id> exists. Safe when several threads or
    // processes unpack the same layer: each into a temporary directory, the first rename
    // wins and the others discard theirs.
    void ensure_layer(const Layer& layer, const Digest& diff_id);
    // Unpacks what is missing and records the image under `name`: name:tag, or name@digest
    // for a reference with a digest and no tag (a pull by digest). The blobs must be in the
    // store already. `manifest_digest` may be an index's (what a registry resolved the name
    // to); `manifest` is then the platform's manifest in it.
    Image add_image(const Reference& name, const Digest& manifest_digest, const Manifest& manifest,
                    const ImageConfig& config);

  private:
    void record(const Image& image);

    std::string root_;
    uint32_t id_shift_;
    BlobStore blobs_;
    mutable std::mutex mu_;  // images.json read-modify-write
};

}  // namespace berth::images
