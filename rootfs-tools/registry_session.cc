#include "rootfs-tools/registry_session.h"

#include <stdexcept>

#include "rootfs-tools/puller.h"

namespace berth::images {

LocalRegistrySession::LocalRegistrySession(RegistriesConfig registries, AuthConfig auth,
                                           RegistryTimings timings, std::function<bool()> cancelled)
    : registries_(std::move(registries)),
      auth_(std::move(auth)),
      timings_(timings),
      cancelled_(std::move(cancelled)) {}

LocalRegistrySession::~LocalRegistrySession() = default;

RegistryClient& LocalRegistrySession::client() {
    if (!client_) throw std::logic_error("a registry session used before it resolved");
    return *client_;
}

RegistrySession::Resolved LocalRegistrySession::resolve(
    const Reference& ref, const std::function<void(const std::string& why)>& retrying) {
    // The mirrors in order, then the registry; the first that has it serves all.
    const std::vector<Endpoint> endpoints = registries_.endpoints_for(ref);
    const std::string wanted = ref.digest ? ref.digest->str() : ref.tag.value_or("latest");
    std::string tried;
    for (size_t i = 0; i < endpoints.size(); ++i) {
        const Endpoint& ep = endpoints[i];
        auto c = std::make_unique<RegistryClient>(ep, auth_.find(ep.host), timings_, cancelled_);
        try {
            RegistryClient::ManifestResponse top =
                c->manifest(wanted, ref.digest, [&](const std::string& why) {
                    if (retrying) retrying("manifest " + wanted + ": " + why);
                });
            Resolved out;
            out.document = parse_manifest_or_index(top.bytes, top.content_type);
            out.digest = top.digest;
            out.bytes = std::move(top.bytes);
            out.endpoint = c->endpoint().str();
            client_ = std::move(c);
            return out;
        } catch (const PullCancelled&) {
            throw;
        } catch (const std::exception& e) {
            if (i + 1 < endpoints.size()) {
                tried += (tried.empty() ? "" : "; ") + ep.str() + ": " + e.what();
                continue;
            }
            if (tried.empty()) throw;
            // The registry's own error, its kind and status kept, with what the mirrors said.
            const std::string all = std::string(e.what()) + " (mirrors tried first: " + tried + ")";
            try {
                throw;
            } catch (const RegistryAuthError& r) {
                throw RegistryAuthError(all, r.status());
            } catch (const RegistryError& r) {
                throw RegistryError(all, r.status());
            } catch (const BlobMismatch&) {
                throw BlobMismatch(all);
            } catch (const ManifestError&) {
                throw ManifestError(all);
            } catch (const std::exception&) {
                throw RegistryError(all);
            }
        }
    }
    throw RegistryError(ref.str() + ": no registry to ask");
}

RegistrySession::Fetched LocalRegistrySession::manifest(const Descriptor& d) {
    Fetched out;
    out.bytes = client().manifest(d.digest.str(), d.digest).bytes;
    out.document = parse_manifest_or_index(out.bytes, d.media_type);
    return out;
}

std::pair<std::string, ImageConfig> LocalRegistrySession::config(const Descriptor& d) {
    std::string bytes = client().small_blob(d);
    ImageConfig parsed = images::parse_config(bytes);
    return {std::move(bytes), std::move(parsed)};
}

Document LocalRegistrySession::parse_document(const std::string& bytes,
                                              const std::string& media_type) {
    return parse_manifest_or_index(bytes, media_type);
}

ImageConfig LocalRegistrySession::parse_config(const std::string& bytes) {
    return images::parse_config(bytes);
}

void LocalRegistrySession::fetch_blob(const Descriptor& blob, BlobStore& store,
                                      const RegistryClient::BlobCallbacks& callbacks) {
    client().fetch_blob(blob, store, callbacks);
}

void LocalRegistrySession::fetch_blob(const Descriptor& blob, RegistryClient::BlobSink& sink,
                                      const RegistryClient::BlobCallbacks& callbacks) {
    client().fetch_blob(blob, sink, callbacks);
}

SessionFactory local_sessions(RegistriesConfig registries, AuthConfig system_auth) {
    return [registries = std::move(registries), system_auth = std::move(system_auth)](
               const PullOptions& options, std::function<bool()> cancelled) {
        AuthConfig auth = options.auth.value_or(AuthConfig{});
        auth.merge_over(system_auth);
        return std::make_unique<LocalRegistrySession>(registries, std::move(auth), options.timings,
                                                      std::move(cancelled));
    };
}

}  // namespace berth::images
