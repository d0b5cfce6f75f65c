// berth-helper: the privileged part of berth. Started by berthd (as root) before it drops
// its privileges; serves typed requests on one socketpair (deletes beside the rest), and
// does only what those requests name. It never sees client bytes.
#include <grp.h>
#include <poll.h>
#include <pwd.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/prctl.h>

#include <CLI/CLI.hpp>
#include <cstring>
#include <iostream>

#include "base/error.h"
#include "base/files.h"
#include "helper.pb.h"
#include "net/dns_service.h"
#include "net/host_network.h"
#include "ns/idmap.h"
#include "ns/security.h"
#include "runtime/helper/sandbox_factory.h"
#include "runtime/wire/frame.h"

using namespace berth;

namespace {

// What berth-helper needs in the host's user namespace, and why (tests/integration/
// test_privileges.py holds the same list):
const std::vector<std::string>& helper_capabilities() {
    static const std::vector<std::string> caps = {
        "SYS_ADMIN",  // mounts (overlay, open_tree, id-mapped), namespaces
        "SETUID",
        "SETGID",           // the sandboxes' uid_map and gid_map (a range, not our own id)
        "CHOWN",            // the control socket and runtime files to the daemon user
        "FOWNER",           // chmod and utimes on what the daemon user or a sandbox owns
        "DAC_OVERRIDE",     // writing and removing in directories a sandbox's root owns
        "DAC_READ_SEARCH",  // walking them (the janitor empties writable layers)
        "KILL",             // signalling sandbox inits (another uid)
        "SYS_PTRACE",       // /proc/INIT/root of a non-dumpable init (storage usage)
        // overlayfs works on a sandbox's writable layer with the credentials of whoever made
        // the overlay (us): what the sandbox's own capabilities allow on its files must be
        // ours too, or the kernel quietly does less (a setgid bit dropped on chmod).
        "FSETID", "MKNOD", "SETFCAP",
        "NET_ADMIN",         // public sandboxes: the bridge, veths, addresses, routes, nftables
        "NET_BIND_SERVICE",  // the DNS child: port 53 on the gateway; published ports < 1024
    };
    return caps;
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"berth-helper: privileged sandbox construction for berthd"};
    int channel = -1;
    helper::Config config;
    std::string service_user = "berth";
    app.add_option("--channel-fd", channel, "the socketpair end shared with berthd")->required();
    app.add_option("--runtime-dir", config.runtime_dir)->required();
    app.add_option("--state-dir", config.state_dir)->required();
    app.add_option("--service-user", service_user, "whose /etc/subuid range sandboxes use");
    app.add_option("--daemon-uid", config.daemon_uid)->required();
    app.add_option("--daemon-gid", config.daemon_gid)->required();
    app.add_option("--cgroup-parent", config.cgroup_parent);
    uint64_t total_memory = 0, total_pids = 0;
    app.add_option("--total-memory", total_memory,
                   "bytes all sandboxes together may use (0: no budget)");
    app.add_option("--total-pids", total_pids, "tasks all sandboxes together may run (0: none)");
    net::RootNetworkConfig network;
    std::vector<std::string> dns;
    app.add_option("--bridge", network.bridge,
                   "the bridge (and nftables table) of public sandboxes; empty: none offered");
    app.add_option("--subnet", network.subnet, "their IPv4 subnet")->default_val("10.89.0.0/16");
    app.add_option("--dns", dns, "DNS servers for public sandboxes (default: the host's)");
    app.add_flag("--network-required", config.network_required,
                 "an unusable --bridge or --subnet stops the helper (the admin chose them) "
                 "rather than leaving public sandboxes unoffered");
    app.add_option("--pool", config.pool_size, "sandbox shells kept ready for creates (0: none)")
        ->capture_default_str();
    CLI11_PARSE(app, argc, argv);
    if (!network.bridge.empty()) {
        // The servers berth's DNS asks for the sandboxes: from the host's own network
        // namespace, so a loopback stub (systemd-resolved's 127.0.0.53) serves too.
        network.nameservers = dns;
        if (dns.empty()) {
            try {
                network.nameservers =
                    net::resolv_conf_nameservers(read_file("/etc/resolv.conf"), false);
            } catch (const std::exception&) {
            }
            if (network.nameservers.empty())
                std::cerr << "berth-helper: /etc/resolv.conf names no IPv4 DNS server: "
                             "sandboxes' lookups will fail (berthd --dns)"
                          << std::endl;
        }
        network.start_dns = [upstreams = network.nameservers](const net::TableConfig& table,
                                                              const std::string& gateway) {
            net::DnsServiceConfig dns_config;
            dns_config.table = table;
            dns_config.forwarder.listen_address = gateway;
            dns_config.forwarder.port = 53;
            dns_config.forwarder.free_bind = true;
            for (const auto& server : upstreams)
                dns_config.forwarder.upstreams.push_back({server, 53});
            return net::start_dns_child(dns_config);
        };
        config.network = network;
    }
    if (total_memory) config.budget.memory_bytes = total_memory;
    if (total_pids) config.budget.pids = total_pids;

    ::prctl(PR_SET_NAME, "berth-helper");
    // argv strings are contiguous; their span is what a sandbox's init may overwrite.
    helper::set_process_title_area(
        argv[0], static_cast<size_t>(argv[argc - 1] + std::strlen(argv[argc - 1]) - argv[0]));
    // Sandbox inits are reaped by the kernel; we follow them by pidfd.
    ::signal(SIGCHLD, SIG_IGN);
    ::signal(SIGPIPE, SIG_IGN);

    std::unique_ptr<helper::SandboxFactory> factory;
    try {
        // A mount namespace of our own keeps the host's table clean of anything we mount.
        check_sys("unshare", "CLONE_NEWNS", [] { return ::unshare(CLONE_NEWNS); });
        check_sys("mount", "/ rslave",
                  [] { return ::mount(nullptr, "/", nullptr, MS_REC | MS_SLAVE, nullptr); });
        ns::raise_nofile_limit();
        // From here on, the smallest set that makes a sandbox, in every set including the
        // bounding set (berth-init's own capabilities are unaffected: a new user namespace
        // starts with a full set of its own), no_new_privs, and a filter of calls no part of
        // berth-helper makes. Before the janitor is forked, so it is confined too.
        ns::confine_process(helper_capabilities(), ns::SeccompProgram::service_profile());
        struct passwd* pw = ::getpwnam(service_user.c_str());
        uid_t service_uid = pw ? pw->pw_uid : config.daemon_uid;
        config.mapping = ns::mapping_for_user(service_user, service_uid);
        if (auto owners = ns::owner_range_for_user(service_user, service_uid, config.mapping))
            config.owners = *owners;
        factory = std::make_unique<helper::SandboxFactory>(config);
    } catch (const std::exception& e) {
        std::cerr << "berth-helper: cannot start: " << e.what() << std::endl;
        v1::helper::Reply fatal;
        fatal.set_error(std::string("berth-helper cannot start: ") + e.what());
        fatal.set_error_code(v1::UNAVAILABLE);
        try {
            wire::write_frame(channel, fatal);
        } catch (...) {
        }
        return 1;
    }
    {
        v1::helper::Reply hello;
        hello.mutable_ready()->set_cgroup_driver(
            factory->cgroup_version() == cgroup::Version::v2 ? "v2" : "v1");
        hello.mutable_ready()->set_network(factory->describe_network());
        hello.mutable_ready()->set_pool(factory->describe_pool());
        wire::write_frame(channel, hello);
    }

    // Requests are served in turn, except deletes, which run beside them (begin_delete):
    // their replies go out as their reapers finish, matched by id.
    auto send = [&](const v1::helper::Reply& reply) {
        try {
            wire::write_frame(channel, reply);
            return true;
        } catch (const std::exception& e) {
            std::cerr << "berth-helper: " << e.what() << std::endl;
            return false;
        }
    };
    for (;;) {
        std::vector<pollfd> fds{{channel, POLLIN, 0}};
        for (int fd : factory->deletion_fds()) fds.push_back({fd, POLLIN, 0});
        // The shell pool is refilled once no request has come for a moment (kIdleMs): a
        // refill takes the helper a few milliseconds that a create arriving in a burst
        // should not wait for.
        constexpr int kIdleMs = 5;
        const int n = ::poll(fds.data(), fds.size(), factory->pool_full() ? -1 : kIdleMs);
        if (n < 0) {
            if (errno == EINTR) continue;
            std::cerr << "berth-helper: poll: " << std::strerror(errno) << std::endl;
            return 1;
        }
        if (n == 0) {
            factory->fill_pool();
            continue;
        }
        for (const auto& reply : factory->finish_deletions())
            if (!send(reply)) return 1;
        if (fds[0].revents == 0) continue;

        v1::helper::Request request;
        wire::ReadStatus status;
        try {
            status = wire::read_frame(channel, request, wire::kDefaultMaxFrame);
        } catch (const std::exception& e) {
            std::cerr << "berth-helper: " << e.what() << std::endl;
            return 1;
        }
        if (status == wire::ReadStatus::eof) {
            // berthd is gone: leave the sandboxes running for the next daemon to reattach.
            // Deletes begun go on in their reapers, which finish the killing and the cgroup
            // removal by themselves; what is left on disk (the sandbox's directories) the
            // next daemon finds dead and deletes. Exiting at once lets the next one start.
            factory->abandon_deletions();
            return 0;
        }
        v1::helper::Reply reply;
        reply.set_id(request.id());
        bool replied_later = false;
        try {
            if (status != wire::ReadStatus::ok) {
                throw helper::HelperError(v1::INVALID_ARGUMENT, "malformed helper request");
            } else if (request.has_create()) {
                *reply.mutable_created() = factory->create(request.create());
            } else if (request.has_delete_()) {
                factory->begin_delete(request.delete_().id(), request.id());
                replied_later = true;
            } else if (request.has_get_storage()) {
                *reply.mutable_storage() = factory->storage_usage(request.get_storage().id());
            } else if (request.has_set_network()) {
                *reply.mutable_network_set() = factory->set_network(request.set_network());
            } else {
                throw helper::HelperError(v1::INVALID_ARGUMENT, "unknown helper request");
            }
        } catch (const helper::HelperError& e) {
            reply.set_error(e.what());
            reply.set_error_code(e.code);
            replied_later = false;
        } catch (const std::exception& e) {
            reply.set_error(e.what());
            reply.set_error_code(v1::INTERNAL);
            replied_later = false;
        }
        if (!replied_later && !send(reply)) return 1;
        try {
            factory->run_deferred();
        } catch (const std::exception& e) {
            std::cerr << "berth-helper: after request " << request.id() << ": " << e.what()
                      << std::endl;
        }
    }
}
