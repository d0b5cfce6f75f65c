#include "runtime/helper/sandbox_factory.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/capability.h>
#include <linux/sched.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <nlohmann/json.hpp>

#include "base/child_process.h"
#include "base/error.h"
#include "base/files.h"
#include "base/pipe.h"
#include "base/proc.h"
#include "base/undo.h"
#include "net/etc_files.h"
#include "ns/net.h"
#include "ns/rootfs.h"
#include "runtime/init/init.h"

namespace berth::helper {

namespace {

constexpr v1::ErrorCode kInvalidArgument = v1::INVALID_ARGUMENT, kNotFound = v1::NOT_FOUND,
                        kPermissionDenied = v1::PERMISSION_DENIED,
                        kAlreadyExists = v1::ALREADY_EXISTS, kInternal = v1::INTERNAL,
                        kUnavailable = v1::UNAVAILABLE,
                        kFailedPrecondition = v1::FAILED_PRECONDITION;

// The janitor's trash directories, in the order the factory gives them.
constexpr size_t kRunTrash = 0, kStateTrash = 1;

bool valid_hostname(const std::string& name) {
    if (name.empty() || name.size() > 63) return false;
    return std::all_of(name.begin(), name.end(), [](char c) {
        return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.';
    });
}

UniqueFd listen_unix(const std::string& path, uid_t owner, gid_t group) {
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    if (path.size() >= sizeof addr.sun_path)
        throw HelperError(kInvalidArgument, "socket path too long: " + path);
    std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
    UniqueFd sock(
        check_sys("socket", path, [] { return ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0); }));
    ::unlink(path.c_str());
    check_sys("bind", path,
              [&] { return ::bind(sock.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr); });
    check_sys("chown", path, [&] { return ::chown(path.c_str(), owner, group); });
    check_sys("chmod", path, [&] { return ::chmod(path.c_str(), 0600); });
    check_sys("listen", path, [&] { return ::listen(sock.get(), 128); });
    return sock;
}

}  // namespace

// Step timings of a create or delete, printed to stderr when BERTH_HELPER_TRACE is set: where the
// milliseconds go, on the host at hand.
class StepTimer {
  public:
    explicit StepTimer(const char* what)
        : enabled_(std::getenv("BERTH_HELPER_TRACE") != nullptr), what_(what) {}
    void mark(const char* step) {
        if (!enabled_) return;
        auto now = std::chrono::steady_clock::now();
        line_ += std::string(" ") + step + "=" +
                 std::to_string(
                     std::chrono::duration_cast<std::chrono::microseconds>(now - last_).count()) +
                 "us";
        last_ = now;
    }
    ~StepTimer() {
        if (enabled_) std::fprintf(stderr, "berth-helper: %s%s\n", what_, line_.c_str());
    }

  private:
    bool enabled_;
    const char* what_;
    std::chrono::steady_clock::time_point last_ = std::chrono::steady_clock::now();
    std::string line_;
};

// Calls fn(id, state) for each sandbox directory under `dir` whose state file parses (a
// half-made sandbox has none).
template <typename F>
void for_each_state(const std::string& dir, F fn) {
    DIR* d = ::opendir(dir.c_str());
    if (!d) return;
    std::vector<std::string> ids;
    while (dirent* e = ::readdir(d))
        if (valid_sandbox_id(e->d_name)) ids.emplace_back(e->d_name);
    ::closedir(d);
    for (const std::string& id : ids) {
        nlohmann::json j;
        try {
            j = nlohmann::json::parse(read_file(dir + "/" + id + "/state.json"));
        } catch (const std::exception&) {
            continue;
        }
        fn(id, j);
    }
}

// A sandbox's network as its state file records it (made by an earlier helper, or before
// a policy change). The file is the helper's own (root's, in its runtime dir); what does not
// parse is taken as `none`, whose rules give nothing.
net::Attachment attachment_from_state(const std::string& id, const nlohmann::json& j) {
    net::Attachment a{id, {}, {}, {}, {}, false};
    try {
        a.address = j.value("address", std::string());
        a.linked = !a.address.empty();
        a.host_ports = j.value("host_ports", std::vector<uint16_t>());
        for (const auto& p : j.value("published", nlohmann::json::array()))
            a.published.push_back({p.at("host_ip").get<std::string>(),
                                   p.at("host_port").get<uint16_t>(),
                                   p.at("port").get<uint16_t>()});
        a.peer_group = j.value("peer_group", std::string());
        a.policy.mode = net::parse_mode(j.value("network", std::string("none")));
        a.policy.allow = net::parse_allow_entries(j.value("allow", std::vector<std::string>()));
    } catch (const std::exception& e) {
        std::fprintf(stderr, "berth-helper: the network of sandbox %s: %s (taken as none)\n",
                     id.c_str(), e.what());
        a.policy = {};
    }
    return a;
}

nlohmann::json published_json(const std::vector<net::PublishedPort>& published) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& p : published)
        out.push_back({{"host_ip", p.host_ip}, {"host_port", p.host_port}, {"port", p.port}});
    return out;
}

std::vector<std::string> allow_texts(const net::Policy& policy) {
    std::vector<std::string> out;
    for (const auto& e : policy.allow) out.push_back(e.text());
    return out;
}

// What a request's mode and allowlist say, checked: the entries come from task files.
net::Policy policy_of(int mode, const google::protobuf::RepeatedPtrField<std::string>& allow,
                      bool network_offered) {
    net::Policy policy;
    switch (mode) {
        case v1::NETWORK_MODE_UNSPECIFIED:
        case v1::NETWORK_NONE:
            policy.mode = net::Mode::none;
            break;
        case v1::NETWORK_PUBLIC:
            policy.mode = net::Mode::public_egress;
            break;
        case v1::NETWORK_ALLOWLIST:
            policy.mode = net::Mode::allowlist;
            break;
        default:
            throw HelperError(kInvalidArgument, "unknown network mode " + std::to_string(mode));
    }
    if (policy.mode != net::Mode::allowlist && !allow.empty())
        throw HelperError(kInvalidArgument,
                          std::string("allowlist entries are for the allowlist mode, not ") +
                              net::mode_name(policy.mode));
    try {
        policy.allow = net::parse_allow_entries({allow.begin(), allow.end()});
    } catch (const Error& e) {
        throw HelperError(kInvalidArgument, e.what());
    }
    if (policy.mode != net::Mode::none && !network_offered)
        throw HelperError(kFailedPrecondition, std::string("this berthd offers no network for ") +
                                                   net::mode_name(policy.mode) +
                                                   " sandboxes (see berthd --bridge)");
    return policy;
}

struct SandboxFactory::Live {
    pid_t pid = -1;
    UniqueFd pidfd;
    std::unique_ptr<cgroup::Cgroup> cgroup;
    uint32_t project_id = 0;  // the project quota bounding its writable layer, if any
    std::string layer_mount;  // a tmpfs layer attached here while the overlay is made
    uid_t userns_owner = 0;   // the host uid owning its user namespace (0: root)
    std::string cgroup_name;  // its cgroup under berth's parent: its shell's name
    net::Attachment net;      // its network (an address on berth's bridge, for public)
};

bool valid_sandbox_id(const std::string& id) {
    return id.size() == 32 && std::all_of(id.begin(), id.end(), [](char c) {
               return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
           });
}

SandboxFactory::SandboxFactory(Config config)
    : config_(std::move(config)),
      janitor_({config_.runtime_dir + "/trash", config_.state_dir + "/trash"}),
      driver_(cgroup::detect(config_.cgroup_parent)),
      template_userns_(ns::make_userns_fd(config_.mapping)),
      seccomp_(ns::SeccompProgram::default_profile()) {
    // Listable (the daemon scans it to reattach after a restart) but ours: were it the
    // daemon's, a compromised daemon could swap a sandbox's directory for a symlink under
    // the helper's feet.
    const std::string sandboxes = config_.runtime_dir + "/sandboxes";
    make_dirs(sandboxes, 0755);
    check_sys("chmod", sandboxes, [&] { return ::chmod(sandboxes.c_str(), 0755); });
    // Root's alone at every start (the writable layers hold what sandboxes made, setuid
    // files of their root uid among it); the overlay writes there with the mounter's
    // credentials.
    const std::string state_sandboxes = config_.state_dir + "/sandboxes";
    make_dirs(state_sandboxes, 0700);
    check_sys("chmod", state_sandboxes, [&] { return ::chmod(state_sandboxes.c_str(), 0700); });
    storage_ = std::make_unique<Storage>(state_sandboxes);
    std::fprintf(stderr, "berth-helper: storage limits are enforced by %s\n",
                 storage_->backend() == StorageBackend::project_quota
                     ? "project quotas on the state filesystem"
                     : "a tmpfs layer per sandbox (the state filesystem has no project quota)");
    sweep_cgroups();
    if (config_.network) {
        try {
            network_ = net::make_root_network(*config_.network);
        } catch (const Error& e) {
            // A --bridge or --subnet the admin chose that cannot be used is theirs to fix:
            // refuse to start. The defaults (a subnet some VPN routes), or a host without
            // nftables, still run sandboxes without a network.
            if (e.kind() == Error::Kind::invalid_argument && config_.network_required) throw;
            std::fprintf(stderr, "berth-helper: no public network on this host: %s\n", e.what());
        }
        if (network_) adopt_networks();
    }
    // The owners of the sandboxes an earlier helper made stay theirs. (A half-made sandbox,
    // without a state file, has no user namespace left to own.)
    for_each_state(sandboxes, [&](const std::string&, const nlohmann::json& j) {
        if (uid_t owner = j.value("userns_owner", 0u)) owners_in_use_.insert(owner);
    });
    if (config_.owners.count == 0) {
        std::fprintf(stderr,
                     "berth-helper: sandboxes' user namespaces are owned by root, sharing "
                     "root's per-user kernel counters (inotify...): give berth subordinate "
                     "uids past its 65536 (usermod --add-subuids %u-%u berth)\n",
                     config_.mapping.uids.host_start + config_.mapping.uids.count,
                     config_.mapping.uids.host_start + config_.mapping.uids.count + 1023);
    }
    if (config_.pool_size > 0)
        pool_ = std::make_unique<ShellPool>(config_.pool_size, [this] { return start_shell(); });
    // At every start: an admin's change of the budget takes effect on restart.
    try {
        driver_->limit_parent(config_.budget);
    } catch (const std::exception& e) {
        // EBUSY: the sandboxes that are running use more than the new budget. They go on;
        // the budget stays as it was until they are fewer.
        std::fprintf(stderr, "berth-helper: cannot set the budget of all sandboxes: %s\n",
                     e.what());
    }
}

void SandboxFactory::sweep_cgroups() {
    // What a crash between a create's first steps left, or an older berth's failed create:
    // a cgroup named like a sandbox that has no directory here. Its processes (if any) are
    // killed and it goes. A sandbox from before this start keeps its cgroup (berthd
    // reattaches it); a name that is no sandbox id is not ours to judge and is left. The
    // cgroup parent is this berthd's alone (docs/architecture.md).
    std::vector<std::string> names;
    try {
        names = driver_->list();
    } catch (const std::exception& e) {
        std::fprintf(stderr, "berth-helper: listing the cgroup parent: %s\n", e.what());
        return;
    }
    // The shells' cgroups that sandboxes kept (their state files name them); any other is
    // a pooled shell's of an earlier helper, or a half-made sandbox's.
    std::set<std::string> kept;
    for_each_state(config_.runtime_dir + "/sandboxes",
                   [&](const std::string&, const nlohmann::json& j) {
                       kept.insert(j.value("cgroup_name", std::string()));
                   });
    for (const std::string& name : names) {
        if (valid_shell_name(name)) {
            if (kept.count(name)) continue;
            try {
                if (auto cg = driver_->open(name)) {
                    cg->kill();
                    cg->remove();
                }
            } catch (const std::exception& e) {
                std::fprintf(stderr, "berth-helper: removing the leftover cgroup %s: %s\n",
                             name.c_str(), e.what());
            }
            continue;
        }
        if (!valid_sandbox_id(name)) {
            std::fprintf(stderr,
                         "berth-helper: %s under the cgroup parent is no sandbox's; left alone\n",
                         name.substr(0, 80).c_str());
            continue;
        }
        if (::access(sandbox_runtime_dir(name).c_str(), F_OK) == 0) continue;
        try {
            if (auto cg = driver_->open(name)) {
                cg->kill();
                cg->remove();
            }
            std::fprintf(stderr, "berth-helper: removed the cgroup of no sandbox %s\n",
                         name.c_str());
        } catch (const std::exception& e) {
            std::fprintf(stderr, "berth-helper: removing the leftover cgroup %s: %s\n",
                         name.c_str(), e.what());
        }
    }
}

SandboxFactory::~SandboxFactory() = default;

std::string SandboxFactory::sandbox_runtime_dir(const std::string& id) const {
    return config_.runtime_dir + "/sandboxes/" + id;
}
std::string SandboxFactory::sandbox_state_dir(const std::string& id) const {
    return config_.state_dir + "/sandboxes/" + id;
}

UniqueFd SandboxFactory::open_rootfs(const std::string& rootfs) const {
    UniqueFd dir(::open(rootfs.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    if (!dir) {
        throw HelperError(errno == ENOENT ? kNotFound : kInvalidArgument,
                          "rootfs '" + rootfs + "': " + std::strerror(errno) +
                              (errno == ENOTDIR ? " (not a directory)" : ""));
    }
    // Where it really is, symlinks resolved, from the fd that will be mounted (so nothing
    // can be swapped in between): never berth's own runtime or state dirs, nor anything
    // above them. Otherwise a sandbox could see another sandbox's writable layer, the
    // image store or the daemon's sockets with its root's rights.
    const std::string where = fd_path(dir.get());
    for (const std::string& own : {config_.runtime_dir, config_.state_dir}) {
        char* resolved = ::realpath(own.c_str(), nullptr);
        const std::string guarded = resolved ? resolved : own;
        std::free(resolved);
        const auto within = [](const std::string& inner, const std::string& outer) {
            return outer == "/" || inner == outer ||
                   (inner.size() > outer.size() && inner.compare(0, outer.size(), outer) == 0 &&
                    inner[outer.size()] == '/');
        };
        if (within(where, guarded) || within(guarded, where)) {
            throw HelperError(kPermissionDenied, "rootfs '" + rootfs + "' (" + where +
                                                     ") is or holds berth's own " + guarded);
        }
    }
    return dir;
}

// What a create asks for, checked before anything is made: a request refused here leaves
// nothing behind.
struct SandboxFactory::CreatePlan {
    std::string id, run, state;
    std::vector<std::string> layer_dirs;  // made from image layers, or
    std::string rootfs;                   // from a directory,
    UniqueFd rootfs_dir;                  // opened and checked (open_rootfs)
    uint64_t storage_bytes = 0;
    cgroup::Limits limits;
    net::Policy network;
    std::vector<uint16_t> host_ports;  // sorted, once each
    std::vector<net::PublishedPort> published;
    std::string peer_group;
};

// Where a sandbox's writes go: the overlay's upper and work directories.
struct SandboxFactory::WritableLayer {
    std::string upper, work;
};

SandboxFactory::CreatePlan SandboxFactory::plan_create(const v1::helper::Create& req) const {
    CreatePlan plan;
    plan.id = req.id();
    if (!valid_sandbox_id(plan.id))
        throw HelperError(kInvalidArgument, "invalid sandbox id '" + plan.id + "'");
    if (!valid_hostname(req.hostname()))
        throw HelperError(kInvalidArgument, "invalid hostname '" + req.hostname() + "'");
    plan.network = policy_of(req.network(), req.allow(), network_ != nullptr);
    if (req.host_ports_size() > 64)
        throw HelperError(kInvalidArgument,
                          "at most 64 host ports, not " + std::to_string(req.host_ports_size()));
    std::set<uint16_t> ports;
    for (uint32_t port : req.host_ports()) {
        if (port < 1 || port > 65535)
            throw HelperError(kInvalidArgument,
                              "host port " + std::to_string(port) + ": not a port (1-65535)");
        ports.insert(static_cast<uint16_t>(port));
    }
    plan.host_ports.assign(ports.begin(), ports.end());
    if (req.publish_size() > 64)
        throw HelperError(kInvalidArgument,
                          "at most 64 published ports, not " + std::to_string(req.publish_size()));
    std::set<std::pair<std::string, uint32_t>> published;
    for (const auto& p : req.publish()) {
        const std::string host_ip = p.host_ip().empty() ? "127.0.0.1" : p.host_ip();
        in_addr a{};
        if (host_ip.size() > 15 || ::inet_pton(AF_INET, host_ip.c_str(), &a) != 1)
            throw HelperError(kInvalidArgument, "published host address '" + host_ip.substr(0, 40) +
                                                    "': not an IPv4 address");
        if (a.s_addr == 0)
            throw HelperError(kInvalidArgument,
                              "publishing on 0.0.0.0 (every address) is not offered: name the "
                              "host address to publish on");
        for (uint32_t port : {p.host_port(), p.port()})
            if (port < 1 || port > 65535)
                throw HelperError(kInvalidArgument, "published port " + std::to_string(port) +
                                                        ": not a port (1-65535)");
        if (!published.insert({host_ip, p.host_port()}).second)
            throw HelperError(kInvalidArgument, "host port " + host_ip + ":" +
                                                    std::to_string(p.host_port()) +
                                                    " is published twice");
        plan.published.push_back(
            {host_ip, static_cast<uint16_t>(p.host_port()), static_cast<uint16_t>(p.port())});
    }
    if (!plan.published.empty() && !network_)
        throw HelperError(kFailedPrecondition,
                          "this berthd offers no network, and published ports need one (see "
                          "berthd --bridge)");
    if (!plan.host_ports.empty() && !network_)
        throw HelperError(kFailedPrecondition,
                          "this berthd offers no network, and host ports need one (see berthd "
                          "--bridge)");
    plan.peer_group = req.peer_group();
    if (!plan.peer_group.empty()) {
        const size_t colon = plan.peer_group.find(':');
        const std::string uid = plan.peer_group.substr(0, colon == std::string::npos ? 0 : colon);
        const std::string name =
            colon == std::string::npos ? "" : plan.peer_group.substr(colon + 1);
        const bool ok = !uid.empty() && uid.size() <= 10 &&
                        uid.find_first_not_of("0123456789") == std::string::npos && !name.empty() &&
                        name.size() <= 64 && std::all_of(name.begin(), name.end(), [](char c) {
                            return std::isalnum(static_cast<unsigned char>(c)) || c == '-' ||
                                   c == '_' || c == '.';
                        });
        if (!ok)
            throw HelperError(kInvalidArgument,
                              "invalid peer group '" + plan.peer_group.substr(0, 80) + "'");
        if (!network_)
            throw HelperError(kFailedPrecondition,
                              "this berthd offers no network, and peer groups need one (see "
                              "berthd --bridge)");
    }
    plan.rootfs = req.rootfs();
    if (!plan.rootfs.empty() && req.layers_size() > 0)
        throw HelperError(kInvalidArgument,
                          "a sandbox is made from a rootfs or from layers, not both");
    if (req.layers_size() > 0) {
        for (const auto& layer : req.layers()) {
            if (layer.size() != 64 ||
                layer.find_first_not_of("0123456789abcdef") != std::string::npos)
                throw HelperError(kInvalidArgument, "invalid layer name '" + layer + "'");
            const std::string dir = config_.state_dir + "/images/layers/" + layer;
            struct stat st;
            if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
                throw HelperError(kNotFound, "layer " + layer + " is not in the image store (" +
                                                 dir + ": " + std::strerror(errno) + ")");
            plan.layer_dirs.push_back(dir);
        }
    } else {
        if (plan.rootfs.empty() || plan.rootfs[0] != '/' ||
            plan.rootfs.find("/../") != std::string::npos)
            throw HelperError(kInvalidArgument,
                              "rootfs must be an absolute path: '" + plan.rootfs + "'");
        plan.rootfs_dir = open_rootfs(plan.rootfs);
    }
    plan.storage_bytes = req.limits().storage_bytes();
    if (plan.storage_bytes) storage_->check(plan.storage_bytes);
    if (req.limits().memory_bytes()) plan.limits.memory_bytes = req.limits().memory_bytes();
    if (req.limits().cpus() > 0) plan.limits.cpus = req.limits().cpus();
    if (req.limits().pids()) plan.limits.pids = req.limits().pids();
    plan.run = sandbox_runtime_dir(plan.id);
    plan.state = sandbox_state_dir(plan.id);
    if (live_.count(plan.id) || deleting_.count(plan.id) || ::access(plan.run.c_str(), F_OK) == 0)
        throw HelperError(kAlreadyExists, "sandbox " + plan.id + " already exists");
    return plan;
}

SandboxFactory::WritableLayer SandboxFactory::make_writable_layer(const CreatePlan& plan,
                                                                  Live& live, UndoList& undo) {
    make_dirs(plan.run + "/rootfs", 0755);
    make_dirs(plan.state, 0700);
    undo.push([state = plan.state] { remove_tree(state); });
    WritableLayer layer{plan.state + "/upper", plan.state + "/work"};
    const bool tmpfs_layer = plan.storage_bytes && storage_->backend() == StorageBackend::tmpfs;
    if (tmpfs_layer) {
        // The overlay's upper and work dirs must share a filesystem: both go in the tmpfs.
        // It is attached (in the helper's own mount namespace) only while the overlay is
        // made; the overlay keeps its own reference, so the layer lives exactly as long as
        // the sandbox's mount namespace, and nothing of it is left on the state dir (whose
        // `layer` dir stays an empty directory that the janitor can move and remove).
        const std::string mnt = plan.state + "/layer";
        make_dirs(mnt, 0700);
        UniqueFd fs = storage_->make_tmpfs(plan.storage_bytes);
        check_sys("move_mount", mnt, [&] {
            return ::move_mount(fs.get(), "", AT_FDCWD, mnt.c_str(), MOVE_MOUNT_F_EMPTY_PATH);
        });
        live.layer_mount = mnt;
        undo.push([&live] {
            if (!live.layer_mount.empty()) ::umount2(live.layer_mount.c_str(), MNT_DETACH);
        });
        layer = {mnt + "/upper", mnt + "/work"};
    }
    make_dirs(layer.upper, 0755);
    make_dirs(layer.work, 0700);
    const uid_t root_uid = config_.mapping.uids.host_start;
    const gid_t root_gid = config_.mapping.gids.host_start;
    check_sys("chown", layer.upper,
              [&] { return ::chown(layer.upper.c_str(), root_uid, root_gid); });
    if (plan.storage_bytes && !tmpfs_layer) {
        live.project_id = storage_->limit_project({layer.upper, layer.work}, plan.storage_bytes);
        undo.push([this, &live] { storage_->release_project(live.project_id); });
    }
    return layer;
}

UniqueFd SandboxFactory::make_root_mount(const CreatePlan& plan, const WritableLayer& layer,
                                         Live& live) {
    UniqueFd overlay;
    if (!plan.layer_dirs.empty()) {
        overlay = ns::make_layered_overlay(plan.layer_dirs, layer.upper, layer.work,
                                           plan.run + "/rootfs");
    } else {
        UniqueFd lower =
            ns::make_idmapped_tree(plan.rootfs_dir.get(), plan.rootfs, template_userns_.get());
        overlay = ns::make_overlay(lower.get(), layer.upper, layer.work, plan.run + "/rootfs");
    }
    if (!live.layer_mount.empty()) {
        // Before the clone: the sandbox's mount namespace must not get a copy of it.
        check_sys("umount2", live.layer_mount,
                  [&] { return ::umount2(live.layer_mount.c_str(), MNT_DETACH); });
        live.layer_mount.clear();
    }
    return overlay;
}

std::unique_ptr<Shell> SandboxFactory::start_shell() {
    ShellSpec spec{driver_.get(), &config_.mapping, &seccomp_, take_owner(), &adjust_oom_};
    std::unique_ptr<Shell> shell;
    try {
        shell = Shell::start(spec);
    } catch (...) {
        if (spec.owner) owners_in_use_.erase(*spec.owner);
        throw;
    }
    // The owner is the factory's to give back when the shell goes unassigned.
    if (spec.owner)
        shell->on_discard = [this, owner = *spec.owner] { owners_in_use_.erase(owner); };
    // Its veth too, once public sandboxes are asked for (a host that runs none gets none).
    // Without it (a failure here is logged), attach makes the veth itself.
    if (network_ && prepare_links_) {
        try {
            shell->link = network_->prepare_link(shell->name(), shell->open_netns().get());
        } catch (const std::exception& e) {
            std::fprintf(stderr, "berth-helper: a veth for %s: %s\n", shell->name().c_str(),
                         e.what());
        }
    }
    return shell;
}

std::unique_ptr<Shell> SandboxFactory::take_shell(StepTimer& timer) {
    if (pool_) {
        if (auto shell = pool_->take()) {
            timer.mark("pooled_shell");
            return shell;
        }
    }
    std::unique_ptr<Shell> shell = start_shell();
    timer.mark("shell");
    if (!shell->ready(std::chrono::seconds(60)))
        throw HelperError(kUnavailable, "a new sandbox shell was not ready within 60 s");
    timer.mark("shell_ready");
    return shell;
}

bool SandboxFactory::fill_pool() {
    return pool_ && pool_->fill_one();
}

bool SandboxFactory::pool_full() const {
    return !pool_ || pool_->full();
}

std::string SandboxFactory::describe_pool() const {
    if (!pool_) return "off (berthd --pool 0): every create starts its own sandbox shell";
    return std::to_string(pool_->target()) +
           " sandbox shells kept ready (berthd --pool), refilled while the helper is idle";
}

v1::helper::ShellAssignment SandboxFactory::assignment_for(const CreatePlan& plan,
                                                           const std::string& hostname,
                                                           const Live& live) const {
    const net::NameSettings names =
        network_ ? network_->names(live.net, hostname)
                 : net::NameSettings{
                       .hostname = hostname, .address = {}, .host_address = {}, .nameservers = {}};
    v1::helper::ShellAssignment assignment;
    assignment.set_hostname(hostname);
    assignment.set_mountpoint(plan.run + "/rootfs");
    for (const auto& [path, content] : {std::pair{"/etc/hosts", net::hosts_file(names)},
                                        std::pair{"/etc/hostname", net::hostname_file(names)},
                                        std::pair{"/etc/resolv.conf", net::resolv_conf(names)}}) {
        auto* f = assignment.add_files();
        f->set_path(path);
        f->set_content(content);
    }
    return assignment;
}

v1::helper::Created SandboxFactory::create(const v1::helper::Create& req) {
    CreatePlan plan = plan_create(req);
    const std::string& id = plan.id;
    // Must be new: never adopt (nor, on failure, remove) something already there.
    check_sys("mkdir", plan.run, [&] { return ::mkdir(plan.run.c_str(), 0711); });
    auto live = std::make_unique<Live>();
    // Until the end, any failure undoes what was made (newest first); what an undo step
    // cannot remove is found by the next delete, or the start-up sweep.
    UndoList undo;
    undo.push([run = plan.run] { remove_tree(run); });

    StepTimer timer("create");
    // First: a shell started here must not get a copy of the tmpfs layer attached below.
    std::unique_ptr<Shell> shell = take_shell(timer);
    shell->cgroup().set_limits(plan.limits);
    // Named by the sandbox's id where the hierarchy can rename (v1); on v2 it keeps its
    // shell's name, which the state file records.
    live->cgroup_name = shell->cgroup().rename(id) ? id : shell->name();
    timer.mark("limits");
    if (network_) {
        try {
            live->net = network_->reserve(id, plan.network, plan.host_ports, plan.published);
            live->net.peer_group = plan.peer_group;
        } catch (const HelperError&) {
            throw;
        } catch (const Error& e) {
            // (The one mapping of kinds to codes: a port in use is ALREADY_EXISTS, and so on.)
            throw HelperError(wire::error_code(e.kind()), e.what());
        }
        undo.push([this, &live] { network_->release(live->net); });
    }
    // What the shell is told (computed before the network thread below touches live->net).
    const v1::helper::ShellAssignment assignment = assignment_for(plan, req.hostname(), *live);
    // The host side of its network on a thread of its own while the root is built here
    // (declared after `undo`: joined before any undo step runs). The helper is
    // single-threaded again before this returns: a raw clone3 (a shell) needs that.
    UniqueFd netns;  // (before the future: open until the thread is joined)
    std::future<void> network_made;
    if (!live->net.address.empty()) {
        netns = shell->open_netns();
        std::function<void()> rest;
        try {
            rest = network_->begin_attach(live->net, netns.get(), shell->link);
        } catch (const HelperError&) {
            throw;
        } catch (const Error& e) {
            throw HelperError(wire::error_code(e.kind()), e.what());
        }
        shell->link.clear();
        network_made = std::async(std::launch::async, std::move(rest));
    }
    const WritableLayer layer = make_writable_layer(plan, *live, undo);
    timer.mark("dirs");
    const std::string socket_path = plan.run + "/init.sock";
    UniqueFd control = listen_unix(socket_path, config_.daemon_uid, config_.daemon_gid);
    timer.mark("socket");
    UniqueFd overlay = make_root_mount(plan, layer, *live);
    timer.mark("overlay");
    shell->assign(assignment, overlay.get(), control.get());
    if (network_made.valid()) {
        network_made.get();  // (rethrows what the attach threw)
        timer.mark("network");
    }
    shell->wait_running();
    timer.mark("child_setup");
    // A `none` sandbox has no use for the veth its shell came with.
    if (!shell->link.empty()) {
        deferred_links_.push_back(shell->link);
        shell->link.clear();
    }
    Shell::Parts parts = shell->release();
    live->pid = parts.pid;
    live->pidfd = std::move(parts.pidfd);
    live->cgroup = std::move(parts.cgroup);
    if (parts.owner) live->userns_owner = *parts.owner;
    if (!live->net.address.empty()) prepare_links_ = true;

    const uid_t root_uid = config_.mapping.uids.host_start;
    v1::helper::Created created;
    created.set_init_pid(live->pid);
    created.set_init_start_time(process_start_time(live->pid));
    created.set_init_socket(socket_path);
    for (const auto& p : live->cgroup->paths()) created.add_cgroup_paths(p);
    created.set_host_root_uid(root_uid);
    created.set_address(live->net.address);
    for (const auto& text : allow_texts(live->net.policy)) created.add_allow(text);
    created.set_cgroup_name(live->cgroup_name);

    nlohmann::json state_json = {
        {"id", id},
        {"init_pid", live->pid},
        {"init_start_time", created.init_start_time()},
        {"init_socket", socket_path},
        {"cgroup_paths", live->cgroup->paths()},
        {"cgroup_driver", driver_->version() == cgroup::Version::v2 ? "v2" : "v1"},
        {"cgroup_name", live->cgroup_name},
        {"host_root_uid", root_uid},
        {"rootfs", plan.rootfs},
        {"layers", std::vector<std::string>(req.layers().begin(), req.layers().end())},
        {"hostname", req.hostname()},
        {"storage_bytes", plan.storage_bytes},
        {"project_id", live->project_id},
        {"userns_owner", live->userns_owner},
        {"network", net::mode_name(live->net.policy.mode)},
        {"address", live->net.address},
        {"allow", allow_texts(live->net.policy)},
        {"host_ports", live->net.host_ports},
        {"published", published_json(live->net.published)},
        {"peer_group", live->net.peer_group},
    };
    // Written after the reply is sent (run_deferred): it is only read by a daemon that
    // restarts, and a file write is a good part of a create's time.
    deferred_ = [this, path = plan.run + "/state.json", text = state_json.dump()] {
        write_file_atomic(path, text, 0644);
        for (const std::string& link : deferred_links_) network_->discard_link(link);
        deferred_links_.clear();
    };
    undo.commit();
    live_[id] = std::move(live);
    return created;
}

void SandboxFactory::adopt_networks() {
    if (!network_) return;
    std::set<std::string> live_ids;
    const std::string dir = config_.runtime_dir + "/sandboxes";
    if (DIR* d = ::opendir(dir.c_str())) {
        std::vector<std::string> ids;
        while (dirent* e = ::readdir(d))
            if (valid_sandbox_id(e->d_name)) ids.emplace_back(e->d_name);
        ::closedir(d);
        for (const std::string& id : ids) {
            try {
                auto j = nlohmann::json::parse(read_file(dir + "/" + id + "/state.json"));
                const pid_t pid = j.at("init_pid").get<pid_t>();
                const uint64_t start = j.at("init_start_time").get<uint64_t>();
                if (start == 0 || process_start_time(pid) != start) continue;  // not running
                live_ids.insert(id);
                net::Attachment a = attachment_from_state(id, j);
                network_->adopt(a);
            } catch (const std::exception& e) {
                std::fprintf(stderr, "berth-helper: the network of sandbox %s: %s\n", id.c_str(),
                             e.what());
            }
        }
    }
    if (int n = network_->sweep(live_ids); n > 0)
        std::fprintf(stderr, "berth-helper: removed %d links of sandboxes that are gone\n", n);
}

std::string SandboxFactory::describe_network() {
    return network_ ? network_->describe() : "none: only loopback is offered (berthd --bridge)";
}

void SandboxFactory::run_deferred() {
    auto work = std::move(deferred_);
    deferred_ = nullptr;
    if (work) work();
}

struct SandboxFactory::Deletion {
    std::unique_ptr<Live> live;
    ChildProcess reaper;
    UniqueFd outcome;                // the reaper's report (see reap_sandbox)
    std::vector<uint64_t> requests;  // every delete request waiting on this one
};

namespace {

// How long a delete waits for a killed init: a sandbox thrashing at its memory limit (or
// berth's) has processes in page-in or OOM waits that take seconds each to die. Only this
// delete waits (in its reaper).
constexpr std::chrono::seconds kDeleteWait{120};

// A reaper's report: one byte, 0 (done) or the v1::ErrorCode it failed with, then what
// went wrong.
void report_outcome(int fd, v1::ErrorCode code, const std::string& message) {
    std::string text(1, static_cast<char>(code));
    text += message.substr(0, 4000);
    ssize_t ignored = ::write(fd, text.data(), text.size());
    (void)ignored;
}

}  // namespace

void SandboxFactory::begin_delete(const std::string& id, uint64_t request_id) {
    if (!valid_sandbox_id(id))
        throw HelperError(kInvalidArgument, "invalid sandbox id '" + id + "'");
    if (auto it = deleting_.find(id); it != deleting_.end()) {
        it->second.requests.push_back(request_id);
        return;
    }
    const std::string run = sandbox_runtime_dir(id), state = sandbox_state_dir(id);
    auto it = live_.find(id);
    std::unique_ptr<Live> live;
    if (it != live_.end()) {
        live = std::move(it->second);
        live_.erase(it);
    } else {
        // Made by an earlier helper: find its init from the state file, guarding pid reuse.
        if (::access(run.c_str(), F_OK) != 0 && ::access(state.c_str(), F_OK) != 0)
            throw HelperError(kNotFound, "no sandbox " + id);
        live = std::make_unique<Live>();
        try {
            auto j = nlohmann::json::parse(read_file(run + "/state.json"));
            pid_t pid = j.at("init_pid").get<pid_t>();
            uint64_t start = j.at("init_start_time").get<uint64_t>();
            live->project_id = j.value("project_id", 0u);
            live->userns_owner = j.value("userns_owner", 0u);
            live->cgroup_name = j.value("cgroup_name", id);
            if (!valid_shell_name(live->cgroup_name)) live->cgroup_name = id;  // (v1: the id)
            live->net = attachment_from_state(id, j);
            int fd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
            if (fd >= 0) {
                UniqueFd pidfd(fd);
                if (start != 0 && process_start_time(pid) == start) {
                    live->pid = pid;
                    live->pidfd = std::move(pidfd);
                }
            }
        } catch (const std::exception&) {
            // No usable state: nothing to kill, clean up what is on disk.
        }
        live->cgroup = driver_->open(live->cgroup_name.empty() ? id : live->cgroup_name);
    }
    Deletion deletion;
    try {
        Pipe outcome = make_pipe("delete of " + id);
        const int report = outcome.write.get();
        const int pidfd = live->pidfd ? live->pidfd.get() : -1;
        cgroup::Cgroup* cg = live->cgroup.get();
        deletion.reaper = ChildProcess::fork("berth-helper: delete of " + id, {report, pidfd}, [&] {
            ::prctl(PR_SET_NAME, "berth-reaper");
            try {
                StepTimer timer("delete");
                // Every process at once first, init with them: a sandbox at its memory
                // limit (or berth's) frees it only as its processes die, and init, which
                // waits for the rest of its pid namespace, would otherwise wait for them to
                // die one by one.
                if (cg) cg->kill();
                if (pidfd >= 0) kill_and_wait(pidfd, id, kDeleteWait);
                timer.mark("kill");
                if (cg) {
                    cg->kill();
                    cg->remove();
                }
                timer.mark("cgroup");
                report_outcome(report, v1::ERROR_CODE_UNSPECIFIED, "");
                return 0;
            } catch (const HelperError& e) {
                report_outcome(report, e.code, e.what());
            } catch (const std::exception& e) {
                report_outcome(report, kInternal, e.what());
            }
            return 1;
        });
        deletion.outcome = std::move(outcome.read);
    } catch (...) {
        live_[id] = std::move(live);  // as it was: a later delete tries again
        throw;
    }
    deletion.live = std::move(live);
    deletion.requests.push_back(request_id);
    deleting_.emplace(id, std::move(deletion));
}

void SandboxFactory::abandon_deletions() {
    for (auto& [id, d] : deleting_) d.reaper.release();
}

std::vector<int> SandboxFactory::deletion_fds() const {
    std::vector<int> fds;
    for (const auto& [id, d] : deleting_) fds.push_back(d.reaper.pidfd());
    return fds;
}

std::vector<v1::helper::Reply> SandboxFactory::finish_deletions() {
    std::vector<v1::helper::Reply> replies;
    for (auto it = deleting_.begin(); it != deleting_.end();) {
        if (!it->second.reaper.wait(std::chrono::milliseconds(0))) {
            ++it;
            continue;
        }
        auto done = finish_delete(it->first, it->second);
        replies.insert(replies.end(), done.begin(), done.end());
        it = deleting_.erase(it);
    }
    return replies;
}

std::vector<v1::helper::Reply> SandboxFactory::finish_delete(const std::string& id,
                                                             Deletion& deletion) {
    std::string outcome;
    char buf[4096];
    for (;;) {
        ssize_t n = ::read(deletion.outcome.get(), buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        outcome.append(buf, static_cast<size_t>(n));
    }
    v1::ErrorCode code = kInternal;
    std::string error = "the reaper of sandbox " + id + " died before it was done";
    if (!outcome.empty()) {
        const auto value = static_cast<unsigned char>(outcome[0]);
        code = v1::ErrorCode_IsValid(value) ? static_cast<v1::ErrorCode>(value) : kInternal;
        error = outcome.substr(1);
    }
    Live& live = *deletion.live;
    if (code == v1::ERROR_CODE_UNSPECIFIED) {
        error.clear();
        // Its init is gone, and its network namespace with it (the veth too, at most a
        // moment later: release deletes a host end that is still there).
        if (network_) network_->release(live.net);
        if (live.project_id) {
            // Its limit goes now; what it holds is counted under its id until the janitor
            // has removed it, so the id is not handed out again before
            // (Storage::limit_project).
            try {
                storage_->release_project(live.project_id);
            } catch (const std::exception& e) {
                std::fprintf(stderr, "berth-helper: deleting %s: %s\n", id.c_str(), e.what());
            }
        }
        // Out of sight now (a restarting daemon finds no trace to reattach), off the disk
        // soon.
        try {
            janitor_.discard(sandbox_runtime_dir(id), kRunTrash, id);
            janitor_.discard(sandbox_state_dir(id), kStateTrash, id);
            if (live.userns_owner) owners_in_use_.erase(live.userns_owner);
        } catch (const HelperError& e) {
            code = e.code;
            error = e.what();
        } catch (const std::exception& e) {
            code = kInternal;
            error = e.what();
        }
    }
    if (!error.empty()) {
        // As it was (what the reaper did is done again harmlessly): deleting it again
        // tries again.
        live_[id] = std::move(deletion.live);
    }
    std::vector<v1::helper::Reply> replies;
    for (uint64_t request : deletion.requests) {
        v1::helper::Reply reply;
        reply.set_id(request);
        if (error.empty()) {
            reply.mutable_deleted();
        } else {
            reply.set_error(error);
            reply.set_error_code(code);
        }
        replies.push_back(std::move(reply));
    }
    return replies;
}

std::optional<uid_t> SandboxFactory::take_owner() {
    if (config_.owners.count == 0) return std::nullopt;
    for (uint32_t i = 0; i < config_.owners.count; ++i) {
        const uid_t uid = config_.owners.host_start + i;
        if (owners_in_use_.insert(uid).second) return uid;
    }
    throw HelperError(kUnavailable, "all " + std::to_string(config_.owners.count) +
                                        " user namespace owner uids are in use (one per "
                                        "sandbox; add subordinate uids to berth's range)");
}

}  // namespace berth::helper

namespace berth::helper {

UniqueFd SandboxFactory::find_init(const std::string& id, pid_t* pid) {
    if (auto it = live_.find(id); it != live_.end()) {
        *pid = it->second->pid;
        int fd = ::fcntl(it->second->pidfd.get(), F_DUPFD_CLOEXEC, 0);
        return UniqueFd(fd);
    }
    const std::string run = sandbox_runtime_dir(id);
    try {
        auto j = nlohmann::json::parse(read_file(run + "/state.json"));
        *pid = j.at("init_pid").get<pid_t>();
        uint64_t start = j.at("init_start_time").get<uint64_t>();
        UniqueFd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, *pid, 0)));
        if (pidfd && start != 0 && process_start_time(*pid) == start) return pidfd;
    } catch (const std::exception&) {
    }
    return UniqueFd();
}

v1::helper::NetworkSet SandboxFactory::set_network(const v1::helper::SetNetwork& req) {
    const std::string& id = req.id();
    if (!valid_sandbox_id(id))
        throw HelperError(kInvalidArgument, "invalid sandbox id '" + id + "'");
    const net::Policy policy = policy_of(req.network(), req.allow(), network_ != nullptr);
    if (deleting_.count(id)) throw HelperError(kNotFound, "sandbox " + id + " is being deleted");
    pid_t pid = -1;
    UniqueFd pidfd = find_init(id, &pid);
    if (!pidfd) throw HelperError(kNotFound, "sandbox " + id + " is not running");
    const std::string state_path = sandbox_runtime_dir(id) + "/state.json";
    nlohmann::json state;
    try {
        state = nlohmann::json::parse(read_file(state_path));
    } catch (const std::exception& e) {
        throw HelperError(kInternal, "the state of sandbox " + id + ": " + e.what());
    }
    // This helper's record, or (a sandbox of an earlier helper) its state file's.
    net::Attachment from_state;
    net::Attachment* net = nullptr;
    if (auto it = live_.find(id); it != live_.end()) {
        net = &it->second->net;
    } else {
        from_state = attachment_from_state(id, state);
        net = &from_state;
    }
    if (network_) {
        // Its network namespace, through its init (the pidfd check after the open guards
        // against a recycled pid: the namespace opened is then the right one's).
        const std::string path = "/proc/" + std::to_string(pid) + "/ns/net";
        UniqueFd netns(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
        if (!netns || ::syscall(SYS_pidfd_send_signal, pidfd.get(), 0, nullptr, 0) != 0)
            throw HelperError(kNotFound, "sandbox " + id + " is not running");
        try {
            network_->set_policy(*net, policy, netns.get());
        } catch (const HelperError&) {
            throw;
        } catch (const Error& e) {
            throw HelperError(wire::error_code(e.kind()),
                              "setting the network of sandbox " + id + ": " + e.what());
        }
    }
    // Recorded for the next helper, which puts these rules back when it starts.
    state["network"] = net::mode_name(net->policy.mode);
    state["address"] = net->address;
    state["allow"] = allow_texts(net->policy);
    write_file_atomic(state_path, state.dump(), 0644);
    v1::helper::NetworkSet out;
    out.set_address(net->address);
    for (const auto& text : allow_texts(net->policy)) out.add_allow(text);
    return out;
}

v1::helper::StorageUsage SandboxFactory::storage_usage(const std::string& id) {
    if (!valid_sandbox_id(id))
        throw HelperError(kInvalidArgument, "invalid sandbox id '" + id + "'");
    if (deleting_.count(id)) throw HelperError(kNotFound, "sandbox " + id + " is being deleted");
    pid_t pid = -1;
    UniqueFd pidfd = find_init(id, &pid);
    if (!pidfd) throw HelperError(kNotFound, "sandbox " + id + " is not running");
    // Its root as its init sees it: the overlay, whose statfs is its upper dir's.
    const std::string root = "/proc/" + std::to_string(pid) + "/root";
    UniqueFd fd(::open(root.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    // Still the same process (the pidfd names it; a recycled pid would be another one).
    if (!fd || ::syscall(SYS_pidfd_send_signal, pidfd.get(), 0, nullptr, 0) != 0)
        throw HelperError(kNotFound, "sandbox " + id + " is not running");
    StorageCount count = storage_count(fd.get(), "root of sandbox " + id);
    v1::helper::StorageUsage usage;
    usage.set_used_bytes(count.used_bytes);
    usage.set_limit_bytes(count.total_bytes);
    return usage;
}

}  // namespace berth::helper
