#include "runtime/images/pulling.h"

#include "rootfs-tools/puller.h"
#include "runtime/images/fetcher.h"

namespace berth::images_service {

namespace {

images::Platform parse_platform(const std::string& text) {
    images::Platform p;
    const size_t a = text.find('/');
    if (a == std::string::npos || a == 0 || a + 1 == text.size())
        throw std::invalid_argument("platform '" + text + "' is not os/arch[/variant]");
    p.os = text.substr(0, a);
    const size_t b = text.find('/', a + 1);
    p.architecture = text.substr(a + 1, b == std::string::npos ? std::string::npos : b - a - 1);
    if (b != std::string::npos) p.variant = text.substr(b + 1);
    if (p.architecture.empty() || p.variant.find('/') != std::string::npos)
        throw std::invalid_argument("platform '" + text + "' is not os/arch[/variant]");
    return p;
}

v1::ImageProgress::Kind kind_of(images::PullEvent::Kind k) {
    using K = images::PullEvent::Kind;
    switch (k) {
        case K::resolved:
            return v1::ImageProgress::RESOLVED;
        case K::blob_present:
            return v1::ImageProgress::BLOB_PRESENT;
        case K::blob_progress:
            return v1::ImageProgress::BLOB_PROGRESS;
        case K::blob_done:
            return v1::ImageProgress::BLOB_DONE;
        case K::layer_unpacked:
            return v1::ImageProgress::LAYER_UNPACKED;
        case K::retrying:
            return v1::ImageProgress::RETRYING;
    }
    return v1::ImageProgress::KIND_UNSPECIFIED;
}

}  // namespace

Pulling make_pulling(images::ImageStore& store, FetcherSpec fetcher) {
    Pulling p;
    p.pull = [&store, fetcher](const v1::PullImage& request,
                               const std::function<void(const v1::ImageProgress&)>& progress,
                               const CancelToken& cancel) -> images::Image {
        const images::Reference ref = images::parse_reference(request.reference());
        images::PullOptions options;
        options.cancel = &cancel;
        if (!request.platform().empty()) options.platform = parse_platform(request.platform());
        options.progress = [&](const images::PullEvent& e) {
            v1::ImageProgress out;
            out.set_kind(kind_of(e.kind));
            out.set_digest(e.digest.str());
            out.set_done(e.done);
            out.set_total(e.total);
            out.set_message(e.message);
            progress(out);
        };
        // The client's credentials go to the fetcher as they came: it parses them. What
        // fails says its code by its kind: a registry's refusal (RegistryAuthError), its 404
        // or unreachability (RegistryError), a cancel (PullCancelled), a bad registries
        // config (ConfigError).
        images::Puller puller(store, fetcher_sessions(fetcher, request.auth_config()));
        return puller.pull(ref, options);
    };
    return p;
}

}  // namespace berth::images_service
