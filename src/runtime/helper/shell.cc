#include "runtime/helper/shell.h"

#include <fcntl.h>
#include <grp.h>
#include <linux/capability.h>
#include <linux/sched.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "base/error.h"
#include "base/files.h"
#include "ns/net.h"
#include "ns/rootfs.h"
#include "runtime/helper/helper_error.h"
#include "runtime/init/init.h"
#include "runtime/wire/frame.h"

namespace berth::helper {

namespace {

constexpr const char* kShellPrefix = "shell-";
constexpr size_t kShellHexDigits = 24;
// Frames between a shell and the helper are small: an assignment is a hostname, a path and
// three /etc files.
constexpr uint32_t kShellMaxFrame = 1u << 20;
// How long an assigned shell may take to become init (mount its rootfs, pivot, harden).
constexpr std::chrono::seconds kAssignWait{60};

char* g_title_start = nullptr;
size_t g_title_length = 0;

void set_title(const char* title) {
    if (!g_title_start || g_title_length == 0) return;
    std::memset(g_title_start, 0, g_title_length);
    std::strncpy(g_title_start, title, g_title_length - 1);
}

// Closes every fd of this (child) process except those in `keep`.
void close_all_except(std::vector<int> keep) {
    std::sort(keep.begin(), keep.end());
    unsigned next = 0;
    for (int fd : keep) {
        if (static_cast<unsigned>(fd) > next) ::syscall(SYS_close_range, next, fd - 1U, 0U);
        next = static_cast<unsigned>(fd) + 1;
    }
    ::syscall(SYS_close_range, next, ~0U, 0U);
}

std::string random_hex(size_t digits) {
    std::string bytes((digits + 1) / 2, '\0');
    for (size_t got = 0; got < bytes.size();) {
        got += static_cast<size_t>(check_sys("getrandom", "shell name", [&] {
            return ::getrandom(bytes.data() + got, bytes.size() - got, 0);
        }));
    }
    static const char* hex = "0123456789abcdef";
    std::string out;
    for (unsigned char b : bytes) {
        out += hex[b >> 4];
        out += hex[b & 15];
    }
    return out.substr(0, digits);
}

void send_report(int sock, v1::helper::ShellReport::Stage stage, const std::string& error) {
    v1::helper::ShellReport report;
    report.set_stage(stage);
    report.set_error(error.substr(0, 4000));
    wire::write_frame(sock, report);
}

// The next order from the helper; the helper gone (EOF) ends the shell, which has nothing
// to become then.
v1::helper::ShellOrder next_order(int sock, std::vector<UniqueFd>* fds) {
    v1::helper::ShellOrder order;
    const wire::ReadStatus status = wire::read_frame(sock, order, kShellMaxFrame, fds);
    if (status == wire::ReadStatus::eof) ::_exit(0);
    if (status != wire::ReadStatus::ok) throw std::runtime_error("malformed order from the helper");
    return order;
}

// The shell's life, as the first process (PID 1) of its pid namespace, in its fresh user,
// mount, net, uts and ipc namespaces: get ready, wait, become the sandbox's init. Never
// returns.
[[noreturn]] void shell_main(int sock, const std::vector<int>& procs,
                             const ns::SeccompProgram* seccomp) {
    UniqueFd oom_score_adj;
    try {
        ::signal(SIGCHLD, SIG_DFL);  // the helper ignores it; init must not
        ::signal(SIGPIPE, SIG_DFL);
        std::vector<int> keep{0, 1, 2, sock};
        keep.insert(keep.end(), procs.begin(), procs.end());
        close_all_except(keep);
        // Now, while our ids are still the host's and our mm dumpable: later /proc/self is
        // the host root's (see init.h). (Dumpable again: the helper's switch to the owner
        // uid for our clone made its mm, and so our copy, non-dumpable.)
        ::prctl(PR_SET_DUMPABLE, 1);
        oom_score_adj.reset(::open("/proc/self/oom_score_adj", O_RDWR | O_CLOEXEC));
        set_title("berth-init");
        ::prctl(PR_SET_NAME, "berth-shell");  // (init renames itself berth-init)
        // What needs our capabilities over the new namespaces but creates nothing that a
        // user owns is done while the helper writes our id maps: we hold those capabilities
        // since clone (our ids are the host's, unmapped, until then).
        ns::bring_up_loopback();
        if (!next_order(sock, nullptr).has_begin())
            throw std::runtime_error("the helper's first order is not begin");
        // Our id maps are written now: become root of the new user namespace, before making
        // anything (mounts, files) that records who made it.
        check_sys("setresgid", "0", [] { return ::setresgid(0, 0, 0); });
        check_sys("setresuid", "0", [] { return ::setresuid(0, 0, 0); });
        check_sys("setgroups", "[]", [] { return ::setgroups(0, nullptr); });
        // A shell outlives no helper (the change of credentials above cleared any earlier
        // setting). Cleared again once it is a sandbox, which does outlive it.
        ::prctl(PR_SET_PDEATHSIG, SIGKILL);
        // Into our cgroup (the helper opened its files: the kernel checks the opener). No
        // process of a sandbox exists before this, so none escapes its limits.
        for (int fd : procs) {
            if (::write(fd, "0", 1) != 1) throw_sys("write", "cgroup.procs (the shell itself)");
            ::close(fd);
        }
        send_report(sock, v1::helper::ShellReport::READY, "");

        std::vector<UniqueFd> fds;
        const v1::helper::ShellOrder order = next_order(sock, &fds);
        if (!order.has_assign() || fds.size() != 2)
            throw std::runtime_error("the helper's order is not an assignment with two fds");
        ::prctl(PR_SET_PDEATHSIG, 0);
        const v1::helper::ShellAssignment& a = order.assign();
        check_sys("sethostname", a.hostname(),
                  [&] { return ::sethostname(a.hostname().data(), a.hostname().size()); });
        std::vector<ns::ProvidedFile> files;
        for (const auto& f : a.files()) files.push_back({f.path(), f.content()});
        // (Its proc, sysfs and device mounts are made here too, not while the shell waits:
        // a mount made earlier would be listed before the root in /proc/mounts, which
        // tools that read its first line as the root would take amiss.)
        ns::enter_rootfs(fds[0].get(), a.mountpoint(), files);
        fds[0].reset();
        int null = check_sys("open", "/dev/null", [] { return ::open("/dev/null", O_RDWR); });
        for (int i = 0; i < 3; ++i) ::dup2(null, i);
        if (null > 2) ::close(null);
        // In our cgroup since before the wait: the cgroup namespace made now has it as root.
        check_sys("unshare", "CLONE_NEWCGROUP", [] { return ::unshare(CLONE_NEWCGROUP); });
        init::harden_init(*seccomp);
        send_report(sock, v1::helper::ShellReport::RUNNING, "");
        ::close(sock);
        init::run_init(std::move(fds[1]), std::move(oom_score_adj));
    } catch (const std::exception& e) {
        try {
            send_report(sock, v1::helper::ShellReport::STAGE_UNSPECIFIED,
                        e.what()[0] ? e.what() : "failed");
        } catch (...) {
        }
        ::_exit(1);
    }
}

// For the span of a clone3(CLONE_NEWUSER): the effective uid `owner`, so that the new user
// namespace is owned by it and the kernel charges the sandbox's per-user counters
// (inotify, namespaces...) to that uid, not to root's. The kernel clears the effective
// capabilities when the effective uid leaves 0 and keeps the permitted ones: they are
// raised again, and come back by themselves when the uid returns to 0. Our mm becomes
// non-dumpable on the change (commit_creds); its previous state is put back.
class OwnerCredentials {
  public:
    explicit OwnerCredentials(std::optional<uid_t> owner) : owner_(owner) {
        if (!owner_) return;
        dumpable_ = ::prctl(PR_GET_DUMPABLE);
        check_sys("setresuid", "-1 " + std::to_string(*owner_) + " -1",
                  [&] { return ::setresuid(-1, *owner_, -1); });
        __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
        __user_cap_data_struct data[2]{};
        check_sys("capget", "self", [&] { return ::syscall(SYS_capget, &header, data); });
        for (auto& d : data) d.effective = d.permitted;
        check_sys("capset", "effective = permitted",
                  [&] { return ::syscall(SYS_capset, &header, data); });
    }
    OwnerCredentials(const OwnerCredentials&) = delete;
    OwnerCredentials& operator=(const OwnerCredentials&) = delete;
    ~OwnerCredentials() {
        if (!owner_) return;
        // Cannot fail for root's saved uid; if it did, the helper must not go on as someone
        // else.
        if (::setresuid(-1, 0, -1) != 0) {
            std::perror("berth-helper: setresuid back to 0");
            std::abort();
        }
        if (dumpable_ > 0) ::prctl(PR_SET_DUMPABLE, dumpable_);
    }

  private:
    std::optional<uid_t> owner_;
    int dumpable_ = -1;
};

}  // namespace

bool valid_shell_name(const std::string& name) {
    const size_t prefix = std::strlen(kShellPrefix);
    return name.size() == prefix + kShellHexDigits && name.compare(0, prefix, kShellPrefix) == 0 &&
           name.find_first_not_of("0123456789abcdef", prefix) == std::string::npos;
}

void set_process_title_area(char* start, size_t length) {
    g_title_start = start;
    g_title_length = length;
}

void kill_and_wait(int pidfd, const std::string& id, std::chrono::seconds wait) {
    if (::syscall(SYS_pidfd_send_signal, pidfd, SIGKILL, nullptr, 0) != 0 && errno != ESRCH)
        throw_sys("pidfd_send_signal", "init of " + id);
    pollfd pfd{pidfd, POLLIN, 0};
    // init exits only after every process in its pid namespace has: then pidfd is readable.
    // Usually at once; a sandbox thrashing at its memory limit (or berth's) has processes
    // in uninterruptible page-in or OOM waits that take seconds each to die.
    const int wait_ms = static_cast<int>(std::chrono::milliseconds(wait).count());
    int n = check_sys("poll", "pidfd of " + id, [&] { return ::poll(&pfd, 1, wait_ms); });
    if (n == 0)
        throw HelperError(v1::UNAVAILABLE, "init of sandbox " + id + " did not exit within " +
                                               std::to_string(wait.count()) +
                                               " s of SIGKILL; try again");
}

std::unique_ptr<Shell> Shell::start(const ShellSpec& spec) {
    std::unique_ptr<Shell> shell(new Shell);
    shell->name_ = kShellPrefix + random_hex(kShellHexDigits);
    shell->owner_ = spec.owner;
    // Unlimited but for the parent's budget until it is assigned (the shell itself is ours);
    // the device rules are in place from the start.
    shell->cgroup_ = spec.driver->create(shell->name_, {});
    int pair[2];
    check_sys("socketpair", shell->name_,
              [&] { return ::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair); });
    shell->socket_.reset(pair[0]);
    UniqueFd theirs(pair[1]);

    clone_args args{};
    int pidfd = -1;
    args.flags = CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWUTS |
                 CLONE_NEWIPC | CLONE_PIDFD;
    args.pidfd = reinterpret_cast<uint64_t>(&pidfd);
    args.exit_signal = SIGCHLD;
    std::vector<int> procs;
    if (int cg = shell->cgroup_->clone_into_fd(); cg >= 0) {
        args.flags |= CLONE_INTO_CGROUP;
        args.cgroup = static_cast<uint64_t>(cg);
    } else {
        procs = shell->cgroup_->open_procs();
    }
    pid_t pid;
    {
        OwnerCredentials as_owner(spec.owner);
        // A raw clone3 (glibc has no wrapper with CLONE_INTO_CGROUP): fine in the helper,
        // which has no threads whose locks the child could inherit held.
        pid = static_cast<pid_t>(::syscall(SYS_clone3, &args, sizeof args));
        if (pid == 0) shell_main(theirs.get(), procs, spec.seccomp);  // (never returns)
    }
    const int clone_errno = errno;
    for (int fd : procs) ::close(fd);
    if (pid < 0) throw SysError("clone3", "sandbox shell " + shell->name_, clone_errno);
    shell->pid_ = pid;
    shell->pidfd_.reset(pidfd);
    theirs.reset();

    ns::write_id_maps(pid, *spec.mapping);
    // The OOM killer picks by process size, and memory a command puts in tmpfs belongs to
    // no process: it could pick init (taking the whole sandbox) over the command. Shield
    // init where we may (lowering a score needs CAP_SYS_RESOURCE, which some hosts' root
    // lacks: then we stop trying, our capabilities do not change); commands also raise
    // their own score (command.cc), which needs no privilege.
    if (spec.adjust_oom && *spec.adjust_oom) {
        try {
            write_file("/proc/" + std::to_string(pid) + "/oom_score_adj", "-999");
        } catch (const SysError& e) {
            if (e.code() != EACCES && e.code() != EPERM) throw;
            *spec.adjust_oom = false;
        }
    }
    v1::helper::ShellOrder begin;
    begin.set_begin(true);
    wire::write_frame(shell->socket_.get(), begin);
    return shell;
}

Shell::~Shell() {
    if (released_) return;
    try {
        if (pidfd_) kill_and_wait(pidfd_.get(), name_, std::chrono::seconds(30));
        if (cgroup_) {
            cgroup_->kill();
            cgroup_->remove();
        }
    } catch (const std::exception& e) {
        std::fprintf(stderr, "berth-helper: discarding %s: %s\n", name_.c_str(), e.what());
    }
    if (on_discard) on_discard();
}

UniqueFd Shell::open_netns() const {
    const std::string path = "/proc/" + std::to_string(pid_) + "/ns/net";
    UniqueFd fd(
        check_sys("open", path, [&] { return ::open(path.c_str(), O_RDONLY | O_CLOEXEC); }));
    // Still our shell (a recycled pid would be another process): the pidfd names it.
    if (::syscall(SYS_pidfd_send_signal, pidfd_.get(), 0, nullptr, 0) != 0)
        throw HelperError(v1::INTERNAL, "sandbox shell " + name_ + " died");
    return fd;
}

v1::helper::ShellReport Shell::read_report(std::chrono::milliseconds wait) {
    pollfd pfd{socket_.get(), POLLIN, 0};
    const int n =
        check_sys("poll", name_, [&] { return ::poll(&pfd, 1, static_cast<int>(wait.count())); });
    v1::helper::ShellReport report;
    if (n == 0) return report;  // STAGE_UNSPECIFIED with no error: nothing yet
    const wire::ReadStatus status = wire::read_frame(socket_.get(), report, kShellMaxFrame);
    if (status != wire::ReadStatus::ok)
        throw HelperError(v1::INTERNAL, "sandbox shell " + name_ + " died before it was ready");
    if (report.stage() == v1::helper::ShellReport::STAGE_UNSPECIFIED)
        throw HelperError(v1::INTERNAL,
                          "setting up the sandbox failed: " +
                              (report.error().empty() ? std::string("?") : report.error()));
    return report;
}

bool Shell::ready(std::chrono::milliseconds wait) {
    if (ready_) return true;
    const auto report = read_report(wait);
    if (report.stage() == v1::helper::ShellReport::STAGE_UNSPECIFIED) return false;
    if (report.stage() != v1::helper::ShellReport::READY)
        throw HelperError(v1::INTERNAL, "sandbox shell " + name_ + " reported out of order");
    ready_ = true;
    return true;
}

void Shell::assign(const v1::helper::ShellAssignment& assignment, int overlay_fd, int control_fd) {
    if (!ready_) throw HelperError(v1::INTERNAL, "sandbox shell " + name_ + " is not ready");
    v1::helper::ShellOrder order;
    *order.mutable_assign() = assignment;
    wire::write_frame(socket_.get(), order, {overlay_fd, control_fd});
    assigned_ = true;
}

void Shell::wait_running() {
    if (!assigned_) throw HelperError(v1::INTERNAL, "sandbox shell " + name_ + " is not assigned");
    const auto report = read_report(kAssignWait);
    if (report.stage() == v1::helper::ShellReport::STAGE_UNSPECIFIED)
        throw HelperError(v1::UNAVAILABLE, "sandbox shell " + name_ + " did not start within " +
                                               std::to_string(kAssignWait.count()) + " s");
    if (report.stage() != v1::helper::ShellReport::RUNNING)
        throw HelperError(v1::INTERNAL, "sandbox shell " + name_ + " reported out of order");
    socket_.reset();
}

Shell::Parts Shell::release() {
    released_ = true;
    return Parts{pid_, std::move(pidfd_), std::move(cgroup_), owner_};
}

std::unique_ptr<Shell> ShellPool::take() {
    for (int pass = 0; pass < 2; ++pass) {
        for (auto it = shells_.begin(); it != shells_.end();) {
            try {
                // First pass: one that is ready now. Second: the oldest still on its way
                // (most of its work is done: sooner than a shell started now).
                if ((*it)->ready(std::chrono::milliseconds(pass == 0 ? 0 : 1000))) {
                    std::unique_ptr<Shell> shell = std::move(*it);
                    shells_.erase(it);
                    return shell;
                }
                if (pass == 1) break;
                ++it;
            } catch (const std::exception& e) {
                std::fprintf(stderr, "berth-helper: a pooled shell failed: %s\n", e.what());
                it = shells_.erase(it);
            }
        }
    }
    return nullptr;
}

bool ShellPool::fill_one() {
    if (full()) return false;
    const auto now = std::chrono::steady_clock::now();
    if (now < retry_after_) return false;
    try {
        shells_.push_back(make_());
        last_error_.clear();
        return true;
    } catch (const std::exception& e) {
        if (e.what() != last_error_)
            std::fprintf(stderr, "berth-helper: cannot fill the shell pool: %s\n", e.what());
        last_error_ = e.what();
        retry_after_ = now + std::chrono::seconds(1);
        return false;
    }
}

}  // namespace berth::helper
