// berth-probe: tries syscalls that berth's default seccomp profile and capability set must
// deny inside a sandbox (and a few it must allow), and prints one "name=RESULT" line each
// (RESULT is "ok" or the errno name). Built statically by the integration tests' conftest and
// copied into the test rootfs, because busybox has no keyctl and cannot call add_key, bpf,
// socket(AF_VSOCK), etc. directly. On x86_64 it also makes i386 syscalls (int $0x80) to show
// the 32-bit path has the same filter; "i386=unavailable" where the kernel has no i386 entry.
#define _GNU_SOURCE
#include <errno.h>
#include <linux/net.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <sys/inotify.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef AF_VSOCK
#define AF_VSOCK 40
#endif
#ifndef AF_ALG
#define AF_ALG 38
#endif

#ifndef KEYCTL_GET_KEYRING_ID
#define KEYCTL_GET_KEYRING_ID 0
#endif
#define KEY_SPEC_SESSION_KEYRING -3
#define KEY_SPEC_PROCESS_KEYRING -2

static void report(const char* name, long rc) {
    if (rc >= 0) {
        printf("%s=ok\n", name);
    } else {
        const char* e = strerrorname_np(errno);
        printf("%s=%s\n", name, e ? e : "unknown");
    }
}

// socket(family, type) and close it; "ok" or the errno name.
static void report_socket(const char* name, int family, int type) {
    int s = socket(family, type | SOCK_CLOEXEC, 0);
    report(name, s);
    if (s >= 0) close(s);
}

static void report_socketpair(const char* name, int family) {
    int sv[2];
    long rc = socketpair(family, SOCK_STREAM | SOCK_CLOEXEC, 0, sv);
    report(name, rc);
    if (rc == 0) {
        close(sv[0]);
        close(sv[1]);
    }
}

#if defined(__x86_64__)
// A syscall through the i386 entry: i386 numbers, 32-bit arguments, seccomp arch I386.
static long int80(long nr, long a, long b, long c) {
    long ret;
    __asm__ volatile("int $0x80"
                     : "=a"(ret)
                     : "a"(nr), "b"(a), "c"(b), "d"(c), "S"(0L), "D"(0L)
                     : "r8", "r9", "r10", "r11", "memory", "cc");
    return ret;
}

static void report_raw(const char* name, long rc) {
    if (rc >= 0) {
        printf("%s=ok\n", name);
    } else {
        const char* e = strerrorname_np((int)-rc);
        printf("%s=%s\n", name, e ? e : "unknown");
    }
}

// Where int $0x80 has no gate (ia32_emulation=0) it faults: try getpid in a child first.
static int ia32_available(void) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) _exit(int80(20 /* getpid */, 0, 0, 0) == getpid() ? 0 : 1);
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) != pid) return 0;
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

static void i386_probes(void) {
    if (!ia32_available()) {
        printf("i386=unavailable\n");
        return;
    }
    printf("i386=available\n");
    // socketcall(SYS_SOCKET, args): the family is behind a pointer, which a 32-bit call can
    // only pass below 4 GiB: a MAP_32BIT page. (Without the filter, the VSOCK one would open.)
    uint32_t* args =
        mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_32BIT, -1, 0);
    if (args == MAP_FAILED) {
        printf("i386_mmap=%s\n", strerrorname_np(errno));
        return;
    }
    args[0] = AF_VSOCK;
    args[1] = SOCK_STREAM;
    args[2] = 0;
    report_raw("i386_socketcall_socket_vsock", int80(102, SYS_SOCKET, (long)(uintptr_t)args, 0));
    args[0] = AF_INET;
    args[1] = SOCK_DGRAM;
    report_raw("i386_socketcall_socket_inet", int80(102, SYS_SOCKET, (long)(uintptr_t)args, 0));
    args[0] = AF_UNIX;
    args[1] = SOCK_STREAM;
    report_raw("i386_socketcall_socketpair", int80(102, SYS_SOCKETPAIR, (long)(uintptr_t)args, 0));
    // The direct i386 socket(2) (359) carries the family in a register: filtered.
    report_raw("i386_socket_vsock", int80(359, AF_VSOCK, SOCK_STREAM, 0));
    report_raw("i386_socket_alg", int80(359, AF_ALG, SOCK_SEQPACKET, 0));
    long fd = int80(359, AF_INET, SOCK_DGRAM, 0);
    report_raw("i386_socket_inet", fd);
    if (fd >= 0) close((int)fd);
    report_raw("i386_kexec_load", int80(283, 0, 0, 0));
    report_raw("i386_keyctl", int80(288, 0, -3, 1));
    munmap(args, 4096);
}
#endif

// "berth-probe inotify N": makes up to N inotify instances, prints "inotify=COUNT" and the
// errno that stopped it ("stopped=EMFILE", or "stopped=none"), then holds them until killed
// (issue 12: per-user kernel counters must not be shared with root or other sandboxes).
static _Noreturn void hold_inotify(int wanted) {
    int made = 0;
    const char* stopped = "none";
    for (; made < wanted; ++made) {
        if (inotify_init1(IN_CLOEXEC) < 0) {
            stopped = strerrorname_np(errno);
            break;
        }
    }
    printf("inotify=%d stopped=%s\n", made, stopped ? stopped : "unknown");
    fflush(stdout);
    for (;;) pause();
}

int main(int argc, char** argv) {
    if (argc == 3 && strcmp(argv[1], "inotify") == 0) hold_inotify(atoi(argv[2]));
    report("keyctl", syscall(SYS_keyctl, KEYCTL_GET_KEYRING_ID, KEY_SPEC_SESSION_KEYRING, 1));
    report("add_key",
           syscall(SYS_add_key, "user", "berth-probe", "x", 1, KEY_SPEC_PROCESS_KEYRING));
    report("unshare_user", unshare(CLONE_NEWUSER));
    report("unshare_mnt", unshare(CLONE_NEWNS));
    report("mount", mount("none", "/tmp", "tmpfs", 0, NULL));
    report("bpf", syscall(SYS_bpf, 0, NULL, 0));
    report("setns", setns(0, 0));
    // Socket families: the allowlist, and a few of the rest.
    report_socket("socket_vsock", AF_VSOCK, SOCK_STREAM);
    report_socket("socket_alg", AF_ALG, SOCK_SEQPACKET);
    report_socket("socket_bluetooth", AF_BLUETOOTH, SOCK_STREAM);
    report_socket("socket_key", AF_KEY, SOCK_RAW);
    report_socket("socket_tipc", AF_TIPC, SOCK_RDM);
    report_socket("socket_xdp", AF_XDP, SOCK_RAW);
    report_socket("socket_unix", AF_UNIX, SOCK_STREAM);
    report_socket("socket_inet", AF_INET, SOCK_STREAM);
    report_socket("socket_inet6", AF_INET6, SOCK_DGRAM);
    report_socket("socket_netlink", AF_NETLINK, SOCK_RAW);
    report_socket("socket_packet", AF_PACKET, SOCK_RAW);  // needs CAP_NET_RAW (root only)
    report_socketpair("socketpair_unix", AF_UNIX);
    report_socketpair("socketpair_vsock", AF_VSOCK);
    // Off the allowlist: a real call Docker denies, one the kernel has but the profile is
    // older than (file_getattr, Linux 6.17), and a number no kernel has.
    report("kexec_load", syscall(SYS_kexec_load, 0, 0, NULL, 0));
    report("kcmp", syscall(SYS_kcmp, getpid(), getpid(), 0, 0, 0));
    report("io_uring_setup", syscall(SYS_io_uring_setup, 1, NULL));
    report("file_getattr", syscall(468, -1, "", NULL, 0, 0));
    report("syscall_999", syscall(999));
    // x32 ABI (x86_64 arch, number | 0x40000000): filtered too.
#if defined(__x86_64__)
    report("x32_socket_vsock", syscall(0x40000000 | SYS_socket, AF_VSOCK, SOCK_STREAM, 0));
    report("x32_kexec_load", syscall(0x40000000 | 528 /* x32 kexec_load */, 0, 0, NULL, 0));
    fflush(stdout);
    i386_probes();
#endif
    fflush(stdout);
    return 0;
}
