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

    bool cancelled() const {
        return abort.load() || (options.cancel && options.cancel->cancelled());
    }
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

// A document's bytes must be the ones its digest (and size, when known) names.
void check_document(const std::string& bytes, const Digest& digest, std::optional<uint64_t> size,
                    const std::string& what) {
    if (size && bytes.size() != *size) {
        throw ManifestError(what + " " + digest.str() + ": " + std::to_string(bytes.size()) +
                            " bytes, its descriptor says " + std::to_string(*size));
    }
    if (const Digest d = sha256_of(bytes); d != digest)
        throw BlobMismatch(what + " " + digest.str() + ": its bytes hash to " + d.str());
}

}  // namespace

Puller::Puller(ImageStore& store, RegistriesConfig registries, AuthConfig system_auth)
    : Puller(store, local_sessions(std::move(registries), std::move(system_auth))) {}

Puller::Puller(ImageStore& store, SessionFactory sessions)
    : store_(store), sessions_(std::move(sessions)) {}

Image Puller::pull(const Reference& ref, const PullOptions& options) {
    // What this pull stores before its name is recorded is not yet needed by any name:
    // remove() and prune() wait while it is held.
    const auto hold = store_.hold_content();
    Pull pull(options, ref.str());
    const std::unique_ptr<RegistrySession> session =
        sessions_(options, [&pull] { return pull.cancelled(); });

    const RegistrySession::Resolved top = session->resolve(ref, [&](const std::string& why) {
        pull.emit({PullEvent::Kind::retrying,
                   ref.digest.value_or(Digest::from_hex(std::string(64, '0'))), 0, 0, why});
    });
    check_document(top.bytes, top.digest, std::nullopt, "manifest");
    if (ref.digest && top.digest != *ref.digest) {
        throw BlobMismatch("manifest " + ref.str() + ": the registry answered " + top.digest.str());
    }
    pull.emit({PullEvent::Kind::resolved, top.digest, 0, 0, top.endpoint});

    // Present already: the tag still names what was recorded, everything is unpacked.
    const Document& doc = top.document;
    const Index* index = std::get_if<Index>(&doc);
    if (auto have = store_.find(ref); have && have->manifest == top.digest) {
        bool complete = true;
        if (index) {
            // A multi-platform image: the platform's manifest must be the one recorded.
            const Descriptor& d = select_manifest(*index, options.platform);
            complete = store_.blobs().has(d.digest);
            if (complete) {
                auto m =
                    session->parse_document(read_file(store_.blobs().path(d.digest)), d.media_type);
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
        RegistrySession::Fetched fetched;
        if (store_.blobs().has(d.digest)) {
            fetched.bytes = read_file(store_.blobs().path(d.digest));
            fetched.document = session->parse_document(fetched.bytes, d.media_type);
        } else {
            fetched = session->manifest(d);
            documents.emplace_back(d.digest, fetched.bytes);
        }
        check_document(fetched.bytes, d.digest, d.size, "manifest of " + top.endpoint);
        Document inner = std::move(fetched.document);
        if (!std::holds_alternative<Manifest>(inner))
            throw ManifestError(ref.str() + ": an index inside an index");
        return std::get<Manifest>(std::move(inner));
    }();
    ImageConfig config;
    if (store_.blobs().has(manifest.config.digest)) {
        config = session->parse_config(read_file(store_.blobs().path(manifest.config.digest)));
    } else {
        auto [bytes, parsed] = session->config(manifest.config);
        check_document(bytes, manifest.config.digest, manifest.config.size,
                       "config of " + top.endpoint);
        documents.emplace_back(manifest.config.digest, std::move(bytes));
        config = std::move(parsed);
    }
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
            [&] { session->fetch_blob(layer.blob, store_.blobs(), callbacks); }, check);
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
