"""The berth CLI against a real berthd: create/exec/ps/inspect/rm, run --rm, exit codes,
stdin, env, workdir, user, doctor, version."""
import json
import time

import hostutil


def test_create_exec_ps_inspect_rm(daemon, busybox_rootfs):
    sid = daemon.create(busybox_rootfs, "--name", "cli-basic")
    assert len(sid) == 32 and all(c in "0123456789abcdef" for c in sid)

    assert daemon.cli_ok("exec", sid, "--", "echo", "hello world") == "hello world\n"
    # By name and by unique id prefix too.
    assert daemon.cli_ok("exec", "cli-basic", "--", "echo", "by-name") == "by-name\n"
    assert daemon.cli_ok("exec", sid[:10], "--", "echo", "by-prefix") == "by-prefix\n"

    table = daemon.cli_ok("ps")
    assert table.splitlines()[0].split()[:5] == ["ID", "NAME", "OWNER", "PID", "STATE"]
    row = [line for line in table.splitlines() if line.startswith(sid[:12])]
    assert len(row) == 1 and "cli-basic" in row[0] and "running" in row[0], table

    assert sid in daemon.cli_ok("ps", "-q").split()

    listed = json.loads(daemon.cli_ok("ps", "--json"))
    mine = [s for s in listed["sandboxes"] if s["id"] == sid]
    assert len(mine) == 1
    assert mine[0]["name"] == "cli-basic"
    assert mine[0]["persistent"] is True
    assert mine[0]["rootfs"] == str(busybox_rootfs)
    assert mine[0]["state"] == "running"

    info = daemon.inspect(sid)
    sb = info["sandbox"]
    assert sb["id"] == sid
    assert sb["hostname"] == sid[:12]
    assert sb["host_root_uid"] == 200000
    assert sb["cgroup_driver"] == hostutil.CGROUP_DRIVER
    assert hostutil.pid_alive(sb["init_pid"]) and hostutil.comm(sb["init_pid"]) == "berth-init"
    # Named by the sandbox's id on v1; on v2 (no rename) by the shell it was made from.
    name = hostutil.cgroup_name(daemon.cgroup_parent, sid)
    assert name == sid or (hostutil.CGROUP_V2 and hostutil.is_shell_cgroup(name)), name
    for path in sb["cgroup_paths"]:
        assert path.endswith(f"/{daemon.cgroup_parent}/{name}")
        assert sb["init_pid"] in [int(x) for x in open(f"{path}/cgroup.procs").read().split()]
    assert {str(p) for p in hostutil.cgroup_dirs(daemon.cgroup_parent, sid) if p.exists()} \
        <= set(sb["cgroup_paths"])
    assert set(info["stats"]) >= {"cpu_usage_ns", "memory_bytes", "pids", "oom_kills"}
    assert int(info["stats"]["pids"]) >= 1  # init at least

    assert daemon.cli_ok("rm", sid).strip() == sid
    assert sid not in daemon.cli_ok("ps", "-q").split()
    hostutil.wait_for(lambda: not hostutil.pid_alive(sb["init_pid"]), 5, what="init to exit")
    assert not hostutil.cgroup_exists(daemon.cgroup_parent, sid)
    # A second rm fails; rm -f does not.
    r = daemon.cli("rm", sid)
    assert r.returncode != 0 and sid in r.stderr
    assert daemon.cli("rm", "-f", sid).returncode == 0


def test_rm_of_many_deletes_them_side_by_side(daemon, busybox_rootfs):
    """berth rm A B C sends its deletes at once (each one waits for its sandbox's processes
    to die, and those waits added up one after another); every id is printed once, a
    missing one is an error naming it (or skipped with -f), the rest are deleted anyway."""
    ids = [daemon.cli_ok("create", "--rootfs", busybox_rootfs).strip() for _ in range(6)]
    for sid in ids:  # something to kill in each
        daemon.cli_ok("exec", sid, "--", "sh", "-c", "sleep 1000 & sleep 1000 &")
    missing = "0" * 32
    r = daemon.cli("rm", ids[0], missing, *ids[1:3])
    assert r.returncode == 1 and missing in r.stderr, r
    assert sorted(r.stdout.split()) == sorted(ids[:3]), r.stdout
    r = daemon.cli("rm", "-f", *ids[3:], missing)
    assert r.returncode == 0 and not r.stderr, r
    assert sorted(r.stdout.split()) == sorted(ids[3:]), r.stdout
    assert not set(ids) & set(daemon.ids())
    assert not set(ids) & {p.name for p in hostutil.sandbox_cgroup_dirs(daemon.cgroup_parent)}


def test_run_rm_leaves_nothing(daemon, busybox_rootfs):
    before = set(daemon.ids())
    r = daemon.cli("run", "--rm", "--rootfs", busybox_rootfs, "--", "sh", "-c",
                   "echo ran; hostname; exit 7")
    assert r.returncode == 7, r.stderr
    assert r.stdout.startswith("ran\n")
    assert set(daemon.ids()) == before
    # Nothing of it remains on the host either.
    assert {p.name for p in (daemon.runtime_dir / "sandboxes").iterdir()} <= before
    assert {p.name for p in (daemon.state_dir / "sandboxes").iterdir()} <= before
    assert {p.name for p in hostutil.sandbox_cgroup_dirs(daemon.cgroup_parent)} <= before
    assert {p.stem for p in (daemon.runtime_dir / "meta").iterdir()} <= before


def test_run_rm_cleans_up_when_the_command_cannot_start(daemon, busybox_rootfs):
    before = set(daemon.ids())
    r = daemon.cli("run", "--rm", "--rootfs", busybox_rootfs, "--", "no-such-program")
    assert r.returncode == 125 and "no-such-program" in r.stderr, r
    # --rm means now, not once the lease of the dead connection runs out.
    assert set(daemon.ids()) == before, "run --rm left its sandbox behind after a failed exec"


def test_run_without_rm_keeps_sandbox(daemon, busybox_rootfs):
    r = daemon.cli("run", "--rootfs", busybox_rootfs, "--name", "run-kept", "--", "echo", "hi")
    assert r.returncode == 0 and r.stdout == "hi\n", r
    sid = r.stderr.strip()
    assert len(sid) == 32, r.stderr
    time.sleep(daemon.lease + 1)  # persistent: not subject to the lease
    assert sid in daemon.ids()
    assert daemon.cli_ok("exec", "run-kept", "--", "echo", "again") == "again\n"
    daemon.cli_ok("rm", sid)


def test_exit_codes_pass_through(daemon, sandbox):
    assert daemon.cli("exec", sandbox, "--", "sh", "-c", "exit 3").returncode == 3
    assert daemon.cli("exec", sandbox, "--", "false").returncode == 1
    assert daemon.cli("exec", sandbox, "--", "true").returncode == 0
    # Killed by a signal: 128 + signal, as a shell reports it.
    assert daemon.cli("exec", sandbox, "--", "sh", "-c", "kill -TERM $$").returncode == 128 + 15
    # A berth error (no such sandbox) is 125 with a message.
    r = daemon.cli("exec", "no-such-sandbox", "--", "true")
    assert r.returncode == 125 and "no-such-sandbox" in r.stderr


def test_stdout_and_stderr_are_separate(daemon, sandbox):
    r = daemon.cli("exec", sandbox, "--", "sh", "-c", "echo out; echo err >&2")
    assert r.returncode == 0
    assert r.stdout == "out\n"
    assert r.stderr == "err\n"


def test_stdin_interactive(daemon, sandbox):
    r = daemon.cli("exec", "-i", sandbox, "--", "cat", input="hello\n")
    assert r.returncode == 0, r.stderr
    assert r.stdout == "hello\n"
    big = "".join(f"line {i}\n" for i in range(20000))  # ~200 KB: several frames and pipe fills
    r = daemon.cli("exec", "-i", sandbox, "--", "wc", "-c", input=big)
    assert r.returncode == 0, r.stderr
    assert int(r.stdout.strip()) == len(big)
    # Without -i the command's stdin is /dev/null.
    r = daemon.cli("exec", sandbox, "--", "cat", input="ignored\n")
    assert r.returncode == 0 and r.stdout == ""


def test_env(daemon, sandbox):
    # The documented form: berth exec -e K=V [-e K=V] ID -- CMD...
    r = daemon.cli("exec", "-e", "FOO=bar baz", "-e", "EMPTY=", sandbox, "--",
                   "sh", "-c", 'echo "[$FOO][${EMPTY-unset}]"')
    assert r.returncode == 0, r.stderr
    assert r.stdout == "[bar baz][]\n"
    r = daemon.cli("exec", "-e", "PATH=/nowhere", sandbox, "--", "/bin/sh", "-c", "echo $PATH")
    assert r.returncode == 0, r.stderr
    assert r.stdout == "/nowhere\n"


def test_env_defaults_and_overrides(daemon, sandbox):
    # The same semantics through the protocol (independent of the CLI's option parsing).
    with daemon.connect() as c:
        res = c.exec(sandbox, ["sh", "-c", 'echo "[$FOO][${EMPTY-unset}][$PATH][$HOME]"'],
                     env=["FOO=bar baz", "EMPTY="]).check()
        assert res.out == ("[bar baz][][/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:"
                           "/sbin:/bin][/root]\n")
        res = c.exec(sandbox, ["/bin/sh", "-c", "echo $PATH $HOME"],
                     env=["PATH=/nowhere", "HOME=/tmp"]).check()
        assert res.out == "/nowhere /tmp\n"
        # Only what was given (plus PATH and HOME) reaches the command.
        res = c.exec(sandbox, ["env"], env=["A=1"]).check()
        assert sorted(res.out.split()) == sorted(
            ["A=1", "HOME=/root",
             "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"])


def test_workdir(daemon, sandbox):
    assert daemon.cli_ok("exec", "-w", "/tmp", sandbox, "--", "pwd") == "/tmp\n"
    assert daemon.cli_ok("exec", sandbox, "--", "pwd") == "/\n"


def test_user(daemon, sandbox):
    out = daemon.cli_ok("exec", "-u", "alice", sandbox, "--", "sh", "-c",
                        'echo $(id -u) $(id -g) $(id -G) $HOME')
    assert out.split() == ["1000", "1000", "1000", "50", "/home/alice"]
    out = daemon.cli_ok("exec", "-u", "1000:1000", sandbox, "--", "sh", "-c", 'echo $(id -u) $(id -g)')
    assert out.split() == ["1000", "1000"]
    out = daemon.cli_ok("exec", "-u", "nobody", sandbox, "--", "id", "-u")
    assert out.strip() == "65534"
    out = daemon.cli_ok("exec", "-u", "alice:staff", sandbox, "--", "id", "-g")
    assert out.strip() == "50"
    out = daemon.cli_ok("exec", sandbox, "--", "id", "-u")
    assert out.strip() == "0"
    # A user id absent from /etc/passwd is allowed numerically.
    out = daemon.cli_ok("exec", "-u", "4242", sandbox, "--", "sh", "-c", 'echo $(id -u) $(id -g)')
    assert out.split() == ["4242", "4242"]


def test_doctor(daemon):
    r = daemon.cli("doctor")
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    driver = [line for line in lines if line.startswith("cgroup driver:")]
    # The driver berthd picks on this host (v1 where cgroup2 has no controllers, as on a hybrid
    # host; v2 on a pure cgroup v2 host such as tests/vm's).
    want = hostutil.CGROUP_DRIVER
    assert driver and driver[0].split()[-1] == want, r.stdout
    assert any(line.startswith("daemon:") and f"(cgroup {want})" in line for line in lines), \
        r.stdout
    assert any("root inside = uid 200000" in line for line in lines), r.stdout


def test_doctor_without_daemon(daemon, base_dir):
    r = daemon.cli("doctor", env={"BERTH_SOCKET": str(base_dir / "nonexistent.sock")})
    assert r.returncode == 1
    assert "nonexistent.sock" in r.stdout


def test_version(daemon):
    r = daemon.cli("version")
    assert r.returncode == 0
    lines = r.stdout.splitlines()
    assert lines[0].startswith("berth client ")
    client_version = lines[0].split()[-1]
    assert lines[1] == f"berthd {client_version} (protocol 1)", r.stdout
