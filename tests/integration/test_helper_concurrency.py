"""berth-helper serves deletes beside everything else: a delete that has to wait (a sandbox
whose processes take long to die) holds no create, exec or other delete.

Needs root and the cgroup v1 freezer (this host's hierarchy): the test holds a delete open
by putting one of the sandbox's processes in a frozen cgroup of its own below the
sandbox's, where SIGKILL cannot end it until the test thaws it. The sandbox's init, killed,
waits for that process (as it waits for any in its pid namespace), and so does its delete.
"""
import time

import pytest

import hostutil
from berth_proto import pb


def freeze_one_process(parent: str, sid: str, init_pid: int):
    """Moves one workload process of the sandbox into <its freezer cgroup>/held, frozen.
    Returns (the held cgroup's directory, the pid)."""
    pid = hostutil.workload_procs(parent, sid, init_pid)[0]
    held = hostutil.cgroup_dir("freezer", parent, sid) / "held"
    held.mkdir()
    (held / "cgroup.procs").write_text(str(pid))
    (held / "freezer.state").write_text("FROZEN")
    hostutil.wait_for(lambda: (held / "freezer.state").read_text().strip() == "FROZEN", 10,
                      what="the held cgroup to freeze")
    return held, pid


def hold_a_process(conn, parent: str, sandbox):
    """Starts a sleeper in the sandbox and freezes it below the sandbox's cgroup."""
    conn.exec(sandbox.id, ["sh", "-c", "sleep 1000 </dev/null >/dev/null 2>&1 &"]).check()
    hostutil.wait_for(lambda: hostutil.workload_procs(parent, sandbox.id, sandbox.init_pid), 10,
                      what="the sleeper to start")
    return freeze_one_process(parent, sandbox.id, sandbox.init_pid)


def no_reply_within(conn, seconds: float) -> bool:
    try:
        conn.recv_msg(timeout=seconds)
    except TimeoutError:
        return True
    return False


@pytest.mark.skipif(hostutil.CGROUP_V2 or "freezer" not in hostutil.V1_MOUNTS,
                    reason="needs the cgroup v1 freezer to hold a delete open")
def test_a_delete_that_waits_holds_no_create_exec_or_other_delete(fresh_daemon,
                                                                   busybox_rootfs):
    d = fresh_daemon
    parent = d.cgroup_parent
    with d.connect() as slow, d.connect() as other, d.connect() as joiner:
        a = slow.create(str(busybox_rootfs), persistent=True)
        held, pid = hold_a_process(slow, parent, a)
        try:
            first = slow.request("delete", pb.DeleteSandbox(sandbox=a.id))
            # It is under way (init is killed and waits for the held process) and stays so.
            hostutil.wait_for(lambda: not hostutil.pid_alive(a.init_pid)
                              or hostutil.status(a.init_pid).get("State", "").startswith("Z")
                              or a.init_pid not in hostutil.cgroup_procs(parent, a.id), 10,
                              what="the delete to kill init")
            assert no_reply_within(slow, 1.0), "the delete ended with a process held"
            # A second delete of the same sandbox joins the first.
            second = joiner.request("delete", pb.DeleteSandbox(sandbox=a.id))

            # Meanwhile everything else goes on: creates, execs, other deletes, lists.
            start = time.monotonic()
            for _ in range(5):
                b = other.create(str(busybox_rootfs), timeout=10)
                assert other.exec(b.id, ["echo", "hi"], timeout=10).check().out == "hi\n"
                other.delete(b.id, timeout=10)
                assert not hostutil.cgroup_exists(parent, b.id)
            assert {s.id for s in other.list()} == {a.id}
            took = time.monotonic() - start
            print(f"5 create/exec/delete beside a delete held open: {took * 1000:.0f} ms")
            assert no_reply_within(slow, 0.1) and no_reply_within(joiner, 0.1)
            # The held sandbox is being deleted: it takes no exec meanwhile.
            r = other.request("exec", pb.Exec(sandbox=a.id, argv=["true"]))
            with pytest.raises(Exception) as info:
                other.wait_reply(r, timeout=10)
            assert "being deleted" in str(info.value)
        finally:
            (held / "freezer.state").write_text("THAWED")
            hostutil.wait_for(lambda: not hostutil.pid_alive(pid), 30,
                              what="the held process to die once thawed")
            held.rmdir()
        # Now both deletes of `a` are answered, and it is gone.
        slow.wait_reply(first, timeout=30)
        joiner.wait_reply(second, timeout=30)
        hostutil.wait_for(lambda: not hostutil.cgroup_exists(parent, a.id), 10,
                          what="a's cgroup to go")
        assert not hostutil.pid_alive(a.init_pid)
        assert other.list() == []


@pytest.mark.skipif(hostutil.CGROUP_V2 or "freezer" not in hostutil.V1_MOUNTS,
                    reason="needs the cgroup v1 freezer to hold a delete open")
def test_berthd_gone_with_a_delete_held_open_the_helper_exits_at_once(fresh_daemon,
                                                                      busybox_rootfs):
    """The helper does not wait for the deletes it began when berthd goes (the next berthd
    could not start meanwhile): their reapers finish on their own, and the next daemon
    deletes what is left."""
    d = fresh_daemon
    parent = d.cgroup_parent
    with d.connect() as slow:
        a = slow.create(str(busybox_rootfs), persistent=True)
        held, pid = hold_a_process(slow, parent, a)
        try:
            slow.request("delete", pb.DeleteSandbox(sandbox=a.id))
            assert no_reply_within(slow, 1.0)
            d.kill()  # asserts that berth-helper exits within 10 s
        finally:
            (held / "freezer.state").write_text("THAWED")
            hostutil.wait_for(lambda: not hostutil.pid_alive(pid), 30,
                              what="the held process to die once thawed")
            held.rmdir()
    hostutil.wait_for(lambda: not hostutil.pid_alive(a.init_pid), 30,
                      what="the reaper to finish killing the sandbox")
    d.start()
    hostutil.wait_for(lambda: a.id not in d.ids(), 30, what="the next berthd to delete it")
    hostutil.wait_for(lambda: not hostutil.cgroup_exists(parent, a.id), 10,
                      what="its cgroup to go")
