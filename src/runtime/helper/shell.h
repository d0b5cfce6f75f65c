// A sandbox shell: a process cloned into the namespaces every sandbox gets (user, mount, pid,
// net, uts, ipc), its id maps written, loopback up, in a cgroup of its own (and, once public
// sandboxes are asked for, with a veth) -- what of a sandbox does not depend on what is
// asked for. Assigning it a rootfs, hostname and /etc files
// makes it the sandbox's berth-init.
//
// Shells are what makes a create fast (ShellPool): the slow, serialised parts of making a
// sandbox -- clone3 of new namespaces, and on cgroup v1 the move into a cgroup, which after
// a quiet spell waits for an RCU grace period (10-20 ms on a 2-core machine) -- are done
// before the create arrives. A create made without a pooled shell starts one and waits for it.
//
// Isolation: a shell runs nothing but the helper's own code until it is assigned, and is
// assigned once: it becomes that sandbox or dies. A shell whose helper goes away dies too
// (it reads EOF on its socket; PR_SET_PDEATHSIG besides); the cgroups of dead shells are
// swept at the next start (SandboxFactory::sweep_cgroups).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "base/unique_fd.h"
#include "cgroup/cgroup.h"
#include "helper.pb.h"
#include "ns/idmap.h"
#include "ns/security.h"

namespace berth::helper {

// "shell-" and 24 hex digits: a shell's name and its cgroup's, which the sandbox it becomes
// keeps (a cgroup cannot be renamed on v2).
bool valid_shell_name(const std::string& name);

struct ShellSpec {
    cgroup::Driver* driver = nullptr;
    const ns::IdMapping* mapping = nullptr;
    const ns::SeccompProgram* seccomp = nullptr;  // the sandbox's filter, put on at assignment
    std::optional<uid_t> owner;                   // the host uid that owns its user namespace
    // Lower init's oom_score_adj (-999); cleared when the host's root may not (no
    // CAP_SYS_RESOURCE), so that later shells do not try again.
    bool* adjust_oom = nullptr;
};

class Shell {
  public:
    // Clones it and writes its id maps; it gets ready by itself (ready()). Throws SysError
    // (nothing is left: its cgroup is removed, the process killed).
    static std::unique_ptr<Shell> start(const ShellSpec& spec);
    // A shell that was not assigned is killed and its cgroup removed.
    ~Shell();
    Shell(const Shell&) = delete;
    Shell& operator=(const Shell&) = delete;

    const std::string& name() const { return name_; }
    pid_t pid() const { return pid_; }
    int pidfd() const { return pidfd_.get(); }
    cgroup::Cgroup& cgroup() { return *cgroup_; }
    std::optional<uid_t> owner() const { return owner_; }
    // Its network namespace (through its pidfd-guarded pid).
    UniqueFd open_netns() const;
    // The host end of a veth made into its network namespace while it waited (see
    // net::HostNetwork::prepare_link), if any.
    std::string link;
    // Runs when it goes unassigned (gives its owner uid back).
    std::function<void()> on_discard;

    // Whether it reported ready within `wait` (0: only look). Throws HelperError with its own
    // words when it failed, or if it died.
    bool ready(std::chrono::milliseconds wait);
    // Makes it the sandbox: attaches `overlay_fd` (the root mount), puts the files in place,
    // takes `control_fd` as init's listening socket. Returns at once: the shell works on
    // while the caller does what else the sandbox needs (its network, on the host side;
    // nothing of the sandbox runs before the caller hands out the control socket).
    void assign(const v1::helper::ShellAssignment& assignment, int overlay_fd, int control_fd);
    // Returns once init serves; throws HelperError with the shell's words otherwise (it is
    // then dead or about to be).
    void wait_running();

    // After a successful assign: what the sandbox keeps (the shell no longer kills it).
    struct Parts {
        pid_t pid;
        UniqueFd pidfd;
        std::unique_ptr<cgroup::Cgroup> cgroup;
        std::optional<uid_t> owner;
    };
    Parts release();

  private:
    Shell() = default;
    v1::helper::ShellReport read_report(std::chrono::milliseconds wait);

    std::string name_;
    pid_t pid_ = -1;
    UniqueFd pidfd_;
    UniqueFd socket_;  // the helper's end of the shell's socketpair
    std::unique_ptr<cgroup::Cgroup> cgroup_;
    std::optional<uid_t> owner_;
    bool ready_ = false;
    bool assigned_ = false;
    bool released_ = false;
};

// Kills a sandbox's init (and so its whole pid namespace) and waits until it is gone, at most
// `wait` (then HelperError UNAVAILABLE).
void kill_and_wait(int pidfd, const std::string& id, std::chrono::seconds wait);

// Prepared shells, kept `target` strong. The helper calls fill_one() when it is idle (no
// request waiting), take() at a create.
class ShellPool {
  public:
    using Maker = std::function<std::unique_ptr<Shell>()>;
    ShellPool(size_t target, Maker make) : target_(target), make_(std::move(make)) {}

    // A ready shell, or null when none is (the caller starts one itself). Shells that
    // failed are dropped on the way.
    std::unique_ptr<Shell> take();
    // Starts one more shell if the pool is short. False when it is full (or making failed:
    // then it waits a while before trying again, and says why on stderr once).
    bool fill_one();
    bool full() const { return shells_.size() >= target_; }
    size_t target() const { return target_; }
    size_t size() const { return shells_.size(); }

  private:
    size_t target_;
    Maker make_;
    std::deque<std::unique_ptr<Shell>> shells_;
    std::chrono::steady_clock::time_point retry_after_{};
    std::string last_error_;
};

// The helper's argv memory: each sandbox's init overwrites its copy so that /proc/1/cmdline
// inside reads "berth-init", not the helper's command line with host paths.
void set_process_title_area(char* start, size_t length);

}  // namespace berth::helper
