// What a pull asks of registries: a reference resolved (its mirrors first) to a document,
// further manifests and the config by descriptor, blobs streamed, and documents parsed.
// Everything here reads bytes a registry (a stranger) wrote; the puller (puller.h) only
// decides what to ask, checks digests and sizes and keeps the store. Two implementations:
// LocalRegistrySession runs RegistryClient and the parsers in this process (tests, tools);
// berth-images runs it in an unprivileged fetcher process and talks to it over a channel
// (src/runtime/images/fetcher.h), so its root part parses nothing a registry sent.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <variant>

#include "rootfs-tools/manifest.h"
#include "rootfs-tools/reference.h"
#include "rootfs-tools/registry.h"
#include "rootfs-tools/registry_config.h"

namespace berth::images {

using Document = std::variant<Manifest, Index>;

class RegistrySession {
  public:
    virtual ~RegistrySession() = default;

    struct Resolved {
        Digest digest = Digest::from_hex(std::string(64, '0'));  // of `bytes`
        std::string bytes;
        Document document = Index{};
        std::string endpoint;  // the mirror or registry that answered (Endpoint::str())
    };
    // The reference's manifest or index (its digest when it has one, else its tag, else
    // "latest") from the first endpoint that has it; that endpoint serves the rest of the
    // session. RegistryError (RegistryAuthError), ManifestError, BlobMismatch, ConfigError.
    virtual Resolved resolve(const Reference& ref,
                             const std::function<void(const std::string& why)>& retrying) = 0;

    struct Fetched {
        std::string bytes;
        Document document = Index{};
    };
    // A manifest by its descriptor (from an index).
    virtual Fetched manifest(const Descriptor& d) = 0;
    // The image config by its descriptor: its bytes and what they say.
    virtual std::pair<std::string, ImageConfig> config(const Descriptor& d) = 0;
    // Documents the store holds already (verified by digest, still a stranger's bytes).
    virtual Document parse_document(const std::string& bytes, const std::string& media_type) = 0;
    virtual ImageConfig parse_config(const std::string& bytes) = 0;
    // Streams a blob into the store, committed there (BlobMismatch if it is not the blob).
    virtual void fetch_blob(const Descriptor& blob, BlobStore& store,
                            const RegistryClient::BlobCallbacks& callbacks) = 0;
};

// Registry access in this process.
class LocalRegistrySession : public RegistrySession {
  public:
    // `auth`: the credentials for every endpoint (the client's merged over the system's).
    LocalRegistrySession(RegistriesConfig registries, AuthConfig auth, RegistryTimings timings,
                         std::function<bool()> cancelled);
    ~LocalRegistrySession() override;

    Resolved resolve(const Reference& ref,
                     const std::function<void(const std::string& why)>& retrying) override;
    Fetched manifest(const Descriptor& d) override;
    std::pair<std::string, ImageConfig> config(const Descriptor& d) override;
    Document parse_document(const std::string& bytes, const std::string& media_type) override;
    ImageConfig parse_config(const std::string& bytes) override;
    void fetch_blob(const Descriptor& blob, BlobStore& store,
                    const RegistryClient::BlobCallbacks& callbacks) override;
    // The same, into any sink (the fetcher's channel); the sink's owner verifies.
    void fetch_blob(const Descriptor& blob, RegistryClient::BlobSink& sink,
                    const RegistryClient::BlobCallbacks& callbacks);

  private:
    RegistryClient& client();  // the resolved endpoint's (std::logic_error before resolve)

    RegistriesConfig registries_;
    AuthConfig auth_;
    RegistryTimings timings_;
    std::function<bool()> cancelled_;
    std::unique_ptr<RegistryClient> client_;
};

// How a pull gets its session: called once per pull, with its options' timings and a
// function that says when it is cancelled.
struct PullOptions;
using SessionFactory = std::function<std::unique_ptr<RegistrySession>(
    const PullOptions& options, std::function<bool()> cancelled)>;

// LocalRegistrySession for every pull, with `system_auth` under PullOptions::auth.
SessionFactory local_sessions(RegistriesConfig registries, AuthConfig system_auth);

}  // namespace berth::images
