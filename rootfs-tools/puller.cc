#include "rootfs-tools/puller.h"

#include <sys/stat.h>

#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "base/files.h"
#include "rootfs-tools/in_flight.h"

namespace berth::images {

namespace {

// One pull's shared state: its progress calls, its first failure, its stop flag.
struct Pull {
    Pull(const PullOptions& o, std::string l) : options(o), label(std::move(l)) {}
    const PullOptions& options;
    std::string label;  // the reference, for messages
    std::mutex mu;
    std::atomic<bool> abort{false};  // a download failed: the others stop
    std::exception_ptr first_error;

    bool cancelled() const { return abort.load() || (options.cancel && options.cancel->load()); }
    void check() const {
        if (cancelled()) throw PullCancelled("pull of " + label + " cancelled");
    }
    void emit(const PullEvent& e) {
        if (!options.progress) return;
        std::lock_guard lock(mu);
        options.progress(e);
    }
    void fail(std::exception_ptr e) {
        {
            std::lock_guard lock(mu);
            if (!first_error) first_error = std::move(e);
        }
        abort = true;  // after the error is recorded: the others' PullCancelled comes second
    }
};

bool exists(const std::string& path) {
    struct stat st;
    return ::stat(path.c_str(), &st) == 0;
}

struct Threads {
    std::vector<std::thread> all;
    ~Threads() {
        for (auto& t : all) t.join();
    }
};

}  // namespace

Puller::Puller(ImageStore& store, RegistriesConfig registries, AuthConfig system_auth)
    : store_(store), registries_(std::move(registries)), system_auth_(std::move(system_auth)) {}

Image Puller::pull(const Reference& ref, const PullOptions& options) {
    // What this pull stores before its name is recorded is not yet needed by any name:
    // remove() and prune() wait while it is held.
    const auto hold = store_.hold_content();
    Pull pull(options, ref.str());
    AuthConfig auth = options.auth.value_or(AuthConfig{});
    auth.merge_over(system_auth_);
    auto cancelled = [&pull] { return pull.cancelled(); };

    // Resolve: the mirrors in order, then the registry; the first that has it serves all.
    const std::vector<Endpoint> endpoints = registries_.endpoints_for(ref);
    const std::string wanted = ref.digest ? ref.digest->str() : ref.tag.value_or("latest");
    std::unique_ptr<RegistryClient> client;
    RegistryClient::ManifestResponse top;
    std::string tried;
    for (size_t i = 0; i < endpoints.size() && !client; ++i) {
        const Endpoint& ep = endpoints[i];
        auto c =
            std::make_unique<RegistryClient>(ep, auth.find(ep.host), options.timings, cancelled);
        try {
            top = c->manifest(wanted, ref.digest, [&](const std::string& why) {
                pull.emit({PullEvent::Kind::retrying,
                           ref.digest.value_or(Digest::from_hex(std::string(64, '0'))), 0, 0,
                           "manifest " + wanted + ": " + why});
            });
            client = std::move(c);
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
    pull.emit({PullEvent::Kind::resolved, top.digest, 0, 0, client->endpoint().str()});

    // Present already: the tag still names what was recorded, everything is unpacked.
    const auto doc = parse_manifest_or_index(top.bytes, top.content_type);
    const Index* index = std::get_if<Index>(&doc);
    if (auto have = store_.find(ref); have && have->manifest == top.digest) {
        bool complete = true;
        if (index) {
            // A multi-platform image: the platform's manifest must be the one recorded.
            const Descriptor& d = select_manifest(*index, options.platform);
            complete = store_.blobs().has(d.digest);
            if (complete) {
                auto m = parse_manifest_or_index(read_file(store_.blobs().path(d.digest)));
                complete = std::holds_alternative<Manifest>(m) &&
                           std::get<Manifest>(m).config.digest == have->config;
            }
        }
        for (const auto& diff_id : have->layers)
            complete = complete && exists(store_.layer_dir(diff_id));
        if (complete) return *have;
    }

    // The documents: kept in memory and stored last, so a pull that stops leaves none.
    std::vector<std::pair<Digest, std::string>> documents{{top.digest, top.bytes}};
    const Manifest manifest = [&]() -> Manifest {
        if (!index) return std::get<Manifest>(doc);
        const Descriptor& d = select_manifest(*index, options.platform);
        std::string bytes;
        if (store_.blobs().has(d.digest)) {
            bytes = read_file(store_.blobs().path(d.digest));
        } else {
            bytes = client->manifest(d.digest.str(), d.digest).bytes;
            documents.emplace_back(d.digest, bytes);
        }
        if (bytes.size() != d.size) {
            throw ManifestError("manifest " + d.digest.str() + " of " + client->endpoint().str() +
                                ": " + std::to_string(bytes.size()) + " bytes, its index says " +
                                std::to_string(d.size));
        }
        auto inner = parse_manifest_or_index(bytes, d.media_type);
        if (!std::holds_alternative<Manifest>(inner))
            throw ManifestError(ref.str() + ": an index inside an index");
        return std::get<Manifest>(std::move(inner));
    }();
    std::string config_bytes;
    if (store_.blobs().has(manifest.config.digest)) {
        config_bytes = read_file(store_.blobs().path(manifest.config.digest));
    } else {
        config_bytes = client->small_blob(manifest.config);
        documents.emplace_back(manifest.config.digest, config_bytes);
    }
    const ImageConfig config = parse_config(config_bytes);
    if (config.diff_ids.size() != manifest.layers.size()) {
        throw ManifestError(ref.str() + ": the manifest has " +
                            std::to_string(manifest.layers.size()) + " layers, its config " +
                            std::to_string(config.diff_ids.size()));
    }

    // The layers not unpacked yet: their blobs fetched (unless present), then unpacked, by
    // at most `parallel` threads. Two pulls of one image in this process share the work.
    std::vector<size_t> jobs;
    for (size_t i = 0; i < manifest.layers.size(); ++i) {
        if (exists(store_.layer_dir(config.diff_ids[i]))) {
            pull.emit({PullEvent::Kind::blob_present, manifest.layers[i].blob.digest, 0,
                       manifest.layers[i].blob.size, "unpacked already"});
        } else {
            jobs.push_back(i);
        }
    }
    const std::string root = store_.blobs().root();
    auto check = [&pull] { pull.check(); };
    auto do_layer = [&](size_t i) {
        const Layer& layer = manifest.layers[i];
        const Digest& blob = layer.blob.digest;
        const Digest& diff_id = config.diff_ids[i];
        uint64_t reported = 0;
        RegistryClient::BlobCallbacks callbacks;
        callbacks.progress = [&](uint64_t done, uint64_t total) {
            // The first bytes, then every 512 KiB: enough for a progress bar.
            if (reported == 0 || done - reported >= (512u << 10) || done == total) {
                reported = done;
                pull.emit({PullEvent::Kind::blob_progress, blob, done, total, {}});
            }
        };
        callbacks.retrying = [&](const std::string& why) {
            pull.emit({PullEvent::Kind::retrying, blob, reported, layer.blob.size, why});
        };
        const bool fetched = InFlight::process().run(
            root + "/blob/" + std::string(blob.hex()), [&] { return store_.blobs().has(blob); },
            [&] { client->fetch_blob(layer.blob, store_.blobs(), callbacks); }, check);
        pull.emit({fetched ? PullEvent::Kind::blob_done : PullEvent::Kind::blob_present,
                   blob,
                   layer.blob.size,
                   layer.blob.size,
                   {}});
        pull.check();
        InFlight::process().run(
            root + "/layer/" + std::string(diff_id.hex()),
            [&] { return exists(store_.layer_dir(diff_id)); },
            [&] { store_.ensure_layer(layer, diff_id); }, check);
        pull.emit({PullEvent::Kind::layer_unpacked, blob, 0, 0, diff_id.str()});
    };
    std::atomic<size_t> next{0};
    auto worker = [&] {
        for (size_t k; (k = next++) < jobs.size() && !pull.cancelled();) {
            try {
                do_layer(jobs[k]);
            } catch (...) {
                pull.fail(std::current_exception());
                return;
            }
        }
    };
    {
        Threads threads;
        try {
            const size_t n = std::min<size_t>(std::max(options.parallel, 1u), jobs.size());
            for (size_t t = 1; t < n; ++t) threads.all.emplace_back(worker);
            worker();
        } catch (...) {
            pull.abort = true;  // (a thread could not be started) the others stop soon
            throw;
        }
    }
    if (pull.first_error) std::rethrow_exception(pull.first_error);
    pull.check();

    // Everything the image needs is there: its documents, then its name.
    for (const auto& [digest, bytes] : documents) {
        if (store_.blobs().put_bytes(bytes) != digest)
            throw std::logic_error("a verified document changed in memory: " + digest.str());
    }
    return store_.add_image(ref, top.digest, manifest, config);
}

}  // namespace berth::images
