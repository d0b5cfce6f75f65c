"""File transfer's bad input gets a clear error naming the path, leaves nothing partial
behind, and the daemon goes on serving: NUL in a path, over-long paths and names, missing
sources, a file where a directory is expected, CopyIn/CopyOut without a pipe or with the
wrong fd, unknown sandboxes, broken and truncated tar streams, a client that goes away
mid-upload, and full filesystems on both sides (a small tmpfs as the sandboxes' state dir,
and as the host destination)."""
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

import hostutil
import transferutil as tu
from berth_proto import BerthError, pb
from conftest import Daemon
from transferutil import MiB, fails, ok, sh


@pytest.fixture(scope="module")
def sb(daemon, busybox_rootfs):
    return daemon.create(busybox_rootfs)


@pytest.fixture
def work(base_dir, request):
    d = base_dir / "transfer-bad" / request.node.name
    d.mkdir(parents=True)
    yield d
    subprocess.run(["rm", "-rf", str(d)], check=False)


def still_copies(daemon, sandbox):
    """The daemon still serves a good upload and download, over a fresh connection and
    through the CLI."""
    with daemon.connect() as c:
        c.upload(sandbox, "/good", tu.tar_bytes([tu.tar_file("g", b"good\n")]))
        data, reply = c.download(sandbox, "/good/g")
        assert b"good\n" in data and reply.bytes == 5, reply
    r = ok(daemon, "cp", f"{sandbox}:/good/g", "-")
    assert tu.tar_names(r.stdout) == ["g"]


def expect_error(fn, code=None, *needles):
    with pytest.raises(BerthError) as info:
        fn()
    err = info.value
    if code is not None:
        assert err.code == code, f"expected {pb.ErrorCode.Name(code)}, got {err}"
    for needle in needles:
        assert needle in err.message, f"{needle!r} not named in {err.message!r}"
    return err


def all_ops(c, sandbox, path):
    """Each file operation on `path`, as a callable."""
    small = tu.tar_bytes([tu.tar_file("x", b"x")])
    return {
        "copy_in": lambda: c.upload(sandbox, path, small, timeout=20),
        "copy_out": lambda: c.download(sandbox, path, timeout=20),
        "stat_path": lambda: c.stat_path(sandbox, path, timeout=20),
        "make_dirs": lambda: c.make_dirs(sandbox, path, timeout=20),
        "remove_path": lambda: c.remove_path(sandbox, path, recursive=True, timeout=20),
    }


def upper_listing(daemon, sandbox) -> list:
    upper = daemon.upper_dir(sandbox)
    return sorted(str(p.relative_to(upper)) for p in upper.rglob("*"))


# ---- paths ---------------------------------------------------------------------------------

def test_nul_in_path(daemon, sb, conn):
    for op, fn in all_ops(conn, sb, "/tmp/a\0b").items():
        err = expect_error(fn, pb.INVALID_ARGUMENT)
        assert "NUL" in err.message and "path" in err.message, (op, err)
    assert not [p for p in upper_listing(daemon, sb) if p.startswith("tmp/a")]
    still_copies(daemon, sb)


def test_over_long_path_and_name(daemon, sb, conn, work):
    long_path = "/tmp/" + "/".join(["d" * 200] * 21)  # 4,225 bytes
    long_name = "/tmp/" + "n" * 256
    assert len(long_path) > 4096
    # Named: the path (its start), or the component that is too long.
    for path, needle in ((long_path, long_path[:60]), (long_name, "n" * 30)):
        for op, fn in all_ops(conn, sb, path).items():
            err = expect_error(fn, pb.INVALID_ARGUMENT)
            assert "too long" in err.message, (op, err.message[:300])
            assert needle in err.message, (op, err.message[:300])
    src = work / "f"
    src.write_text("f\n")
    fails(daemon, "cp", src, f"{sb}:{long_name}", needles=["too long", "n" * 30])
    fails(daemon, "cp", src, f"{sb}:{long_path}", needles=["too long"])
    fails(daemon, "cp", f"{sb}:{long_name}", work / "out", needles=["too long"])
    fails(daemon, "fs", "mkdir", f"{sb}:{long_path}", needles=["too long"])
    # In a tar stream: an entry whose name has a component over 255 bytes.
    data = tu.tar_bytes([tu.tar_file("ok", b"ok"), tu.tar_file("n" * 256, b"x")])
    fails(daemon, "cp", "-", f"{sb}:/tmp/longname", input=data, needles=["n" * 256])
    assert not [p for p in upper_listing(daemon, sb)
                if p.startswith("tmp/longname") or p.startswith("tmp/d")], upper_listing(daemon, sb)
    assert not (work / "out").exists()
    still_copies(daemon, sb)


def test_missing_source_both_ways(daemon, sb, conn, work):
    missing = work / "no-such-file"
    fails(daemon, "cp", missing, f"{sb}:/tmp/", needles=[str(missing)])
    fails(daemon, "cp", "-a", work / "no-such-dir" / ".", f"{sb}:/tmp/x",
          needles=[str(work / "no-such-dir")])
    fails(daemon, "cp", f"{sb}:/no/such/file", work / "out", needles=["/no/such/file"])
    fails(daemon, "cp", f"{sb}:/no/such/dir/.", work / "out", needles=["/no/such/dir"])
    fails(daemon, "cp", f"{sb}:/no/such/file", "-", needles=["/no/such/file"])
    assert os.listdir(work) == []
    expect_error(lambda: conn.download(sb, "/no/such/file"), pb.NOT_FOUND, "/no/such/file")
    assert conn.stat_path(sb, "/no/such/file").type == pb.PathStat.MISSING
    assert conn.stat_path(sb, "/no/such").type == pb.PathStat.MISSING
    expect_error(lambda: conn.remove_path(sb, "/etc/no-such-file"), pb.NOT_FOUND,
                 "/etc/no-such-file")
    still_copies(daemon, sb)
    # The path as given, also when a parent is what is missing (file_ops.h: "all errors are
    # SysError naming the path as given").
    expect_error(lambda: conn.remove_path(sb, "/no/such/file"), pb.NOT_FOUND, "/no/such/file")
    fails(daemon, "fs", "rm", f"{sb}:/no/such/file", needles=["/no/such/file"])


def test_destination_is_a_file(daemon, sb, conn, work):
    passwd = sh(daemon, sb, "cat /etc/passwd")
    f = work / "f.txt"
    f.write_text("f\n")
    d = work / "dir"
    d.mkdir()
    (d / "a").write_text("a\n")
    fails(daemon, "cp", f, f"{sb}:/etc/passwd/", needles=["/etc/passwd"])
    fails(daemon, "cp", f, f"{sb}:/etc/passwd/sub/f.txt", needles=["/etc/passwd"])
    fails(daemon, "cp", d, f"{sb}:/etc/passwd", needles=["/etc/passwd"])
    fails(daemon, "fs", "mkdir", f"{sb}:/etc/passwd", needles=["/etc/passwd"])
    # A tar with a directory where a file is.
    data = tu.tar_bytes([tu.tar_dir("passwd"), tu.tar_file("passwd/x", b"x")])
    fails(daemon, "cp", "-", f"{sb}:/etc", input=data, needles=["passwd"])
    err = expect_error(lambda: conn.upload(sb, "/etc/passwd", tu.tar_bytes(
        [tu.tar_file("x", b"x")])), None, "/etc/passwd")
    assert "ot a directory" in err.message, err
    assert sh(daemon, sb, "cat /etc/passwd") == passwd
    assert "etc/passwd" not in upper_listing(daemon, sb)
    # Downloads: a directory onto a host file, a file under a host file.
    host_file = work / "host-file"
    host_file.write_text("keep\n")
    fails(daemon, "cp", f"{sb}:/etc", host_file, needles=[str(host_file)])
    fails(daemon, "cp", f"{sb}:/etc/passwd", f"{host_file}/", needles=[str(host_file)])
    fails(daemon, "cp", f"{sb}:/etc/passwd", host_file / "x", needles=[str(host_file)])
    assert host_file.read_text() == "keep\n"
    still_copies(daemon, sb)


def test_exactly_one_side_in_a_sandbox(daemon, sb, work):
    f = work / "f"
    f.write_text("f\n")
    fails(daemon, "cp", f, work / "g", needles=["SANDBOX:PATH"])
    fails(daemon, "cp", f"{sb}:/etc/passwd", f"{sb}:/tmp/x", needles=["SANDBOX:PATH"])
    fails(daemon, "cp", "-", "-", needles=["SANDBOX:PATH"])
    assert sorted(os.listdir(work)) == ["f"]
    # "./a:b" is a host path (a slash before the colon), so this is host-to-host too.
    fails(daemon, "cp", f, f"./{sb}:x", needles=["SANDBOX:PATH"], cwd=str(work))
    still_copies(daemon, sb)


# ---- the pipe ------------------------------------------------------------------------------

def berthd_fds(daemon) -> int:
    return hostutil.fd_count(daemon.proc.pid)


def test_copy_needs_exactly_one_pipe(daemon, sb, conn, work):
    baseline = berthd_fds(daemon)
    regular = work / "regular"
    regular.write_bytes(tu.tar_bytes([tu.tar_file("x", b"x")]))
    starts = {"copy_in": lambda fds: conn.start_copy_in(sb, "/tmp/fdtest", fds),
              "copy_out": lambda fds: conn.start_copy_out(sb, "/etc/passwd", fds)}
    for op, start in starts.items():
        # No fd at all.
        expect_error(lambda: conn.wait_reply(start(None), 20), pb.INVALID_ARGUMENT)
        # A regular file.
        fd = os.open(regular, os.O_RDWR)
        try:
            expect_error(lambda: conn.wait_reply(start(fd), 20), pb.INVALID_ARGUMENT)
        finally:
            os.close(fd)
        # A socket.
        a, b = socket.socketpair()
        try:
            expect_error(lambda: conn.wait_reply(start(a.fileno()), 20), pb.INVALID_ARGUMENT)
        finally:
            a.close()
            b.close()
        # Two pipes.
        p1, p2 = os.pipe(), os.pipe()
        try:
            expect_error(lambda: conn.wait_reply(start([p1[0], p2[1]]), 20),
                         pb.INVALID_ARGUMENT)
        finally:
            for fd in p1 + p2:
                os.close(fd)
    # The wrong end of a pipe: an error (whichever), not a hang.
    r, w = os.pipe()
    try:
        expect_error(lambda: conn.wait_reply(conn.start_copy_in(sb, "/tmp/fdtest", w), 20))
        expect_error(lambda: conn.wait_reply(conn.start_copy_out(sb, "/etc/passwd", r), 20))
    finally:
        os.close(r)
        os.close(w)
    # Requests that take no fd drop one that comes along.
    r, w = os.pipe()
    try:
        rid = conn.request_with_fds("stat_path", pb.StatPath(sandbox=sb, path="/etc"), [r])
        try:
            conn.wait_reply(rid, 20)
        except BerthError as e:
            assert e.code == pb.INVALID_ARGUMENT, e
    finally:
        os.close(r)
        os.close(w)
    assert "tmp/fdtest" not in upper_listing(daemon, sb)
    still_copies(daemon, sb)
    # berthd keeps none of the fds it was sent.
    hostutil.wait_for(lambda: berthd_fds(daemon) <= baseline, 5,
                      what=f"berthd's fds to come back to {baseline} (now {berthd_fds(daemon)})")


def test_unknown_sandbox(daemon, sb, conn, work):
    for op, fn in all_ops(conn, "no-such-box", "/tmp").items():
        expect_error(fn, pb.NOT_FOUND, "no-such-box")
    f = work / "f"
    f.write_text("f\n")
    fails(daemon, "cp", f, "no-such-box:/tmp/", needles=["no-such-box"])
    fails(daemon, "cp", "no-such-box:/etc/passwd", work / "out", needles=["no-such-box"])
    fails(daemon, "fs", "rm", "no-such-box:/tmp", needles=["no-such-box"])
    assert sorted(os.listdir(work)) == ["f"]
    still_copies(daemon, sb)


# ---- broken streams and clients that go away -----------------------------------------------

def test_broken_and_truncated_tar(daemon, sb, work):
    sh(daemon, sb, "mkdir -p /keep && echo old > /keep/f")
    before = upper_listing(daemon, sb)
    fails(daemon, "cp", "-", f"{sb}:/garbage", input=b"\x42" * 4096)
    # A valid header, then the stream ends in the middle of the file's data: nothing under
    # the final name, no temporary left, and an existing file of that name keeps its content.
    whole = tu.tar_bytes([tu.tar_file("other", b"o\n"), tu.tar_file("f", b"N" * MiB)])
    cut = whole[:len(whole) // 2]
    fails(daemon, "cp", "-", f"{sb}:/keep", input=cut, needles=["f"])
    fails(daemon, "cp", "-", f"{sb}:/truncated-new", input=cut)
    # A checksum error in the second header.
    bad = bytearray(tu.tar_bytes([tu.tar_file("a", b"a"), tu.tar_file("b", b"b")]))
    second = [i for i in range(0, len(bad), 512) if bad[i:i + 1] == b"b"][0]
    bad[second + 148:second + 156] = b"0000000\0"
    fails(daemon, "cp", "-", f"{sb}:/badsum", input=bytes(bad))
    assert sh(daemon, sb, "cat /keep/f; ls -A /keep") == "old\nf\n"
    assert upper_listing(daemon, sb) == before, sorted(set(upper_listing(daemon, sb)) ^
                                                       set(before))
    still_copies(daemon, sb)


def test_client_gone_mid_upload(daemon, sb, work):
    sh(daemon, sb, "mkdir -p /gone")
    before = upper_listing(daemon, sb)
    # Over the protocol: the connection closes while the pipe is still open.
    c = daemon.connect()
    r, w = os.pipe()
    c.start_copy_in(sb, "/gone", r)
    os.close(r)
    stream = tu.tar_bytes([tu.tar_file("half", b"H" * (8 * MiB))])
    written = 0
    os.set_blocking(w, False)
    deadline = time.monotonic() + 10
    while written < 2 * MiB and time.monotonic() < deadline:
        try:
            written += os.write(w, stream[written:written + 65536])
        except BlockingIOError:
            time.sleep(0.01)
    assert written >= 2 * MiB, "the daemon did not read the CopyIn stream"
    c.close()
    try:
        hostutil.wait_for(lambda: upper_listing(daemon, sb) == before, 10,
                          what="the abandoned upload to be removed")
    finally:
        os.close(w)

    # Through the CLI: `berth cp - SB:/gone` killed in the middle of a file.
    env = dict(os.environ, BERTH_SOCKET=daemon.socket)
    p = subprocess.Popen([str(tu.BERTH), "cp", "-", f"{sb}:/gone"], env=env,
                         stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    try:
        # As much of the stream as the CLI takes within a second, not all of it.
        os.set_blocking(p.stdin.fileno(), False)
        sent, deadline = 0, time.monotonic() + 1.0
        while sent < 3 * MiB and time.monotonic() < deadline:
            try:
                sent += os.write(p.stdin.fileno(), stream[sent:sent + 65536])
            except BlockingIOError:
                time.sleep(0.01)
        assert sent > 0, "berth cp - read nothing from stdin"
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait(10)
        p.stdin.close()
    hostutil.wait_for(lambda: upper_listing(daemon, sb) == before, 10,
                      what="the killed CLI's upload to be removed")
    still_copies(daemon, sb)


# ---- full filesystems ----------------------------------------------------------------------

@pytest.fixture
def small_tmpfs(base_dir, request):
    """Mounts small tmpfs's under the test's dir: mount(size) -> path. Unmounted after."""
    mounted = []

    def mount(size: str, name: str) -> Path:
        p = base_dir / "transfer-tmpfs" / f"{request.node.name}-{name}"
        p.mkdir(parents=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs",
                        str(p)], check=True)
        mounted.append(p)
        return p

    yield mount
    for p in reversed(mounted):
        if subprocess.run(["umount", str(p)]).returncode != 0:
            subprocess.run(["umount", "-l", str(p)])
        p.rmdir()


def free_bytes(path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def test_no_space_left_in_sandbox(base_dir, busybox_rootfs, small_tmpfs, work):
    mnt = small_tmpfs("8m", "state")
    d = Daemon(base_dir, state_dir=mnt / "state")
    d.start()
    try:
        sid = d.create(busybox_rootfs)
        sh(d, sid, "mkdir /dst")
        before = upper_listing(d, sid)
        free_before = free_bytes(mnt)
        big = work / "big-nospace.bin"
        tu.write_pattern_file(big, 20 * MiB)
        fails(d, "cp", big, f"{sid}:/dst/", needles=["No space left", "big-nospace.bin"])
        assert upper_listing(d, sid) == before, upper_listing(d, sid)
        assert free_bytes(mnt) >= free_before - 64 * 1024, "the partial file still takes space"
        # A tree that runs out of space midway, to a missing destination: none of it stays.
        tree = work / "tree"
        tree.mkdir()
        for i in range(5):
            tu.write_pattern_file(tree / f"part{i}", 3 * MiB, seed=i)
        fails(d, "cp", tree, f"{sid}:/tree-dst", needles=["No space left"])
        assert upper_listing(d, sid) == before, upper_listing(d, sid)
        # Over the protocol: the same error, named.
        with d.connect() as c:
            stream = tu.tar_bytes([tu.tar_file("raw-big", big.read_bytes())])
            expect_error(lambda: c.upload(sid, "/dst", stream, timeout=60), None,
                         "No space left", "raw-big")
        assert upper_listing(d, sid) == before
        # The daemon serves the next request: a small upload works...
        small = work / "small.txt"
        small.write_text("small\n")
        ok(d, "cp", small, f"{sid}:/dst/")
        assert sh(d, sid, "cat /dst/small.txt") == "small\n"
        # ...and after the sandbox fills the disk itself, one fails until it removes stuff.
        d.cli("exec", sid, "--", "sh", "-c", "cat /bin/busybox /bin/busybox /bin/busybox "
              "/bin/busybox /bin/busybox /bin/busybox /bin/busybox /bin/busybox > /fill")
        small2 = work / "small2.txt"
        small2.write_bytes(b"s" * 200000)
        fails(d, "cp", small2, f"{sid}:/dst/", needles=["No space left", "small2.txt"])
        sh(d, sid, "rm /fill")
        ok(d, "cp", small2, f"{sid}:/dst/")
        assert sh(d, sid, "wc -c < /dst/small2.txt").strip() == "200000"
    finally:
        problems = d.cleanup()
        assert not problems, problems


def test_no_space_left_on_host(daemon, sb, small_tmpfs):
    mnt = small_tmpfs("4m", "dest")
    sh(daemon, sb, "mkdir -p /nospace/tree && head -c 8388608 /dev/urandom > /nospace/big8 && "
                   "for i in 1 2 3; do head -c 2097152 /dev/urandom > /nospace/tree/p$i; done")
    results = []
    for args in (["cp", f"{sb}:/nospace/big8", mnt],
                 ["cp", f"{sb}:/nospace/big8", mnt / "renamed"]):
        r = tu.berth(daemon, *args)
        assert r.returncode == 125, tu.describe(args, r)
        assert os.listdir(mnt) == [], os.listdir(mnt)
        results.append((args, r, str(args[2])))
    args = ["cp", f"{sb}:/nospace/tree", mnt]
    r = tu.berth(daemon, *args)
    assert r.returncode == 125, tu.describe(args, r)
    # No file is left half-written under its final name, nor a temporary.
    for dirpath, _, files in os.walk(mnt):
        for name in files:
            size = os.lstat(os.path.join(dirpath, name)).st_size
            assert name.startswith("p") and size == 2097152, (dirpath, name, size)
    results.append((args, r, str(mnt)))
    still_copies(daemon, sb)
    # The message is the host's error, naming the host path (not a consequence of it on the
    # sandbox's side, such as a broken pipe).
    for args, r, host_path in results:
        tu.check_failed(args, r, needles=["No space left", host_path])
