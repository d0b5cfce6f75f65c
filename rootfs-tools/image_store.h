// Images on disk: the blob store, every layer unpacked once (layers/<diff_id hex>, shared
// by all images and sandboxes that use it), and the names (images.json: reference → the
// manifest it resolved to). Imports verify every blob they copy and write the names last,
// so an interrupted import leaves nothing a later one trusts.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <vector>

#include "base/cancel.h"
#include "base/error.h"
#include "rootfs-tools/blob_store.h"
#include "rootfs-tools/document_parser.h"
#include "rootfs-tools/layer.h"
#include "rootfs-tools/manifest.h"
#include "rootfs-tools/reference.h"
#include "rootfs-tools/source_dir.h"

namespace berth::images {

struct Image {
    std::string name;  // a full reference without digest: "docker.io/library/debian:12"
    Digest manifest = Digest::from_hex(std::string(64, '0'));
    Digest config = Digest::from_hex(std::string(64, '0'));
    std::vector<Digest> layers;  // diff_ids, bottom first
    uint64_t size = 0;           // compressed bytes of the layers, as a registry counts
    std::string created;
};

// How import_fd reads what it is given.
struct ImportOptions {
    std::string label = "the imported image";  // how messages name the source
    // A directory is read with this user's rights (see SourceDir); none: with our own.
    std::optional<Caller> caller;
    const CancelToken* cancel = nullptr;  // cancelled: stop reading a tar (as transfer's)
};

// A manifest a live sandbox uses, and how to name that sandbox in a refusal.
struct InUse {
    Digest manifest;
    std::string sandbox;
};

// Refused: the image is used by a sandbox (what() names it).
class ImageInUse : public Error {
  public:
    explicit ImageInUse(const std::string& what) : Error(Kind::failed_precondition, what) {}
};

struct RemoveResult {
    std::vector<std::string> untagged;  // names
    std::vector<std::string> deleted;   // "sha256:..." for blobs, "layer sha256:..." for layers
    uint64_t freed_bytes = 0;           // disk blocks given back
};

// What unpacks a layer for the store (unpack_layer's shape). berth-images gives the store one
// that runs it in an unprivileged worker in a user namespace (src/runtime/images/
// unpack_worker.h); without one, unpack_layer runs in this process.
using Unpacker = std::function<UnpackResult(int blob_fd, Compression compression,
                                            const std::string& dest, const UnpackOptions& options)>;

// What extracts an image archive (a docker-archive or an OCI layout as a tar, read from `in`
// until its end or until `cancel`, when given, is cancelled) into the new directory `dest`,
// strictly (transfer's extractor: nothing outside `dest`, no device, owners its own). berth-images
// gives the store one that runs it in the unpack worker; without one it runs here.
using ArchiveExtractor =
    std::function<void(int in, const CancelToken* cancel, const std::string& dest)>;

// The on-disk format of the store. 2: opaque directories are marked `user.overlay.opaque`
// (what a user namespace can write; the overlay is mounted with `userxattr`) and layers hold
// no device nodes. A store of format 1 (trusted.overlay.opaque, written as root) is
// converted when it is opened.
constexpr int kStoreFormat = 2;
// Bounds on what an image unpacks to, checked while each layer is extracted (a layer that
// would take the image past one is refused before it fills the disk): bytes of file data
// (sparse files at their apparent size) and entries, of all its layers together. Layers
// it shares with images already stored count too.
struct ImageLimits {
    uint64_t max_bytes = uint64_t{32} << 30;  // 32 GiB
    uint64_t max_entries = 4u << 20;          // 4 Mi entries
};

class ImageStore {
  public:
    // `uid_shift`, `gid_shift`: the sandboxes' root uid and gid outside (where the service
    // user's /etc/subuid and /etc/subgid ranges start), added to unpacked layers' owners.
    ImageStore(std::string root, uint32_t uid_shift, uint32_t gid_shift);
    // Both ranges starting at `id_shift`.
    ImageStore(std::string root, uint32_t id_shift)
        : ImageStore(std::move(root), id_shift, id_shift) {}

    // Imports an OCI image layout directory: the manifest named `tag` in its index.json
    // (org.opencontainers.image.ref.name), or its only one; an index inside is resolved
    // to this host's platform. The image is recorded under `name`.
    Image import_oci_layout(const std::string& dir, const Reference& name,
                            std::optional<std::string> tag = {});

    // Imports a `docker save` / `skopeo copy ... docker-archive:` tar: the image tagged
    // `name` in it, or its only one. Its layers become blobs as they are (plain tars, or
    // gzip/zstd as found) under a Docker schema 2 manifest made here.
    Image import_docker_archive(const std::string& archive, const Reference& name);

    // Imports from an open fd, never a path (the root image service reads what a client
    // opened): a directory is an OCI image layout, read through a SourceDir as
    // `options.caller`; a tar (a regular file or a pipe) is unpacked strictly into a scratch
    // directory and is an OCI layout if it has oci-layout, else a docker-archive. The image
    // is recorded under `name`, or the name the layout or archive gives it; with several
    // images in it, `name` picks one (by full name, else by its tag).
    Image import_fd(int fd, const std::optional<Reference>& name, const ImportOptions& options);

    // Makes a one-layer image of a root filesystem directory (what debootstrap leaves):
    // its tree as an uncompressed layer tar (owners as they are there: root's files
    // belong to the sandboxes' root once unpacked), `config` for the run settings.
    Image import_rootfs_dir(const std::string& dir, const Reference& name,
                            const ImageConfig& config);

    // Writes `image` as an OCI image layout into `dir` (made; it must not exist), its
    // manifest named by `tag` in index.json. Blobs are hard links where the filesystem
    // allows (they are immutable), else copies. Importing it again gives the same digest.
    void export_oci_layout(const Image& image, const std::string& dir, const std::string& tag);
    // The same layout as a tar stream written to `out` (a pipe or a file), made in a scratch
    // directory of the store; index.json also names the image in full
    // (io.containerd.image.name, as containerd and docker write it), so importing the tar
    // needs no name. `cancel` as transfer's. Returns the bytes of file data written.
    uint64_t export_oci_archive(const Image& image, int out, const std::string& tag,
                                const CancelToken* cancel = nullptr);

    std::vector<Image> list() const;
    std::optional<Image> find(const Reference& ref) const;
    // The overlay lower directories of `image`, top layer first (overlayfs's order).
    std::vector<std::string> lower_dirs(const Image& image) const;
    std::string layer_dir(const Digest& diff_id) const;

    // Content no name refers to yet (what an import or a pull has stored before it records
    // its name) is safe from remove() and prune() only while this is held: every import and
    // pull that may run beside them holds it for its whole length.
    std::shared_lock<std::shared_mutex> hold_content() {
        return std::shared_lock<std::shared_mutex>(content_mu_);
    }
    // Removes the name `image.name`. Unless a sandbox uses its manifest (`in_use`), the
    // image's blobs and layers that no other name and no sandbox uses go too. An image in
    // use is refused with ImageInUse naming the sandbox, unless `force`: then only the name
    // goes. ImageNotFound (image_lookup.h) if the name is gone already. Waits for imports
    // and pulls in progress (hold_content).
    RemoveResult remove(const Image& image, const std::vector<InUse>& in_use, bool force);
    // Removes every blob and layer that no named image and no manifest in `in_use` needs,
    // and what interrupted unpacks and removals left. Waits like remove().
    RemoveResult prune(const std::vector<InUse>& in_use);

    BlobStore& blobs() { return blobs_; }

    // Replaces how layers are unpacked (before any import or pull starts).
    void set_unpacker(Unpacker unpacker) { unpacker_ = std::move(unpacker); }
    // Replaces what parses the image documents the store reads (before anything starts).
    void set_parser(std::shared_ptr<DocumentParser> parser) { parser_ = std::move(parser); }
    DocumentParser& parser() { return *parser_; }
    // Replaces how import archives are extracted (before any import starts).
    void set_archive_extractor(ArchiveExtractor x) { archive_extractor_ = std::move(x); }
    // The bounds from here on (the defaults until called).
    void set_limits(const ImageLimits& limits) { limits_ = limits; }
    const ImageLimits& limits() const { return limits_; }

    // Unpacks the layer's blob unless layers/<diff_id> exists. Safe when several threads or
    // processes unpack the same layer: each into a temporary directory, the first rename
    // wins and the others discard theirs.
    // `used`: what the image's layers below it unpack to; this one may take the rest of
    // the limits (else LayerTooLarge, nothing of it left). Returns what the layer unpacks
    // to (zeros for one an older berth unpacked, which recorded no size).
    UnpackedSize ensure_layer(const Layer& layer, const Digest& diff_id,
                              const UnpackedSize& used = {});
    // Unpacks what is missing and records the image under `name`: name:tag, or name@digest
    // for a reference with a digest and no tag (a pull by digest). The blobs must be in the
    // store already. `manifest_digest` may be an index's (what a registry resolved the name
    // to); `manifest` is then the platform's manifest in it.
    Image add_image(const Reference& name, const Digest& manifest_digest, const Manifest& manifest,
                    const ImageConfig& config);

  private:
    void record(const Image& image);

    Image import_layout_from(const SourceDir& src, const std::optional<Reference>& name,
                             std::optional<std::string> tag);
    Image import_docker_from(const SourceDir& src, const std::optional<Reference>& name);
    // Drops `name` from images.json; false if it was not there.
    bool forget(const std::string& name);
    // Deletes the blobs and layers among `candidates` that nothing named nor in use needs.
    void collect(const std::vector<Digest>* blob_candidates,
                 const std::vector<Digest>* layer_candidates, const std::vector<InUse>& in_use,
                 RemoveResult& result);
    // Removes what interrupted unpacks and removals left in layers/ (".*.unpacking-*",
    // ".*.removing-*"); at open, and in prune.
    void sweep_layers(RemoveResult* result);

    // Opens or converts the store's format (kStoreFormat), refusing one it does not know.
    void check_format();

    std::string root_;
    uint32_t uid_shift_, gid_shift_;
    Unpacker unpacker_;
    ArchiveExtractor archive_extractor_;
    std::shared_ptr<DocumentParser> parser_ = std::make_shared<LocalDocumentParser>();
    ImageLimits limits_;
    BlobStore blobs_;
    mutable std::mutex mu_;         // images.json read-modify-write
    std::shared_mutex content_mu_;  // see hold_content()
};

}  // namespace berth::images
