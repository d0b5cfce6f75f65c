// The privileged half of a sandbox's life: build it from namespaces, an id-mapped
// overlay and a cgroup; tear it down so that nothing is left behind.
#pragma once

#include <sys/types.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>

#include "base/error.h"
#include "base/undo.h"
#include "base/unique_fd.h"
#include "berth.pb.h"
#include "cgroup/cgroup.h"
#include "helper.pb.h"
#include "net/host_network.h"
#include "ns/idmap.h"
#include "ns/security.h"
#include "runtime/helper/helper_error.h"
#include "runtime/helper/janitor.h"
#include "runtime/helper/shell.h"
#include "runtime/helper/storage.h"
#include "runtime/wire/error_codes.h"

namespace berth::helper {

class StepTimer;

struct Config {
    std::string runtime_dir;  // /run/berth: sockets and state files
    std::string state_dir;    // /var/lib/berth: writable layers
    uid_t daemon_uid = 0;     // who may connect to each init's control socket
    gid_t daemon_gid = 0;
    ns::IdMapping mapping;  // root inside = mapping.uids.host_start outside
    // Host uids that own the sandboxes' user namespaces, one each (ns::owner_range_for_user);
    // count 0: root owns them (and they share root's per-user kernel counters).
    ns::IdRange owners;
    std::string cgroup_parent = "berth";
    cgroup::Limits budget;  // on the parent cgroup: what all sandboxes together may use
    // The bridge, subnet and DNS of public sandboxes; unset: only NONE is offered.
    std::optional<net::RootNetworkConfig> network;
    // Whether a network config that cannot be used (a subnet clashing with a host route)
    // stops the helper: yes when the admin chose it, no for the defaults.
    bool network_required = false;
    // Sandbox shells kept ready (shell.h); 0: each create starts its own.
    size_t pool_size = 4;
};

class SandboxFactory {
  public:
    explicit SandboxFactory(Config config);
    ~SandboxFactory();

    v1::helper::Created create(const v1::helper::Create& request);

    // Deleting kills every process of the sandbox and removes its cgroup; then its layers
    // and state are moved out of the way and removed in the background (Janitor). A
    // sandbox this helper did not create (a previous helper did) is found by its state file.
    //
    // The killing and waiting run in a process of their own (a reaper), not here: a
    // sandbox full of processes takes a second to empty, one thrashing at a memory limit
    // tens of them, and the helper meanwhile goes on with creates and other deletes. A
    // delete of a sandbox already being deleted joins it. Throws HelperError for what is
    // refused at once (a bad id, no such sandbox); the reply of `request_id` otherwise
    // comes from finish_deletions().
    void begin_delete(const std::string& id, uint64_t request_id);
    // Readable fds (one per delete in progress): poll them, then call finish_deletions().
    std::vector<int> deletion_fds() const;
    // The replies of every delete whose reaper is done (empty: none is). A reaper that
    // failed (an init still exiting after its wait) leaves the sandbox as it was: deleting
    // it again tries again.
    std::vector<v1::helper::Reply> finish_deletions();
    size_t deletions_in_progress() const { return deleting_.size(); }
    // The helper is exiting: its reapers are left to finish on their own (not killed).
    void abandon_deletions();
    // How full the sandbox's writable layer is (statfs of its root, through its init).
    v1::helper::StorageUsage storage_usage(const std::string& id);

    // A running sandbox's network policy (mode and allowlist), in force when this returns.
    v1::helper::NetworkSet set_network(const v1::helper::SetNetwork& request);

    // For doctor.
    std::string describe_network();
    std::string describe_pool() const;

    // The pool of sandbox shells: the helper calls fill_pool() when it has been idle a
    // moment and the pool is not full (one shell per call; false: none was started).
    bool fill_pool();
    bool pool_full() const;

    // Work that may wait until the reply has been sent (the state file of a new sandbox).
    void run_deferred();

    cgroup::Version cgroup_version() const { return driver_->version(); }

  private:
    // At start: removes the cgroups under berth's parent that belong to no sandbox (see
    // sandbox_factory.cc).
    void sweep_cgroups();
    struct Live;
    // The steps of a create, in order (each pushes how to undo what it made).
    struct CreatePlan;
    struct WritableLayer;
    CreatePlan plan_create(const v1::helper::Create& request) const;
    WritableLayer make_writable_layer(const CreatePlan& plan, Live& live, UndoList& undo);
    UniqueFd make_root_mount(const CreatePlan& plan, const WritableLayer& layer, Live& live);
    // A shell for a create: a pooled one, or one started now.
    std::unique_ptr<Shell> take_shell(StepTimer& timer);
    std::unique_ptr<Shell> start_shell();
    // What the shell is told: hostname, mountpoint, the /etc files of its network.
    v1::helper::ShellAssignment assignment_for(const CreatePlan& plan, const std::string& hostname,
                                               const Live& live) const;
    // The directory a rootfs create names, opened and checked (see the .cc).
    UniqueFd open_rootfs(const std::string& rootfs) const;
    std::string sandbox_runtime_dir(const std::string& id) const;
    std::string sandbox_state_dir(const std::string& id) const;
    // The running init of a sandbox, from this helper's own record or (made by an earlier
    // helper) its state file, pid reuse guarded; empty when it is not running.
    UniqueFd find_init(const std::string& id, pid_t* pid);

    Config config_;
    Janitor janitor_;  // first: forked while the helper is small
    std::unique_ptr<cgroup::Driver> driver_;
    UniqueFd template_userns_;
    ns::SeccompProgram seccomp_;
    std::unique_ptr<Storage> storage_;  // how --storage is enforced on this state filesystem
    std::map<std::string, std::unique_ptr<Live>> live_;
    struct Deletion;
    std::map<std::string, Deletion> deleting_;
    // The delete of `id` once its reaper is done: replies for each request waiting on it.
    std::vector<v1::helper::Reply> finish_delete(const std::string& id, Deletion& deletion);
    // Owner uids of the user namespaces of the sandboxes that exist (this helper's and
    // earlier ones', from their state files): a new sandbox takes the lowest free one.
    std::set<uid_t> owners_in_use_;
    std::optional<uid_t> take_owner();
    std::function<void()> deferred_;
    std::unique_ptr<net::HostNetwork> network_;  // null: no network but loopback offered
    // At start: the addresses of running sandboxes of earlier helpers are taken again and
    // links of sandboxes that no longer exist are removed.
    void adopt_networks();
    bool adjust_oom_ = true;           // cleared when this host's root may not lower oom_score_adj
    std::unique_ptr<ShellPool> pool_;  // null: --pool 0
    // Shells get a veth once a sandbox with a network has been made.
    bool prepare_links_ = false;
    std::vector<std::string> deferred_links_;  // prepared veths no sandbox uses, deleted later
};

// [0-9a-f]{32}: ids become path components, so nothing else is accepted.
bool valid_sandbox_id(const std::string& id);

}  // namespace berth::helper
