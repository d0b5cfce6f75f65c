// `berth pull`: a reference resolved at a registry (its mirrors first) to a manifest, the
// host's platform picked from an index, the config and missing layer blobs downloaded in
// parallel and verified into the blob store, the missing layers unpacked, the name recorded
// last. What is present is not fetched again:
//  - an image whose tag still resolves to the manifest recorded for it costs one manifest
//    request and nothing else;
//  - a blob in the store is not downloaded;
//  - a layer already unpacked (layers/<diff_id>, verified against its diff_id when it was
//    made) needs no blob at all, present or not: the blob is only its transport form. Such
//    a layer's blob stays missing when nothing brought it (an export of the image then
//    names it); every layer that is unpacked here keeps its blob.
// Interrupted or cancelled, a pull leaves no name, no partial blob and no partial layer;
// blobs and layers it completed stay (verified, and reused by the next pull). A pull holds
// the store's content (ImageStore::hold_content) throughout: remove and prune wait for it.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "base/cancel.h"
#include "rootfs-tools/image_store.h"
#include "rootfs-tools/manifest.h"
#include "rootfs-tools/reference.h"
#include "rootfs-tools/registry.h"
#include "rootfs-tools/registry_config.h"
#include "rootfs-tools/registry_session.h"

namespace berth::images {

struct PullEvent {
    enum class Kind {
        resolved,        // digest: what the reference resolved to; message: the endpoint
        blob_present,    // digest: a layer blob not downloaded (in the store, or unpacked)
        blob_progress,   // digest, done, total: bytes of a layer blob so far
        blob_done,       // digest, total: a layer blob downloaded and verified
        layer_unpacked,  // digest: the layer's blob; message: its diff_id
        retrying,        // digest: the blob (the manifest's when pinned, else zeros);
                         // message: why, which attempt
    };
    Kind kind;
    Digest digest;
    uint64_t done = 0, total = 0;
    std::string message;
};

// Called under the pull's mutex: calls of one pull never overlap. It runs on the pull's
// download threads, so it should be quick.
using PullProgress = std::function<void(const PullEvent&)>;

struct PullOptions {
    PullProgress progress;
    // Set: the pull stops soon with PullCancelled, leaving nothing that a later pull trusts.
    const CancelToken* cancel = nullptr;
    std::optional<AuthConfig> auth;  // the client's credentials, merged over the system's
    Platform platform = host_platform();
    RegistryTimings timings;  // connect and stall timeouts, retries (tests shorten them)
    unsigned parallel = 4;    // layer blobs downloaded at once
};

// The puller decides what to ask for and keeps the store; what registries send is read
// and parsed by its RegistrySession (registry_session.h). It checks what the session
// returns the way it would check a registry: every document against its digest (and its
// size where a descriptor gives one), every blob by the store's writer.
class Puller {
  public:
    // Registry access in this process (LocalRegistrySession).
    Puller(ImageStore& store, RegistriesConfig registries, AuthConfig system_auth);
    // Registry access through `sessions` (berth-images: its unprivileged fetcher).
    Puller(ImageStore& store, SessionFactory sessions);

    // Returns the image recorded under `ref` (its name: ref without digest, or name@digest
    // when ref has no tag); Image::manifest is what the reference resolved to (a manifest
    // list's digest for a multi-platform image). Throws RegistryError (RegistryAuthError),
    // ManifestError, BlobMismatch, PullCancelled, ConfigError or SysError.
    Image pull(const Reference& ref, const PullOptions& options = {});

  private:
    ImageStore& store_;
    SessionFactory sessions_;
};

}  // namespace berth::images
