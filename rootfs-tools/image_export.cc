// An image as an OCI image layout tar: the layout is made in a scratch directory of the
// store (blobs hard-linked: nothing is copied there) and streamed by transfer's archive
// writer, which never follows a symlink and moves file data in the kernel where it can.
#include <nlohmann/json.hpp>

#include "base/files.h"
#include "rootfs-tools/image_store.h"
#include "transfer/archive.h"
#include "transfer/root.h"

namespace berth::images {

uint64_t ImageStore::export_oci_archive(const Image& image, int out, const std::string& tag,
                                        const CancelToken* cancel) {
    const std::string scratch = blobs_.make_scratch_dir("export");
    struct Scratch {
        std::string path;
        ~Scratch() { remove_tree(path); }
    } cleanup{scratch};
    const std::string layout = scratch + "/layout";
    export_oci_layout(image, layout, tag);

    const std::string index_path = layout + "/index.json";
    nlohmann::json index = nlohmann::json::parse(berth::read_file(index_path));
    for (auto& m : index["manifests"]) m["annotations"]["io.containerd.image.name"] = image.name;
    write_file_atomic(index_path, index.dump() + "\n");

    // (Initialized in place: assigning "." to the string trips GCC 12's -Wrestrict under
    // the sanitizers, a false positive.)
    const transfer::WriteOptions w{.name = ".", .contents_only = true, .cancel = cancel};
    return transfer::write_archive(transfer::Root::open(layout), ".", out, w).bytes;
}

}  // namespace berth::images
