// berth: the command-line client, docker-like.
#include <google/protobuf/util/json_util.h>
#include <signal.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <optional>

#include "base/files.h"
#include "base/size.h"
#include "cgroup/cgroup.h"
#include "ns/idmap.h"
#include "runtime/cli/copy.h"
#include "runtime/cli/images.h"
#include "runtime/client/client.h"

using namespace berth;
using client::Client;
using client::ClientError;

namespace {

constexpr int kExitError = 125;    // berth itself failed (as docker)
constexpr int kExitTimeout = 124;  // as timeout(1)
// berth rm: deletes sent at once (each becomes a reaper process in berth-helper).
constexpr size_t kDeletesInFlight = 32;

uint64_t parse_size(const std::string& text) {
    size_t pos = 0;
    double value = std::stod(text, &pos);
    std::string unit = text.substr(pos);
    double mult = 1;
    if (unit == "k" || unit == "K" || unit == "KiB" || unit == "kb")
        mult = 1024.0;
    else if (unit == "m" || unit == "M" || unit == "MiB" || unit == "mb")
        mult = 1024.0 * 1024;
    else if (unit == "g" || unit == "G" || unit == "GiB" || unit == "gb")
        mult = 1024.0 * 1024 * 1024;
    else if (!unit.empty() && unit != "b" && unit != "B")
        throw std::invalid_argument("bad size unit '" + unit + "'");
    if (value < 0) throw std::invalid_argument("negative size");
    return static_cast<uint64_t>(value * mult);
}

v1::NetworkMode network_mode(const std::string& name) {
    if (name == "none") return v1::NETWORK_NONE;
    if (name == "public") return v1::NETWORK_PUBLIC;
    if (name == "allowlist") return v1::NETWORK_ALLOWLIST;
    throw std::invalid_argument("--network '" + name + "': give none, public or allowlist");
}

// "[HOSTIP:]HOSTPORT:PORT[/tcp]", as docker's -p (TCP only).
v1::PublishedPort published_port(std::string spec) {
    const std::string given = spec;
    if (spec.size() > 4 && spec.substr(spec.size() - 4) == "/tcp") spec.resize(spec.size() - 4);
    auto bad = [&](const std::string& why) {
        return std::invalid_argument("-p '" + given + "': " + why);
    };
    std::vector<std::string> parts;
    size_t start = 0;
    for (size_t colon; (colon = spec.find(':', start)) != std::string::npos; start = colon + 1)
        parts.push_back(spec.substr(start, colon - start));
    parts.push_back(spec.substr(start));
    if (parts.size() < 2 || parts.size() > 3) throw bad("give [HOSTIP:]HOSTPORT:PORT");
    auto port = [&](const std::string& text) -> uint32_t {
        if (text.empty() || text.size() > 5 ||
            text.find_first_not_of("0123456789") != std::string::npos)
            throw bad("'" + text + "' is not a port");
        return static_cast<uint32_t>(std::stoul(text));
    };
    v1::PublishedPort p;
    if (parts.size() == 3) p.set_host_ip(parts[0]);
    p.set_host_port(port(parts[parts.size() - 2]));
    p.set_port(port(parts.back()));
    return p;
}

struct CreateOptions {
    std::string image, rootfs, name, hostname, memory, workdir, storage, network = "none";
    std::vector<std::string> allow;
    std::vector<uint32_t> host_ports;
    std::vector<std::string> publish;
    std::string peer_group;
    double cpus = 0;
    uint64_t pids = 0;
    bool storage_given = false;
    std::optional<uint32_t> owner;
    void add_to(CLI::App* cmd) {
        cmd->add_option("--rootfs", rootfs,
                        "a root filesystem directory instead of an image (the overlay's lower "
                        "layer; for tests and tools)");
        cmd->add_option("--name", name, "a unique name");
        cmd->add_option("--hostname", hostname,
                        "hostname inside (default: the id's first 12 chars)");
        cmd->add_option("-m,--memory", memory, "memory limit, e.g. 512m, 2g (swap off)");
        cmd->add_option("--cpus", cpus, "cpu limit, fractional allowed");
        cmd->add_option("--pids", pids, "process limit (default: berthd's --default-pids)");
        // A callback, not a plain option: `--storage ""` must be refused, not read as unset.
        cmd->add_option_function<std::string>(
            "--storage",
            [this](const std::string& v) {
                storage = v;
                storage_given = true;
            },
            "bound on what the sandbox writes to its filesystem, e.g. 512m, 10g "
            "(default: the daemon's --default-storage)");
        cmd->add_option("--network", network,
                        "none (loopback only, the default), public (egress through NAT) or "
                        "allowlist (only the --allow entries)")
            ->capture_default_str();
        cmd->add_option("--allow", allow,
                        "with --network allowlist: HOST, *.DOMAIN or IPv4[/LEN], each with an "
                        "optional :PORT or :FROM-TO (repeatable)")
            ->allow_extra_args(false);
        cmd->add_option("--host-port", host_ports,
                        "a TCP port of the host's 127.0.0.1 the sandbox reaches at "
                        "host.berth.internal, in every network mode (repeatable)")
            ->allow_extra_args(false);
        cmd->add_option("-p,--publish", publish,
                        "[HOSTIP:]HOSTPORT:PORT: the host's HOSTIP:HOSTPORT (default 127.0.0.1) "
                        "goes to the sandbox's TCP PORT (repeatable)")
            ->allow_extra_args(false);  // one value each: `-p 80:80 IMAGE` keeps IMAGE
        cmd->add_option("--peer-group", peer_group,
                        "public sandboxes of yours in the same group reach each other (default: "
                        "every sandbox is isolated from every other)");
        cmd->add_option("--owner", owner,
                        "root only: the host uid the sandbox belongs to (default: yours)");
        cmd->add_option("--sandbox-workdir", workdir,
                        "where relative exec cwds and copy paths start (default: the image's "
                        "WorkingDir, else /)");
    }
    void check() const {
        if (image.empty() == rootfs.empty())
            throw std::invalid_argument(image.empty() ? "give an IMAGE (or --rootfs DIR)"
                                                      : "give an IMAGE or --rootfs DIR, not both");
    }
    v1::CreateSandbox request(bool persistent) const {
        check();
        v1::CreateSandbox c;
        if (!image.empty()) {
            c.set_image(image);
        } else {
            char resolved[PATH_MAX];
            c.set_rootfs(::realpath(rootfs.c_str(), resolved) ? resolved : rootfs);
        }
        c.set_name(name);
        c.set_hostname(hostname);
        c.set_network(network_mode(network));
        for (const auto& entry : allow) c.add_allow(entry);
        for (uint32_t port : host_ports) c.add_host_ports(port);
        for (const auto& spec : publish) *c.add_publish() = published_port(spec);
        c.set_peer_group(peer_group);
        c.set_persistent(persistent);
        c.set_workdir(workdir);
        if (owner) c.set_owner_uid(*owner);
        if (!memory.empty()) c.mutable_resources()->set_memory_bytes(parse_size(memory));
        c.mutable_resources()->set_cpus(cpus);
        c.mutable_resources()->set_pids(pids);
        if (storage_given) {
            std::string error;
            auto bytes = berth::parse_size(storage, &error);
            if (!bytes) throw std::invalid_argument("storage: " + error);
            c.mutable_resources()->set_storage_bytes(*bytes);
        }
        return c;
    }
};

// What `berth run` runs, as docker does: the image's Entrypoint followed by the command
// given, or by the image's Cmd when none is. `--entrypoint` replaces the image's (and
// an empty one drops it, the Cmd then runs alone).
std::vector<std::string> run_argv(const v1::SandboxInfo& sandbox,
                                  const std::vector<std::string>& command,
                                  const std::optional<std::string>& entrypoint) {
    std::vector<std::string> argv;
    if (entrypoint) {
        if (!entrypoint->empty()) argv.push_back(*entrypoint);
    } else {
        argv.assign(sandbox.image_config().entrypoint().begin(),
                    sandbox.image_config().entrypoint().end());
    }
    if (!command.empty()) {
        argv.insert(argv.end(), command.begin(), command.end());
    } else if (!entrypoint) {
        argv.insert(argv.end(), sandbox.image_config().cmd().begin(),
                    sandbox.image_config().cmd().end());
    }
    if (argv.empty()) {
        throw std::invalid_argument(sandbox.image().empty()
                                        ? "give a command to run"
                                        : "image " + sandbox.image() +
                                              " has no Entrypoint or Cmd: give a command to run");
    }
    return argv;
}

struct ExecOptions {
    std::string user, workdir;
    std::vector<std::string> env;
    double timeout = 0;
    bool interactive = false;
    std::vector<std::string> command;
    void add_to(CLI::App* cmd) {
        cmd->add_option("-u,--user", user, "user[:group], by name or id (default root)");
        cmd->add_option("-w,--workdir", workdir, "working directory inside");
        // One value per -e: CLI11 would otherwise swallow the command after `--` too.
        cmd->add_option("-e,--env", env, "K=V environment variable (repeatable)")
            ->allow_extra_args(false);
        cmd->add_option("--timeout", timeout,
                        "seconds; then the whole process tree is killed (exit 124)");
        cmd->add_flag("-i,--interactive", interactive, "pass stdin to the command");
    }
    v1::Exec request(const std::string& sandbox) const {
        v1::Exec e;
        e.set_sandbox(sandbox);
        for (const auto& a : command) e.add_argv(a);
        for (const auto& kv : env) e.add_env(kv);
        e.set_cwd(workdir);
        e.set_user(user);
        e.set_timeout_ms(static_cast<uint64_t>(timeout * 1000));
        return e;
    }
};

int run_exec(Client& c, const v1::Exec& request, bool interactive) {
    Client::ExecCallbacks cb;
    cb.output = [](v1::ExecOutput::Stream stream, std::string_view data) {
        FILE* f = stream == v1::ExecOutput::STDERR ? stderr : stdout;
        std::fwrite(data.data(), 1, data.size(), f);
        std::fflush(f);
    };
    v1::ExecExit exit = c.exec(request, cb, interactive ? STDIN_FILENO : -1);
    if (exit.timed_out()) {
        std::cerr << "berth: timed out; the command's process tree was killed" << std::endl;
        return kExitTimeout;
    }
    if (exit.oom_killed())
        std::cerr << "berth: killed by the OOM killer (memory limit)" << std::endl;
    if (exit.storage_full())
        std::cerr << "berth: the sandbox's storage is full (its --storage limit, or the host's "
                     "disk)"
                  << std::endl;
    if (exit.signal()) return 128 + exit.signal();
    return exit.exit_code();
}

v1::ClientMessage message_delete(const std::string& sandbox) {
    v1::ClientMessage m;
    m.mutable_delete_()->set_sandbox(sandbox);
    return m;
}

int doctor(const std::string& socket) {
    utsname u{};
    ::uname(&u);
    std::cout << "kernel:          " << u.release << "\n";
    try {
        auto host = cgroup::probe_host();
        std::cout << "cgroup driver:   " << (host.version == cgroup::Version::v2 ? "v2" : "v1")
                  << "\n";
        std::cout << "  why:           " << host.reason << "\n";
        std::cout << "  cgroup2 mount: "
                  << (host.unified_mount.empty() ? "(none)" : host.unified_mount) << "\n";
        std::cout << "  v2 controllers:";
        for (auto& c : host.v2_controllers) std::cout << ' ' << c;
        std::cout << "\n  v1 controllers:";
        for (auto& c : host.v1_controllers) std::cout << ' ' << c;
        std::cout << "\n  cgroup.kill:   " << (host.cgroup_kill ? "yes" : "no") << "\n";
    } catch (const std::exception& e) {
        std::cout << "cgroup driver:   unusable: " << e.what() << "\n";
    }
    try {
        std::cout << "user namespaces: max " << read_file("/proc/sys/user/max_user_namespaces");
    } catch (const std::exception& e) {
        std::cout << "user namespaces: unknown (" << e.what() << ")\n";
    }
    try {
        auto m = ns::mapping_for_user("berth", static_cast<uid_t>(-1));
        std::cout << "id mapping:      root inside = uid " << m.uids.host_start << " outside ("
                  << m.uids.count << " ids from /etc/subuid)\n";
    } catch (const std::exception& e) {
        std::cout << "id mapping:      " << e.what() << "\n";
    }
    int major = 0, minor = 0;
    std::sscanf(u.release, "%d.%d", &major, &minor);
    auto at_least = [&](int a, int b) { return major > a || (major == a && minor >= b); };
    std::cout << "idmapped mounts: " << (at_least(5, 12) ? "yes" : "no (kernel < 5.12)") << "\n";
    std::cout << "clone3 into cgroup: " << (at_least(5, 7) ? "yes" : "no") << "\n";
    std::cout << "openat2:         " << (at_least(5, 6) ? "yes" : "no") << "\n";
    try {
        Client c(socket);
        std::cout << "daemon:          berthd " << c.hello().server_version() << " at " << socket
                  << " (cgroup " << c.hello().cgroup_driver() << ")\n";
        std::cout << "network:         " << c.hello().network() << "\n";
        std::cout << "shell pool:      " << c.hello().pool() << "\n";
    } catch (const ClientError& e) {
        std::cout << "daemon:          " << e.what() << "\n";
        return 1;
    }
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"berth: fast, isolated sandboxes for agent evaluation trials"};
    app.require_subcommand(1);
    std::string socket = client::default_socket_path();
    app.add_option("-H,--socket", socket, "berthd's socket (env BERTH_SOCKET)");

    CreateOptions create_opts;
    auto* create = app.add_subcommand("create", "create a sandbox from an image; prints its id");
    create_opts.add_to(create);
    create->add_option("image", create_opts.image, "image reference (see berth images)");

    ExecOptions exec_opts;
    std::string exec_target;
    auto* exec = app.add_subcommand("exec", "run a command in a sandbox");
    exec_opts.add_to(exec);
    exec->add_option("sandbox", exec_target, "id, id prefix or name")->required();
    exec->add_option("command", exec_opts.command, "command and arguments (after --)")->required();

    CreateOptions run_create;
    ExecOptions run_exec_opts;
    bool run_rm = false;
    std::optional<std::string> run_entrypoint;
    auto* run = app.add_subcommand(
        "run",
        "create a sandbox from an image and run a command in it (default: the image's "
        "Entrypoint and Cmd)");
    run_create.add_to(run);
    run_exec_opts.add_to(run);
    run->add_flag("--rm", run_rm, "delete the sandbox when the command ends");
    run->add_option("--entrypoint", run_entrypoint,
                    "replaces the image's Entrypoint (\"\" drops it)");
    run->add_option("image", run_create.image, "image reference (omit with --rootfs)");
    run->add_option("command", run_exec_opts.command, "command and arguments (after --)");

    bool ps_json = false, ps_quiet = false;
    auto* ps = app.add_subcommand("ps", "list sandboxes");
    ps->add_flag("--json", ps_json, "JSON output");
    ps->add_flag("-q,--quiet", ps_quiet, "ids only");

    std::string network_target, network_mode_name;
    std::vector<std::string> network_allow;
    auto* network = app.add_subcommand("network", "a running sandbox's network");
    auto* network_set = network->add_subcommand(
        "set",
        "change a running sandbox's network mode: in force for new connections at once; "
        "none also cuts established ones");
    network_set->add_option("sandbox", network_target, "id, id prefix or name")->required();
    network_set->add_option("mode", network_mode_name, "none, public or allowlist")->required();
    network_set->add_option("--allow", network_allow, "allowlist entries, as for create")
        ->allow_extra_args(false);
    network->require_subcommand(1);

    std::string inspect_target;
    auto* inspect = app.add_subcommand("inspect", "show a sandbox and its resource usage (JSON)");
    inspect->add_option("sandbox", inspect_target)->required();

    std::vector<std::string> rm_targets;
    bool rm_force = false;
    auto* rm = app.add_subcommand("rm", "delete sandboxes (their processes are killed)");
    rm->add_option("sandbox", rm_targets)->required();
    rm->add_flag("-f,--force", rm_force, "no error for sandboxes that do not exist");

    cli::CopyArgs cp_args;
    auto* cp = app.add_subcommand(
        "cp",
        "copy files between the host and a sandbox (SANDBOX:PATH on one side; - for a tar "
        "stream on stdin/stdout)");
    cp->add_flag("-a,--archive", cp_args.archive,
                 "keep uid/gid numbers (downloads: only when run as root)");
    cp->add_option("-u,--user", cp_args.user, "owner of uploaded files (default root)");
    cp->add_option("source", cp_args.source, "host path, SANDBOX:PATH or -")->required();
    cp->add_option("destination", cp_args.destination, "host path, SANDBOX:PATH or -")->required();

    auto* fs = app.add_subcommand("fs", "file operations inside a sandbox");
    fs->require_subcommand(1);
    std::string fs_target, fs_user, fs_mode;
    bool fs_json = false, fs_follow = false, fs_recursive = false;
    auto* fs_stat = fs->add_subcommand("stat", "show a path (exit 1 if missing)");
    fs_stat->add_option("target", fs_target, "SANDBOX:PATH")->required();
    fs_stat->add_flag("--json", fs_json, "JSON output");
    fs_stat->add_flag("-L,--follow", fs_follow, "follow a symlink (inside the sandbox)");
    auto* fs_mkdir = fs->add_subcommand("mkdir", "create a directory and its parents");
    fs_mkdir->add_option("target", fs_target, "SANDBOX:PATH")->required();
    fs_mkdir->add_option("-u,--user", fs_user, "owner (default root)");
    fs_mkdir->add_option("-m,--mode", fs_mode, "octal mode (default 755)");
    auto* fs_rm = fs->add_subcommand("rm", "remove a file, symlink or (with -r) a directory");
    fs_rm->add_option("target", fs_target, "SANDBOX:PATH")->required();
    fs_rm->add_flag("-r,--recursive", fs_recursive, "directories and their contents");

    auto* doctor_cmd =
        app.add_subcommand("doctor", "show what this host supports and what berth uses");
    auto* version = app.add_subcommand("version", "print versions");
    cli::ImageCommands image_commands(app);

    CLI11_PARSE(app, argc, argv);
    ::signal(SIGPIPE, SIG_IGN);

    try {
        if (doctor_cmd->parsed()) return doctor(socket);
        if (version->parsed()) {
            std::cout << "berth client " << BERTH_VERSION << "\n";
            try {
                Client c(socket);
                std::cout << "berthd " << c.hello().server_version() << " (protocol "
                          << c.hello().protocol_version() << ")\n";
            } catch (const ClientError& e) {
                std::cout << "berthd: " << e.what() << "\n";
            }
            return 0;
        }
        Client c(socket);
        if (image_commands.parsed()) return image_commands.run(c);
        if (create->parsed()) {
            // With --rootfs, what CLI11 took for the image is not one.
            if (!create_opts.rootfs.empty() && !create_opts.image.empty())
                throw std::invalid_argument("give an IMAGE or --rootfs DIR, not both");
            v1::ClientMessage m;
            *m.mutable_create() = create_opts.request(true);
            std::cout << c.call(m).create().sandbox().id() << std::endl;
            return 0;
        }
        if (cp->parsed()) return cli::run_copy(c, cp_args);
        if (fs_stat->parsed()) return cli::run_fs_stat(c, fs_target, fs_follow, fs_json);
        if (fs_mkdir->parsed()) return cli::run_fs_mkdir(c, fs_target, fs_user, fs_mode);
        if (fs_rm->parsed()) return cli::run_fs_rm(c, fs_target, fs_recursive);
        if (exec->parsed())
            return run_exec(c, exec_opts.request(exec_target), exec_opts.interactive);
        if (run->parsed()) {
            // `berth run --rootfs DIR -- cmd args`: the first word was taken for an image.
            if (!run_create.rootfs.empty() && !run_create.image.empty()) {
                run_exec_opts.command.insert(run_exec_opts.command.begin(), run_create.image);
                run_create.image.clear();
            }
            v1::ClientMessage m;
            // With --rm the sandbox lives on this connection's lease: if we die, it goes too.
            *m.mutable_create() = run_create.request(!run_rm);
            const v1::SandboxInfo sandbox = c.call(m).create().sandbox();
            const std::string id = sandbox.id();
            int code;
            try {
                v1::Exec request = run_exec_opts.request(id);
                request.clear_argv();
                for (auto& a : run_argv(sandbox, run_exec_opts.command, run_entrypoint))
                    request.add_argv(a);
                code = run_exec(c, request, run_exec_opts.interactive);
            } catch (const std::exception&) {
                // The command could not start: --rm still means gone.
                if (run_rm) {
                    try {
                        c.call(message_delete(id));
                    } catch (const ClientError&) {
                    }
                }
                throw;
            }
            if (run_rm)
                c.call(message_delete(id));
            else
                std::cerr << id << std::endl;
            return code;
        }
        if (ps->parsed()) {
            v1::ClientMessage m;
            m.mutable_list();
            auto list = c.call(m).list();
            if (ps_json) {
                std::cout << cli::to_json(list) << std::endl;
            } else if (ps_quiet) {
                for (const auto& s : list.sandboxes()) std::cout << s.id() << "\n";
            } else {
                // (Root sees everybody's sandboxes, others their own: the owner column
                // is what tells them apart.)
                std::printf("%-14s %-20s %-8s %-8s %-8s %s\n", "ID", "NAME", "OWNER", "PID",
                            "STATE", "IMAGE/ROOTFS");
                for (const auto& s : list.sandboxes()) {
                    std::printf("%-14s %-20s %-8u %-8d %-8s %s\n", s.id().substr(0, 12).c_str(),
                                s.name().c_str(), s.owner_uid(), s.init_pid(), s.state().c_str(),
                                (s.image().empty() ? s.rootfs() : s.image()).c_str());
                }
            }
            return 0;
        }
        if (network_set->parsed()) {
            v1::ClientMessage m;
            auto* set = m.mutable_set_network();
            set->set_sandbox(network_target);
            set->set_network(network_mode(network_mode_name));
            for (const auto& entry : network_allow) set->add_allow(entry);
            c.call(m);
            return 0;
        }
        if (inspect->parsed()) {
            v1::ClientMessage m;
            m.mutable_inspect()->set_sandbox(inspect_target);
            std::cout << cli::to_json(c.call(m).inspect()) << std::endl;
            return 0;
        }
        if (rm->parsed()) {
            // Side by side, as docker rm does: each delete waits for its sandbox's
            // processes to die, and deletes of sandboxes under load one after another
            // would add those waits up. Each id is printed as its delete completes.
            std::vector<v1::ClientMessage> deletes;
            for (const auto& target : rm_targets) deletes.push_back(message_delete(target));
            int code = 0;
            c.call_each(std::move(deletes), kDeletesInFlight,
                        [&](size_t i, const v1::ServerMessage*, const ClientError* e) {
                            if (!e) {
                                std::cout << rm_targets[i] << std::endl;
                            } else if (!(rm_force && e->code == v1::NOT_FOUND)) {
                                std::cerr << "berth: " << e->what() << std::endl;
                                code = 1;
                            }
                        });
            return code;
        }
    } catch (const std::exception& e) {  // ClientError and the CLI's own alike
        std::cerr << "berth: " << e.what() << std::endl;
        return kExitError;
    }
    return 0;
}
