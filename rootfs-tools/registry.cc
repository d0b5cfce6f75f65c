#include "rootfs-tools/registry.h"

#include <nlohmann/json.hpp>
#include <thread>

#include "rootfs-tools/auth_challenge.h"

namespace berth::images {

using nlohmann::json;

namespace {

constexpr const char* kAccept =
    "Accept: application/vnd.oci.image.index.v1+json, "
    "application/vnd.oci.image.manifest.v1+json, "
    "application/vnd.docker.distribution.manifest.list.v2+json, "
    "application/vnd.docker.distribution.manifest.v2+json";

// An answer worth another try: a 5xx, 429 or 408, or a blob answer that ended early.
class Transient : public Error {
  public:
    explicit Transient(const std::string& what) : Error(Kind::unavailable, what) {}
};

bool transient_status(long s) {
    return s == 408 || s == 429 || (s >= 500 && s <= 599);
}

// The registry's own words from an error body ({"errors": [{"code", "message"}]}), or the
// start of whatever else it sent.
std::string error_text(const std::string& body) {
    try {
        const json j = json::parse(body);
        std::string out;
        for (const auto& e : j.at("errors")) {
            if (!out.empty()) out += "; ";
            out += e.value("code", std::string("ERROR")) + ": " + e.value("message", std::string());
        }
        if (!out.empty()) return out;
    } catch (const std::exception&) {
        // not the registry's JSON: quote it
    }
    std::string s = body.substr(0, 200);
    for (char& c : s) c = (c == '\n' || c == '\r') ? ' ' : c;
    return s.empty() ? "(no body)" : s;
}

std::string status_text(const HttpResponse& r) {
    return "HTTP " + std::to_string(r.status) + ": " + error_text(r.body);
}

}  // namespace

class RegistryClient::Lease {
  public:
    explicit Lease(RegistryClient& owner) : owner_(owner) {
        {
            std::lock_guard lock(owner_.mu_);
            if (!owner_.idle_.empty()) {
                client_ = std::move(owner_.idle_.back());
                owner_.idle_.pop_back();
            }
        }
        if (!client_) {
            HttpTimeouts t;
            t.connect = owner_.timings_.connect;
            t.low_speed_bytes = owner_.timings_.low_speed_bytes;
            t.low_speed_time = owner_.timings_.low_speed_time;
            client_ = std::make_unique<HttpClient>(t, owner_.cancelled_);
        }
    }
    ~Lease() {
        std::lock_guard lock(owner_.mu_);
        owner_.idle_.push_back(std::move(client_));
    }
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    HttpClient* operator->() { return client_.get(); }

  private:
    RegistryClient& owner_;
    std::unique_ptr<HttpClient> client_;
};

RegistryClient::RegistryClient(Endpoint endpoint, std::optional<Credentials> credentials,
                               RegistryTimings timings, std::function<bool()> cancelled)
    : endpoint_(std::move(endpoint)),
      credentials_(std::move(credentials)),
      timings_(timings),
      cancelled_(std::move(cancelled)),
      https_(!endpoint_.plain_http) {
    if (!cancelled_) cancelled_ = [] { return false; };
}

RegistryClient::~RegistryClient() = default;

std::string RegistryClient::base_url() const {
    return std::string(https_ ? "https://" : "http://") + endpoint_.host + "/v2/" +
           endpoint_.repository + "/";
}

std::string RegistryClient::repo_label() const {
    return endpoint_.host + "/" + endpoint_.repository;
}

void RegistryClient::check_cancelled() const {
    if (cancelled_()) throw PullCancelled("pull from " + repo_label() + " cancelled");
}

void RegistryClient::pause(int attempt) const {
    // retry_base * 2^(attempt-1), in slices so a cancel is not kept waiting.
    const auto until =
        std::chrono::steady_clock::now() + timings_.retry_base * (1 << std::min(attempt - 1, 10));
    while (std::chrono::steady_clock::now() < until) {
        check_cancelled();
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
}

void RegistryClient::add_auth(HttpRequest& r) {
    std::lock_guard lock(mu_);
    if (auth_ == Auth::basic) {
        r.basic = credentials_;
    } else if (auth_ == Auth::bearer) {
        auto it = tokens_.find(scope_);
        if (it != tokens_.end()) r.headers.push_back("Authorization: Bearer " + it->second);
    }
}

void RegistryClient::fail_auth(const std::string& detail) const {
    if (!credentials_) {
        throw RegistryAuthError("registry " + endpoint_.host + " requires authentication for " +
                                    endpoint_.repository +
                                    ": no credentials (berth pull --authfile, or "
                                    "/etc/berth/auth.json)",
                                401);
    }
    throw RegistryAuthError("registry " + endpoint_.host + " rejected the credentials for user " +
                                credentials_->username + " (pulling " + endpoint_.repository +
                                (detail.empty() ? "" : ": " + detail) + ")",
                            401);
}

void RegistryClient::authenticate(const HttpResponse& answer) {
    std::vector<AuthChallenge> challenges;
    std::string raw;
    for (auto [it, end] = answer.headers.equal_range("www-authenticate"); it != end; ++it) {
        raw += (raw.empty() ? "" : ", ") + it->second;
        try {
            for (auto& c : parse_www_authenticate(it->second)) challenges.push_back(std::move(c));
        } catch (const std::invalid_argument& e) {
            throw RegistryError("registry " + endpoint_.host + ": " + e.what(), 401);
        }
    }
    const AuthChallenge* bearer = nullptr;
    const AuthChallenge* basic = nullptr;
    for (const auto& c : challenges) {
        if (c.scheme == "bearer" && !bearer) bearer = &c;
        if (c.scheme == "basic" && !basic) basic = &c;
    }
    if (!bearer && !basic) {
        throw RegistryError("registry " + endpoint_.host + " wants authentication for " +
                                endpoint_.repository + " that berth does not speak (" +
                                (raw.empty() ? "no WWW-Authenticate" : raw) + ")",
                            401);
    }
    if (!bearer) {
        if (!credentials_) fail_auth("");
        std::lock_guard lock(mu_);
        auth_ = Auth::basic;
        return;
    }
    // A token from the realm the registry named, for the scope it asked (or pull of this
    // repository), with our credentials when we have some; anonymous otherwise.
    const std::string realm = bearer->param("realm");
    if (realm.rfind("https://", 0) != 0 && realm.rfind("http://", 0) != 0) {
        throw RegistryError("registry " + endpoint_.host + ": bearer challenge with realm '" +
                                realm + "', not an http(s) URL",
                            401);
    }
    std::string scope = bearer->param("scope");
    if (scope.empty()) scope = "repository:" + endpoint_.repository + ":pull";
    std::string url = realm + (realm.find('?') == std::string::npos ? "?" : "&");
    if (const std::string service = bearer->param("service"); !service.empty())
        url += "service=" + url_escape(service) + "&";
    url += "scope=" + url_escape(scope);
    if (credentials_) url += "&account=" + url_escape(credentials_->username);
    HttpRequest r;
    r.url = url;
    r.basic = credentials_;
    r.verify_tls = !endpoint_.insecure;
    HttpResponse got;
    {
        Lease http(*this);
        ++requests_;
        got = http->get(r, nullptr, 1 << 20);
    }
    if (got.status == 401 || got.status == 403) fail_auth(error_text(got.body));
    if (got.status != 200) {
        throw RegistryError(
            "token server " + realm + " (for registry " + endpoint_.host + "): " + status_text(got),
            got.status);
    }
    std::string token;
    try {
        const json j = json::parse(got.body);
        token = j.value("token", std::string());
        if (token.empty()) token = j.value("access_token", std::string());
    } catch (const std::exception& e) {
        throw RegistryError("token server " + realm + ": not a token answer (" + e.what() + ")");
    }
    if (token.empty()) throw RegistryError("token server " + realm + ": the answer has no token");
    std::lock_guard lock(mu_);
    tokens_[scope] = token;
    scope_ = scope;
    auth_ = Auth::bearer;
}

HttpResponse RegistryClient::send(const std::string& path, HttpRequest request,
                                  const HttpSink* sink, size_t body_limit) {
    bool answered_challenge = false;
    // An insecure registry may speak either scheme, and which one is learnt from the first
    // answer. Until then a transport failure is tried once on the other scheme; if that
    // fails too, the first scheme and its error stand (a connection dropped by the network
    // is not a registry speaking the other protocol).
    std::exception_ptr first_failure;
    for (;;) {
        HttpRequest r = request;
        r.url = base_url() + path;
        r.verify_tls = !endpoint_.insecure;
        add_auth(r);
        HttpResponse got;
        try {
            Lease http(*this);
            ++requests_;
            got = http->get(r, sink, body_limit);
        } catch (const HttpTransportError&) {
            if (!endpoint_.insecure || scheme_settled_) throw;
            https_ = !https_;
            if (first_failure) std::rethrow_exception(first_failure);
            first_failure = std::current_exception();
            continue;
        }
        if (endpoint_.insecure && !scheme_settled_.exchange(true) && !https_ && got.status == 400 &&
            got.body.find("HTTP request to an HTTPS server") != std::string::npos) {
            https_ = true;  // Go's TLS server answering plain http
            continue;
        }
        if (got.status != 401) return got;
        if (answered_challenge) fail_auth(error_text(got.body));
        authenticate(got);
        answered_challenge = true;
    }
}

template <typename F>
auto RegistryClient::with_retries(const std::string& what, bool retry_unreachable,
                                  const std::function<void(const std::string&)>& retrying,
                                  F&& attempt) {
    for (int n = 1;; ++n) {
        check_cancelled();
        std::string why;
        try {
            return attempt();
        } catch (const HttpCancelled&) {
            throw PullCancelled(what + ": cancelled");
        } catch (const HttpTransportError& e) {
            // A registry nobody answers for: the next endpoint is tried rather than this one
            // four times more (a blob's registry did answer before: retried all the same).
            if (!retry_unreachable && e.no_connection())
                throw RegistryError(what + ": " + e.what());
            why = e.what();
        } catch (const Transient& e) {
            why = e.what();
        }
        if (n >= timings_.max_attempts) {
            throw RegistryError(what + ": gave up after " + std::to_string(n) +
                                " attempts; the last: " + why);
        }
        if (retrying)
            retrying(why + " (attempt " + std::to_string(n + 1) + " of " +
                     std::to_string(timings_.max_attempts) + ")");
        pause(n);
    }
}

RegistryClient::ManifestResponse RegistryClient::manifest(
    const std::string& tag_or_digest, const std::optional<Digest>& expected,
    const std::function<void(const std::string&)>& retrying) {
    const bool by_digest = tag_or_digest.rfind("sha256:", 0) == 0;
    const std::string what = "manifest " + repo_label() + (by_digest ? "@" : ":") + tag_or_digest;
    HttpResponse got = with_retries(what, false, retrying, [&] {
        HttpRequest r;
        r.headers = {kAccept};
        HttpResponse x = send("manifests/" + tag_or_digest, r, nullptr, 4 << 20);
        if (transient_status(x.status)) throw Transient(what + ": " + status_text(x));
        return x;
    });
    if (got.status == 404) throw RegistryError(what + ": not found (HTTP 404)", 404);
    if (got.status != 200) throw RegistryError(what + ": " + status_text(got), got.status);
    ManifestResponse out;
    out.content_type = got.header("content-type");
    out.content_type = out.content_type.substr(0, out.content_type.find(';'));
    if (out.content_type.find("distribution.manifest.v1") != std::string::npos) {
        throw ManifestError(what + ": a Docker schema 1 manifest (" + out.content_type +
                            ") is not supported; push the image again with a current docker or "
                            "skopeo");
    }
    out.bytes = std::move(got.body);
    out.digest = sha256_of(out.bytes);
    if (expected && out.digest != *expected) {
        throw BlobMismatch(what + ": its " + std::to_string(out.bytes.size()) + " bytes hash to " +
                           out.digest.str());
    }
    if (const std::string said = got.header("docker-content-digest"); !said.empty()) {
        std::optional<Digest> d;
        try {
            d = Digest::parse(said);
        } catch (const std::invalid_argument&) {
            // another algorithm (sha512): the bytes' sha256 is checked by whoever uses it
        }
        if (d && *d != out.digest) {
            throw BlobMismatch(what + ": the registry says its digest is " + said +
                               ", its bytes hash to " + out.digest.str());
        }
    }
    return out;
}

std::string RegistryClient::small_blob(const Descriptor& blob, size_t limit) {
    const std::string what = "blob " + blob.digest.str() + " of " + repo_label();
    if (blob.size > limit) {
        throw ManifestError(what + ": " + std::to_string(blob.size) + " bytes, more than the " +
                            std::to_string(limit) + " a config may have");
    }
    HttpResponse got = with_retries(what, true, {}, [&] {
        HttpResponse x = send("blobs/" + blob.digest.str(), {}, nullptr, limit);
        if (transient_status(x.status)) throw Transient(what + ": " + status_text(x));
        return x;
    });
    if (got.status == 404) throw RegistryError(what + ": not found (HTTP 404)", 404);
    if (got.status != 200) throw RegistryError(what + ": " + status_text(got), got.status);
    if (got.body.size() != blob.size) {
        throw BlobMismatch(what + ": " + std::to_string(got.body.size()) + " bytes, expected " +
                           std::to_string(blob.size));
    }
    if (const Digest d = sha256_of(got.body); d != blob.digest)
        throw BlobMismatch(what + ": its bytes hash to " + d.str());
    return std::move(got.body);
}

void RegistryClient::fetch_blob(const Descriptor& blob, BlobStore& store,
                                const BlobCallbacks& callbacks) {
    // The writer outlives attempts: a resumed transfer appends to it, its hash state intact.
    class StoreSink : public BlobSink {
      public:
        StoreSink(BlobStore& store, const Descriptor& blob)
            : store_(store), blob_(blob), writer_(store.writer(blob.digest, blob.size)) {}
        void write(std::string_view data) override { writer_->write(data.data(), data.size()); }
        uint64_t written() const override { return writer_->written(); }
        void restart() override { writer_.emplace(store_.writer(blob_.digest, blob_.size)); }
        void commit() { writer_->commit(); }

      private:
        BlobStore& store_;
        const Descriptor& blob_;
        std::optional<BlobWriter> writer_;
    } sink(store, blob);
    fetch_blob(blob, sink, callbacks);
    sink.commit();
}

void RegistryClient::fetch_blob(const Descriptor& blob, BlobSink& out,
                                const BlobCallbacks& callbacks) {
    const std::string what = "blob " + blob.digest.str() + " of " + repo_label();
    HttpSink sink;
    sink.begin = [&](const HttpResponse& r) {
        if (r.status == 206) {
            // "Content-Range: bytes N-M/T": the bytes must go on where ours stop.
            const std::string range = r.header("content-range");
            const size_t space = range.find(' '), dash = range.find('-');
            const uint64_t start = space == std::string::npos || dash == std::string::npos
                                       ? UINT64_MAX
                                       : std::strtoull(range.c_str() + space + 1, nullptr, 10);
            if (const uint64_t have = out.written(); start != have) {
                out.restart();
                throw Transient(what + ": asked for the bytes from " + std::to_string(have) +
                                ", got '" + range + "'; starting over");
            }
        } else if (out.written() > 0) {
            // The whole blob instead of the rest: what was kept cannot be trusted to line up.
            out.restart();
        }
    };
    sink.data = [&](std::string_view data) {
        if (out.written() + data.size() > blob.size) {
            throw BlobMismatch(what + ": more than the " + std::to_string(blob.size) +
                               " bytes its descriptor says");
        }
        out.write(data);
        if (callbacks.progress) callbacks.progress(out.written(), blob.size);
    };
    with_retries(what, true, callbacks.retrying, [&] {
        HttpRequest r;
        if (out.written() > 0) r.range_from = out.written();
        HttpResponse x = send("blobs/" + blob.digest.str(), r, &sink, 64 << 10);
        if (x.status == 200 || x.status == 206) {
            if (out.written() < blob.size) {
                throw Transient(what + ": the answer ended at byte " +
                                std::to_string(out.written()) + " of " + std::to_string(blob.size));
            }
            return 0;
        }
        if (x.status == 416) {  // the range was refused: the whole blob, once more
            out.restart();
            throw Transient(what + ": " + status_text(x));
        }
        if (transient_status(x.status)) throw Transient(what + ": " + status_text(x));
        if (x.status == 404) throw RegistryError(what + ": not found (HTTP 404)", 404);
        throw RegistryError(what + ": " + status_text(x), x.status);
    });
}

}  // namespace berth::images
