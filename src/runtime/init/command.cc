#include "runtime/init/command.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/pipe.h"
#include "ns/security.h"
#include "runtime/init/process_tree.h"
#include "runtime/init/users.h"

namespace berth::init {

namespace {

// The codes a failed spawn reports (the daemon passes them through to the client).
constexpr v1::ErrorCode kInvalidArgument = v1::INVALID_ARGUMENT, kNotFound = v1::NOT_FOUND,
                        kPermissionDenied = v1::PERMISSION_DENIED,
                        kResourceExhausted = v1::RESOURCE_EXHAUSTED, kInternal = v1::INTERNAL;
constexpr const char* kDefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

// What the command's child reports through its close-on-exec pipe when it cannot exec.
struct ChildFailure {
    enum Stage : int { kStdio, kIdentity, kCwd, kExec } stage;
    int err;
    char detail[96];
};

[[noreturn]] void child_fail(int pipe_fd, ChildFailure::Stage stage, int err, const char* detail) {
    ChildFailure f{stage, err, {}};
    if (detail) std::strncpy(f.detail, detail, sizeof f.detail - 1);
    ssize_t ignored = ::write(pipe_fd, &f, sizeof f);
    (void)ignored;
    ::_exit(127);
}

std::string env_value(const std::vector<std::string>& env, std::string_view key) {
    for (const auto& kv : env) {
        if (kv.size() > key.size() && kv.compare(0, key.size(), key) == 0 && kv[key.size()] == '=')
            return kv.substr(key.size() + 1);
    }
    return {};
}

bool has_key(const std::vector<std::string>& env, std::string_view key) {
    for (const auto& kv : env) {
        if (kv.size() > key.size() && kv.compare(0, key.size(), key) == 0 && kv[key.size()] == '=')
            return true;
    }
    return false;
}

// Everything the command's child needs, built before it is cloned: with CLONE_VM the child
// runs on our memory, so it should do as little as it can — syscalls, no allocation.
struct CommandPlan {
    std::vector<std::string> candidates;  // paths to try, in PATH order
    std::vector<char*> argv, envp;
    const UniqueFd* stdio;
    const ns::ProcessIdentity* identity;
    const char* cwd;
    int report_fd;
};

CommandPlan plan_command(std::vector<std::string>& argv, std::vector<std::string>& env) {
    CommandPlan plan{};
    for (auto& a : argv) plan.argv.push_back(a.data());
    plan.argv.push_back(nullptr);
    for (auto& e : env) plan.envp.push_back(e.data());
    plan.envp.push_back(nullptr);
    const std::string& file = argv[0];
    if (file.find('/') != std::string::npos) {
        plan.candidates.push_back(file);
        return plan;
    }
    // A PATH search over the *command's* PATH (execvpe would use ours).
    const std::string path = env_value(env, "PATH");
    size_t start = 0;
    for (;;) {
        size_t end = path.find(':', start);
        std::string dir = path.substr(start, end == std::string::npos ? end : end - start);
        plan.candidates.push_back((dir.empty() ? "." : dir) + "/" + file);
        if (end == std::string::npos) break;
        start = end + 1;
    }
    return plan;
}

// The command's child: cloned with CLONE_VM|CLONE_VFORK, so the shim sleeps until this
// execs or exits, and no page tables are copied (a fork here costs 0.5-2 ms on small VMs).
int command_child(void* arg) {
    const CommandPlan& plan = *static_cast<const CommandPlan*>(arg);
    const int rfd = plan.report_fd;
    ::setsid();
    for (int i = 0; i < 3; ++i) {
        if (::dup2(plan.stdio[i].get(), i) < 0)
            child_fail(rfd, ChildFailure::kStdio, errno, nullptr);
    }
    // Nothing but stdio crosses into the command.
    ::syscall(SYS_close_range, 3U, ~0U, CLOSE_RANGE_CLOEXEC);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    // The command adopts every orphan of its own tree (the setting survives execve), so
    // a timeout finds a double-forked, setsid'd grandchild among its descendants.
    ::prctl(PR_SET_CHILD_SUBREAPER, 1);
    // Never PR_SET_DUMPABLE here: until execve this child runs on init's memory, and a
    // dumpable mm, even for the microseconds until execve, lets a process of the sandbox
    // with the command's uid open /proc/PID/mem of it, or ptrace it, and so own init.
    // (Its OOM score comes from init, see raise_oom_score.) execve makes the command's
    // new mm dumpable by the usual rules.
    const char* step = nullptr;
    if (int rc = ns::apply_identity(*plan.identity, &step); rc != 0)
        child_fail(rfd, ChildFailure::kIdentity, -rc, step);
    if (::chdir(plan.cwd) != 0) child_fail(rfd, ChildFailure::kCwd, errno, nullptr);
    int saw = ENOENT;
    for (const std::string& candidate : plan.candidates) {
        ::execve(candidate.c_str(), plan.argv.data(), plan.envp.data());
        if (errno == EACCES)
            saw = EACCES;  // keep looking, but report it if nothing runs
        else if (errno != ENOENT && errno != ENOTDIR) {
            saw = errno;
            break;
        }
    }
    child_fail(rfd, ChildFailure::kExec, saw, nullptr);
}

// Commands are the OOM killer's first choice in their sandbox, before init and the shims
// (and, on the host, before the host's own processes). The child cannot set its own score:
// /proc/self is owned by the host's root while it shares init's non-dumpable mm. It inherits
// init's instead (copied at clone), so init raises its own for the clone and restores it
// after, through an fd opened while that was still possible (run_init's). Raising needs no
// privilege, and going back to a value init already had is allowed too.
class OomScore {
  public:
    static OomScore& get() {
        static OomScore score;
        return score;
    }
    void adopt(UniqueFd fd) {
        fd_ = std::move(fd);
        if (!fd_) return;
        char buf[16];
        ssize_t n = ::pread(fd_.get(), buf, sizeof buf - 1, 0);
        if (n <= 0) {
            fd_.reset();
            return;
        }
        original_.assign(buf, static_cast<size_t>(n));
    }
    void raise() const noexcept {
        if (fd_) (void)!::pwrite(fd_.get(), "500", 3, 0);
    }
    void restore() const noexcept {
        if (fd_) (void)!::pwrite(fd_.get(), original_.data(), original_.size(), 0);
    }

  private:
    OomScore() = default;
    UniqueFd fd_;  // kept for init's life
    std::string original_;
};

// The stack the command's child runs on, made once and kept for init's life. One is
// enough: with CLONE_VFORK init is suspended until the child has exec'd or exited, and init
// is single-threaded, so no two children ever use it at once. Pages are faulted in only
// where the child touches them (a few, at the top), once; a stack allocated per exec was
// zeroed every time, and in a fresh sandbox that meant 64 page faults on the first exec.
// The lowest page is a guard: an overflow faults instead of writing over init's memory.
char* child_stack_top(int* error) {
    constexpr size_t kStackSize = 256 * 1024, kGuard = 4096;
    static char* top = nullptr;
    if (top) return top;
    void* base = ::mmap(nullptr, kStackSize + kGuard, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
    if (base == MAP_FAILED) {
        *error = errno;
        return nullptr;
    }
    if (::mprotect(base, kGuard, PROT_NONE) != 0) {
        *error = errno;
        ::munmap(base, kStackSize + kGuard);
        return nullptr;
    }
    top = static_cast<char*>(base) + kGuard + kStackSize;
    return top;
}

}  // namespace

std::variant<pid_t, CommandFailure> start_command(const v1::init::Spawn& spawn,
                                                  const std::vector<UniqueFd>& stdio) {
    if (stdio.size() != 3)
        return CommandFailure{kInvalidArgument, "a Spawn needs exactly 3 stdio fds"};
    if (spawn.argv_size() == 0 || spawn.argv(0).empty())
        return CommandFailure{kInvalidArgument, "empty argv: nothing to run"};

    // No passwd: numeric users still work, names are reported as unknown.
    std::string error;
    auto user = resolve_sandbox_user(spawn.user(), &error);
    if (!user) return CommandFailure{kNotFound, error};
    if (error = check_mapped_here(*user); !error.empty())
        return CommandFailure{kInvalidArgument, error};

    std::vector<std::string> argv(spawn.argv().begin(), spawn.argv().end());
    std::vector<std::string> env(spawn.env().begin(), spawn.env().end());
    if (!has_key(env, "PATH")) env.push_back(std::string("PATH=") + kDefaultPath);
    if (!has_key(env, "HOME")) env.push_back("HOME=" + user->home);
    const std::string cwd = spawn.cwd().empty() ? "/" : spawn.cwd();

    ns::ProcessIdentity identity;
    identity.uid = user->uid;
    identity.gid = user->gid;
    identity.groups = user->groups;

    Pipe report;
    try {
        report = make_pipe("exec report");
    } catch (const SysError& e) {
        return CommandFailure{kInternal, e.what()};
    }
    UniqueFd &report_read = report.read, &report_write = report.write;

    CommandPlan plan = plan_command(argv, env);
    plan.stdio = stdio.data();
    plan.identity = &identity;
    plan.cwd = cwd.c_str();
    plan.report_fd = report_write.get();
    // The child's own stack: it must not scribble on ours while we wait for it.
    int stack_error = 0;
    char* stack_top = child_stack_top(&stack_error);
    if (!stack_top) {
        return CommandFailure{kResourceExhausted,
                              "mmap of the command's stack: " + std::string(strerror(stack_error))};
    }
    const OomScore& oom = OomScore::get();
    oom.raise();
    pid_t pid = ::clone(command_child, stack_top, CLONE_VM | CLONE_VFORK | SIGCHLD, &plan);
    const int clone_errno = errno;
    oom.restore();
    if (pid < 0) {
        return CommandFailure{clone_errno == EAGAIN ? kResourceExhausted : kInternal,
                              "clone: " + std::string(strerror(clone_errno)) +
                                  (clone_errno == EAGAIN ? " (the sandbox's pids limit?)" : "")};
    }
    report_write.reset();
    ChildFailure failure{};
    ssize_t got;
    do {
        got = ::read(report_read.get(), &failure, sizeof failure);
    } while (got < 0 && errno == EINTR);
    if (got != static_cast<ssize_t>(sizeof failure)) return pid;

    ::waitpid(pid, nullptr, 0);
    const std::string why = strerror(failure.err);
    switch (failure.stage) {
        case ChildFailure::kCwd:
            return CommandFailure{failure.err == ENOENT   ? kNotFound
                                  : failure.err == EACCES ? kPermissionDenied
                                                          : kInvalidArgument,
                                  "working directory '" + cwd + "': " + why};
        case ChildFailure::kExec:
            if (failure.err == ENOENT) {
                return CommandFailure{kNotFound,
                                      "executable '" + argv[0] + "' not found" +
                                          (argv[0].find('/') == std::string::npos
                                               ? " in PATH (" + env_value(env, "PATH") + ")"
                                               : std::string())};
            }
            return CommandFailure{failure.err == EACCES ? kPermissionDenied : kInvalidArgument,
                                  "exec '" + argv[0] + "': " + why};
        case ChildFailure::kIdentity:
            return CommandFailure{kInternal, "setting up user " + std::to_string(identity.uid) +
                                                 " (" + failure.detail + "): " + why};
        case ChildFailure::kStdio:
            break;
    }
    return CommandFailure{kInternal, "setting up stdio: " + why};
}

void prepare_commands(UniqueFd oom_score_adj) {
    OomScore::get().adopt(std::move(oom_score_adj));
}

void kill_command_tree(pid_t main) {
    // Stop first, kill after: a stopped process can neither fork nor exit, so the tree
    // holds still while we walk it (the command is its descendants' subreaper, so even
    // double-forked, setsid'd ones are in it). Then SIGKILL, which ends stopped ones too.
    std::set<pid_t> stopped;
    for (int round = 0; round < 1000; ++round) {
        bool added = false;
        for (pid_t p : tree_of({main})) {
            if (stopped.insert(p).second) {
                ::kill(p, SIGSTOP);
                added = true;
            }
        }
        if (!added) break;
    }
    for (pid_t p : stopped) ::kill(p, SIGKILL);
}

}  // namespace berth::init
