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

#include "base/child_process.h"
#include "base/error.h"
#include "base/files.h"

namespace berth::helper {

namespace {

// The janitor's life: sweep, wait for a poke, sweep again; on EOF (the helper closed its
// end, or died) a last sweep, then exit. Never returns.
// It holds nothing of the helper's but stderr (ChildProcess::fork closes the rest): berthd
// must see EOF on the helper's channel when the helper dies, not when the janitor is done.
int janitor_main(int poke, const std::vector<std::string>& dirs) {
    ::prctl(PR_SET_NAME, "berth-janitor");
    for (;;) {
        sweep_trash(dirs);
        char buf[256];
        ssize_t n = ::read(poke, buf, sizeof buf);  // pokes sent meanwhile coalesce here
        if (n == 0) {
            sweep_trash(dirs);
            return 0;
        }
        if (n < 0 && errno != EINTR) {
            std::fprintf(stderr, "berth-janitor: read: %s\n", std::strerror(errno));
            return 1;
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
    const int poke = read_end.get();
    process_ =
        ChildProcess::fork("berth-janitor", {poke}, [&] { return janitor_main(poke, trash_); });
    read_end.reset();
    ::shutdown(write_end.get(), SHUT_RD);
    poke_ = std::move(write_end);
}

Janitor::~Janitor() {
    // Closing poke_ tells the janitor to finish its sweep and exit: not killed, not waited
    // for (a helper that exits leaves it to finish on its own).
    poke_.reset();
    process_.release();
}

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
        std::fprintf(stderr, "berth-helper: the janitor %d is gone (%s); starting another\n",
                     static_cast<int>(process_.pid()), std::strerror(err));
        process_.kill_and_wait();  // reaped (and were it only stuck, ended)
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
