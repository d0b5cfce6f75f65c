// The daemon's view of live sandboxes: lookup by id, id prefix or name; leases; and the
// metadata that lets a restarted daemon reattach to sandboxes it did not create.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "berth.pb.h"
#include "cgroup/cgroup.h"

namespace berth::daemon {

using Clock = std::chrono::steady_clock;

struct Sandbox {
    v1::SandboxInfo info;
    std::string init_socket;
    uint64_t init_start_time = 0;
    // Opened read-only, for stats and OOM counts. Shared: an exec reads its OOM count after
    // its command ends, which may be after a concurrent delete has dropped the sandbox.
    std::shared_ptr<cgroup::Cgroup> cgroup;
    uint64_t owner_session = 0;  // the connection that holds its lease; 0 = none
    std::optional<Clock::time_point> lease_deadline;
    bool deleting = false;
};

// `path` in a sandbox made absolute against its `workdir` ("/" when empty): where relative
// exec cwds and file-transfer paths start. An empty path is the workdir itself.
std::string in_workdir(const std::string& workdir, const std::string& path);

class SandboxRegistry {
  public:
    SandboxRegistry(std::string runtime_dir, cgroup::Driver* driver);

    // Finds by full id, unique id prefix (4+ chars) or name. Sets `error` when ambiguous.
    Sandbox* find(const std::string& key, std::string* error);
    Sandbox* by_id(const std::string& id);
    bool name_taken(const std::string& name) const;
    // True while the sandbox's init (pid and start time as recorded) is running.
    bool init_alive(const Sandbox& sandbox) const;

    // `cgroup_name`: its cgroup under berth's parent (empty: an older berth's, named by the id).
    Sandbox& add(v1::SandboxInfo info, std::string init_socket, uint64_t init_start_time,
                 const std::string& cgroup_name);
    void remove(const std::string& id);
    std::vector<Sandbox*> all();

    // Writes what the daemon alone knows (name, persistence, resources) beside the
    // helper's state, so a restarted daemon can rebuild the registry.
    void save_meta(const Sandbox& sandbox) const;

    struct Found {
        v1::SandboxInfo info;
        std::string init_socket;
        uint64_t init_start_time = 0;
        std::string cgroup_name;
        bool alive = false;
    };
    // Sandboxes left by an earlier daemon, from the runtime dir.
    std::vector<Found> scan() const;

    cgroup::Driver* driver() const { return driver_; }

  private:
    std::string runtime_dir_;
    cgroup::Driver* driver_;
    std::map<std::string, std::unique_ptr<Sandbox>> by_id_;
};

}  // namespace berth::daemon
