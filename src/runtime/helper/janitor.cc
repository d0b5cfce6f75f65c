#include "runtime/helper/janitor.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

#include "base/error.h"
#include "base/files.h"

namespace berth::helper {

namespace {

// The janitor's life: sweep, wait for a poke, sweep again; on EOF (the helper closed its
// end, or died) a last sweep, then exit. Never returns.
[[noreturn]] void janitor_main(int poke, const std::vector<std::string>& dirs) {
    ::prctl(PR_SET_NAME, "berth-janitor");
    // Hold nothing of the helper's but stderr: berthd must see EOF on the helper's channel
    // when the helper dies, not when the janitor is done.
    if (poke > 3) ::close_range(3, static_cast<unsigned>(poke) - 1, 0);
    ::close_range(static_cast<unsigned>(poke) + 1, ~0U, 0);
    for (;;) {
        sweep_trash(dirs);
        char buf[256];
        ssize_t n = ::read(poke, buf, sizeof buf);  // pokes sent meanwhile coalesce here
        if (n == 0) {
            sweep_trash(dirs);
            ::_exit(0);
        }
        if (n < 0 && errno != EINTR) {
            std::fprintf(stderr, "berth-janitor: read: %s\n", std::strerror(errno));
            ::_exit(1);
        }
    }
}

}  // namespace

size_t sweep_trash(const std::vector<std::string>& dirs) {
    size_t failed = 0;
    for (const std::string& dir : dirs) {
        std::vector<std::string> names;
        if (DIR* d = ::opendir(dir.c_str())) {
            while (dirent* e = ::readdir(d)) {
                if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0)
                    names.emplace_back(e->d_name);
            }
            ::closedir(d);
        } else {
            std::fprintf(stderr, "berth-janitor: opendir %s: %s\n", dir.c_str(),
                         std::strerror(errno));
            ++failed;
            continue;
        }
        for (const std::string& name : names) {
            try {
                remove_tree(dir + "/" + name);
            } catch (const std::exception& e) {
                // Left for the next sweep (the next poke, or the next helper's start).
                std::fprintf(stderr, "berth-janitor: %s\n", e.what());
                ++failed;
            }
        }
    }
    return failed;
}

Janitor::Janitor(std::vector<std::string> trash_dirs) : trash_(std::move(trash_dirs)) {
    for (const std::string& dir : trash_) {
        make_dirs(dir, 0700);
        // Only the helper may look in: it holds what sandboxes wrote.
        check_sys("chmod", dir, [&] { return ::chmod(dir.c_str(), 0700); });
    }
    start();
}

void Janitor::start() {
    // A socket, not a pipe: send() can be told not to raise SIGPIPE should the janitor die.
    int fds[2];
    check_sys("socketpair", "janitor",
              [&] { return ::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds); });
    UniqueFd read_end(fds[0]), write_end(fds[1]);
    pid_ = check_sys("fork", "berth-janitor", [] { return ::fork(); });
    if (pid_ == 0) {
        write_end.reset();
        janitor_main(read_end.get(), trash_);
    }
    read_end.reset();
    ::shutdown(write_end.get(), SHUT_RD);
    poke_ = std::move(write_end);
}

Janitor::~Janitor() = default;  // closing poke_ tells the janitor to finish and exit

void Janitor::discard(const std::string& path, size_t trash, const std::string& name) {
    const std::string target = trash_.at(trash) + "/" + name;
    if (::rename(path.c_str(), target.c_str()) != 0) {
        // Absent (nothing to do: remove_tree says so quietly), on another filesystem (EXDEV)
        // or the name taken: remove it in place, as if there were no janitor.
        remove_tree(path);
        return;
    }
    if (poke_) {
        // A full buffer (EAGAIN) means pokes are pending already: a delete never waits.
        if (::send(poke_.get(), "x", 1, MSG_DONTWAIT | MSG_NOSIGNAL) == 1 || errno == EAGAIN)
            return;
        // Gone (killed, or it crashed): reaped, and a new one sweeps what is in the trash,
        // this path included.
        const int err = errno;
        poke_.reset();
        int status = 0;
        ::waitpid(pid_, &status, 0);
        std::fprintf(stderr, "berth-helper: the janitor %d is gone (%s); starting another\n",
                     static_cast<int>(pid_), std::strerror(err));
        try {
            start();
            return;
        } catch (const std::exception& e) {
            std::fprintf(stderr, "berth-helper: no janitor (%s); removing in place\n", e.what());
        }
    }
    remove_tree(target);
}

}  // namespace berth::helper
