// Work that several threads of this process may want at the same moment (one blob for two
// pulls of an image, one layer to unpack) done once: the first asker does it, the others
// wait for it to end and then find it done. Across processes the store itself is safe
// (blobs and layers are named only when complete); this only saves the duplicate work.
#pragma once

#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

namespace berth::images {

class InFlight {
  public:
    // Returns false when `done()` says it is done (checked under the lock, so the end of
    // another thread's work is never missed). Otherwise, while another thread runs work
    // under `key`, waits for it (calling `wait_check` every 50 ms: it throws to stop
    // waiting) and looks again: its failure or cancellation is its own, so then this thread
    // runs `work` itself. Returns true when it ran `work` (whose exceptions pass through).
    bool run(const std::string& key, const std::function<bool()>& done,
             const std::function<void()>& work, const std::function<void()>& wait_check);

    // The one of this process.
    static InFlight& process();

  private:
    struct Slot {
        bool finished = false;
        std::condition_variable cv;
    };
    std::mutex mu_;
    std::map<std::string, std::shared_ptr<Slot>> running_;
};

}  // namespace berth::images
