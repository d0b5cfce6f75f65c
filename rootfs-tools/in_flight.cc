#include "rootfs-tools/in_flight.h"

#include <chrono>

namespace berth::images {

bool InFlight::run(const std::string& key, const std::function<bool()>& done,
                   const std::function<void()>& work, const std::function<void()>& wait_check) {
    std::shared_ptr<Slot> mine;
    {
        std::unique_lock lock(mu_);
        for (;;) {
            auto it = running_.find(key);
            if (it == running_.end()) {
                if (done()) return false;
                mine = std::make_shared<Slot>();
                running_.emplace(key, mine);
                break;
            }
            std::shared_ptr<Slot> other = it->second;
            while (!other->finished) {
                other->cv.wait_for(lock, std::chrono::milliseconds(50));
                if (!other->finished && wait_check) {
                    lock.unlock();
                    wait_check();  // may throw: nothing of ours to clean up yet
                    lock.lock();
                }
            }
        }
    }
    // Whatever happens to the work, its slot goes, and its waiters look again.
    struct Finish {
        InFlight& self;
        const std::string& key;
        std::shared_ptr<Slot>& slot;
        ~Finish() {
            std::lock_guard lock(self.mu_);
            slot->finished = true;
            self.running_.erase(key);
            slot->cv.notify_all();
        }
    } finish{*this, key, mine};
    work();
    return true;
}

InFlight& InFlight::process() {
    static InFlight instance;
    return instance;
}

}  // namespace berth::images
