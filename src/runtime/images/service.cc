#include "runtime/images/service.h"

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <iostream>
#include <thread>

#include "base/error.h"
#include "base/files.h"
#include "rootfs-tools/blob_store.h"
#include "rootfs-tools/bootstrap.h"
#include "rootfs-tools/image_lookup.h"
#include "runtime/images/pulling.h"
#include "runtime/wire/error_codes.h"
#include "runtime/wire/frame.h"

namespace berth::images_service {

using images::Image;

namespace {

// An exception as the protocol's error: the code says what kind of failure it was, the
// message what failed. `fallback` for system errors that say nothing more specific (a bad
// archive on import, a store problem elsewhere).
std::pair<v1::ErrorCode, std::string> classify(std::exception_ptr e, v1::ErrorCode fallback) {
    try {
        std::rethrow_exception(e);
    } catch (const SysError& x) {
        if (x.code() == ECANCELED) return {v1::CANCELED, "canceled"};
        return {wire::error_code_for_errno(x.code(), fallback), x.what()};
    } catch (const Error& x) {  // the store's, the registry's (auth, 404, unreachable), ...
        return {wire::error_code(x.kind()), x.what()};
    } catch (const std::invalid_argument& x) {
        return {v1::INVALID_ARGUMENT, x.what()};
    } catch (const std::exception& x) {
        return {v1::INTERNAL, x.what()};
    }
    return {v1::INTERNAL, "unknown error"};
}

std::vector<images::InUse> in_use_of(const v1::images::Request& request) {
    std::vector<images::InUse> out;
    for (const auto& u : request.in_use()) {
        out.push_back({images::Digest::parse(u.manifest_digest()), u.sandbox()});
    }
    return out;
}

// The tag an exported layout names its manifest by (skopeo's oci:DIR:TAG).
std::string tag_of(const std::string& name) {
    const size_t at = name.find('@');
    if (at != std::string::npos) return "latest";
    const size_t colon = name.rfind(':');
    const size_t slash = name.rfind('/');
    if (colon == std::string::npos || (slash != std::string::npos && colon < slash))
        return "latest";
    return name.substr(colon + 1);
}

}  // namespace

v1::ImageInfo image_info(const Image& image) {
    v1::ImageInfo info;
    info.set_name(image.name);
    info.set_manifest_digest(image.manifest.str());
    info.set_config_digest(image.config.str());
    for (const auto& l : image.layers) info.add_layers(l.str());
    info.set_size(image.size);
    info.set_created(image.created);
    return info;
}

Service::Service(images::ImageStore& store, int channel, Pulling pulling)
    : store_(store), channel_(channel), pulling_(std::move(pulling)) {}

void Service::send(const v1::images::Reply& reply) {
    std::lock_guard lock(write_mu_);
    try {
        wire::write_frame(channel_, reply);
    } catch (const std::exception& e) {
        // berthd is gone; the read loop sees EOF and ends the service.
        std::cerr << "berth-images: reply " << reply.id() << ": " << e.what() << std::endl;
    }
}

void Service::send_error(uint64_t id, v1::ErrorCode code, const std::string& message) {
    v1::images::Reply reply;
    reply.set_id(id);
    reply.mutable_error()->set_code(code);
    reply.mutable_error()->set_message(message);
    send(reply);
}

void Service::serve() {
    for (;;) {
        v1::images::Request request;
        std::vector<UniqueFd> fds;
        wire::ReadStatus status;
        try {
            status = wire::read_frame(channel_, request, wire::kDefaultMaxFrame, &fds);
        } catch (const std::exception& e) {
            std::cerr << "berth-images: " << e.what() << std::endl;
            status = wire::ReadStatus::eof;
        }
        if (status == wire::ReadStatus::eof) break;
        if (status != wire::ReadStatus::ok) {
            send_error(request.id(), v1::INVALID_ARGUMENT, "malformed images request");
            continue;
        }
        dispatch(std::move(request), std::move(fds));
    }
    // berthd is gone (or closed the channel): nothing will read a reply, and nothing a
    // client was told had failed may appear later. The work in progress is stopped by our
    // exit, not waited for (waiting would let an import record its name): everything in
    // the store is made to be cut at any point, and what a cut leaves is swept at the next
    // open. The jobs are flagged first so that none starts anything new meanwhile.
    std::lock_guard lock(jobs_mu_);
    for (auto& [id, job] : jobs_) job->cancel.cancel();
}

void Service::dispatch(v1::images::Request request, std::vector<UniqueFd> fds) {
    const uint64_t id = request.id();
    using R = v1::images::Request;
    const bool takes_fd =
        request.body_case() == R::kImportImage || request.body_case() == R::kExportImage;
    if (takes_fd ? fds.size() != 1 : !fds.empty()) {
        send_error(id, v1::INVALID_ARGUMENT,
                   takes_fd ? "expected one fd with the request, got " + std::to_string(fds.size())
                            : "this request takes no fd");
        return;
    }
    switch (request.body_case()) {
        case R::kCancel: {
            std::lock_guard lock(jobs_mu_);
            if (auto it = jobs_.find(id); it != jobs_.end()) it->second->cancel.cancel();
            return;  // the request itself answers (CANCELED, or its result if it was done)
        }
        case R::kListImages:
            return list(id);
        case R::kInspectImage:
            return inspect(id, request.inspect_image());
        case R::kPullImage:
            return spawn(id, [this, r = request.pull_image()](Job& job) { pull(job, r); });
        case R::kImportImage: {
            auto fd = std::make_shared<UniqueFd>(std::move(fds[0]));
            return spawn(id,
                         [this, request, fd](Job& job) { import(job, request, std::move(*fd)); });
        }
        case R::kExportImage: {
            auto fd = std::make_shared<UniqueFd>(std::move(fds[0]));
            return spawn(id, [this, r = request.export_image(), fd](Job& job) {
                export_image(job, r, std::move(*fd));
            });
        }
        case R::kBootstrapImage:
            return spawn(id,
                         [this, r = request.bootstrap_image()](Job& job) { bootstrap(job, r); });
        case R::kRemoveImage:
            return spawn(id, [this, request](Job& job) { remove(job.id, request); });
        case R::kPruneImages:
            return spawn(id, [this, request](Job& job) { prune(job.id, request); });
        default:
            send_error(id, v1::INVALID_ARGUMENT, "empty or unknown images request");
    }
}

void Service::spawn(uint64_t id, std::function<void(Job&)> work) {
    std::shared_ptr<Job> job;
    try {
        job = std::make_shared<Job>();
    } catch (const SysError& e) {  // its token's eventfd
        send_error(id, v1::RESOURCE_EXHAUSTED, std::string("eventfd: ") + std::strerror(e.code()));
        return;
    }
    job->id = id;
    {
        std::lock_guard lock(jobs_mu_);
        if (!jobs_.emplace(id, job).second) {
            send_error(id, v1::INVALID_ARGUMENT,
                       "request id " + std::to_string(id) + " is already running");
            return;
        }
    }
    std::thread([this, job, work = std::move(work)] {
        try {
            work(*job);
        } catch (...) {
            auto [code, message] = classify(std::current_exception(), v1::INTERNAL);
            if (job->cancel.cancelled()) code = v1::CANCELED, message = "canceled";
            send_error(job->id, code, message);
        }
        std::lock_guard lock(jobs_mu_);
        jobs_.erase(job->id);
    }).detach();
}

void Service::pull(Job& job, const v1::PullImage& request) {
    if (!pulling_.pull) {
        send_error(job.id, v1::UNAVAILABLE, "this berth-images was built without registry pulls");
        return;
    }
    // Progress of one blob at most every 100 ms: a fast download makes thousands of events.
    std::map<std::string, std::chrono::steady_clock::time_point> last;
    auto progress = [&](const v1::ImageProgress& p) {
        if (p.kind() == v1::ImageProgress::BLOB_PROGRESS) {
            const auto now = std::chrono::steady_clock::now();
            auto& t = last[p.digest()];
            if (now - t < std::chrono::milliseconds(100) && p.done() != p.total()) return;
            t = now;
        }
        v1::images::Reply reply;
        reply.set_id(job.id);
        *reply.mutable_progress() = p;
        send(reply);
    };
    // (The puller holds the store's content against remove and prune until it is named.)
    const Image image = pulling_.pull(request, progress, job.cancel);
    v1::images::Reply reply;
    reply.set_id(job.id);
    *reply.mutable_pull_image()->mutable_image() = image_info(image);
    send(reply);
}

void Service::import(Job& job, const v1::images::Request& request, UniqueFd fd) {
    std::optional<images::Reference> name;
    if (!request.import_image().name().empty())
        name = images::parse_reference(request.import_image().name());
    images::ImportOptions options;
    struct stat st;
    const bool dir = ::fstat(fd.get(), &st) == 0 && S_ISDIR(st.st_mode);
    options.label = dir ? "the layout directory" : "the archive";
    options.cancel = &job.cancel;
    if (request.has_caller()) {
        images::Caller caller;
        caller.uid = request.caller().uid();
        caller.gid = request.caller().gid();
        caller.groups.assign(request.caller().groups().begin(), request.caller().groups().end());
        options.caller = std::move(caller);
    } else if (dir) {
        // A directory is read as someone: refuse rather than read it with our own rights.
        send_error(job.id, v1::INVALID_ARGUMENT, "an import of a directory needs the caller");
        return;
    }
    Image image;
    try {
        auto hold = store_.hold_content();
        image = store_.import_fd(fd.get(), name, options);
    } catch (const SysError&) {
        // A system error while reading the client's archive is about that archive.
        auto [code, message] = classify(std::current_exception(), v1::INVALID_ARGUMENT);
        if (job.cancel.cancelled()) code = v1::CANCELED, message = "canceled";
        send_error(job.id, code, message);
        return;
    }
    v1::images::Reply reply;
    reply.set_id(job.id);
    *reply.mutable_import_image()->mutable_image() = image_info(image);
    send(reply);
}

void Service::export_image(Job& job, const v1::ExportImage& request, UniqueFd fd) {
    const Image image = images::lookup_image(store_, request.reference());
    uint64_t bytes = 0;
    try {
        auto hold = store_.hold_content();  // its blobs stay while they are read
        bytes = store_.export_oci_archive(image, fd.get(), tag_of(image.name), &job.cancel);
    } catch (const SysError& e) {
        auto [code, message] = classify(std::current_exception(), v1::INTERNAL);
        if (e.code() == EPIPE) code = v1::CANCELED, message = "the reader of the export went away";
        if (job.cancel.cancelled()) code = v1::CANCELED, message = "canceled";
        send_error(job.id, code, message);
        return;
    }
    v1::images::Reply reply;
    reply.set_id(job.id);
    reply.mutable_export_image()->set_bytes(bytes);
    send(reply);
}

void Service::bootstrap(Job& job, const v1::BootstrapImage& request) {
    const std::string suite = images::debian_suite(request.source());
    const images::Reference name = images::parse_reference(
        request.name().empty() ? "localhost/debian:" + suite : request.name());
    images::BootstrapOptions options;
    options.cancel = &job.cancel;
    options.progress = [&](const std::string& line) {
        v1::images::Reply reply;
        reply.set_id(job.id);
        reply.mutable_progress()->set_kind(v1::ImageProgress::STEP);
        reply.mutable_progress()->set_message(line);
        send(reply);
    };
    const Image image = images::bootstrap_image(store_, request.source(), name, options);
    v1::images::Reply reply;
    reply.set_id(job.id);
    *reply.mutable_bootstrap_image()->mutable_image() = image_info(image);
    send(reply);
}

void Service::list(uint64_t id) {
    try {
        auto images = store_.list();
        std::sort(images.begin(), images.end(),
                  [](const Image& a, const Image& b) { return a.name < b.name; });
        v1::images::Reply reply;
        reply.set_id(id);
        auto* out = reply.mutable_list_images();  // set even when there are none
        for (const auto& im : images) *out->add_images() = image_info(im);
        send(reply);
    } catch (...) {
        auto [code, message] = classify(std::current_exception(), v1::INTERNAL);
        send_error(id, code, message);
    }
}

void Service::inspect(uint64_t id, const v1::InspectImage& request) {
    try {
        const Image image = images::lookup_image(store_, request.reference());
        const images::ImageConfig config =
            store_.parser().config(read_file(store_.blobs().path(image.config)));
        v1::images::Reply reply;
        reply.set_id(id);
        auto* out = reply.mutable_inspect_image();
        *out->mutable_image() = image_info(image);
        auto* c = out->mutable_config();
        for (const auto& e : config.env) c->add_env(e);
        for (const auto& e : config.entrypoint) c->add_entrypoint(e);
        for (const auto& e : config.cmd) c->add_cmd(e);
        c->set_working_dir(config.working_dir);
        c->set_user(config.user);
        for (const auto& d : store_.lower_dirs(image)) out->add_lower_dirs(d);
        out->set_platform(config.platform.str());
        send(reply);
    } catch (...) {
        auto [code, message] = classify(std::current_exception(), v1::INTERNAL);
        send_error(id, code, message);
    }
}

void Service::remove(uint64_t id, const v1::images::Request& request) {
    const auto& r = request.remove_image();
    const auto in_use = in_use_of(request);
    const Image image = images::lookup_image(store_, r.reference());
    // By digest, an image with several names is ambiguous about what to remove (docker's
    // rule): all of them only when forced.
    std::vector<Image> targets{image};
    bool by_name = false;
    try {
        for (const auto& ref : images::candidate_names(r.reference()))
            by_name = by_name || store_.find(ref).has_value();
    } catch (const std::invalid_argument&) {
    }
    if (!by_name) {
        std::vector<std::string> names;
        for (const auto& im : store_.list())
            if (im.manifest == image.manifest && im.name != image.name) targets.push_back(im);
        if (targets.size() > 1 && !r.force()) {
            std::string list;
            for (const auto& t : targets) list += (list.empty() ? "" : ", ") + t.name;
            send_error(id, v1::FAILED_PRECONDITION,
                       r.reference() + " has " + std::to_string(targets.size()) + " names (" +
                           list + "): remove them by name, or force to remove all");
            return;
        }
    }
    v1::images::Reply reply;
    reply.set_id(id);
    auto* out = reply.mutable_remove_image();
    for (const auto& t : targets) {
        const images::RemoveResult result = store_.remove(t, in_use, r.force());
        for (const auto& n : result.untagged) out->add_untagged(n);
        for (const auto& d : result.deleted) out->add_deleted(d);
        out->set_freed_bytes(out->freed_bytes() + result.freed_bytes);
    }
    send(reply);
}

void Service::prune(uint64_t id, const v1::images::Request& request) {
    const images::RemoveResult result = store_.prune(in_use_of(request));
    v1::images::Reply reply;
    reply.set_id(id);
    auto* out = reply.mutable_prune_images();
    for (const auto& d : result.deleted) out->add_deleted(d);
    out->set_freed_bytes(result.freed_bytes);
    send(reply);
}

}  // namespace berth::images_service
