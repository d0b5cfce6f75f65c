#include "runtime/daemon/image_client.h"

#include <iostream>

#include "runtime/wire/frame.h"

namespace berth::daemon {

namespace {

v1::images::Reply error_reply(uint64_t id, v1::ErrorCode code, const std::string& message) {
    v1::images::Reply reply;
    reply.set_id(id);
    reply.mutable_error()->set_code(code);
    reply.mutable_error()->set_message(message);
    return reply;
}

constexpr const char* kLost = "the image service (berth-images) has exited; berthd is restarting";

}  // namespace

ImageClient::ImageClient(std::shared_ptr<FramedSocket> channel) : channel_(std::move(channel)) {
    channel_->start([this](FramedSocket::Event event, std::string&& payload) {
        if (event != FramedSocket::Event::frame) {
            on_lost();
            return;
        }
        on_frame(std::move(payload));
    });
}

void ImageClient::on_frame(std::string&& payload) {
    v1::images::Reply reply;
    if (!reply.ParseFromString(payload)) {
        std::cerr << "berthd: berth-images sent a malformed reply; closing its channel"
                  << std::endl;
        channel_->close();
        on_lost();
        return;
    }
    auto it = pending_.find(reply.id());
    if (it == pending_.end()) return;  // abandoned
    if (reply.has_progress()) {
        if (it->second.progress) it->second.progress(reply.progress());
        return;
    }
    Handlers handlers = std::move(it->second);
    pending_.erase(it);
    if (handlers.done) handlers.done(reply);
}

void ImageClient::on_lost() {
    if (lost_) return;
    lost_ = true;
    auto pending = std::move(pending_);
    pending_.clear();
    for (auto& [id, handlers] : pending) {
        if (handlers.done) handlers.done(error_reply(id, v1::UNAVAILABLE, kLost));
    }
    if (on_lost_) on_lost_();
}

uint64_t ImageClient::call(v1::images::Request request, std::vector<UniqueFd> fds,
                           Handlers handlers) {
    const uint64_t id = next_id_++;
    request.set_id(id);
    if (lost_) {
        if (handlers.done) handlers.done(error_reply(id, v1::UNAVAILABLE, kLost));
        return id;
    }
    pending_[id] = std::move(handlers);
    channel_->send(wire::encode_frame(request), std::move(fds));
    return id;
}

void ImageClient::cancel(uint64_t id) {
    if (lost_ || !pending_.count(id)) return;
    v1::images::Request request;
    request.set_id(id);
    request.mutable_cancel();
    channel_->send(wire::encode_frame(request));
}

void ImageClient::abandon(uint64_t id) {
    cancel(id);
    pending_.erase(id);
}

void ImageClient::resolve(
    const std::string& reference,
    std::function<void(v1::ErrorCode, const std::string&, const v1::InspectImageReply&)> done) {
    v1::images::Request request;
    request.mutable_inspect_image()->set_reference(reference);
    Handlers handlers;
    handlers.done = [done = std::move(done)](const v1::images::Reply& reply) {
        if (reply.has_inspect_image()) {
            done(v1::ERROR_CODE_UNSPECIFIED, "", reply.inspect_image());
            return;
        }
        v1::ErrorCode code = reply.has_error() ? reply.error().code() : v1::INTERNAL;
        if (code == v1::ERROR_CODE_UNSPECIFIED) code = v1::INTERNAL;
        done(code, reply.has_error() ? reply.error().message() : "unexpected reply to a resolve",
             v1::InspectImageReply());
    };
    call(std::move(request), {}, std::move(handlers));
}

}  // namespace berth::daemon
