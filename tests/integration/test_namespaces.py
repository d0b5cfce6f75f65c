"""Isolation: namespaces, id mapping, network, hostname, capabilities, no_new_privs, seccomp,
masked and read-only /proc paths, denied syscalls. Observed from the host where possible."""
import os
import socket
from contextlib import contextmanager
from pathlib import Path

import pytest

import hostutil

NAMESPACES = ("pid", "mnt", "uts", "ipc", "net", "cgroup", "user")

# Docker's default capability set, by number (linux/capability.h).
DOCKER_CAPS = {
    "CHOWN": 0, "DAC_OVERRIDE": 1, "FOWNER": 3, "FSETID": 4, "KILL": 5, "SETGID": 6,
    "SETUID": 7, "SETPCAP": 8, "NET_BIND_SERVICE": 10, "NET_RAW": 13, "SYS_CHROOT": 18,
    "MKNOD": 27, "AUDIT_WRITE": 29, "SETFCAP": 31,
}
DOCKER_CAP_MASK = sum(1 << n for n in DOCKER_CAPS.values())

HOST_ROOT_UID = 200000  # /etc/subuid: berth:200000:65536


def init_pid(daemon, sid) -> int:
    return int(daemon.inspect(sid)["sandbox"]["init_pid"])


@contextmanager
def running(daemon, sid, argv=("sleep", "1000"), user=""):
    """Runs argv in the sandbox; yields (host pid, pid inside). Cancels it afterwards."""
    c = daemon.connect()
    try:
        rid = c.start_exec(sid, list(argv), user=user)
        res = c.collect_exec(rid, timeout=10, until_started=True)
        assert res.error is None and res.exit is None, res
        ipid = init_pid(daemon, sid)

        def find():
            for p in hostutil.descendants(ipid):
                try:
                    st = hostutil.status(p)
                except FileNotFoundError:
                    continue
                if hostutil.comm(p) == os.path.basename(argv[0]):
                    return (p, int(st["NSpid"].split()[-1]))
            return None

        host_pid, inner_pid = hostutil.wait_for(find, 10, what=f"{argv[0]} in the sandbox")
        yield host_pid, inner_pid, c, rid, res
        c.cancel(rid)
        c.collect_exec(rid, timeout=10, result=res)
    finally:
        c.close()


def test_exec_runs_under_init_in_own_namespaces(daemon, sandbox):
    ipid = init_pid(daemon, sandbox)
    assert hostutil.comm(ipid) == "berth-init"
    with running(daemon, sandbox) as (host_pid, inner_pid, c, rid, res):
        # init starts it directly (no shim process in between).
        assert int(hostutil.status(host_pid)["PPid"]) == ipid
        # Inside, init is PID 1 and the command has a small pid of its own.
        assert hostutil.status(ipid)["NSpid"].split()[-1] == "1"
        assert inner_pid != host_pid and inner_pid > 1
        for ns in NAMESPACES:
            mine = hostutil.ns_link("self", ns)
            theirs = hostutil.ns_link(host_pid, ns)
            assert theirs != mine, f"{ns} namespace is shared with the host: {theirs}"
            assert theirs == hostutil.ns_link(ipid, ns) or ns == "cgroup", \
                f"the exec is not in init's {ns} namespace"
        # The cgroup namespace is made by init after joining its cgroup: same as init's.
        assert hostutil.ns_link(host_pid, "cgroup") == hostutil.ns_link(ipid, "cgroup")
        # And it is in the sandbox's cgroup(s) (one per controller hierarchy on v1).
        for ctrl in ("memory", "pids", "cpu"):
            assert host_pid in hostutil.cgroup_procs(daemon.cgroup_parent, sandbox, ctrl)
    # The protocol reported the pid inside.
    assert res.started_pid == inner_pid


def test_sandbox_sees_only_its_own_processes_and_cgroup(daemon, sandbox):
    out = daemon.cli_ok("exec", sandbox, "--", "ps", "-o", "pid,ppid,comm")
    assert hostutil.strip_spare(out) == ["berth-init", "ps"], out
    assert any(line.split()[0] == "1" and line.split()[2] == "berth-init"
               for line in out.splitlines()[1:]), out
    # Inside its cgroup namespace the sandbox's own cgroup is the root.
    cgroups = daemon.cli_ok("exec", sandbox, "--", "cat", "/proc/self/cgroup")
    entries = [line.split(":", 2) for line in cgroups.splitlines()]
    if hostutil.CGROUP_V2:
        # The unified hierarchy's line is "0::<path>".
        assert ["0", "", "/"] in entries, cgroups
        return
    seen = set()
    for _, controllers, path in entries:
        for c in ("memory", "pids", "cpu"):
            if c in controllers.split(","):
                seen.add(c)
                assert path == "/", cgroups
    assert seen == {"memory", "pids", "cpu"}, cgroups


def test_init_and_shims_are_not_inspectable(daemon, sandbox):
    """berth-init and the shims hold the daemon's connections: the sandbox's root may not
    read their memory, environment or file descriptors."""
    script = ("for f in /proc/1/environ /proc/1/maps /proc/$PPID/environ; do "
              "  cat $f > /dev/null 2>&1 && echo readable:$f; done; "
              "for d in /proc/1/fd /proc/1/root/ /proc/$PPID/fd; do "
              "  ls $d > /dev/null 2>&1 && echo listable:$d; done; "
              "kill -9 1; sleep 0.2; echo init-alive")
    out = daemon.cli_ok("exec", sandbox, "--", "sh", "-c", script)
    assert out == "init-alive\n", out
    assert hostutil.pid_alive(init_pid(daemon, sandbox))


def test_root_inside_is_unprivileged_outside(daemon, sandbox):
    assert daemon.cli_ok("exec", sandbox, "--", "id", "-u").strip() == "0"
    assert daemon.inspect(sandbox)["sandbox"]["host_root_uid"] == HOST_ROOT_UID
    with running(daemon, sandbox) as (host_pid, *_):
        st = hostutil.status(host_pid)
        assert st["Uid"].split() == [str(HOST_ROOT_UID)] * 4
        assert st["Gid"].split() == [str(HOST_ROOT_UID)] * 4
        uid_map = Path(f"/proc/{host_pid}/uid_map").read_text().split()
        assert uid_map == ["0", str(HOST_ROOT_UID), "65536"]
    with running(daemon, sandbox, user="alice") as (host_pid, *_):
        assert hostutil.status(host_pid)["Uid"].split() == [str(HOST_ROOT_UID + 1000)] * 4
    # init itself runs as the mapped root too, never as host root.
    assert hostutil.status(init_pid(daemon, sandbox))["Uid"].split()[0] == str(HOST_ROOT_UID)


def test_only_loopback_network(daemon, sandbox):
    assert daemon.cli_ok("exec", sandbox, "--", "ls", "/sys/class/net").split() == ["lo"]
    links = daemon.cli_ok("exec", sandbox, "--", "ip", "-o", "link").strip().splitlines()
    assert len(links) == 1 and ": lo:" in links[0], links
    assert "UP" in links[0].split("<")[1].split(">")[0].split(","), links
    # Loopback works; the outside world is unreachable.
    assert daemon.cli_ok("exec", sandbox, "--", "ping", "-c", "1", "-W", "2", "127.0.0.1")
    r = daemon.cli("exec", "--timeout", "5", sandbox, "--", "nc", "-w", "2", "1.1.1.1", "53")
    assert r.returncode not in (0, 124), r


def test_hostname(daemon, make_sandbox):
    sid = make_sandbox()
    assert daemon.cli_ok("exec", sid, "--", "hostname").strip() == sid[:12]
    assert daemon.cli_ok("exec", sid, "--", "uname", "-n").strip() == sid[:12]
    named = make_sandbox("--hostname", "trial-box.local")
    assert daemon.cli_ok("exec", named, "--", "hostname").strip() == "trial-box.local"
    assert daemon.inspect(named)["sandbox"]["hostname"] == "trial-box.local"
    # Changing it needs CAP_SYS_ADMIN, which is not in the default set (as in Docker).
    host = socket.gethostname()
    r = daemon.cli("exec", sid, "--", "hostname", "changed-inside")
    assert r.returncode != 0 and "Operation not permitted" in r.stderr, r
    assert daemon.cli_ok("exec", sid, "--", "hostname").strip() == sid[:12]
    assert socket.gethostname() == host


def _caps(status_text: str) -> dict:
    out = {}
    for line in status_text.splitlines():
        key, _, value = line.partition(":")
        out[key] = value.strip()
    return out


@pytest.mark.parametrize("user", ["root", "alice"])
def test_capabilities_nonewprivs_seccomp(daemon, sandbox, user):
    st = _caps(daemon.cli_ok("exec", "-u", user, sandbox, "--", "cat", "/proc/self/status"))
    want_eff = DOCKER_CAP_MASK if user == "root" else 0
    assert int(st["CapEff"], 16) == want_eff, f"{user}: CapEff {st['CapEff']}"
    assert int(st["CapPrm"], 16) == want_eff, f"{user}: CapPrm {st['CapPrm']}"
    assert int(st["CapInh"], 16) == 0
    assert int(st["CapAmb"], 16) == 0
    assert int(st["CapBnd"], 16) == DOCKER_CAP_MASK, f"{user}: CapBnd {st['CapBnd']}"
    assert st["NoNewPrivs"] == "1"
    assert st["Seccomp"] == "2"


def test_masked_paths(daemon, sandbox):
    files = ["/proc/kcore", "/proc/keys", "/proc/latency_stats", "/proc/timer_list",
             "/proc/timer_stats", "/proc/sched_debug", "/proc/interrupts"]
    dirs = ["/proc/acpi", "/proc/asound", "/proc/scsi", "/sys/firmware"]
    checked_nonempty = 0
    for path in files:
        exists_on_host = os.path.exists(path)
        r = daemon.cli("exec", sandbox, "--", "sh", "-c",
                       f"test -e {path} || {{ echo absent; exit 0; }}; wc -c < {path}")
        assert r.returncode == 0, r.stderr
        if exists_on_host:
            assert r.stdout.strip() == "0", f"{path} is not masked: {r.stdout!r}"
            with open(path, "rb") as f:
                checked_nonempty += bool(f.read(1))
        else:
            # Absent on this kernel (e.g. no CONFIG_PROC_KCORE): absent inside too.
            assert r.stdout.strip() == "absent", f"{path}: {r.stdout!r}"
    assert checked_nonempty >= 1, "no masked file with host content to compare against"
    for path in dirs:
        if not os.path.isdir(path):
            continue
        out = daemon.cli_ok("exec", sandbox, "--", "ls", "-A", path)
        assert out == "", f"{path} is not masked: {out!r}"
    # Masks cannot be removed from inside.
    r = daemon.cli("exec", sandbox, "--", "umount", "/proc/interrupts")
    assert r.returncode != 0


def test_proc_sys_read_only(daemon, sandbox):
    r = daemon.cli("exec", sandbox, "--", "sh", "-c", "echo x > /proc/sys/kernel/hostname")
    assert r.returncode != 0 and "Read-only file system" in r.stderr, r
    r = daemon.cli("exec", sandbox, "--", "sh", "-c", "echo h > /proc/sysrq-trigger")
    assert r.returncode != 0, r
    mounts = daemon.cli_ok("exec", sandbox, "--", "cat", "/proc/mounts").splitlines()
    sys_mounts = [m.split() for m in mounts if m.split()[1] == "/proc/sys"]
    assert sys_mounts and "ro" in sys_mounts[-1][3].split(","), sys_mounts
    # /sys is read-only as a whole.
    r = daemon.cli("exec", sandbox, "--", "sh", "-c", "echo 1 > /sys/kernel/profiling")
    assert r.returncode != 0


@pytest.mark.parametrize("user", ["root", "alice"])
def test_denied_syscalls(daemon, sandbox, user):
    out = daemon.cli_ok("exec", "-u", user, sandbox, "--", "berth-probe")
    results = dict(line.split("=", 1) for line in out.split())
    for call in ("keyctl", "add_key", "unshare_user", "mount", "bpf", "setns"):
        assert results.get(call) == "EPERM", f"{call}: {results.get(call)} ({user})"
    assert results.get("unshare_mnt") == "EPERM", results
    r = daemon.cli("exec", "-u", user, sandbox, "--", "unshare", "-U", "true")
    assert r.returncode != 0 and "Operation not permitted" in r.stderr, r


def test_mounts_do_not_leak(daemon, sandbox):
    # Nothing the sandbox mounts shows in the host's table (the helper mounts in a namespace
    # of its own), and nothing of the host's table shows inside.
    host_mounts = Path("/proc/self/mountinfo").read_text()
    assert str(daemon.runtime_dir) not in host_mounts
    assert str(daemon.state_dir) not in host_mounts
    inside = daemon.cli_ok("exec", sandbox, "--", "cat", "/proc/mounts").splitlines()
    points = [line.split()[1] for line in inside]
    assert points[0] == "/" and inside[0].split()[2] == "overlay", inside
    allowed = ("/proc", "/sys", "/dev")
    # berth's /etc/hosts, /etc/hostname and /etc/resolv.conf (as Docker's): binds of a tmpfs of
    # the sandbox's own, nothing of the host's.
    provided = {"/etc/hosts", "/etc/hostname", "/etc/resolv.conf"}
    for line in inside:
        if line.split()[1] in provided:
            assert line.split()[2] == "tmpfs", line
    stray = [p for p in points[1:] if p not in provided
             and not any(p == a or p.startswith(a + "/") for a in allowed)]
    assert not stray, f"host mounts visible in the sandbox: {stray}"


def test_rootfs_is_copy_on_write(daemon, make_sandbox, busybox_rootfs):
    a, b = make_sandbox(), make_sandbox()
    daemon.cli_ok("exec", a, "--", "sh", "-c", "echo mine > /etc/written; rm /etc/group")
    assert daemon.cli_ok("exec", a, "--", "cat", "/etc/written") == "mine\n"
    # Neither the image nor the other sandbox sees the change.
    assert not (busybox_rootfs / "etc/written").exists()
    assert (busybox_rootfs / "etc/group").exists()
    assert daemon.cli("exec", b, "--", "cat", "/etc/written").returncode != 0
    assert daemon.cli_ok("exec", b, "--", "cat", "/etc/group").startswith("root:")
    # The write landed in a's upper layer, owned by its mapped root.
    upper = daemon.state_dir / "sandboxes" / a / "upper" / "etc" / "written"
    assert upper.read_text() == "mine\n"
    assert upper.stat().st_uid == HOST_ROOT_UID
