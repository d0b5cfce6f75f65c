"""Issue 12, item 3: sandboxes do not share root's per-user kernel counters.

The kernel charges what a user namespace's processes hold of inotify instances (and
watches, user and mount namespaces... /proc/sys/user) to the namespace's owner too. Owned
by root, every sandbox drew on root's 128 inotify instances: one sandbox holding them made
root's inotify_init1 fail. Each sandbox's namespace is now owned by a uid of its own, from
berth's subordinate uids past the 65536 the mapping uses.
"""
import ctypes
import fcntl
import os
import struct

import pytest

import hostutil
from conftest import Daemon

NS_GET_OWNER_UID = 0xB704  # _IO(0xb7, 0x4), linux/nsfs.h
IN_CLOEXEC = os.O_CLOEXEC
OWNER_RANGE = range(265536, 265536 + 1024)  # scripts/install-deps


def userns_owner(pid: int) -> int:
    fd = os.open(f"/proc/{pid}/ns/user", os.O_RDONLY)
    try:
        buf = bytearray(4)
        fcntl.ioctl(fd, NS_GET_OWNER_UID, buf)
        return struct.unpack("I", buf)[0]
    finally:
        os.close(fd)


def root_can_make_inotify() -> bool:
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(IN_CLOEXEC)
    if fd < 0:
        return False
    os.close(fd)
    return True


@pytest.fixture
def two_sandboxes(base_dir, busybox_rootfs):
    d = Daemon(base_dir).start()
    try:
        ids = [d.create(busybox_rootfs) for _ in range(2)]
        yield d, ids
    finally:
        problems = d.cleanup()
        assert not problems, "\n".join(problems)


def test_each_sandbox_namespace_has_an_owner_of_its_own(two_sandboxes, busybox_rootfs):
    d, ids = two_sandboxes
    owners = [userns_owner(int(d.inspect(sid)["sandbox"]["init_pid"])) for sid in ids]
    assert owners[0] != owners[1], owners
    assert all(o in OWNER_RANGE for o in owners), owners
    # Freed by a delete, taken again by the next create; a restarted helper knows which are
    # taken (from the state files).
    d.cli_ok("rm", "-f", ids[0])
    d.restart()
    third = d.create(busybox_rootfs)
    assert userns_owner(int(d.inspect(third)["sandbox"]["init_pid"])) == owners[0]
    assert userns_owner(int(d.inspect(ids[1])["sandbox"]["init_pid"])) == owners[1]
    ids[0] = third


def test_inotify_exhaustion_in_one_sandbox_leaves_root_and_others_unaffected(two_sandboxes):
    d, (hog, other) = two_sandboxes
    limit = int(open("/proc/sys/fs/inotify/max_user_instances").read())
    with d.connect() as c:
        rid = c.start_exec(hog, ["berth-probe", "inotify", str(limit + 50)])
        res = c.collect_exec(rid, until_stdout=b"\n", timeout=20)
        made, stopped = [kv.split("=")[1] for kv in res.stdout.decode().split()]
        # The sandbox is held at the host's per-user limit, of its own owner...
        assert int(made) == limit and stopped == "EMFILE", res.stdout
        # ...while root (the test, uid 0 on the host) still gets instances,
        assert root_can_make_inotify(), "a sandbox took root's inotify instances"
        # ...and so does the other sandbox.
        rid2 = c.start_exec(other, ["berth-probe", "inotify", "10"])
        res2 = c.collect_exec(rid2, until_stdout=b"\n", timeout=20)
        assert res2.stdout.decode().split() == ["inotify=10", "stopped=none"], res2.stdout
        for r in (rid, rid2):
            c.cancel(r)
    hostutil.wait_for(root_can_make_inotify, 5, what="root's inotify")
