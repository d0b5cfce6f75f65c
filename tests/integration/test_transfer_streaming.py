"""What the issue promises of streams that nothing else checks: data is streamed, never held
whole in memory (a file larger than the sandbox's memory limit goes through the tar stream,
and the client's memory stays small), and Cancel stops a copy, which then leaves nothing."""
import os
import subprocess
import time

import pytest

import hostutil
import transferutil as tu
from berth_proto import BerthError, pb
from transferutil import MiB


@pytest.fixture
def work(base_dir, request):
    d = base_dir / "transfer-streaming" / request.node.name
    d.mkdir(parents=True)
    yield d
    subprocess.run(["rm", "-rf", str(d)], check=False)


def test_file_larger_than_the_sandboxs_memory_streams(daemon, busybox_rootfs, work):
    sid = daemon.create(busybox_rootfs, "--memory", "48m")
    big = work / "big.bin"
    with open(big, "wb") as f:
        for i in range(160):
            f.write(bytes([i]) * MiB)
    # Others may write it: no side file, the data goes through the tar stream and the
    # sandbox's worker (in the 48 MiB cgroup) — held whole, it would be OOM-killed.
    os.chmod(big, 0o666)
    back = work / "back.bin"

    def peak_kib(*args) -> int:
        p = subprocess.Popen([str(tu.BERTH), *args], stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE,
                             env=dict(os.environ, BERTH_SOCKET=str(daemon.socket)))
        _, status, usage = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        err = p.stderr.read().decode(errors="replace")
        p.stderr.close()
        assert p.returncode == 0, f"berth {args}: {err}"
        return usage.ru_maxrss  # KiB; includes what a vfork'd child shares with us

    baseline = peak_kib("version")
    for args in ([str(big), f"{sid}:/big.bin"], [f"{sid}:/big.bin", str(back)]):
        # 160 MiB moved with a few MiB more than the CLI needs to say its version.
        peak = peak_kib("cp", *args)
        assert peak < baseline + 16 * 1024, f"berth cp peaked at {peak} KiB ({baseline} idle)"
    assert os.path.getsize(back) == 160 * MiB
    with open(back, "rb") as f:
        for i in range(160):
            assert f.read(MiB) == bytes([i]) * MiB, f"MiB {i} differs"
    info = daemon.inspect(sid)
    assert info["stats"].get("oom_kills", 0) in (0, "0"), info["stats"]
    daemon.cli_ok("rm", sid)


def test_cancel_stops_a_copy_and_it_leaves_nothing(daemon, busybox_rootfs):
    sid = daemon.create(busybox_rootfs)
    daemon.cli_ok("fs", "mkdir", f"{sid}:/c")
    upper = daemon.upper_dir(sid)
    before = sorted(p.name for p in (upper / "c").iterdir())
    stream = tu.tar_bytes([tu.tar_file("done", b"d" * 1000),
                           tu.tar_file("half", b"H" * (8 * MiB))])
    with daemon.connect() as c:
        r, w = os.pipe()
        rid = c.start_copy_in(sid, "/c", r)
        os.close(r)
        os.set_blocking(w, False)
        written, deadline = 0, time.monotonic() + 10
        while written < 2 * MiB and time.monotonic() < deadline:
            try:
                written += os.write(w, stream[written:written + 65536])
            except BlockingIOError:
                time.sleep(0.01)
        assert written >= 2 * MiB, "the sandbox did not read the stream"
        c.cancel(rid)
        with pytest.raises(BerthError) as info:
            c.wait_reply(rid, 20)
        assert info.value.code == pb.CANCELED, info.value
        os.close(w)
        # The connection still serves.
        assert c.stat_path(sid, "/c").type == pb.PathStat.DIRECTORY
    # "done" was complete before the cancel, "half" was not: the upload removes both.
    hostutil.wait_for(lambda: sorted(p.name for p in (upper / "c").iterdir()) == before, 10,
                      what="the canceled upload's files to be removed")
    daemon.cli_ok("rm", sid)
