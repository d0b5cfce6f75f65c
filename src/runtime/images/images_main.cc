// berth-images: the image store's privileged keeper. Started by berthd (as root) before it
// drops its privileges, like berth-helper, and confined at once to the capability set below
// (no_new_privs, the service seccomp filter). Layers are unpacked by a worker in a user
// namespace (unpack_worker.h), which is this binary again with --unpack-worker. It serves
// berthd's typed requests on one socketpair, several at once, and never sees a client byte:
// what a client gives it (an archive, a directory, a place to export to) arrives as an fd the
// client opened.
// It dies with berthd: at EOF on the channel it exits at once, cutting short what runs (the
// store is made to be cut anywhere; the next open sweeps what is left).
#include <fcntl.h>
#include <pwd.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <memory>

#include "base/error.h"
#include "base/files.h"
#include "images.pb.h"
#include "ns/idmap.h"
#include "ns/security.h"
#include "rootfs-tools/image_store.h"
#include "runtime/images/fetcher.h"
#include "runtime/images/pulling.h"
#include "runtime/images/service.h"
#include "runtime/images/unpack_worker.h"
#include "runtime/wire/frame.h"

using namespace berth;

namespace {

// What the root part of berth-images needs in the host's user namespace (tests/integration/
// test_privileges.py holds the same list). Layers are unpacked by a worker in a user
// namespace (unpack_worker.h); what is left is the store's own files, the worker's id maps,
// and the debootstrap bootstrap, which runs as root under this bounding set and needs what
// debootstrap and dpkg need (chroot, device nodes, owners, file capabilities, mounting
// /proc in a namespace of its own).
const std::vector<std::string>& images_capabilities() {
    static const std::vector<std::string> caps = {
        "SETUID", "SETGID",  // the unpack worker's id maps; debootstrap's maintainer scripts
        "CHOWN", "FOWNER", "FSETID", "DAC_OVERRIDE", "DAC_READ_SEARCH",  // the store's
        // trees (layers are owned by the sandboxes' ids), and debootstrap's
        "KILL",       // stopping debootstrap's tree, ending an unpack worker
        "SYS_ADMIN",  // debootstrap's and the fetcher's pid and mount namespaces, their /proc
        "SETPCAP",    // emptying the fetcher's bounding set
        "SYS_CHROOT", "MKNOD", "SETFCAP",  // debootstrap and dpkg
    };
    return caps;
}

}  // namespace

int main(int argc, char** argv) {
    // A layer's unpack worker (unpack_worker.h): berth-images itself, exec'd in a user
    // namespace by isolated_unpacker.
    if (argc == 2 && std::strcmp(argv[1], "--unpack-worker") == 0)
        return images_service::unpack_worker_main();
    // A pull's registry fetcher (fetcher.h): berth-images itself, exec'd as berthd's user in
    // namespaces of its own by fetcher_sessions.
    if (argc == 2 && std::strcmp(argv[1], "--fetch-worker") == 0)
        return images_service::fetcher_main(/*network=*/true);
    // The store's parse worker (the same, without network).
    if (argc == 2 && std::strcmp(argv[1], "--parse-worker") == 0)
        return images_service::fetcher_main(/*network=*/false);
    CLI::App app{"berth-images: the image store for berthd"};
    int channel = -1;
    pid_t parent = 0;
    std::string state_dir, runtime_dir, service_user = "berth";
    std::string registries_conf = "/etc/berth/registries.conf";
    std::string auth_file = "/etc/berth/auth.json";
    app.add_option("--channel-fd", channel, "the socketpair end shared with berthd")->required();
    app.add_option("--parent-pid", parent, "berthd's pid (we die with it)")->required();
    app.add_option("--state-dir", state_dir, "the store is STATE_DIR/images")->required();
    app.add_option("--runtime-dir", runtime_dir, "berthd's sockets (hidden from the fetcher)");
    app.add_option("--service-user", service_user,
                   "whose /etc/subuid range sandboxes use; the registry fetcher runs as it");
    app.add_option("--registries-conf", registries_conf, "registry mirrors and rewrites");
    app.add_option("--auth-file", auth_file, "registry credentials of the system");
    images::ImageLimits limits;
    app.add_option("--max-image-size", limits.max_bytes,
                   "bytes of files an image's layers may unpack to, together");
    app.add_option("--max-image-entries", limits.max_entries,
                   "entries an image's layers may unpack to, together");
    CLI11_PARSE(app, argc, argv);

    ::prctl(PR_SET_NAME, "berth-images");
    // When berthd dies before it has dropped its privileges, so do we. Afterwards the
    // kernel drops the signal (an unprivileged parent may not signal a root child): the
    // channel's EOF is what ends us then. (Checked after the prctl: if berthd went before
    // it, our parent is not berthd any more.)
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) return 1;
    ::signal(SIGPIPE, SIG_IGN);
    // The channel came to us without close-on-exec; nothing we start (debootstrap) may
    // inherit a line to berthd.
    ::fcntl(channel, F_SETFD, FD_CLOEXEC);
    // Layers are written as root with the owners they say; the store's own files get
    // exactly the modes asked for.
    ::umask(022);

    std::unique_ptr<images::ImageStore> store;
    images_service::Pulling pulling;
    try {
        struct passwd* pw = ::getpwnam(service_user.c_str());
        if (!pw) throw std::runtime_error("user '" + service_user + "' does not exist");
        // The helper's mapping: a layer's uid U is the sandbox's U, the host's start + U.
        const ns::IdMapping mapping = ns::mapping_for_user(service_user, pw->pw_uid);
        // 0700 at every start, not only when made (see ImageStore: it does the same for
        // its own directories).
        make_dirs(state_dir, 0700);
        check_sys("chmod", state_dir, [&] { return ::chmod(state_dir.c_str(), 0700); });
        store = std::make_unique<images::ImageStore>(state_dir + "/images", mapping.uids.host_start,
                                                     mapping.gids.host_start);
        const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
        store->set_unpacker(images_service::isolated_unpacker(self, mapping));
        store->set_archive_extractor(images_service::isolated_archive_extractor(self, mapping));
        store->set_limits(limits);
        images_service::FetcherSpec fetcher;
        fetcher.binary = self;
        fetcher.uid = pw->pw_uid;
        fetcher.gid = pw->pw_gid;
        fetcher.hidden_dirs = {state_dir};
        fetcher.root_staging = state_dir;
        if (!runtime_dir.empty()) fetcher.hidden_dirs.push_back(runtime_dir);
        fetcher.registries_conf = registries_conf;
        fetcher.auth_file = auth_file;
        store->set_parser(images_service::remote_parser(fetcher));
        pulling = images_service::make_pulling(*store, std::move(fetcher));
        // Before any thread starts (capabilities and filters are per thread; threads made
        // later inherit them).
        ns::confine_process(images_capabilities(), ns::SeccompProgram::service_profile());
    } catch (const std::exception& e) {
        std::cerr << "berth-images: cannot start: " << e.what() << std::endl;
        v1::images::Reply fatal;
        fatal.mutable_error()->set_code(v1::UNAVAILABLE);
        fatal.mutable_error()->set_message(std::string("berth-images cannot start: ") + e.what());
        try {
            wire::write_frame(channel, fatal);
        } catch (...) {
        }
        return 1;
    }
    {
        v1::images::Reply hello;
        hello.mutable_ready()->set_store(state_dir + "/images");
        try {
            wire::write_frame(channel, hello);
        } catch (const std::exception& e) {
            std::cerr << "berth-images: " << e.what() << std::endl;
            return 1;
        }
    }
    images_service::Service(*store, channel, std::move(pulling)).serve();
    // Jobs still run and use the store: leave without destructors, cutting them short.
    std::cout.flush();
    std::cerr.flush();
    ::_exit(0);
}
