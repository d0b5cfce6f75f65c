#include "rootfs-tools/bootstrap.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <ctime>
#include <deque>
#include <fstream>
#include <map>
#include <sstream>

#include "base/error.h"
#include "base/files.h"
#include "base/unique_fd.h"

namespace berth::images {

namespace {

std::vector<std::string> words(const std::string& line) {
    std::istringstream in(line);
    std::vector<std::string> out;
    for (std::string w; in >> w;) out.push_back(w);
    return out;
}

// A Debian archive that is not the security one: what debootstrap can fetch a suite from.
bool usable_mirror(const std::string& uri, const std::string& suite) {
    return uri.find("://") != std::string::npos && uri.find("debian") != std::string::npos &&
           uri.find("security") == std::string::npos && suite.find("security") == std::string::npos;
}

std::optional<std::string> mirror_in_one_line_file(const std::string& path) {
    std::ifstream in(path);
    for (std::string line; std::getline(in, line);) {
        auto w = words(line.substr(0, line.find('#')));
        if (w.empty() || w[0] != "deb") continue;
        size_t i = 1;
        if (i < w.size() && w[i].front() == '[') {  // [arch=amd64 signed-by=...]
            while (i < w.size() && w[i].back() != ']') ++i;
            ++i;
        }
        if (i + 1 < w.size() && usable_mirror(w[i], w[i + 1])) return w[i];
    }
    return std::nullopt;
}

std::optional<std::string> mirror_in_deb822_file(const std::string& path) {
    std::ifstream in(path);
    std::map<std::string, std::string> fields;
    auto check = [&]() -> std::optional<std::string> {
        const auto types = words(fields["types"]);
        const auto uris = words(fields["uris"]);
        const auto suites = words(fields["suites"]);
        const bool deb = std::find(types.begin(), types.end(), "deb") != types.end();
        if (deb && fields["enabled"] != "no" && !uris.empty() && !suites.empty() &&
            usable_mirror(uris[0], suites[0]))
            return uris[0];
        return std::nullopt;
    };
    for (std::string line; std::getline(in, line);) {
        if (line.find_first_not_of(" \t") == std::string::npos) {  // end of a paragraph
            if (auto m = check()) return m;
            fields.clear();
            continue;
        }
        if (line[0] == '#' || line[0] == ' ' || line[0] == '\t') continue;
        const size_t colon = line.find(':');
        if (colon == std::string::npos) continue;
        std::string key = line.substr(0, colon);
        for (auto& c : key) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        std::string value = line.substr(colon + 1);
        value.erase(0, value.find_first_not_of(" \t"));
        value.erase(value.find_last_not_of(" \t\r") + 1);
        fields[key] = value;
    }
    return check();
}

std::string now_rfc3339() {
    const std::time_t t = std::time(nullptr);
    std::tm tm{};
    ::gmtime_r(&t, &tm);
    char buf[32];
    std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
    return buf;
}

// From a forked child, where only async-signal-safe calls may be made.
[[noreturn]] void child_fail(int out, const char* what) {
    const int err = errno;
    (void)!::write(out, "berth: ", 7);
    (void)!::write(out, what, std::strlen(what));
    (void)!::write(out, ": ", 2);
    const char* msg = ::strerrordesc_np(err);
    if (msg) (void)!::write(out, msg, std::strlen(msg));
    (void)!::write(out, "\n", 1);
    ::_exit(126);
}

int exit_code(int status) {
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// debootstrap, in a pid and mount namespace of its own. Runs in the child of fork(): A
// makes the namespaces, B is their first process (all in it die with it) and the reaper,
// C is debootstrap. A dies with the thread that forked it, B with A: PR_SET_PDEATHSIG.
[[noreturn]] void run_in_namespaces(pid_t parent, int out, char* const argv[], char* const envp[]) {
    if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) child_fail(out, "prctl");
    if (::getppid() != parent) ::_exit(125);  // our parent went before the line above
    if (::unshare(CLONE_NEWPID | CLONE_NEWNS) != 0) child_fail(out, "unshare(pid, mount)");
    // debootstrap mounts proc and sys in the target: not on the host, and gone with us.
    if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0)
        child_fail(out, "mount / private");
    int lifeline[2];
    if (::pipe2(lifeline, O_CLOEXEC) != 0) child_fail(out, "pipe2");
    const pid_t b = ::fork();
    if (b < 0) child_fail(out, "fork");
    if (b == 0) {
        ::close(lifeline[1]);
        if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) child_fail(out, "prctl");
        // getppid() is 0 across the namespace: the pipe tells whether A is still there.
        pollfd p{lifeline[0], POLLIN, 0};
        if (::poll(&p, 1, 0) != 0) ::_exit(125);
        const pid_t c = ::fork();
        if (c < 0) child_fail(out, "fork");
        if (c == 0) {
            const int null = ::open("/dev/null", O_RDONLY);
            if (null < 0 || ::dup2(null, 0) < 0 || ::dup2(out, 1) < 0 || ::dup2(out, 2) < 0)
                child_fail(out, "dup2");
            ::execve(argv[0], argv, envp);
            child_fail(out, argv[0]);
        }
        // The namespace's init: reap every orphan until debootstrap itself is done.
        for (;;) {
            int status = 0;
            const pid_t w = ::waitpid(-1, &status, 0);
            if (w == c) ::_exit(exit_code(status));
            if (w < 0 && errno != EINTR) ::_exit(125);
        }
    }
    ::close(lifeline[0]);
    int status = 0;
    while (::waitpid(b, &status, 0) < 0) {
        if (errno != EINTR) ::_exit(125);
    }
    ::_exit(exit_code(status));
}

}  // namespace

std::string debian_suite(std::string_view source) {
    const std::string_view prefix = "debian:";
    const std::string suite(source.substr(std::min(source.size(), prefix.size())));
    if (source.substr(0, prefix.size()) != prefix || suite.empty() ||
        suite.find_first_not_of("abcdefghijklmnopqrstuvwxyz") != std::string::npos) {
        throw std::invalid_argument("cannot bootstrap '" + std::string(source) +
                                    "': only debian:SUITE is supported (e.g. debian:bookworm)");
    }
    struct stat st;
    const std::string script = "/usr/share/debootstrap/scripts/" + suite;
    if (::stat(script.c_str(), &st) != 0) {
        throw std::invalid_argument("cannot bootstrap '" + std::string(source) +
                                    "': debootstrap does not know the suite " + suite + " (no " +
                                    script + ")");
    }
    return suite;
}

std::optional<std::string> host_debian_mirror(const std::string& apt_dir) {
    if (auto m = mirror_in_one_line_file(apt_dir + "/sources.list")) return m;
    std::vector<std::string> files;
    if (DIR* d = ::opendir((apt_dir + "/sources.list.d").c_str())) {
        while (dirent* e = ::readdir(d)) files.emplace_back(e->d_name);
        ::closedir(d);
    }
    std::sort(files.begin(), files.end());  // apt reads them in this order too
    for (const auto& f : files) {
        const std::string path = apt_dir + "/sources.list.d/" + f;
        auto ends = [&](std::string_view s) {
            return f.size() > s.size() && f.compare(f.size() - s.size(), s.size(), s) == 0;
        };
        std::optional<std::string> m;
        if (ends(".list")) m = mirror_in_one_line_file(path);
        if (ends(".sources")) m = mirror_in_deb822_file(path);
        if (m) return m;
    }
    return std::nullopt;
}

Image bootstrap_image(ImageStore& store, std::string_view source, const Reference& name,
                      const BootstrapOptions& options) {
    const std::string suite = debian_suite(source);
    const std::string scratch = store.blobs().make_scratch_dir("bootstrap");
    struct Scratch {
        std::string path;
        ~Scratch() { remove_tree(path); }
    } cleanup{scratch};
    const std::string target = scratch + "/rootfs";
    if (::mkdir(target.c_str(), 0755) != 0) throw_sys("mkdir", target);
    // (mkdir's mode passes through the umask; the image's / must be 0755.)
    if (::chmod(target.c_str(), 0755) != 0) throw_sys("chmod", target);

    std::string mirror = options.mirror;
    if (mirror.empty()) mirror = host_debian_mirror().value_or("");
    std::vector<std::string> args = {options.debootstrap, "--variant=minbase", suite, target};
    if (!mirror.empty()) args.push_back(mirror);
    std::vector<std::string> env = {
        "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C",
        "DEBIAN_FRONTEND=noninteractive", "HOME=/root"};
    std::vector<char*> argv, envp;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    if (options.progress) {
        std::string line = "debootstrap --variant=minbase " + suite + " " + target;
        if (!mirror.empty()) line += " " + mirror;
        options.progress(line);
    }

    int pipe_fds[2];
    if (::pipe2(pipe_fds, O_CLOEXEC) != 0) throw_sys("pipe2", "debootstrap output");
    UniqueFd out_read(pipe_fds[0]), out_write(pipe_fds[1]);
    const pid_t self = ::getpid();
    const pid_t child = ::fork();
    if (child < 0) throw_sys("fork", "debootstrap");
    if (child == 0) {
        // The write end must survive exec in debootstrap; the read end must not.
        const int out = ::fcntl(out_write.get(), F_DUPFD, 3);
        if (out < 0) ::_exit(126);
        run_in_namespaces(self, out, argv.data(), envp.data());
    }
    out_write.reset();
    struct Child {  // killed (the whole namespace with it) unless it was reaped
        pid_t pid;
        bool reaped = false;
        ~Child() {
            if (reaped) return;
            ::kill(pid, SIGKILL);
            while (::waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
            }
        }
    } guard{child};

    std::deque<std::string> tail;  // the last lines, for the error message
    std::string partial;
    bool cancelled = false;
    char buf[4096];
    for (;;) {
        if (options.cancel && options.cancel->cancelled()) {
            cancelled = true;
            break;
        }
        pollfd p{out_read.get(), POLLIN, 0};
        const int r = ::poll(&p, 1, 200);
        if (r < 0 && errno != EINTR) throw_sys("poll", "debootstrap output");
        if (r <= 0) continue;
        const ssize_t n = ::read(out_read.get(), buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) throw_sys("read", "debootstrap output");
        if (n == 0) break;
        partial.append(buf, static_cast<size_t>(n));
        for (size_t nl; (nl = partial.find('\n')) != std::string::npos;) {
            std::string line = partial.substr(0, nl);
            partial.erase(0, nl + 1);
            if (line.empty()) continue;
            if (options.progress) options.progress(line);
            tail.push_back(std::move(line));
            if (tail.size() > 12) tail.pop_front();
        }
    }
    if (cancelled) throw BootstrapError("bootstrap of " + std::string(source) + " cancelled");
    int status = 0;
    while (::waitpid(child, &status, 0) < 0) {
        if (errno != EINTR) throw_sys("waitpid", "debootstrap");
    }
    guard.reaped = true;
    if (exit_code(status) != 0) {
        std::string msg = "debootstrap --variant=minbase " + suite + " failed (exit " +
                          std::to_string(exit_code(status)) + "); its last lines:";
        for (const auto& l : tail) msg += "\n  " + l;
        throw BootstrapError(msg);
    }

    // Host-specific files debootstrap copies in, and apt's lists (fetched again by the
    // image's first apt-get update, as in Docker's Debian images).
    ::unlink((target + "/etc/hostname").c_str());
    write_file_atomic(target + "/etc/resolv.conf", "");
    const std::string lists = target + "/var/lib/apt/lists";
    if (DIR* d = ::opendir(lists.c_str())) {
        std::vector<std::string> doomed;
        while (dirent* e = ::readdir(d)) {
            const std::string n = e->d_name;
            if (n != "." && n != ".." && n != "partial" && n != "lock") doomed.push_back(n);
        }
        ::closedir(d);
        for (const auto& n : doomed) remove_tree(lists + "/" + n);
    }

    ImageConfig config;
    config.env = {"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"};
    config.cmd = {"/bin/bash"};
    config.created = now_rfc3339();
    // Its layer blob is stored before its name: prune and remove must wait for the name.
    const auto hold = store.hold_content();
    return store.import_rootfs_dir(target, name, config);
}

}  // namespace berth::images
