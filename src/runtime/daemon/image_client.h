// berthd's side of the berth-images channel: requests go out with an id (and, for import
// and export, the client's fd), progress and the final reply come back by that id, in any
// order across requests. If berth-images goes away, what is pending fails UNAVAILABLE and
// so does every later call; the daemon keeps serving sandboxes.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "base/unique_fd.h"
#include "images.pb.h"
#include "runtime/daemon/framed_socket.h"

namespace berth::daemon {

class ImageClient {
  public:
    struct Handlers {
        std::function<void(const v1::ImageProgress&)> progress;  // optional
        std::function<void(const v1::images::Reply&)> done;      // the final reply (or error)
    };

    explicit ImageClient(std::shared_ptr<FramedSocket> channel);

    // Sends `request` (its id is set here) with `fds`; returns that id, for cancel().
    uint64_t call(v1::images::Request request, std::vector<UniqueFd> fds, Handlers handlers);
    // Asks berth-images to stop request `id`; its done handler still runs (CANCELED).
    void cancel(uint64_t id);
    // Forgets request `id`: its replies are dropped (the client went away); it is also
    // cancelled.
    void abandon(uint64_t id);

    // The image a reference names, for a create: `done` runs on the io thread with
    // ERROR_CODE_UNSPECIFIED and the image (InspectImageReply: image.layers are diff_ids
    // bottom first, lower_dirs top first, config the run settings), or an error code and a
    // message naming the reference.
    void resolve(
        const std::string& reference,
        std::function<void(v1::ErrorCode, const std::string&, const v1::InspectImageReply&)> done);

    bool available() const { return !lost_; }
    // Runs once when berth-images is gone (its channel closed or broke), after the pending
    // requests have failed.
    void set_on_lost(std::function<void()> f) { on_lost_ = std::move(f); }

  private:
    void on_frame(std::string&& payload);
    void on_lost();

    std::shared_ptr<FramedSocket> channel_;
    uint64_t next_id_ = 1;
    std::map<uint64_t, Handlers> pending_;
    bool lost_ = false;
    std::function<void()> on_lost_;
};

}  // namespace berth::daemon
