// berthd: the unprivileged front end. Started as root, it starts berth-helper, then drops
// to the service user for good before it reads a single client byte.
#include <fcntl.h>
#include <grp.h>
#include <malloc.h>
#include <pwd.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <boost/asio.hpp>
#include <filesystem>
#include <iostream>

#include "base/error.h"
#include "base/files.h"
#include "base/size.h"
#include "cgroup/cgroup.h"
#include "helper.pb.h"
#include "images.pb.h"
#include "runtime/daemon/host_budget.h"
#include "runtime/daemon/image_client.h"
#include "runtime/daemon/server.h"
#include "runtime/wire/frame.h"

using namespace berth;

namespace {

std::string env_or(const char* name, const std::string& fallback) {
    const char* v = std::getenv(name);
    return v && *v ? v : fallback;
}

std::string sibling_binary(const std::string& name) {
    std::error_code ec;
    auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
    return (self.parent_path() / name).string();
}

pid_t start_helper(const std::string& path, int channel, const std::vector<std::string>& args) {
    pid_t pid = check_sys("fork", "berth-helper", [] { return ::fork(); });
    if (pid == 0) {
        int flags = ::fcntl(channel, F_GETFD);
        ::fcntl(channel, F_SETFD, flags & ~FD_CLOEXEC);
        std::vector<char*> argv;
        argv.push_back(const_cast<char*>(path.c_str()));
        for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
        argv.push_back(nullptr);
        ::execv(path.c_str(), argv.data());
        std::cerr << "berthd: exec " << path << ": " << std::strerror(errno) << std::endl;
        ::_exit(127);
    }
    return pid;
}

// berth-images: root like the helper (it keeps the image store and starts the unpack
// workers' user namespaces), with a channel of its own; it exits when that channel closes (when we
// die: a death signal could not reach it once we are unprivileged).
UniqueFd start_images(const std::string& path, const std::string& state_dir,
                      const std::string& runtime_dir, const std::string& user,
                      const std::string& registries_conf, const std::string& auth_file,
                      const std::string& max_image_size, const std::string& max_image_entries) {
    int pair[2];
    check_sys("socketpair", "images channel",
              [&] { return ::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair); });
    UniqueFd ours(pair[0]), theirs(pair[1]);
    start_helper(
        path, theirs.get(),
        {"--channel-fd", std::to_string(theirs.get()), "--parent-pid", std::to_string(::getpid()),
         "--state-dir", state_dir, "--runtime-dir", runtime_dir, "--service-user", user,
         "--registries-conf", registries_conf, "--auth-file", auth_file, "--max-image-size",
         max_image_size, "--max-image-entries", max_image_entries});
    return ours;
}

// Its first word: Ready once its store is open, or why it cannot start.
void wait_images_ready(int channel) {
    v1::images::Reply hello;
    if (wire::read_frame(channel, hello, wire::kDefaultMaxFrame) != wire::ReadStatus::ok)
        throw std::runtime_error("berth-images exited before it was ready");
    if (hello.has_error()) throw std::runtime_error(hello.error().message());
    if (!hello.has_ready()) throw std::runtime_error("berth-images sent no Ready message");
}

// The soft RLIMIT_NOFILE up to the hard one (what systemd advises a daemon that needs
// many fds to do itself; children keep the usual soft limit, select() users among them).
// Returns the limit now in force.
size_t raise_nofile_limit() {
    rlimit lim{};
    if (::getrlimit(RLIMIT_NOFILE, &lim) != 0) return 1024;
    if (lim.rlim_cur < lim.rlim_max) {
        rlimit raised{lim.rlim_max, lim.rlim_max};
        if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) lim = raised;
    }
    return lim.rlim_cur == RLIM_INFINITY ? size_t{1} << 20 : static_cast<size_t>(lim.rlim_cur);
}

void drop_privileges(uid_t uid, gid_t gid) {
    check_sys("setgroups", "[berth]", [&] { return ::setgroups(1, &gid); });
    check_sys("setresgid", std::to_string(gid), [&] { return ::setresgid(gid, gid, gid); });
    check_sys("setresuid", std::to_string(uid), [&] { return ::setresuid(uid, uid, uid); });
    if (uid != 0 && ::setuid(0) == 0)
        throw std::runtime_error("could regain root after dropping it");
    ::prctl(PR_SET_NO_NEW_PRIVS, 1);
}

}  // namespace

int main(int argc, char** argv) {
    // A long-lived daemon that idles most of the time: frames and copy buffers of a busy
    // spell must go back to the kernel when it ends. A fixed mmap threshold turns off
    // glibc's dynamic one (which, after the first large free, would serve large blocks
    // from the heap and keep them: 6 -> 10 MiB RSS after one big copy), and the heap top
    // is trimmed past 256 KiB free.
    ::mallopt(M_MMAP_THRESHOLD, 128 * 1024);
    ::mallopt(M_TRIM_THRESHOLD, 256 * 1024);
    CLI::App app{"berthd: the berth daemon"};
    std::string runtime_dir = env_or("BERTH_RUNTIME_DIR", "/run/berth");
    std::string state_dir = env_or("BERTH_STATE_DIR", "/var/lib/berth");
    std::string socket_path;
    std::string user = "berth", group = "berth";
    std::string helper_path = sibling_binary("berth-helper");
    std::string images_path = sibling_binary("berth-images");
    std::string cgroup_parent = "berth";
    std::string registries_conf = "/etc/berth/registries.conf";
    std::string auth_file = "/etc/berth/auth.json";
    double lease_seconds = 60;
    uint32_t max_frame = wire::kDefaultMaxFrame;
    std::string default_storage = "none";
    // What one image may unpack to (its layers together), checked while unpacking.
    uint64_t max_image_size = uint64_t{32} << 30, max_image_entries = 4u << 20;
    app.add_option("--runtime-dir", runtime_dir,
                   "sockets and sandbox state (env BERTH_RUNTIME_DIR)");
    app.add_option("--state-dir", state_dir, "writable layers (env BERTH_STATE_DIR)");
    app.add_option("--socket", socket_path,
                   "client socket (env BERTH_SOCKET; default RUNTIME_DIR/berth.sock)");
    app.add_option("--user", user, "the unprivileged user berthd runs as");
    app.add_option("--group", group, "the group whose members may use berth");
    app.add_option("--helper", helper_path, "path of berth-helper");
    app.add_option("--images", images_path, "path of berth-images (the image store's process)");
    app.add_option("--cgroup-parent", cgroup_parent, "cgroup directory that holds sandboxes");
    app.add_option("--registries-conf", registries_conf,
                   "registry mirrors and rewrites (TOML, like containers' registries.conf)");
    app.add_option("--auth-file", auth_file,
                   "the system's registry credentials (docker's config.json format)");
    app.add_option("--lease", lease_seconds,
                   "seconds a non-persistent sandbox outlives its client's connection");
    app.add_option("--max-frame", max_frame, "largest accepted frame in bytes");
    app.add_option("--default-storage", default_storage,
                   "the storage limit of a sandbox whose create gives none, e.g. 10g "
                   "(none or 0: no limit)");
    app.add_option("--max-image-size", max_image_size,
                   "bytes of files an image may unpack to, its layers together (sparse files "
                   "at their apparent size; suffixes K M G T, of 1024; default 32G)")
        ->transform(CLI::AsSizeValue(false));
    app.add_option("--max-image-entries", max_image_entries,
                   "files, directories and links an image may unpack to (default 4194304)");
    std::string total_memory = "auto", total_pids = "auto", default_memory = "auto",
                default_pids = "auto";
    app.add_option("--total-memory", total_memory,
                   "memory all sandboxes together may use (berth's parent cgroup): a size, "
                   "auto (MemTotal less max(1G, 20%)) or none");
    app.add_option("--total-pids", total_pids,
                   "tasks all sandboxes together may run: a number, auto (half of "
                   "min(pid_max, threads-max)) or none");
    app.add_option("--default-memory", default_memory,
                   "the memory limit of a sandbox whose create gives none: a size, auto (an "
                   "eighth of --total-memory, at least 512M) or none");
    app.add_option("--default-pids", default_pids,
                   "the pids limit of a sandbox whose create gives none: a number or auto (a "
                   "sixteenth of --total-pids, 256 to 4096)");
    size_t max_connections = 0, max_connections_per_user = 0;
    double frame_timeout_seconds = 30;
    app.add_option("--max-connections", max_connections,
                   "client connections open at once (default: from RLIMIT_NOFILE, at most "
                   "1024)");
    app.add_option("--max-connections-per-user", max_connections_per_user,
                   "client connections one uid other than root may hold (default: half of "
                   "--max-connections)");
    app.add_option("--frame-timeout", frame_timeout_seconds,
                   "seconds a client has to finish a request frame it began");
    std::string bridge = "berth0", subnet = "10.89.0.0/16";
    std::vector<std::string> dns;
    auto* bridge_option =
        app.add_option("--bridge", bridge,
                       "the bridge (and nftables table inet NAME) of public sandboxes, made at the "
                       "first one; 'none': offer no network but loopback")
            ->capture_default_str();
    auto* subnet_option =
        app.add_option("--subnet", subnet,
                       "the IPv4 subnet of public sandboxes (the bridge takes its first address). "
                       "A given --bridge or --subnet that cannot be used (a subnet overlapping a "
                       "host route) stops berthd; the defaults then only go without a public "
                       "network")
            ->capture_default_str();
    app.add_option("--dns", dns,
                   "DNS servers public sandboxes use (repeatable; default: the host's "
                   "resolv.conf servers that are not loopback stubs)");
    size_t pool = 4;
    app.add_option("--pool", pool,
                   "sandbox shells the helper keeps ready (namespaces made, cgroup joined, veth "
                   "made), so that a create only assigns one; each holds a few hundred KiB. 0: "
                   "every create starts its own")
        ->capture_default_str()
        ->check(CLI::Range(0, 256));
    CLI11_PARSE(app, argc, argv);
    uint64_t default_storage_bytes = 0;
    if (default_storage != "none") {
        std::string error;
        auto bytes = berth::parse_size(default_storage, &error);
        if (!bytes || (*bytes != 0 && *bytes < daemon::kMinStorageBytes)) {
            std::cerr << "berthd: --default-storage: "
                      << (bytes ? "must be at least 1 MiB (or none)" : error) << std::endl;
            return 2;
        }
        default_storage_bytes = *bytes;
    }
    if (socket_path.empty()) socket_path = env_or("BERTH_SOCKET", runtime_dir + "/berth.sock");
    daemon::HostBudget budget;
    try {
        const daemon::HostBudget derived = daemon::derive_budget(daemon::read_host_facts());
        std::string error;
        auto option = [&](const char* name, const std::string& text, bool size, uint64_t from_host,
                          uint64_t* out) {
            if (!daemon::parse_budget_option(text, size, from_host, out, &error))
                throw std::runtime_error(std::string(name) + ": " + error);
        };
        option("--total-memory", total_memory, true, derived.total_memory, &budget.total_memory);
        option("--total-pids", total_pids, false, derived.total_pids, &budget.total_pids);
        // The defaults follow the budget chosen, not the host's.
        daemon::HostBudget defaults = budget;
        daemon::derive_defaults(&defaults);
        uint64_t auto_memory = defaults.default_memory, auto_pids = defaults.default_pids;
        option("--default-memory", default_memory, true, auto_memory, &budget.default_memory);
        option("--default-pids", default_pids, false, auto_pids, &budget.default_pids);
        if (budget.default_pids == 0)
            throw std::runtime_error("--default-pids: a sandbox must have a pids limit");
        if (budget.default_memory && budget.default_memory < (uint64_t{4} << 20))
            throw std::runtime_error("--default-memory: must be at least 4 MiB (or none)");
        if (budget.total_memory && budget.default_memory > budget.total_memory)
            throw std::runtime_error("--default-memory: more than --total-memory");
        if (budget.total_pids && budget.default_pids > budget.total_pids)
            throw std::runtime_error("--default-pids: more than --total-pids");
    } catch (const std::exception& e) {
        std::cerr << "berthd: " << e.what() << std::endl;
        return 2;
    }

    try {
        if (::geteuid() != 0) {
            throw std::runtime_error(
                "berthd must be started as root: it starts the privileged berth-helper and then "
                "drops to user '" +
                user + "' (rootless mode is not available yet)");
        }
        struct passwd* pw = ::getpwnam(user.c_str());
        if (!pw)
            throw std::runtime_error("user '" + user +
                                     "' does not exist (scripts/install-deps creates it)");
        struct group* gr = ::getgrnam(group.c_str());
        if (!gr) throw std::runtime_error("group '" + group + "' does not exist");
        const uid_t uid = pw->pw_uid;
        const gid_t gid = gr->gr_gid;

        // Owned by the daemon; searchable (not listable) by all, because each sandbox's
        // root (an unprivileged host uid) attaches its overlay on a directory in here.
        // The client socket's own mode (0660, group berth) is what guards berthd.
        make_dirs(runtime_dir, 0711);
        check_sys("chown", runtime_dir, [&] { return ::chown(runtime_dir.c_str(), uid, gid); });
        check_sys("chmod", runtime_dir, [&] { return ::chmod(runtime_dir.c_str(), 0711); });
        // Root's alone, enforced at every start (an older berth, or an admin, may have left
        // it looser): under it are the image layers (setuid files owned by the sandboxes'
        // root uid) and the sandboxes' writable layers. Only root walks it: the helper and
        // berth-images, and the overlays the helper mounts (whose lower and upper lookups
        // use the mounter's credentials).
        make_dirs(state_dir, 0700);
        check_sys("chmod", state_dir, [&] { return ::chmod(state_dir.c_str(), 0700); });

        int pair[2];
        check_sys("socketpair", "helper channel",
                  [&] { return ::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair); });
        UniqueFd ours(pair[0]), theirs(pair[1]);
        std::vector<std::string> helper_args{"--channel-fd",    std::to_string(theirs.get()),
                                             "--runtime-dir",   runtime_dir,
                                             "--state-dir",     state_dir,
                                             "--service-user",  user,
                                             "--daemon-uid",    std::to_string(uid),
                                             "--daemon-gid",    std::to_string(gid),
                                             "--cgroup-parent", cgroup_parent,
                                             "--total-memory",  std::to_string(budget.total_memory),
                                             "--total-pids",    std::to_string(budget.total_pids),
                                             "--pool",          std::to_string(pool)};
        if (bridge != "none") {
            helper_args.insert(helper_args.end(), {"--bridge", bridge, "--subnet", subnet});
            // Chosen by the admin (not the defaults): unusable, they stop berthd.
            if (subnet_option->count() > 0 || bridge_option->count() > 0)
                helper_args.push_back("--network-required");
            for (const auto& server : dns) helper_args.insert(helper_args.end(), {"--dns", server});
        }
        start_helper(helper_path, theirs.get(), helper_args);
        theirs.reset();
        UniqueFd images_channel =
            start_images(images_path, state_dir, runtime_dir, user, registries_conf, auth_file,
                         std::to_string(max_image_size), std::to_string(max_image_entries));

        drop_privileges(uid, gid);
        const size_t nofile = raise_nofile_limit();
        // Each connection may hold an fd, up to 16 passed fds and execs' pipes: a quarter
        // of the fds are left for sandboxes, the helper and images.
        if (max_connections == 0) max_connections = std::clamp<size_t>(nofile / 24, 8, 1024);
        if (max_connections_per_user == 0)
            max_connections_per_user = std::max<size_t>(1, max_connections / 2);

        // The helper's first word: which cgroup driver it chose, or why it cannot start.
        v1::helper::Reply hello;
        if (wire::read_frame(ours.get(), hello, wire::kDefaultMaxFrame) != wire::ReadStatus::ok)
            throw std::runtime_error("berth-helper exited before it was ready");
        if (!hello.error().empty()) throw std::runtime_error(hello.error());
        if (!hello.has_ready()) throw std::runtime_error("berth-helper sent no Ready message");
        const std::string driver_name = hello.ready().cgroup_driver();
        wait_images_ready(images_channel.get());

        boost::asio::io_context io;
        auto channel = std::make_shared<daemon::FramedSocket>(
            daemon::UnixSocket(io, boost::asio::local::stream_protocol(), ours.release()),
            wire::kDefaultMaxFrame);
        daemon::ServerConfig config;
        config.socket_path = socket_path;
        config.runtime_dir = runtime_dir;
        config.max_frame = max_frame;
        config.lease = std::chrono::milliseconds(static_cast<int64_t>(lease_seconds * 1000));
        config.daemon_uid = uid;
        config.allowed_gid = gid;
        config.allowed_group_name = group;
        config.cgroup_driver = driver_name;
        config.network = hello.ready().network();
        config.pool = hello.ready().pool();
        config.default_storage_bytes = default_storage_bytes;
        config.budget = budget;
        config.max_connections = max_connections;
        config.max_connections_per_user = max_connections_per_user;
        config.frame_timeout =
            std::chrono::milliseconds(static_cast<int64_t>(frame_timeout_seconds * 1000));
        auto driver = driver_name == "v2" ? cgroup::make_v2_driver(cgroup_parent)
                                          : cgroup::make_v1_driver(cgroup_parent);
        daemon::Server server(io, config, channel, std::move(driver));
        server.set_images(
            std::make_shared<daemon::ImageClient>(std::make_shared<daemon::FramedSocket>(
                daemon::UnixSocket(io, boost::asio::local::stream_protocol(),
                                   images_channel.release()),
                wire::kDefaultMaxFrame)));
        server.start();

        boost::asio::signal_set signals(io, SIGINT, SIGTERM);
        signals.async_wait([&](boost::system::error_code, int sig) {
            std::cerr << "berthd: signal " << sig << ", stopping (sandboxes keep running)"
                      << std::endl;
            server.stop();
        });
        ::signal(SIGPIPE, SIG_IGN);
        // berth-helper and berth-images are our only children: should one die, the kernel
        // reaps it (no zombie for the life of the service); we learn of it from its
        // channel's EOF. (Set only now: a disposition of SIG_IGN would pass through their
        // exec, and they wait for children of their own.)
        ::signal(SIGCHLD, SIG_IGN);
        io.run();
        return server.exit_code();
    } catch (const std::exception& e) {
        std::cerr << "berthd: " << e.what() << std::endl;
        return 1;
    }
}
