"""A sandbox's workdir: where relative exec cwds and relative copy paths start, kept across a
daemon restart."""


def test_workdir_for_exec_and_copy(daemon, busybox_rootfs, tmp_path):
    sid = daemon.create(busybox_rootfs, "--sandbox-workdir", "/home/alice")
    # exec: no cwd = the workdir, a relative cwd starts there.
    assert daemon.cli_ok("exec", sid, "--", "pwd") == "/home/alice\n"
    daemon.cli_ok("exec", sid, "--", "mkdir", "/home/alice/sub")
    assert daemon.cli_ok("exec", sid, "-w", "sub", "--", "pwd") == "/home/alice/sub\n"
    assert daemon.cli_ok("exec", sid, "-w", "/tmp", "--", "pwd") == "/tmp\n"

    # copy: a relative path and "ID:" (docker: the workdir) land under it.
    src = tmp_path / "note.txt"
    src.write_text("relative\n")
    daemon.cli_ok("cp", str(src), f"{sid}:sub/note.txt")
    assert daemon.cli_ok("exec", sid, "--", "cat", "/home/alice/sub/note.txt") == "relative\n"
    daemon.cli_ok("cp", str(src), f"{sid}:")
    assert daemon.cli_ok("exec", sid, "--", "cat", "/home/alice/note.txt") == "relative\n"
    out = daemon.cli_ok("fs", "stat", "--json", f"{sid}:note.txt")
    assert '"type": "file"' in out

    back = tmp_path / "back.txt"
    daemon.cli_ok("cp", f"{sid}:sub/note.txt", str(back))
    assert back.read_text() == "relative\n"
    daemon.cli_ok("rm", sid)


def test_workdir_must_be_absolute(daemon, busybox_rootfs):
    r = daemon.cli("create", "--rootfs", str(busybox_rootfs), "--sandbox-workdir", "rel/dir")
    assert r.returncode == 125
    assert "workdir: 'rel/dir' is not an absolute path" in r.stderr


def test_workdir_survives_a_daemon_restart(fresh_daemon, busybox_rootfs):
    sid = fresh_daemon.create(busybox_rootfs, "--sandbox-workdir", "/tmp")
    fresh_daemon.kill()
    fresh_daemon.restart()
    assert fresh_daemon.cli_ok("exec", sid, "--", "pwd") == "/tmp\n"
    fresh_daemon.cli_ok("rm", sid)
