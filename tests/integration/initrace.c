// berth-initrace: run inside a sandbox as root while other execs are being spawned, it does
// what a hostile process would to berth-init. Each exec's child runs on init's memory until
// its execve (CLONE_VM|CLONE_VFORK); if that mm were ever dumpable, even for microseconds,
// a process of the sandbox with the child's uid and capabilities could open /proc/CHILD/mem
// (init's memory) or ptrace the child (and write init's memory through it). So, for a few
// seconds, over and over: the newest pid of the sandbox (ns_last_pid, which is the child
// while one is being spawned) and init itself. A hit is an open of /proc/N/maps that
// succeeds while N's mm is init's: the open takes the same check as /proc/N/mem and ptrace
// (the caller's uid and capabilities against the task's, then the mm's dumpable flag) and
// holds on to the mm it checked, so what the fd then lists proves which mm it was: init's
// holds the berth-helper executable, a command's never does. (A PTRACE_SEIZE cannot be told
// apart this way: a seize late in the command's execve, on its new mm, looks the same.)
// Prints "tries=N hits=M".
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ptrace.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static long try_pid(int pid) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/maps", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    static char buf[1 << 16];
    size_t got = 0;
    ssize_t n;
    while (got < sizeof buf - 1 && (n = read(fd, buf + got, sizeof buf - 1 - got)) > 0)
        got += (size_t)n;
    close(fd);
    buf[got] = '\0';
    if (!strstr(buf, "berth-helper")) return 0;
    fprintf(stderr, "read init's memory map through /proc/%d/maps\n", pid);
    return 1;
}

int main(int argc, char** argv) {
    const double seconds = argc > 1 ? atof(argv[1]) : 3.0;
    const double end = now() + seconds;
    long tries = 0, hits = 0;
    int last = open("/proc/sys/kernel/ns_last_pid", O_RDONLY | O_CLOEXEC);
    if (last < 0) {
        perror("open /proc/sys/kernel/ns_last_pid");
        return 2;
    }
    const int self = getpid();
    while (now() < end) {
        for (int i = 0; i < 32; ++i) {
            char buf[16] = {0};
            int newest = pread(last, buf, sizeof buf - 1, 0) > 0 ? atoi(buf) : 0;
            ++tries;
            if (newest > 1 && newest != self) hits += try_pid(newest);
            hits += try_pid(1);
        }
    }
    printf("tries=%ld hits=%ld\n", tries, hits);
    return 0;
}
