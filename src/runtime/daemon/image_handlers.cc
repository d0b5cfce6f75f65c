// berthd's image requests: what a client may pass is checked here (the fds above all: a
// root process will read or write through them), then the request goes to berth-images
// with the in-use set (the manifests live sandboxes were made from) and the client's
// identity; its progress and reply come back to the client under the client's id. The
// daemon never reads the data, and keeps serving everything else while a pull runs.
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <algorithm>
#include <iostream>

#include "images.pb.h"
#include "runtime/daemon/image_client.h"
#include "runtime/daemon/server.h"

namespace berth::daemon {

namespace {

// The fd of an import: a tar to read (a regular file, or a pipe's read end) or an OCI
// layout directory open for reading (not O_PATH: opening a directory for reading took
// the client's read permission on it; an O_PATH fd would let anyone name /root).
std::string check_import_fd(const std::vector<UniqueFd>& fds) {
    if (fds.size() != 1)
        return "expected one fd (the archive or directory) with the request, got " +
               std::to_string(fds.size());
    struct stat st;
    const int flags = ::fcntl(fds[0].get(), F_GETFL);
    if (::fstat(fds[0].get(), &st) != 0 || flags < 0) return "the fd passed is not open";
    if (flags & O_PATH)
        return "the fd passed is an O_PATH fd: open the file or directory to read it";
    if ((flags & O_ACCMODE) == O_WRONLY) return "the fd passed is not open for reading";
    if (!S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode) && !S_ISFIFO(st.st_mode))
        return "the fd passed is neither a file, a pipe nor a directory";
    return "";
}

// The fd of an export: where the tar goes, a pipe's write end or a regular file open for
// writing.
std::string check_export_fd(const std::vector<UniqueFd>& fds) {
    if (fds.size() != 1)
        return "expected one fd (a pipe or file to write to) with the request, got " +
               std::to_string(fds.size());
    struct stat st;
    const int flags = ::fcntl(fds[0].get(), F_GETFL);
    if (::fstat(fds[0].get(), &st) != 0 || flags < 0) return "the fd passed is not open";
    if ((flags & O_PATH) || (flags & O_ACCMODE) == O_RDONLY)
        return "the fd passed is not open for writing";
    if (!S_ISREG(st.st_mode) && !S_ISFIFO(st.st_mode))
        return "the fd passed is neither a regular file nor a pipe";
    return "";
}

// Who is at the other end of the client socket, as the kernel recorded it at connect().
v1::images::Caller caller_of(int fd) {
    v1::images::Caller caller;
    ucred cred{};
    socklen_t len = sizeof cred;
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) {
        caller.set_uid(cred.uid);
        caller.set_gid(cred.gid);
    } else {
        // Unknown: the least privileged answer, so a directory is read as nobody.
        caller.set_uid(65534);
        caller.set_gid(65534);
    }
    gid_t groups[256];
    socklen_t glen = sizeof groups;
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups, &glen) == 0) {
        for (size_t i = 0; i < glen / sizeof(gid_t); ++i) caller.add_groups(groups[i]);
    }
    return caller;
}

void to_client(const v1::images::Reply& reply, v1::ServerMessage& msg) {
    using R = v1::images::Reply;
    switch (reply.body_case()) {
        case R::kError:
            *msg.mutable_error() = reply.error();
            if (msg.error().code() == v1::ERROR_CODE_UNSPECIFIED)
                msg.mutable_error()->set_code(v1::INTERNAL);
            return;
        case R::kPullImage:
            *msg.mutable_pull_image() = reply.pull_image();
            return;
        case R::kImportImage:
            *msg.mutable_import_image() = reply.import_image();
            return;
        case R::kExportImage:
            *msg.mutable_export_image() = reply.export_image();
            return;
        case R::kBootstrapImage:
            *msg.mutable_bootstrap_image() = reply.bootstrap_image();
            return;
        case R::kListImages:
            *msg.mutable_list_images() = reply.list_images();
            return;
        case R::kInspectImage:
            *msg.mutable_inspect_image() = reply.inspect_image();
            return;
        case R::kRemoveImage:
            *msg.mutable_remove_image() = reply.remove_image();
            return;
        case R::kPruneImages:
            *msg.mutable_prune_images() = reply.prune_images();
            return;
        default:
            msg.mutable_error()->set_code(v1::INTERNAL);
            msg.mutable_error()->set_message("berth-images sent an unexpected reply");
    }
}

}  // namespace

void Server::set_images(std::shared_ptr<ImageClient> images) {
    images_ = std::move(images);
    // berthd, unprivileged by now, cannot start berth-images again: it exits, and its
    // supervisor (systemd's Restart=on-failure) starts the whole service again, which
    // reattaches the sandboxes (they run on meanwhile). As for a lost helper.
    images_->set_on_lost([this] {
        std::cerr << "berthd: lost berth-images; exiting with status " << kExitChildLost
                  << " so that the service restarts (sandboxes keep running)" << std::endl;
        exit_code_ = kExitChildLost;
        // After the replies already queued (the failed image requests) had a moment.
        asio::post(io_, [this] { stop(); });
    });
    set_image_resolver(
        [this](const std::string& reference,
               std::function<void(v1::ErrorCode, const std::string&, const ResolvedImage&)> done) {
            images_->resolve(reference,
                             [done = std::move(done)](v1::ErrorCode code, const std::string& error,
                                                      const v1::InspectImageReply& r) {
                                 ResolvedImage image;
                                 if (code == v1::ERROR_CODE_UNSPECIFIED) {
                                     image.name = r.image().name();
                                     image.manifest_digest = r.image().manifest_digest();
                                     // diff_ids bottom first -> hex, top first (overlayfs's
                                     // lowerdir order).
                                     for (auto it = r.image().layers().rbegin();
                                          it != r.image().layers().rend(); ++it)
                                         image.layers.push_back(it->substr(it->find(':') + 1));
                                     image.config = r.config();
                                 }
                                 done(code, error, image);
                             });
        });
}

void Server::handle_image(const std::shared_ptr<Session>& session, const v1::ClientMessage& msg,
                          std::vector<UniqueFd> fds) {
    const uint64_t id = msg.id();
    if (!images_ || !images_->available()) {
        session->send_error(
            id, v1::UNAVAILABLE,
            "the image service (berth-images) is not running; berthd is restarting");
        return;
    }
    if (image_calls_.count({session->id, id})) {
        session->send_error(id, v1::INVALID_ARGUMENT,
                            "request id " + std::to_string(id) + " is in use");
        return;
    }
    v1::images::Request request;
    std::string error;
    auto add_in_use = [&] {
        for (Sandbox* s : registry_.all()) {
            if (s->info.image_digest().empty()) continue;
            auto* u = request.add_in_use();
            u->set_manifest_digest(s->info.image_digest());
            u->set_sandbox(s->info.id() +
                           (s->info.name().empty() ? "" : " (" + s->info.name() + ")"));
        }
        for (const auto& digest : creating_images_) {
            auto* u = request.add_in_use();
            u->set_manifest_digest(digest);
            u->set_sandbox("a sandbox being created");
        }
    };
    switch (msg.body_case()) {
        case v1::ClientMessage::kPullImage:
            *request.mutable_pull_image() = msg.pull_image();
            if (msg.pull_image().reference().empty()) error = "reference: an image is required";
            break;
        case v1::ClientMessage::kImportImage:
            *request.mutable_import_image() = msg.import_image();
            error = check_import_fd(fds);
            *request.mutable_caller() = caller_of(session->socket->native_handle());
            break;
        case v1::ClientMessage::kExportImage:
            *request.mutable_export_image() = msg.export_image();
            error = check_export_fd(fds);
            break;
        case v1::ClientMessage::kBootstrapImage:
            *request.mutable_bootstrap_image() = msg.bootstrap_image();
            break;
        case v1::ClientMessage::kListImages:
            *request.mutable_list_images() = msg.list_images();
            break;
        case v1::ClientMessage::kInspectImage:
            *request.mutable_inspect_image() = msg.inspect_image();
            break;
        case v1::ClientMessage::kRemoveImage:
            *request.mutable_remove_image() = msg.remove_image();
            add_in_use();
            break;
        default:
            *request.mutable_prune_images() = msg.prune_images();
            add_in_use();
    }
    const bool takes_fd = msg.has_import_image() || msg.has_export_image();
    if (error.empty() && !takes_fd && !fds.empty()) error = "this request takes no fd";
    if (!error.empty()) {
        session->send_error(id, v1::INVALID_ARGUMENT, error);
        return;
    }

    std::weak_ptr<Session> weak = session;
    const auto key = std::make_pair(session->id, id);
    ImageClient::Handlers handlers;
    handlers.progress = [weak, id](const v1::ImageProgress& p) {
        auto s = weak.lock();
        if (!s) return;
        v1::ServerMessage out;
        out.set_id(id);
        *out.mutable_image_progress() = p;
        s->send(out);
    };
    handlers.done = [this, weak, id, key](const v1::images::Reply& reply) {
        image_calls_.erase(key);
        auto s = weak.lock();
        if (!s) return;
        v1::ServerMessage out;
        out.set_id(id);
        to_client(reply, out);
        s->send(out);
    };
    // Registered first: a reply cannot come before the call returns, but a lost channel
    // answers at once, from inside call().
    image_calls_[key] = 0;
    const uint64_t call = images_->call(std::move(request), std::move(fds), std::move(handlers));
    if (auto it = image_calls_.find(key); it != image_calls_.end()) it->second = call;
}

bool Server::cancel_image(const std::shared_ptr<Session>& session, uint64_t id) {
    auto it = image_calls_.find({session->id, id});
    if (it == image_calls_.end()) return false;
    images_->cancel(it->second);
    return true;
}

void Server::abandon_images(uint64_t session_id) {
    for (auto it = image_calls_.lower_bound({session_id, 0});
         it != image_calls_.end() && it->first.first == session_id;) {
        if (images_) images_->abandon(it->second);
        it = image_calls_.erase(it);
    }
}

}  // namespace berth::daemon
