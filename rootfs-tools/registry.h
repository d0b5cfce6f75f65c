// A client of one repository at one registry endpoint, speaking the distribution v2 API:
// manifests by tag or digest, blobs streamed into the blob store. It answers the
// registry's challenges (a bearer token from the realm it names, or basic auth), retries
// what a flaky network or a restarting registry breaks, and resumes a cut blob download
// where it stopped. Safe to use from several threads at once (a pull's downloads).
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/error.h"
#include "rootfs-tools/blob_store.h"
#include "rootfs-tools/digest.h"
#include "rootfs-tools/http.h"
#include "rootfs-tools/manifest.h"
#include "rootfs-tools/registry_config.h"

namespace berth::images {

struct RegistryTimings {
    std::chrono::milliseconds connect{15000};
    // A connection moving fewer than low_speed_bytes a second for low_speed_time is stalled.
    uint32_t low_speed_bytes = 1024;
    std::chrono::seconds low_speed_time{30};
    int max_attempts = 5;                       // per request: the first and four retries
    std::chrono::milliseconds retry_base{200};  // waits retry_base * 2^n between attempts
};

// The registry said no, or could not be reached; what() names the registry, the
// repository and the manifest or blob. Kind not_found for a 404, else unavailable.
class RegistryError : public Error {
  public:
    RegistryError(const std::string& what, long status = 0)
        : RegistryError(status == 404 ? Kind::not_found : Kind::unavailable, what, status) {}
    long status() const { return status_; }  // the HTTP status, 0 without an answer

  protected:
    RegistryError(Kind kind, const std::string& what, long status)
        : Error(kind, what), status_(status) {}

  private:
    long status_;
};

// Authentication failed: no credentials for a registry that wants them, or rejected ones.
class RegistryAuthError : public RegistryError {
  public:
    RegistryAuthError(const std::string& what, long status = 0)
        : RegistryError(Kind::permission_denied, what, status) {}
};

// The pull was cancelled (its cancel flag, or a failure elsewhere in it).
class PullCancelled : public Error {
  public:
    explicit PullCancelled(const std::string& what) : Error(Kind::cancelled, what) {}
};

class RegistryClient {
  public:
    // `cancelled` is polled while waiting on the network and between retries.
    RegistryClient(Endpoint endpoint, std::optional<Credentials> credentials,
                   RegistryTimings timings, std::function<bool()> cancelled);
    ~RegistryClient();

    const Endpoint& endpoint() const { return endpoint_; }

    struct ManifestResponse {
        std::string bytes, content_type;
        Digest digest = Digest::from_hex(std::string(64, '0'));  // of the bytes
    };
    // GET /v2/<repository>/manifests/<tag or digest>, accepting OCI indexes and manifests
    // and Docker manifest lists and schema 2 (schema 1 is refused by name). With
    // `expected`, the bytes must hash to it (BlobMismatch); otherwise, when the registry
    // says a Docker-Content-Digest, to that.
    ManifestResponse manifest(const std::string& tag_or_digest,
                              const std::optional<Digest>& expected = {},
                              const std::function<void(const std::string& why)>& retrying = {});

    // A small blob (an image config) into memory, verified against its descriptor.
    std::string small_blob(const Descriptor& blob, size_t limit = 16 << 20);

    struct BlobCallbacks {
        std::function<void(uint64_t done, uint64_t total)> progress;
        std::function<void(const std::string& why)> retrying;
    };
    // Where a blob's bytes go as they arrive: the blob store, or (in the fetcher) the
    // channel to berth-images, which writes and verifies them there.
    class BlobSink {
      public:
        virtual ~BlobSink() = default;
        virtual void write(std::string_view data) = 0;
        virtual uint64_t written() const = 0;
        // What was written is dropped: the bytes start over from the first.
        virtual void restart() = 0;
    };
    // Streams the blob into `sink`, retrying and resuming as fetch_blob below; returns
    // when all of its bytes were written (the sink's owner checks their digest).
    void fetch_blob(const Descriptor& blob, BlobSink& sink, const BlobCallbacks& callbacks);
    // GET /v2/<repository>/blobs/<digest>, streamed into `store` as it arrives and committed
    // there (BlobMismatch, and nothing stored, when the bytes are not the blob). A transfer
    // cut short is retried and resumed with a Range request, keeping what was written; a
    // registry that answers the whole blob instead (200) starts it over.
    void fetch_blob(const Descriptor& blob, BlobStore& store, const BlobCallbacks& callbacks);

    // How many requests went out (tests: a repeated pull asks for the manifest only).
    uint64_t requests() const { return requests_.load(); }

  private:
    class Lease;
    // One request with authentication: a 401 is answered once (a token from the realm,
    // or basic credentials) and the request made again.
    HttpResponse send(const std::string& path, HttpRequest request, const HttpSink* sink,
                      size_t body_limit);
    void authenticate(const HttpResponse& challenge_response);
    void add_auth(HttpRequest& request);
    std::string base_url() const;
    std::string repo_label() const;
    [[noreturn]] void fail_auth(const std::string& detail) const;
    // Runs `attempt` up to max_attempts times while it fails in a way worth retrying.
    template <typename F>
    auto with_retries(const std::string& what, bool retry_unreachable,
                      const std::function<void(const std::string&)>& retrying, F&& attempt);
    void pause(int attempt) const;
    void check_cancelled() const;

    Endpoint endpoint_;
    std::optional<Credentials> credentials_;
    RegistryTimings timings_;
    std::function<bool()> cancelled_;

    std::mutex mu_;                                  // what follows
    std::vector<std::unique_ptr<HttpClient>> idle_;  // connections to reuse
    enum class Auth { none, basic, bearer } auth_ = Auth::none;
    std::map<std::string, std::string> tokens_;  // bearer tokens by scope
    std::string scope_;                          // the scope the registry asked for
    std::atomic<bool> https_;                    // the scheme in use (insecure may switch)
    std::atomic<bool> scheme_settled_{false};
    std::atomic<uint64_t> requests_{0};
};

}  // namespace berth::images
