"""Issue 13: the helper's pool of sandbox shells (runtime/helper/shell.h). A create takes a
prepared shell (its namespaces, id maps and cgroup made before the request came); a shell is
never used twice, a create that fails with a shell kills it, the pool refills, dies with its
helper and leaves nothing after a SIGKILL; `--pool 0` starts a shell per create. Needs root."""
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

import hostutil
from conftest import Daemon

POOL = 3


def shell_pids(d):
    """The processes of each pooled shell's cgroup (one each), by cgroup name; on v2 the
    cgroups sandboxes kept (named like shells) are left out."""
    parent = hostutil.cgroup_dir("pids", d.cgroup_parent)
    kept = {hostutil.cgroup_name(d.cgroup_parent, sid) for sid in d.ids()} \
        if hostutil.CGROUP_V2 else set()
    out = {}
    for p in sorted(parent.iterdir()) if parent.is_dir() else []:
        if not hostutil.is_shell_cgroup(p.name) or p.name in kept:
            continue
        try:
            pids = [int(x) for x in (p / "cgroup.procs").read_text().split()]
        except FileNotFoundError:
            continue
        if pids:
            out[p.name] = pids
    return out


def start_time(pid):
    """(pid, start time): a process's identity (pids are recycled)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return pid, int(f.read().rsplit(")", 1)[1].split()[19])
    except FileNotFoundError:
        return pid, None


def wait_pool_full(d, n=POOL, timeout=15):
    """The pooled shells, as (pid, start time), once there are `n`."""
    def full():
        shells = shell_pids(d)
        return len(shells) == n and all(len(v) == 1 for v in shells.values())
    hostutil.wait_for(full, timeout, what=f"{n} pooled shells")
    return {start_time(v[0]) for v in shell_pids(d).values()}


@pytest.fixture
def pool_daemon(base_dir):
    d = Daemon(base_dir, extra_args=["--pool", str(POOL), "--bridge", "none"])
    d.start()
    yield d
    problems = d.cleanup()
    assert not problems, "\n".join(problems) + "\n" + d.log()


def init_pid(d, sid):
    return d.inspect(sid)["sandbox"]["init_pid"]


def test_create_takes_a_pooled_shell_and_the_pool_refills(pool_daemon, busybox_rootfs):
    d = pool_daemon
    before = wait_pool_full(d)
    sid = d.create(busybox_rootfs, "-m", "48m", "--pids", "32")
    pid = init_pid(d, sid)
    # Its init is a shell that existed before the create was sent.
    assert start_time(pid) in before, (pid, before)
    assert hostutil.comm(pid) == "berth-init"
    # Its cgroup: the shell's, named by the sandbox (v1) and limited as asked.
    assert pid in hostutil.cgroup_procs(d.cgroup_parent, sid)
    assert hostutil.memory_limit(d.cgroup_parent, sid) == 48 << 20
    assert hostutil.pids_max(d.cgroup_parent, sid) == 32
    assert d.cli_ok("exec", sid, "--", "sh", "-c", "echo $$; cat /etc/hostname") == \
        f"2\n{sid[:12]}\n"
    # The pool is full again, with new shells only.
    after = wait_pool_full(d)
    assert start_time(pid) not in after and len(after - before) == 1
    d.cli_ok("rm", "-f", sid)


def test_a_shell_is_never_used_twice(pool_daemon, busybox_rootfs):
    d = pool_daemon
    seen_inits = set()
    wait_pool_full(d)
    for _ in range(2 * POOL + 1):
        sid = d.create(busybox_rootfs)
        pid = init_pid(d, sid)
        me = start_time(pid)
        assert me not in seen_inits
        seen_inits.add(me)
        d.cli_ok("exec", sid, "--", "true")
        d.cli_ok("rm", "-f", sid)
        assert not hostutil.pid_alive(pid)
        # No shell in the pool is one that was a sandbox.
        assert not wait_pool_full(d) & seen_inits
    # Namespaces: each sandbox's own, none the helper's.
    a, b = d.create(busybox_rootfs), d.create(busybox_rootfs)
    pa, pb = init_pid(d, a), init_pid(d, b)
    for ns in ("user", "mnt", "net", "pid", "uts", "ipc", "cgroup"):
        na, nb = (os.readlink(f"/proc/{p}/ns/{ns}") for p in (pa, pb))
        assert na != nb, ns
        assert na != os.readlink(f"/proc/{d.helper_pid}/ns/{ns}"), ns
    d.cli_ok("rm", "-f", a, b)


def test_a_create_that_fails_kills_its_shell(pool_daemon, busybox_rootfs, base_dir):
    d = pool_daemon
    # (Under base_dir: a filesystem that takes id-mapped mounts, unlike the VM's /tmp.)
    bad = Path(tempfile.mkdtemp(prefix="bad-rootfs-", dir=base_dir))
    bad.chmod(0o755)
    subprocess.run(["cp", "-a", f"{busybox_rootfs}/.", str(bad)], check=True)
    hosts = bad / "etc/hosts"
    if hosts.exists() or hosts.is_symlink():
        hosts.unlink()
    hosts.mkdir(parents=True)  # berth mounts its own file there: refused
    before = wait_pool_full(d)
    r = d.cli("create", "--rootfs", str(bad))
    assert r.returncode != 0 and "not a regular file" in r.stderr, r.stderr
    # The shell it took is gone, not back in the pool.
    after = wait_pool_full(d)
    gone = before - after
    assert len(gone) == 1, (before, after)
    gone_pid = next(iter(gone))[0]
    hostutil.wait_for(lambda: start_time(gone_pid) not in gone, 5, what="the shell's death")
    assert d.ids() == []
    # The daemon serves on.
    sid = d.create(busybox_rootfs)
    assert start_time(init_pid(d, sid)) in after
    d.cli_ok("rm", "-f", sid)


def test_the_pool_dies_with_its_helper_and_is_swept(pool_daemon, busybox_rootfs):
    d = pool_daemon
    keep = d.create(busybox_rootfs)
    kept_pid = init_pid(d, keep)
    shells = wait_pool_full(d)
    names = set(shell_pids(d))
    # SIGKILL of the helper: berthd goes too; the shells die with the helper, the sandbox
    # does not.
    os.kill(d.helper_pid, signal.SIGKILL)
    d.proc.wait(timeout=10)
    hostutil.wait_for(lambda: not any(start_time(p) in shells for p, _ in shells), 10,
                      what="the pooled shells to die with their helper")
    assert hostutil.pid_alive(kept_pid)
    d.start()
    # Their cgroups were swept; the sandbox is back; a new pool fills.
    fresh = wait_pool_full(d)
    assert not names & set(shell_pids(d)) and not fresh & shells
    assert d.cli_ok("exec", keep, "--", "echo", "ok") == "ok\n"
    # berthd SIGKILLed: its helper exits on its own, and takes its shells with it.
    d.kill()
    hostutil.wait_for(lambda: not any(start_time(p) in fresh for p, _ in fresh), 10,
                      what="the pool to go with the helper")
    d.start()
    wait_pool_full(d)
    d.cli_ok("rm", "-f", keep)


def test_doctor_reports_the_pool(pool_daemon):
    out = pool_daemon.cli_ok("doctor")
    assert f"shell pool:      {POOL} sandbox shells kept ready" in out, out


def test_no_pool_starts_a_shell_per_create(base_dir, busybox_rootfs):
    d = Daemon(base_dir, extra_args=["--pool", "0", "--bridge", "none"])
    d.start()
    try:
        sid = d.create(busybox_rootfs)
        assert d.cli_ok("exec", sid, "--", "echo", "cold") == "cold\n"
        time.sleep(0.2)
        assert shell_pids(d) == {}
        assert "shell pool:      off" in d.cli_ok("doctor")
        d.cli_ok("rm", "-f", sid)
    finally:
        problems = d.cleanup()
    assert not problems, problems


def test_bad_pool_size_is_refused(base_dir):
    d = Daemon(base_dir, extra_args=["--pool", "100000"])
    with pytest.raises(AssertionError):
        d.start(timeout=5)
    assert "--pool" in d.log()
