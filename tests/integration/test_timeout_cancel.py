"""A timeout, a Cancel and a dropped client connection each kill the exec's whole process tree,
setsid'd grandchildren included; the ExecExit says which one it was."""
import time

import pytest

import hostutil

# A tree that tries to get away: a background child, and a setsid'd grandchild session that
# starts a great-grandchild in the background. Prints "ready" once all are started.
TREE = ('setsid sh -c "sleep 1000 & echo \\$! > /tmp/gc; sleep 1000" & '
        'sleep 1000 & '
        'while [ ! -s /tmp/gc ]; do usleep 10000; done; echo ready; sleep 1000')


def sandbox_procs(daemon, sid):
    """Host pids in the sandbox's cgroup other than init and its idle spare shim."""
    init = int(daemon.inspect(sid)["sandbox"]["init_pid"])
    return hostutil.workload_procs(daemon.cgroup_parent, sid, init)


def assert_only_init_left(daemon, sid, within=5.0):
    hostutil.wait_for(lambda: not sandbox_procs(daemon, sid), within,
                      what="every process but init (and its spare shim) to be gone from the "
                           "sandbox's cgroup")
    out = daemon.cli_ok("exec", sid, "--", "ps", "-o", "pid,ppid,comm")
    comms = hostutil.strip_spare(out)
    assert comms == ["berth-init", "ps"], out
    # The grandchild recorded its pid: it is gone too.
    gc = daemon.cli_ok("exec", sid, "--", "cat", "/tmp/gc").strip()
    assert gc.isdigit()
    assert daemon.cli("exec", sid, "--", "kill", "-0", gc).returncode != 0


def start_tree(daemon, sid, conn, timeout_ms=0):
    daemon.cli_ok("exec", sid, "--", "rm", "-f", "/tmp/gc")
    rid = conn.start_exec(sid, ["sh", "-c", TREE], timeout_ms=timeout_ms)
    res = conn.collect_exec(rid, timeout=15, until_stdout=b"ready\n")
    assert res.exit is None and res.error is None, res
    # The whole tree is running: sh and 3 sleeps (the setsid sh execs its last sleep).
    assert len(sandbox_procs(daemon, sid)) >= 4, sandbox_procs(daemon, sid)
    return rid, res


def test_timeout_kills_whole_tree_cli(daemon, sandbox):
    daemon.cli_ok("exec", sandbox, "--", "rm", "-f", "/tmp/gc")
    t0 = time.monotonic()
    r = daemon.cli("exec", "--timeout", "1", sandbox, "--", "sh", "-c", TREE, timeout=30)
    elapsed = time.monotonic() - t0
    assert r.returncode == 124, r
    assert "timed out" in r.stderr
    assert r.stdout == "ready\n"
    assert 0.9 <= elapsed < 4, elapsed
    assert_only_init_left(daemon, sandbox, within=2)


def test_timeout_kills_whole_tree_protocol(daemon, sandbox, conn):
    t0 = time.monotonic()
    rid, res = start_tree(daemon, sandbox, conn, timeout_ms=1500)
    res = conn.collect_exec(rid, timeout=10, result=res)
    elapsed = time.monotonic() - t0
    assert res.error is None, res.error
    assert res.exit.timed_out and not res.exit.canceled and not res.exit.oom_killed, res.exit
    assert res.exit.signal == 9, res.exit
    assert elapsed < 5, elapsed
    assert 1.4e6 <= res.exit.duration_us < 5e6, res.exit.duration_us
    assert_only_init_left(daemon, sandbox)


def test_cancel_kills_whole_tree(daemon, sandbox, conn):
    rid, res = start_tree(daemon, sandbox, conn)
    t0 = time.monotonic()
    conn.cancel(rid)
    res = conn.collect_exec(rid, timeout=10, result=res)
    assert time.monotonic() - t0 < 3
    assert res.error is None, res.error
    assert res.exit.canceled and not res.exit.timed_out and not res.exit.oom_killed, res.exit
    assert res.exit.signal == 9
    assert_only_init_left(daemon, sandbox)
    # The connection goes on serving.
    assert conn.exec(sandbox, ["echo", "next"]).check().out == "next\n"


def test_cancel_of_unknown_exec_is_not_found(daemon, sandbox, conn):
    conn.cancel(4242)
    msg = conn.recv_msg(timeout=5)
    assert msg.id == 4242 and msg.HasField("error"), msg
    assert msg.error.code == 2 and "4242" in msg.error.message  # NOT_FOUND


def test_closing_connection_kills_whole_tree(daemon, sandbox):
    c = daemon.connect()
    start_tree(daemon, sandbox, c)
    c.close()
    assert_only_init_left(daemon, sandbox)


def test_killing_cli_kills_whole_tree(daemon, sandbox):
    """A CLI killed mid-exec drops its connection: the same as a client gone away."""
    import subprocess
    import signal
    from conftest import BERTH
    daemon.cli_ok("exec", sandbox, "--", "rm", "-f", "/tmp/gc")
    p = subprocess.Popen([str(BERTH), "exec", sandbox, "--", "sh", "-c", TREE],
                         env={"BERTH_SOCKET": daemon.socket}, stdout=subprocess.PIPE, text=True)
    try:
        line = p.stdout.readline()
        assert line == "ready\n", line
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=10)
    assert_only_init_left(daemon, sandbox)


@pytest.mark.parametrize("how", ["timeout", "cancel"])
def test_tree_kill_reaches_processes_that_ignore_signals(daemon, sandbox, conn, how):
    """SIGKILL cannot be ignored: a tree that traps TERM/INT/HUP still dies at once."""
    script = ("trap '' TERM INT HUP; (trap '' TERM INT HUP; sleep 1000) & "
              "setsid sh -c \"trap '' TERM INT HUP; sleep 1000\" & echo ready; wait")
    rid = conn.start_exec(sandbox, ["sh", "-c", script],
                          timeout_ms=1000 if how == "timeout" else 0)
    res = conn.collect_exec(rid, timeout=10, until_stdout=b"ready\n")
    if how == "cancel":
        conn.cancel(rid)
    res = conn.collect_exec(rid, timeout=10, result=res)
    assert res.exit is not None, res
    assert (res.exit.timed_out if how == "timeout" else res.exit.canceled), res.exit
    hostutil.wait_for(lambda: not sandbox_procs(daemon, sandbox), 5,
                      what="the trapping tree to be gone")


def test_tree_kill_cannot_be_escaped_by_killing_the_parent(daemon, sandbox, conn):
    """The command runs as the sandbox's root, which may signal every process in the sandbox.
    Killing its parent (init, which ignores signals from inside) must not let the exec's
    processes get away from the timeout (they must not live on after the exec ended)."""
    daemon.cli_ok("exec", sandbox, "--", "rm", "-f", "/tmp/gc")
    rid = conn.start_exec(sandbox, ["sh", "-c",
                                    "sleep 1000 & echo $! > /tmp/gc; kill -9 $PPID; sleep 1000"],
                          timeout_ms=1000)
    res = conn.collect_exec(rid, timeout=10)
    # However the exec is reported, nothing it started may survive it.
    time.sleep(1.0)
    left = sandbox_procs(daemon, sandbox)
    comms = [hostutil.comm(p) for p in left]
    assert not left, (f"processes of the exec outlived it: {comms} "
                      f"(exec ended with {res.exit or res.error})")
