#include "runtime/daemon/helper_client.h"

#include "runtime/wire/frame.h"

namespace berth::daemon {

HelperClient::HelperClient(std::shared_ptr<FramedSocket> channel, std::function<void()> on_lost)
    : channel_(std::move(channel)), on_lost_(std::move(on_lost)) {
    channel_->start([this](FramedSocket::Event event, std::string&& payload) {
        if (event != FramedSocket::Event::frame) {
            on_lost_();
            return;
        }
        v1::helper::Reply reply;
        if (!reply.ParseFromString(payload)) {
            on_lost_();
            return;
        }
        auto it = pending_.find(reply.id());
        if (it == pending_.end()) return;
        Callback done = std::move(it->second);
        pending_.erase(it);
        done(reply);
    });
}

void HelperClient::call(v1::helper::Request request, Callback done) {
    request.set_id(next_id_++);
    pending_[request.id()] = std::move(done);
    channel_->send(wire::encode_frame(request));
}

}  // namespace berth::daemon
