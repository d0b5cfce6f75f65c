// berthd's side of the helper channel: requests go out in order, replies are matched by id.
#pragma once

#include <functional>
#include <map>
#include <memory>

#include "helper.pb.h"
#include "runtime/daemon/framed_socket.h"

namespace berth::daemon {

class HelperClient {
  public:
    using Callback = std::function<void(const v1::helper::Reply&)>;

    // `on_lost` runs if the helper goes away: the daemon cannot work without it.
    HelperClient(std::shared_ptr<FramedSocket> channel, std::function<void()> on_lost);
    void call(v1::helper::Request request, Callback done);

  private:
    std::shared_ptr<FramedSocket> channel_;
    std::function<void()> on_lost_;
    uint64_t next_id_ = 1;
    std::map<uint64_t, Callback> pending_;
};

}  // namespace berth::daemon
