// berth-probe: tries syscalls that berth's default seccomp profile and capability set must
// deny inside a sandbox, and prints one "name=RESULT" line each (RESULT is "ok" or the errno
// name). Built statically by the integration tests' conftest and copied into the test rootfs,
// because busybox has no keyctl and cannot call add_key, bpf, etc. directly.
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/syscall.h>
#include <unistd.h>

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

int main(void) {
    report("keyctl", syscall(SYS_keyctl, KEYCTL_GET_KEYRING_ID, KEY_SPEC_SESSION_KEYRING, 1));
    report("add_key", syscall(SYS_add_key, "user", "berth-probe", "x", 1, KEY_SPEC_PROCESS_KEYRING));
    report("unshare_user", unshare(CLONE_NEWUSER));
    report("unshare_mnt", unshare(CLONE_NEWNS));
    report("mount", mount("none", "/tmp", "tmpfs", 0, NULL));
    report("bpf", syscall(SYS_bpf, 0, NULL, 0));
    report("setns", setns(0, 0));
    fflush(stdout);
    return 0;
}
