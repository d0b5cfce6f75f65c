"""Exec I/O over the protocol: large outputs arrive intact, concurrent execs on one connection
are kept apart by request id, stdin streams in chunks, and a background process holding the
output pipe does not hold up the result."""
import hashlib
import time

from berth_proto import pb


def test_large_output_intact(daemon, sandbox, conn):
    conn.exec(sandbox, ["sh", "-c", "head -c 6000000 /dev/urandom > /tmp/blob"]).check()
    digest = conn.exec(sandbox, ["md5sum", "/tmp/blob"]).check().out.split()[0]
    res = conn.exec(sandbox, ["cat", "/tmp/blob"], timeout=60).check()
    assert len(res.stdout) == 6000000
    assert hashlib.md5(res.stdout).hexdigest() == digest
    # The same through the CLI (binary-safe on stdout).
    r = daemon.cli("exec", sandbox, "--", "sh", "-c", "cat /tmp/blob | wc -c")
    assert r.stdout.strip() == "6000000"


def test_stdout_stderr_order_within_streams(daemon, sandbox, conn):
    res = conn.exec(sandbox, ["sh", "-c",
                              "i=0; while [ $i -lt 2000 ]; do echo o$i; echo e$i >&2; "
                              "i=$((i+1)); done"]).check()
    assert res.out.split() == [f"o{i}" for i in range(2000)]
    assert res.err.split() == [f"e{i}" for i in range(2000)]


def test_parallel_execs_on_one_connection(daemon, sandbox, conn):
    rids = {}
    for i in range(12):
        rid = conn.start_exec(sandbox, ["sh", "-c", f"sleep 1; echo exec-{i}; exit {i}"])
        rids[rid] = i
    t0 = time.monotonic()
    for rid, i in rids.items():
        res = conn.collect_exec(rid, timeout=20)
        assert res.error is None, res.error
        assert res.out == f"exec-{i}\n" and res.exit.exit_code == i, (i, res)
    # They ran concurrently (serially it would take 12 s).
    assert time.monotonic() - t0 < 6


def test_parallel_clients(daemon, sandbox):
    conns = [daemon.connect() for _ in range(8)]
    try:
        rids = [(c, c.start_exec(sandbox, ["sh", "-c", f"sleep 0.3; echo client-{n}"]))
                for n, c in enumerate(conns)]
        for n, (c, rid) in enumerate(rids):
            assert c.collect_exec(rid, timeout=20).check().out == f"client-{n}\n"
    finally:
        for c in conns:
            c.close()


def test_stdin_chunks_and_close(daemon, sandbox, conn):
    rid = conn.start_exec(sandbox, ["sh", "-c", "wc -c; echo second-read-done"], stdin=True)
    chunks = [bytes([65 + i % 26]) * 70000 for i in range(10)]
    for chunk in chunks:
        conn.send_input(rid, chunk)
    conn.send_input(rid, close=True)
    res = conn.collect_exec(rid, timeout=30).check()
    assert res.out.split() == [str(sum(map(len, chunks))), "second-read-done"]


def test_exec_input_for_unknown_exec(daemon, sandbox, conn):
    conn.send_input(777, b"data")
    msg = conn.recv_msg(timeout=5)
    assert msg.id == 777 and msg.error.code == pb.NOT_FOUND and "777" in msg.error.message


def test_background_process_does_not_hold_up_result(daemon, sandbox, conn):
    t0 = time.monotonic()
    res = conn.exec(sandbox, ["sh", "-c", "sleep 30 & echo main-done"], timeout=20).check()
    assert time.monotonic() - t0 < 5
    assert res.out == "main-done\n"
    conn.exec(sandbox, ["pkill", "sleep"])


def test_exit_statuses(daemon, sandbox, conn):
    for code in (0, 1, 2, 42, 255):
        res = conn.exec(sandbox, ["sh", "-c", f"exit {code}"])
        assert res.exit.exit_code == code and res.exit.signal == 0, res.exit
    res = conn.exec(sandbox, ["sh", "-c", "kill -SEGV $$"])
    assert res.exit.signal == 11 and not res.exit.oom_killed
    assert res.exit.duration_us > 0
