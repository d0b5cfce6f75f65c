"""What berth's privileged processes keep, and what the processes that parse untrusted bytes
have: read from /proc/PID/status of the real processes of a running daemon.

- berth-helper, its janitor and berth-images' root part: exactly the capability sets chosen
  in their main()s (the lists below, which must change with them), no_new_privs, a seccomp
  filter;
- the layer unpack worker (caught while a tar stream stalls it): in a user namespace of its
  own holding the sandboxes' mapping, so it has no capability in the host's namespace, with
  no_new_privs and a seccomp filter;
- a sandbox below the confined helper: what it had before (test_namespaces checks its
  capability sets; here, that the calls the helper's filter denies behave the same).

Needs root."""
import os
import signal
import subprocess
import sys
import time

from conftest import BERTH
import hostutil

CAP = {
    "CHOWN": 0, "DAC_OVERRIDE": 1, "DAC_READ_SEARCH": 2, "FOWNER": 3, "FSETID": 4, "KILL": 5,
    "SETGID": 6, "SETUID": 7, "SETPCAP": 8, "NET_BIND_SERVICE": 10, "NET_ADMIN": 12,
    "NET_RAW": 13, "SYS_CHROOT": 18, "SYS_PTRACE": 19, "SYS_ADMIN": 21, "SYS_RESOURCE": 24,
    "MKNOD": 27, "AUDIT_WRITE": 29, "SETFCAP": 31,
}

# src/runtime/helper/helper_main.cc: helper_capabilities()
HELPER_CAPS = ["SYS_ADMIN", "SETUID", "SETGID", "CHOWN", "FOWNER", "DAC_OVERRIDE",
               "DAC_READ_SEARCH", "KILL", "SYS_PTRACE", "FSETID", "MKNOD", "SETFCAP", "NET_ADMIN",
               "NET_BIND_SERVICE"]
# src/runtime/images/images_main.cc: images_capabilities()
IMAGES_CAPS = ["SETUID", "SETGID", "CHOWN", "FOWNER", "FSETID", "DAC_OVERRIDE", "SETPCAP",
               "DAC_READ_SEARCH", "KILL", "SYS_ADMIN", "SYS_CHROOT", "MKNOD", "SETFCAP"]
# src/runtime/images/unpack_worker.cc: what the worker keeps inside its own namespace
WORKER_CAPS = ["CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "SETFCAP"]

HOST_ROOT_UID = 200000  # /etc/subuid: berth:200000:65536


def mask(names) -> int:
    return sum(1 << CAP[n] for n in names)


def status(pid: int) -> dict:
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            out[key] = value.strip()
    return out


def assert_confined(pid: int, caps, what: str):
    st = status(pid)
    want = mask(caps)
    for key in ("CapBnd", "CapPrm", "CapEff"):
        assert int(st[key], 16) == want, f"{what}: {key} {st[key]}, want {want:016x}"
    assert int(st["CapInh"], 16) == 0, what
    assert int(st["CapAmb"], 16) == 0, what
    assert st["NoNewPrivs"] == "1", what
    assert st["Seccomp"] == "2", what


def test_helper_janitor_and_images_keep_only_their_sets(daemon):
    assert_confined(daemon.helper_pid, HELPER_CAPS, "berth-helper")
    # Every thread (capabilities and filters are per thread).
    for t in os.listdir(f"/proc/{daemon.images_pid}/task"):
        assert_confined(int(t), IMAGES_CAPS, f"berth-images thread {t}")
    janitors = [p for p in hostutil.children(daemon.helper_pid)
                if open(f"/proc/{p}/comm").read().strip() == "berth-janitor"]
    assert janitors, "no berth-janitor below the helper"
    assert_confined(janitors[0], HELPER_CAPS, "berth-janitor")


def test_a_sandbox_below_the_confined_helper_sees_the_same_errors(daemon, make_sandbox):
    # io_uring_setup and keyctl are denied by both filters with EPERM: the sandbox's answers.
    sid = make_sandbox()
    r = daemon.cli("exec", sid, "--", "sh", "-c", "echo ok")
    assert r.returncode == 0 and r.stdout.strip() == "ok", r
    st = {k: v for k, v in (line.split(":\t", 1) for line in daemon.cli_ok(
        "exec", sid, "--", "cat", "/proc/self/status").splitlines() if ":\t" in line)}
    assert st["Seccomp"] == "2"
    # Two filters stacked: the helper's and the sandbox's own.
    if "Seccomp_filters" in st:
        assert int(st["Seccomp_filters"]) >= 2, st["Seccomp_filters"]


def test_the_unpack_worker_has_no_capability_on_the_host(daemon, tmp_path):
    # A layer big enough that its unpack is caught in the act, then stopped while it is read.
    sys.path.insert(0, os.path.dirname(__file__))
    from test_images import big_layout_tar
    tar = big_layout_tar(tmp_path, 300)
    layout = tmp_path / "layout"
    layout.mkdir()
    subprocess.run(["tar", "-xf", str(tar), "-C", str(layout)], check=True)
    os.chmod(tmp_path, 0o755)
    proc = subprocess.Popen([str(BERTH), "image", "import", str(layout), "--name", "it/priv:1"],
                            env=dict(os.environ, BERTH_SOCKET=daemon.socket),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen = None
    try:
        deadline = time.monotonic() + 120
        while seen is None and proc.poll() is None and time.monotonic() < deadline:
            for pid in hostutil.children(daemon.images_pid):
                try:
                    if open(f"/proc/{pid}/comm").read().strip() == "berth-unpack":
                        os.kill(pid, signal.SIGSTOP)
                        seen = pid
                        break
                except OSError:
                    pass
            time.sleep(0.002)
        assert seen, ("no unpack worker seen during the import",
                      proc.communicate() if proc.poll() is not None else "(still running)")
        try:
            st = status(seen)
            uid_map = open(f"/proc/{seen}/uid_map").read().split()
            gid_map = open(f"/proc/{seen}/gid_map").read().split()
            userns = os.readlink(f"/proc/{seen}/ns/user")
            # A root of its own: the host's /usr and /etc, four device nodes, nothing else.
            top = set(os.listdir(f"/proc/{seen}/root"))
            for hidden in (daemon.state_dir, daemon.runtime_dir, "/tmp", "/home", "/proc"):
                assert not os.path.exists(f"/proc/{seen}/root{hidden}"), hidden
        finally:
            os.kill(seen, signal.SIGCONT)
        assert {"usr", "etc", "dev"} <= top <= {"usr", "etc", "dev", "bin", "sbin", "lib",
                                                "lib64", "lib32", "libx32", "run"}, top
        # Its own namespace, holding the sandboxes' mapping: root inside is 200000 outside,
        # and the capabilities it keeps are over that namespace only.
        assert userns != os.readlink("/proc/self/ns/user")
        assert uid_map[:2] == ["0", str(HOST_ROOT_UID)], uid_map
        assert gid_map[:2] == ["0", str(HOST_ROOT_UID)], gid_map
        assert st["Uid"].split() == [str(HOST_ROOT_UID)] * 4, st["Uid"]
        assert st["Gid"].split() == [str(HOST_ROOT_UID)] * 4, st["Gid"]
        assert st["Groups"] == "", st["Groups"]
        for key in ("CapBnd", "CapPrm", "CapEff"):
            assert int(st[key], 16) == mask(WORKER_CAPS), f"{key} {st[key]}"
        assert int(st["CapInh"], 16) == 0 and int(st["CapAmb"], 16) == 0
        assert st["NoNewPrivs"] == "1"
        assert st["Seccomp"] == "2"
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # What it unpacked: owned by the sandboxes' root, in the store.
    layers = daemon.state_dir / "images/layers"
    dirs = [d for d in layers.iterdir() if not d.name.startswith(".")]
    big = [d for d in dirs if (d / "big.bin").exists()]
    assert big and (big[0] / "big.bin").stat().st_uid == HOST_ROOT_UID
    daemon.cli_ok("rmi", "it/priv:1")


def test_an_import_archive_is_read_by_the_unprivileged_worker(daemon, tmp_path):
    """The tar a client imports (here through a fifo, half written) is extracted by the unpack
    worker in its user namespace, not by berth-images' root part: caught while it waits for
    the rest of the stream."""
    sys.path.insert(0, os.path.dirname(__file__))
    from test_images import big_layout_tar
    data = big_layout_tar(tmp_path, 2).read_bytes()
    fifo = tmp_path / "archive.fifo"
    os.mkfifo(fifo)
    os.chmod(tmp_path, 0o755)
    proc = subprocess.Popen([str(BERTH), "image", "import", str(fifo), "--name", "it/archive:1"],
                            env=dict(os.environ, BERTH_SOCKET=daemon.socket),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        with open(fifo, "wb") as w:  # (opens once the CLI has opened it for reading)
            w.write(data[: len(data) // 2])
            w.flush()
            seen = None
            deadline = time.monotonic() + 60
            while seen is None and time.monotonic() < deadline:
                for pid in hostutil.children(daemon.images_pid):
                    try:
                        if (open(f"/proc/{pid}/comm").read().strip() == "berth-unpack" and
                                os.readlink(f"/proc/{pid}/fd/4") == str(fifo)):
                            seen = pid
                            break
                    except OSError:
                        pass
                time.sleep(0.01)
            assert seen, "no worker read the archive"
            st = status(seen)
            assert os.readlink(f"/proc/{seen}/ns/user") != os.readlink("/proc/self/ns/user")
            assert st["Uid"].split() == [str(HOST_ROOT_UID)] * 4, st["Uid"]
            for key in ("CapBnd", "CapPrm", "CapEff"):
                assert int(st[key], 16) == mask(WORKER_CAPS), f"{key} {st[key]}"
            assert st["NoNewPrivs"] == "1" and st["Seccomp"] == "2"
            w.write(data[len(data) // 2:])
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    daemon.cli_ok("rmi", "it/archive:1")



def test_image_documents_are_parsed_by_an_unprivileged_worker(daemon, tmp_path):
    """The JSON of an import (oci-layout, index.json, manifests, configs) and of the store's
    own documents (inspect: a sandbox's run settings) is parsed by berth-images' parse worker:
    berthd's user, no capability in any set, no_new_privs, a filter without sockets, its own
    pid and mount namespaces. One worker serves them all, and a new one replaces it if it
    dies."""
    import pwd
    sys.path.insert(0, os.path.dirname(__file__))
    from test_images import big_layout_tar
    tar = big_layout_tar(tmp_path, 1)
    daemon.cli_ok("image", "import", str(tar), "--name", "it/parse:1")
    try:
        def parsers():
            return [p for p in hostutil.descendants(daemon.images_pid) if hostutil.comm(p) == "berth-parse"]
        found = parsers()
        assert len(found) == 1, found
        pid = found[0]
        berth = pwd.getpwnam("berth")
        st = status(pid)
        assert st["Uid"].split() == [str(berth.pw_uid)] * 4, st["Uid"]
        assert st["Groups"] == "", st["Groups"]
        for key in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
            assert int(st[key], 16) == 0, f"{key} {st[key]}"
        assert st["NoNewPrivs"] == "1" and st["Seccomp"] == "2"
        assert st["NSpid"].split()[-1] == "1", st["NSpid"]
        assert not os.path.exists(f"/proc/{pid}/root{daemon.state_dir}")
        assert not os.path.exists(f"/proc/{pid}/root/tmp")
        # Inspect parses the stored config through the same worker.
        assert "it/parse:1" in daemon.cli_ok("image", "inspect", "it/parse:1")
        assert parsers() == [pid]
        # Killed (as a crash would): the next document gets a new worker.
        os.kill(pid, signal.SIGKILL)
        hostutil.wait_for(lambda: not hostutil.pid_alive(pid), 10, what="the parse worker to die")
        assert "it/parse:1" in daemon.cli_ok("image", "inspect", "it/parse:1")
        again = parsers()
        assert len(again) == 1 and again[0] != pid, again
    finally:
        daemon.cli_ok("rmi", "it/parse:1")
