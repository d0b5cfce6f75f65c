"""Issue 12: a copy whose berthd died after the copy landed was reported failed.

A copy's stream runs between the CLI (or the caller's pipe) and the sandbox's init without
passing through berthd; berthd only forwards the request and relays init's reply. Each test
stops berthd (SIGSTOP) once the stream is flowing, lets the copy finish, then kills berthd:
the data is where it should be, and the CLI must not say it failed — for a download it read
to the archive's end, that is success (with a warning); where it cannot know, it says the
copy may have completed.
"""
import hashlib
import io
import os
import select
import signal
import subprocess
import tarfile
import time
from pathlib import Path

import hostutil
from conftest import BERTH


def cli_popen(d, *args, **kw):
    env = dict(os.environ, BERTH_SOCKET=str(d.socket))
    return subprocess.Popen([str(BERTH), *map(str, args)], env=env, **kw)


def kill_stopped_daemon(d):
    d.proc.send_signal(signal.SIGKILL)
    d.proc.wait(timeout=10)
    d._wait_helper_gone(10)


def test_an_upload_landed_before_berthd_died_is_not_reported_failed(fresh_daemon,
                                                                     busybox_rootfs):
    d = fresh_daemon
    sid = d.create(busybox_rootfs)
    init_pid = d.inspect(sid)["sandbox"]["init_pid"]
    d.cli_ok("exec", sid, "--", "mkdir", "/dst")
    data = os.urandom(3 << 20)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("big")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    stream = buf.getvalue()
    p = cli_popen(d, "cp", "-", f"{sid}:/dst", stdin=subprocess.PIPE, stderr=subprocess.PIPE)
    # The pipe holds 64 KiB: once 1 MiB is written, init is reading it (berthd has passed the
    # request on).
    p.stdin.write(stream[:1 << 20])
    p.stdin.flush()
    os.kill(d.proc.pid, signal.SIGSTOP)
    try:
        p.stdin.write(stream[1 << 20:])
        p.stdin.close()
        landed = Path(f"/proc/{init_pid}/root/dst/big")
        hostutil.wait_for(lambda: landed.exists() and landed.stat().st_size == len(data), 30,
                          what="the upload to land in the sandbox")
    finally:
        kill_stopped_daemon(d)
    err = p.stderr.read().decode()
    assert p.wait(timeout=30) != 0
    assert "may have completed" in err and "copy again" in err, err
    # The sandbox lives on; a new daemon finds it, and the file is whole.
    d.start()
    out = d.cli_ok("exec", sid, "--", "sha256sum", "/dst/big")
    assert out.split()[0] == hashlib.sha256(data).hexdigest()
    # Copying again, as the message says one may, replaces it.
    r = subprocess.run([str(BERTH), "cp", "-", f"{sid}:/dst"], input=stream,
                       env=dict(os.environ, BERTH_SOCKET=str(d.socket)), capture_output=True)
    assert r.returncode == 0, r.stderr
    d.cli_ok("rm", "-f", sid)


def test_a_download_to_a_pipe_says_it_may_have_completed(fresh_daemon, busybox_rootfs):
    d = fresh_daemon
    sid = d.create(busybox_rootfs)
    d.cli_ok("exec", sid, "--", "sh", "-c", "head -c 3000000 /dev/urandom > /big")
    p = cli_popen(d, "cp", f"{sid}:/big", "-", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    fd = p.stdout.fileno()
    first = p.stdout.read(1 << 20)  # flowing: berthd has passed the request on
    os.kill(d.proc.pid, signal.SIGSTOP)
    chunks = [first]
    try:
        # No EOF comes while the CLI (waiting for berthd) holds its stdout: read until the
        # stream has stopped for a second with the whole file in it.
        while True:
            ready, _, _ = select.select([fd], [], [], 1.0)
            if not ready:
                if sum(map(len, chunks)) > 3000000:
                    break
                continue
            data = os.read(fd, 1 << 20)
            if not data:
                break
            chunks.append(data)
    finally:
        kill_stopped_daemon(d)
    rest = b"".join(chunks[1:]) + p.stdout.read()
    err = p.stderr.read().decode()
    assert p.wait(timeout=30) != 0
    assert "may have completed" in err, err
    with tarfile.open(fileobj=io.BytesIO(first + rest)) as tar:
        assert tar.getmember("big").size == 3000000
    d.start()
    d.cli_ok("rm", "-f", sid)


def test_a_download_read_to_its_end_succeeds_with_a_warning(fresh_daemon, busybox_rootfs,
                                                            tmp_path):
    d = fresh_daemon
    sid = d.create(busybox_rootfs)
    files = 20000
    d.cli_ok("exec", sid, "--", "sh", "-c",
             f"mkdir /t && cd /t && i=0; while [ $i -lt {files} ]; do echo $i > f$i; "
             "i=$((i+1)); done", timeout=120)
    dest = tmp_path / "out"
    dest.mkdir()
    p = cli_popen(d, "cp", f"{sid}:/t", str(dest), stdout=subprocess.PIPE,
                  stderr=subprocess.PIPE)
    # Files arriving: berthd has passed the request on. Stopped then, it cannot reply.
    deadline = time.monotonic() + 30
    while not (dest / "t").is_dir() or not any((dest / "t").iterdir()):
        assert p.poll() is None, "the copy ended before berthd could be stopped"
        assert time.monotonic() < deadline, "no file arrived"
        time.sleep(0.001)
    os.kill(d.proc.pid, signal.SIGSTOP)
    try:
        hostutil.wait_for(lambda: len(os.listdir(dest / "t")) == files, 60,
                          what="every file to arrive")
        time.sleep(0.5)  # the end-of-archive marker, read after the last file
    finally:
        kill_stopped_daemon(d)
    out, err = p.communicate(timeout=30)
    assert p.returncode == 0, err
    assert "archive arrived complete" in err.decode(), err
    assert (dest / "t" / f"f{files - 1}").read_text() == f"{files - 1}\n"
    d.start()
    d.cli_ok("rm", "-f", sid)
