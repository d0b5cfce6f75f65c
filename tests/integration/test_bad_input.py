"""Bad input gets a precise error naming the offending thing, and the daemon goes on serving."""
import errno
import os
import socket
import struct
import subprocess
import sys

import pytest

import berth_proto
from berth_proto import BerthError, pb

DEFAULT_MAX_FRAME = 4 << 20


def still_serves(daemon, sandbox):
    """A fresh connection can still run a command."""
    with daemon.connect() as c:
        assert c.exec(sandbox, ["echo", "ok"], timeout=20).check().out == "ok\n"


def expect_error(fn, code, *needles):
    with pytest.raises(BerthError) as info:
        fn()
    err = info.value
    assert err.code == code, f"expected {pb.ErrorCode.Name(code)}, got {err}"
    for needle in needles:
        assert needle in err.message, f"{needle!r} not named in {err.message!r}"
    return err


def exec_error(conn, sandbox, argv, **kw):
    res = conn.exec(sandbox, argv, timeout=20, **kw)
    assert res.exit is None, f"expected an error, the command ran: {res.exit}"
    assert res.error is not None
    return res.error


def test_malformed_frame_then_valid_request(daemon, sandbox):
    garbage = b"\xff" * 16  # an over-long varint tag: no valid ClientMessage
    with pytest.raises(Exception):
        pb.ClientMessage().ParseFromString(garbage)  # (the test's own premise)
    with daemon.connect() as c:
        c.send_frame(garbage)
        msg = c.recv_msg(timeout=5)
        assert msg is not None and msg.HasField("error"), msg
        assert msg.error.code == pb.INVALID_ARGUMENT, msg
        assert "malformed" in msg.error.message
        # The same connection serves the next request.
        assert c.exec(sandbox, ["echo", "after"], timeout=20).check().out == "after\n"
        assert any(s.id == sandbox for s in c.list())


def test_oversize_frame(daemon, sandbox):
    with daemon.connect() as c:
        assert c.hello_reply.max_frame_bytes == DEFAULT_MAX_FRAME
        c.send_raw(struct.pack(">I", DEFAULT_MAX_FRAME + 1) + b"\0" * 1024)
        msg = c.recv_msg(timeout=5)
        assert msg is not None and msg.HasField("error"), msg
        assert msg.error.code == pb.RESOURCE_EXHAUSTED, msg
        assert str(DEFAULT_MAX_FRAME + 1) in msg.error.message
        assert c.at_eof(5), "the connection stays open after an oversize frame"
    still_serves(daemon, sandbox)


def test_oversize_frame_with_custom_max(base_dir, busybox_rootfs):
    from conftest import Daemon
    d = Daemon(base_dir, max_frame=4096)
    d.start()
    try:
        with d.connect() as c:
            assert c.hello_reply.max_frame_bytes == 4096
            # Exactly the cap is fine (a valid, padded request)...
            msg = pb.ClientMessage(id=7, list=pb.ListSandboxes())
            body = msg.SerializeToString()
            # ...pad with an unknown field (number 100, bytes) to exactly 4096 bytes.
            pad = 4096 - len(body) - 4
            body += b"\xa2\x06" + bytes([0x80 | (pad & 0x7f), pad >> 7]) + b"p" * pad
            assert len(body) == 4096
            c.send_frame(body)
            reply = c.wait_reply(7, timeout=5)
            assert reply.HasField("list")
            c.send_frame(b"\0" * 4097)
            err = c.recv_msg(timeout=5)
            assert err.error.code == pb.RESOURCE_EXHAUSTED and "4097" in err.error.message
            assert c.at_eof(5)
        with d.connect() as c:
            assert c.list() == []
    finally:
        problems = d.cleanup()
        assert not problems, problems


def test_request_before_hello_refused(daemon, sandbox):
    with daemon.connect(hello=False) as c:
        err = expect_error(lambda: c.list(), pb.INVALID_ARGUMENT, "Hello")
        assert err.request_id != 0
        err = expect_error(lambda: c.call("exec", pb.Exec(sandbox=sandbox, argv=["true"])),
                           pb.INVALID_ARGUMENT, "Hello")
        # Nothing ran, and Hello is still accepted afterwards.
        c.hello()
        assert any(s.id == sandbox for s in c.list())


def test_wrong_protocol_version_refused(daemon, sandbox):
    with daemon.connect(hello=False) as c:
        err = expect_error(lambda: c.hello(version=2), pb.INVALID_ARGUMENT, "2", "1")
        assert "version" in err.message
        assert c.at_eof(5), "a client speaking another protocol version is not disconnected"
    with daemon.connect(hello=False) as c:
        expect_error(lambda: c.hello(version=0), pb.INVALID_ARGUMENT, "version")
    still_serves(daemon, sandbox)


def test_unknown_sandbox(daemon, sandbox, conn):
    err = exec_error(conn, "deadbeefcafe", ["true"])
    assert err.code == pb.NOT_FOUND and "deadbeefcafe" in err.message, err
    expect_error(lambda: conn.inspect("no-such-box"), pb.NOT_FOUND, "no-such-box")
    expect_error(lambda: conn.delete("no-such-box"), pb.NOT_FOUND, "no-such-box")
    r = daemon.cli("exec", "no-such-box", "--", "true")
    assert r.returncode == 125 and "no-such-box" in r.stderr, r
    still_serves(daemon, sandbox)


def refused_both_ways(daemon, sandbox, conn, needle, cli_flag, **exec_args):
    """The exec is refused with NOT_FOUND naming `needle`, over the protocol and through the
    CLI (exit 125, message on stderr); the daemon then serves the next request."""
    err = exec_error(conn, sandbox, ["true"], **exec_args)
    assert err.code == pb.NOT_FOUND and needle in err.message, err
    r = daemon.cli("exec", cli_flag, needle, sandbox, "--", "true")
    assert r.returncode == 125 and needle in r.stderr, r
    still_serves(daemon, sandbox)


def test_unknown_user(daemon, sandbox, conn):
    err = exec_error(conn, sandbox, ["true"], user="alice:nosuchgroup")
    assert err.code == pb.NOT_FOUND and "nosuchgroup" in err.message, err
    refused_both_ways(daemon, sandbox, conn, "mallory", "-u", user="mallory")


def test_nonexistent_cwd(daemon, sandbox, conn):
    refused_both_ways(daemon, sandbox, conn, "/no/such/dir", "-w", cwd="/no/such/dir")


def test_empty_argv(daemon, sandbox, conn):
    err = exec_error(conn, sandbox, [])
    assert err.code == pb.INVALID_ARGUMENT and "argv" in err.message, err
    err = exec_error(conn, sandbox, [""])
    assert err.code == pb.INVALID_ARGUMENT, err
    still_serves(daemon, sandbox)


def test_unknown_executable(daemon, sandbox, conn):
    err = exec_error(conn, sandbox, ["no-such-program", "arg"])
    assert err.code == pb.NOT_FOUND and "no-such-program" in err.message, err
    err = exec_error(conn, sandbox, ["/bin/no-such-program"])
    assert err.code == pb.NOT_FOUND and "/bin/no-such-program" in err.message, err
    # Not executable: permission denied, naming it.
    err = exec_error(conn, sandbox, ["/etc/passwd"])
    assert err.code == pb.PERMISSION_DENIED and "/etc/passwd" in err.message, err
    r = daemon.cli("exec", sandbox, "--", "no-such-program")
    assert r.returncode == 125 and "no-such-program" in r.stderr, r
    still_serves(daemon, sandbox)


def test_unknown_request_kind(daemon, sandbox, conn):
    conn.send(pb.ClientMessage(id=99))  # no body at all
    msg = conn.recv_msg(timeout=5)
    assert msg.id == 99 and msg.error.code == pb.INVALID_ARGUMENT, msg
    still_serves(daemon, sandbox)


def test_create_nonexistent_rootfs(daemon, sandbox, conn, base_dir):
    missing = str(base_dir / "no-such-rootfs")
    expect_error(lambda: conn.create(missing), pb.NOT_FOUND, missing)
    expect_error(lambda: conn.create("relative/rootfs"), pb.INVALID_ARGUMENT, "relative/rootfs")
    expect_error(lambda: conn.create(""), pb.INVALID_ARGUMENT, "rootfs")
    r = daemon.cli("create", "--rootfs", missing)
    assert r.returncode == 125 and missing in r.stderr, r
    # A file is not a rootfs.
    f = base_dir / "a-file"
    f.write_text("x")
    expect_error(lambda: conn.create(str(f)), pb.INVALID_ARGUMENT, str(f))
    # Nothing half-made is left behind.
    assert {p.name for p in (daemon.runtime_dir / "sandboxes").iterdir()} <= \
        {s.id for s in conn.list()}
    still_serves(daemon, sandbox)


def test_duplicate_name(daemon, busybox_rootfs, make_sandbox, conn):
    first = make_sandbox("--name", "dup-name")
    r = daemon.cli("create", "--rootfs", busybox_rootfs, "--name", "dup-name")
    assert r.returncode == 125 and "dup-name" in r.stderr, r
    expect_error(lambda: conn.create(busybox_rootfs, name="dup-name"), pb.ALREADY_EXISTS,
                 "dup-name")
    expect_error(lambda: conn.create(busybox_rootfs, name="bad name!"), pb.INVALID_ARGUMENT,
                 "bad name!")
    # The name still refers to the first sandbox.
    assert daemon.cli_ok("exec", "dup-name", "--", "hostname").strip() == first[:12]


def test_bad_resources(daemon, busybox_rootfs, conn):
    expect_error(lambda: conn.create(busybox_rootfs, memory_bytes=1 << 20), pb.INVALID_ARGUMENT,
                 "memory")
    expect_error(lambda: conn.create(busybox_rootfs, cpus=-1), pb.INVALID_ARGUMENT, "cpus")
    expect_error(lambda: conn.create(busybox_rootfs, hostname="bad_host name"),
                 pb.INVALID_ARGUMENT, "bad_host name")


# ---- peers outside the group ------------------------------------------------------------

# Runs as nobody: connects, sends the given Hello frame, prints what came back.
_NOBODY_CLIENT = r"""
import os, socket, struct, sys
path, hello = sys.argv[1], bytes.fromhex(sys.argv[2])
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(10)
try:
    s.connect(path)
except OSError as e:
    print("connect-errno", e.errno)
    sys.exit(0)
print("connected")
try:
    s.sendall(hello)
except OSError as e:
    print("send-errno", e.errno)
data = b""
while True:
    try:
        chunk = s.recv(65536)
    except (ConnectionResetError, socket.timeout) as e:
        print("recv-error", type(e).__name__)
        break
    if not chunk:
        print("eof")
        break
    data += chunk
print("data", data.hex())
"""


def run_as_nobody(path):
    hello = pb.ClientMessage(id=1, hello=pb.Hello(protocol_version=1, client="nobody"))
    frame = berth_proto.encode_frame(hello.SerializeToString())
    r = subprocess.run([sys.executable, "-c", _NOBODY_CLIENT, path, frame.hex()],
                       user=65534, group=65534, extra_groups=[], capture_output=True, text=True,
                       timeout=30, cwd="/")
    assert r.returncode == 0, r.stderr
    return r.stdout.split("\n")


def test_peer_outside_group_refused(daemon, sandbox):
    mode = os.stat(daemon.socket).st_mode & 0o777
    assert mode == 0o660, oct(mode)
    out = run_as_nobody(daemon.socket)
    assert out[0] == f"connect-errno {errno.EACCES}", out

    # With the file mode opened up, berthd itself refuses the peer by its credentials.
    os.chmod(daemon.socket, 0o666)
    try:
        out = run_as_nobody(daemon.socket)
    finally:
        os.chmod(daemon.socket, 0o660)
    assert out[0] == "connected", out
    # Closed after the error frame: EOF, or a reset because our Hello was never read.
    assert "eof" in out or "recv-error ConnectionResetError" in out, \
        f"berthd did not close the connection: {out}"
    data = bytes.fromhex([line for line in out if line.startswith("data")][0].split()[1])
    (length,) = struct.unpack(">I", data[:4])
    msg = pb.ServerMessage()
    msg.ParseFromString(data[4:4 + length])
    assert msg.HasField("error") and msg.error.code == pb.PERMISSION_DENIED, msg
    assert "65534" in msg.error.message and "berth" in msg.error.message, msg
    # Only that error frame: nothing was served.
    assert len(data) == 4 + length
    still_serves(daemon, sandbox)
