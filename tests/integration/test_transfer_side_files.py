"""Large files outside the tar stream: `berth cp` passes a large regular file itself (upload)
or an O_TMPFILE to fill (download) beside the stream's pipe, and the sandbox copies the data
in the kernel. The copies must be exact; berthd must let through only fds that cannot lead
anywhere else (a read-only regular file up, an empty anonymous writable file down)."""
import hashlib
import os
import socket
import subprocess

import pytest

import hostutil
from berth_proto import BerthError, pb


@pytest.fixture(scope="module")
def sb(daemon, busybox_rootfs):
    return daemon.create(busybox_rootfs)


@pytest.fixture
def work(base_dir, request):
    d = base_dir / "transfer-side" / request.node.name
    d.mkdir(parents=True)
    yield d
    subprocess.run(["rm", "-rf", str(d)], check=False)


def digest(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@pytest.mark.parametrize("mode", [0o640, 0o4755, 0o666])  # 0666: others may write: the stream
def test_large_file_round_trip(daemon, sb, work, mode):
    src = work / "big.bin"
    with open(src, "wb") as f:
        for i in range(24):
            f.write(os.urandom(64) + bytes([i]) * ((1 << 20) - 64))
    os.chmod(src, mode)
    os.utime(src, ns=(1_600_000_000_123_456_789, 1_600_000_000_123_456_789))
    want = digest(src)

    daemon.cli_ok("cp", str(src), f"{sb}:/side/big.bin")
    inside = daemon.cli_ok("exec", sb, "--", "sh", "-c",
                           "sha256sum /side/big.bin; stat -c '%a %s %Y %u' /side/big.bin")
    assert want in inside, inside
    assert f"{mode:o} {24 << 20} 1600000000 0" in inside, inside

    back = work / "back.bin"
    daemon.cli_ok("cp", f"{sb}:/side/big.bin", str(back))
    assert digest(back) == want
    st = os.stat(back)
    assert st.st_mode & 0o7777 == mode and st.st_mtime_ns == 1_600_000_000_123_456_789
    # Into an existing directory, under its own name; over an existing file.
    daemon.cli_ok("cp", f"{sb}:/side/big.bin", str(work))
    daemon.cli_ok("cp", f"{sb}:/side/big.bin", str(back))
    assert digest(work / "big.bin") == want and digest(back) == want
    # Nothing else appeared in the destination (no leftover temporaries).
    assert sorted(p.name for p in work.iterdir()) == ["back.bin", "big.bin"]
    daemon.cli_ok("fs", "rm", "-r", f"{sb}:/side")


def expect_invalid(fn, needle):
    with pytest.raises(BerthError) as info:
        fn()
    assert info.value.code == pb.INVALID_ARGUMENT, info.value
    assert needle in info.value.message, info.value.message


def test_only_safe_side_fds_get_through(daemon, sb, work):
    baseline = hostutil.fd_count(daemon.proc.pid)
    regular = work / "regular"
    regular.write_bytes(b"x" * 100)
    with daemon.connect() as conn:
        r, w = os.pipe()
        rw = os.open(regular, os.O_RDWR)
        dirfd = os.open(work, os.O_RDONLY | os.O_DIRECTORY)
        path_fd = os.open(regular, os.O_PATH)
        named_w = os.open(regular, os.O_WRONLY)
        tmp_full = os.open(work, os.O_TMPFILE | os.O_RDWR, 0o600)
        os.write(tmp_full, b"already data")
        tmp_ok = os.open(work, os.O_TMPFILE | os.O_RDWR, 0o600)
        ro = os.open(regular, os.O_RDONLY)
        a, b = socket.socketpair()
        try:
            up = lambda fds: conn.wait_reply(conn.start_copy_in(sb, "/tmp/side", fds), 20)
            down = lambda fds: conn.wait_reply(conn.start_copy_out(sb, "/etc/passwd", fds), 20)
            # Upload: read-only regular files only, at most 4.
            expect_invalid(lambda: up([r, rw]), "read-only")
            expect_invalid(lambda: up([r, dirfd]), "not an open regular file")
            expect_invalid(lambda: up([r, path_fd]), "not an open regular file")
            expect_invalid(lambda: up([r, a.fileno()]), "not an open regular file")
            expect_invalid(lambda: up([r, ro, ro, ro, ro, ro]), "too many fds")
            # Download: one empty O_TMPFILE, open for writing.
            expect_invalid(lambda: down([w, named_w]), "O_TMPFILE")
            expect_invalid(lambda: down([w, tmp_full]), "O_TMPFILE")
            expect_invalid(lambda: down([w, ro]), "O_TMPFILE")
            expect_invalid(lambda: down([w, tmp_ok, tmp_ok]), "too many fds")
        finally:
            for fd in (r, w, rw, dirfd, path_fd, named_w, tmp_full, tmp_ok, ro):
                os.close(fd)
            a.close()
            b.close()
    assert regular.read_bytes() == b"x" * 100
    hostutil.wait_for(lambda: hostutil.fd_count(daemon.proc.pid) <= baseline, 5,
                      what="berthd to keep none of the fds it was sent")
