// Runs as root (the spawning side) and as the worker: a layer is unpacked by a short-lived
// process in a user namespace of its own that holds the sandboxes' mapping (root inside is
// the helper's subuid start outside), so the tar and compressed bytes of a stranger's image
// are read with no capability in the host's namespace: the worker keeps, inside its
// namespace only, what extraction needs (chown within the range, modes, file capabilities,
// which the kernel stores in the namespaced v3 form), sets no_new_privs and installs
// SeccompProgram::worker_profile (no sockets, no new process). It reads the verified blob
// and writes into an empty scratch directory through fds; proto/berth/v1/unpack.proto is the
// contract. The root side checks that what it left is a directory and renames it into the
// store; it never reads the tar stream.
#pragma once

#include <string>

#include "ns/idmap.h"
#include "rootfs-tools/image_store.h"

namespace berth::images_service {

// What the worker keeps in its own namespace (tests/integration/test_privileges.py).
const std::vector<std::string>& unpack_worker_capabilities();

// An Unpacker for ImageStore::set_unpacker: starts `binary --unpack-worker` for each layer,
// with `mapping` as its user namespace's id maps. The options' shifts are ignored (the
// namespace shifts); rootless form is implied.
images::Unpacker isolated_unpacker(std::string binary, ns::IdMapping mapping);

// An ArchiveExtractor for ImageStore::set_archive_extractor: an import's archive (the
// client's tar, as an fd) extracted by the same worker, so no tar stream is read by root.
images::ArchiveExtractor isolated_archive_extractor(std::string binary, ns::IdMapping mapping);

// The worker's main(): called by berth-images when started with --unpack-worker (fds 3: the
// channel, 4: the blob, 5: the scratch directory). Returns the exit code.
int unpack_worker_main();

}  // namespace berth::images_service
