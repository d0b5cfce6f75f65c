// berth-images' request loop: reads berthd's requests (images.proto) from the channel on
// this thread and runs each long one (pull, import, export, bootstrap, remove, prune) on a
// thread of its own, so a 35 s bootstrap does not hold up a list. Replies (and progress)
// are written whole, one at a time, under a mutex; each carries its request's id.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "base/cancel.h"
#include "base/unique_fd.h"
#include "images.pb.h"
#include "rootfs-tools/image_store.h"

namespace berth::images_service {

// The long-running pieces that come from elsewhere (the registry puller), so the loop does
// not depend on how a pull is made.
struct Pulling {
    // Pulls `request` into the store, calling `progress` as it goes; stops soon after
    // `cancel` is cancelled (throwing). Returns the image recorded.
    std::function<images::Image(const v1::PullImage& request,
                                const std::function<void(const v1::ImageProgress&)>& progress,
                                const CancelToken& cancel)>
        pull;
};

class Service {
  public:
    Service(images::ImageStore& store, int channel, Pulling pulling);

    // Serves until berthd closes the channel; then flags what runs as cancelled and
    // returns: the caller must exit at once (_exit), cutting it short.
    void serve();

  private:
    // One request that runs on a thread of its own.
    struct Job {
        uint64_t id = 0;
        CancelToken cancel;  // its eventfd is what transfer and the unpack worker watch
    };

    void dispatch(v1::images::Request request, std::vector<UniqueFd> fds);
    // Runs `work` on a thread; its exceptions become the request's Error reply.
    void spawn(uint64_t id, std::function<void(Job&)> work);
    void send(const v1::images::Reply& reply);
    void send_error(uint64_t id, v1::ErrorCode code, const std::string& message);

    void pull(Job& job, const v1::PullImage& request);
    void import(Job& job, const v1::images::Request& request, UniqueFd fd);
    void export_image(Job& job, const v1::ExportImage& request, UniqueFd fd);
    void bootstrap(Job& job, const v1::BootstrapImage& request);
    void list(uint64_t id);
    void inspect(uint64_t id, const v1::InspectImage& request);
    void remove(uint64_t id, const v1::images::Request& request);
    void prune(uint64_t id, const v1::images::Request& request);

    images::ImageStore& store_;
    int channel_;
    Pulling pulling_;
    std::mutex write_mu_;
    std::mutex jobs_mu_;
    std::map<uint64_t, std::shared_ptr<Job>> jobs_;
};

// The store's image as the protocol shows it.
v1::ImageInfo image_info(const images::Image& image);

}  // namespace berth::images_service
