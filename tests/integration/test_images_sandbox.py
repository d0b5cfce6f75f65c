"""Sandboxes from images pulled from a real registry (Debian's docker-registry on loopback,
images built by umoci and pushed by skopeo: tests/registry/fixture.py), through the real
berthd and berth-images: the files a sandbox sees are exactly the image's, its config is
honoured, sandboxes share layers, re-pulls transfer nothing, auth, corrupt blobs, cut
connections and a daemon killed mid-pull.

Needs root (the fixture builds images with umoci; berthd), docker-registry, skopeo, umoci."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import BERTH, REPO_ROOT, Daemon
import hostutil

sys.path.insert(0, str(REPO_ROOT / "tests/registry"))
import fixture as fx  # noqa: E402

# Paths whose content is the sandbox's own, not the image's.
IGNORE = fx.DEFAULT_IGNORE + ("/etc/hosts", "/etc/hostname", "/etc/resolv.conf")


@pytest.fixture(scope="module")
def images():
    return {"busybox": fx.busybox_layout(), "debian": fx.debian_layered_layout(),
            "index": fx.index_layout()}


@pytest.fixture(scope="module")
def registry(base_dir, images):
    with fx.Registry(base_dir / "registry-open") as reg:
        reg.pushed = {
            "busybox": fx.push_oci_layout(images["busybox"].layout, "latest", reg,
                                          "berth-test/busybox", "latest"),
            "busybox-entrypoint": fx.push_oci_layout(images["busybox"].layout,
                                                     "alice-entrypoint", reg,
                                                     "berth-test/busybox", "alice-entrypoint"),
            "debian": fx.push_oci_layout(images["debian"].layout, "latest", reg,
                                         "berth-test/debian", "v1"),
            "index": fx.push_oci_layout(images["index"].layout, "latest", reg,
                                        "berth-test/multi", "latest"),
        }
        yield reg


@pytest.fixture(scope="module")
def daemon(base_dir):
    d = Daemon(base_dir).start()
    yield d
    d.stop()


@pytest.fixture
def fresh_daemon(base_dir):
    """A daemon with an empty image store: the blobs a test serves are not there already."""
    d = Daemon(base_dir).start()
    yield d
    d.stop()


def layers_dir(d: Daemon) -> Path:
    return d.state_dir / "images/layers"


def pull(d: Daemon, ref: str, *args, **kw) -> str:
    return d.cli_ok("pull", "--quiet", *args, ref, timeout=300, **kw)


def image_named(d: Daemon, ref: str):
    for img in json.loads(d.cli_ok("images", "--json")):
        if ref in (img.get("name"), img.get("reference")) or ref.endswith(img.get("name", "")):
            return img
    return None


def listing_in(d: Daemon, sandbox: str) -> dict:
    out = d.cli_ok("exec", sandbox, "--", "sh", "-c", fx.SANDBOX_LISTING_SH, timeout=300)
    return fx.parse_sandbox_listing(out)


def test_busybox_pulled_by_tag_is_exactly_the_image(daemon, registry, images):
    ref = registry.ref("berth-test/busybox", "latest")
    pull(daemon, ref)
    sandbox = daemon.cli_ok("create", ref).strip()
    try:
        info = daemon.inspect(sandbox)["sandbox"]
        assert info["image_digest"] == registry.pushed["busybox"]
        fx.assert_listing_equal(fx.read_listing(images["busybox"].listing),
                                listing_in(daemon, sandbox), ignore=IGNORE)
    finally:
        daemon.cli_ok("rm", sandbox)


def test_debian_layers_by_digest_apply_whiteouts_and_opaque_dirs(daemon, registry, images):
    ref = registry.ref("berth-test/debian", registry.pushed["debian"])
    pull(daemon, ref)
    sandbox = daemon.cli_ok("create", ref).strip()
    try:
        seen = listing_in(daemon, sandbox)
        for path in fx.DEBIAN_EXPECT["absent"]:
            assert path not in seen, f"{path} was deleted by a later layer but is visible"
        for path, content in fx.DEBIAN_EXPECT["present"].items():
            assert daemon.cli_ok("exec", sandbox, "--", "cat", path) == content
        fx.assert_listing_equal(fx.read_listing(images["debian"].listing), seen, ignore=IGNORE)
    finally:
        daemon.cli_ok("rm", sandbox)


def test_image_config_is_honoured(daemon, registry):
    ref = registry.ref("berth-test/busybox", "latest")
    pull(daemon, ref)
    # Cmd ["sh"] with stdin at EOF: runs and exits 0.
    r = daemon.cli("run", "--rm", ref)
    assert r.returncode == 0, r.stderr
    out = daemon.cli_ok("run", "--rm", ref, "--", "sh", "-c",
                        'pwd; echo "$BERTH_TEST_IMAGE"; id -u; echo "$PATH"')
    cwd, marker, uid, path = out.splitlines()
    assert (cwd, marker, uid) == ("/home/alice", "busybox", "0")
    assert "/bin" in path.split(":")
    # The exec's own environment wins over the image's.
    out = daemon.cli_ok("run", "--rm", "-e", "BERTH_TEST_IMAGE=mine", ref, "--", "sh", "-c",
                        'echo "$BERTH_TEST_IMAGE"')
    assert out == "mine\n"

    ep = registry.ref("berth-test/busybox", "alice-entrypoint")
    pull(daemon, ep)
    assert daemon.cli_ok("run", "--rm", ep) == "entrypoint: from-cmd\n"
    assert daemon.cli_ok("run", "--rm", ep, "--", "given") == "entrypoint: given\n"
    assert daemon.cli_ok("run", "--rm", "--entrypoint", "id", ep, "--", "-u") == "1000\n"
    sandbox = daemon.cli_ok("create", ep).strip()
    try:
        # User alice from the config; -u overrides it.
        assert daemon.cli_ok("exec", sandbox, "--", "id", "-u") == "1000\n"
        assert daemon.cli_ok("exec", "-u", "root", sandbox, "--", "id", "-u") == "0\n"
    finally:
        daemon.cli_ok("rm", sandbox)


def test_index_pull_picks_this_hosts_platform(daemon, registry, images):
    ref = registry.ref("berth-test/multi", "latest")
    pull(daemon, ref)
    sandbox = daemon.cli_ok("create", ref).strip()
    try:
        r = daemon.cli("exec", sandbox, "--", "cat", "/etc/berth-platform")
        assert r.returncode != 0, "the arm64 image's marker file is visible: wrong platform"
        assert daemon.cli_ok("exec", sandbox, "--", "cat", "/home/alice/hello.txt")
    finally:
        daemon.cli_ok("rm", sandbox)


def test_repeated_pull_transfers_no_layer(daemon, registry):
    ref = registry.ref("berth-test/debian", "v1")
    pull(daemon, ref)
    before = registry.blob_gets()
    pull(daemon, ref)
    assert registry.blob_gets() == before


def _du_bytes(path: Path) -> int:
    out = subprocess.run(["du", "-s", "-B1", "-x", str(path)], capture_output=True, text=True,
                         check=True).stdout
    return int(out.split()[0])


def test_twenty_sandboxes_share_the_image_layers(daemon, registry):
    ref = registry.ref("berth-test/debian", "v1")
    pull(daemon, ref)
    layer_names = sorted(p.name for p in layers_dir(daemon).iterdir())
    layers_size = _du_bytes(layers_dir(daemon))
    sandboxes_dir = daemon.state_dir / "sandboxes"
    before = _du_bytes(sandboxes_dir) if sandboxes_dir.exists() else 0
    ids = []
    try:
        for _ in range(20):
            ids.append(daemon.cli_ok("create", ref).strip())
        for sandbox in ids:
            daemon.cli_ok("exec", sandbox, "--", "sh", "-c", "echo x > /root/mark")
        # No layer copied or added, and the sandboxes' own disk use is their upper dirs only.
        assert sorted(p.name for p in layers_dir(daemon).iterdir()) == layer_names
        assert _du_bytes(layers_dir(daemon)) == layers_size
        grown = _du_bytes(sandboxes_dir) - before
        assert grown < 20 * 256 * 1024, (
            f"20 sandboxes added {grown} bytes; the image's layers are {layers_size}")
        # Every sandbox's overlay has the same lowers: the image's four layer directories
        # in the store, top first.
        lowers_seen = set()
        for sandbox in ids:
            pid = daemon.inspect(sandbox)["sandbox"]["init_pid"]
            mounts = Path(f"/proc/{pid}/mountinfo").read_text()
            root_line = next(line for line in mounts.splitlines() if " / / " in line)
            options = root_line.split(" - ", 1)[1].split()[2].split(",")
            lowers = [o.split("=", 1)[1] for o in options if o.startswith("lowerdir")]
            if len(lowers) == 1:  # kernels before 6.8 show one "lowerdir=a:b:c"
                lowers = lowers[0].split(":")
            assert len(lowers) == 4, root_line
            assert all(Path(p).parent == layers_dir(daemon) for p in lowers), root_line
            lowers_seen.add(tuple(lowers))
        assert len(lowers_seen) == 1, lowers_seen
    finally:
        for sandbox in ids:
            daemon.cli("rm", sandbox)


def test_token_auth_pull_with_and_without_credentials(base_dir, daemon, images, tmp_path):
    with fx.Registry(base_dir / "registry-token", auth="token") as reg:
        fx.push_oci_layout(images["busybox"].layout, "latest", reg, "private/busybox", "v1")
        ref = reg.ref("private/busybox", "v1")
        r = daemon.cli("pull", "--quiet", ref, env={"HOME": str(tmp_path)}, timeout=120)
        assert r.returncode != 0
        assert "authentication" in r.stderr or "credentials" in r.stderr, r.stderr
        assert image_named(daemon, ref) is None
        bad = tmp_path / "bad.json"
        reg.write_docker_config(bad, credentials=("berth", "wrong-password"))
        r = daemon.cli("pull", "--quiet", "--authfile", bad, ref, timeout=120)
        assert r.returncode != 0 and "berth" in r.stderr, r.stderr
        good = reg.write_docker_config(tmp_path / "good.json")
        pull(daemon, ref, "--authfile", good)
        assert daemon.cli_ok("run", "--rm", ref, "--", "cat", "/home/alice/hello.txt")
        assert any(t["status"] == 200 for t in reg.token_server.requests)


def test_basic_auth_pull(base_dir, daemon, images, tmp_path):
    with fx.Registry(base_dir / "registry-basic", auth="basic") as reg:
        fx.push_oci_layout(images["busybox"].layout, "latest", reg, "basic/busybox", "v1")
        ref = reg.ref("basic/busybox", "v1")
        r = daemon.cli("pull", "--quiet", ref, env={"HOME": str(tmp_path)}, timeout=120)
        assert r.returncode != 0 and "authentication" in r.stderr, r.stderr
        pull(daemon, ref, "--authfile", reg.write_docker_config(tmp_path / "auth.json"))


def test_a_blob_with_the_wrong_digest_is_refused(base_dir, fresh_daemon, images):
    with fx.Registry(base_dir / "registry-corrupt") as reg:
        fx.push_oci_layout(images["busybox"].layout, "latest", reg, "bad/busybox", "v1")
        layer = fx.layout_layers(images["busybox"].layout, "latest")[0]
        layer_digest = layer["digest"] if isinstance(layer, dict) else layer
        reg.corrupt_blob(layer_digest)
        ref = reg.ref("bad/busybox", "v1")
        r = fresh_daemon.cli("pull", "--quiet", ref, timeout=120)
        assert r.returncode != 0
        assert layer_digest.split(":")[1][:12] in r.stderr, r.stderr
        assert image_named(fresh_daemon, ref) is None
        assert layer_digest.split(":")[1] not in os.listdir(fresh_daemon.state_dir /
                                                            "images/blobs/sha256")
        assert fresh_daemon.alive()


def test_a_connection_cut_mid_layer_is_resumed(base_dir, fresh_daemon, images):
    with fx.Registry(base_dir / "registry-cut") as reg:
        fx.push_oci_layout(images["debian"].layout, "latest", reg, "cut/debian", "v1")
        with fx.CuttingProxy(reg.host, cut_after_bytes=3 << 20, cut_times=2) as proxy:
            ref = f"{proxy.host}/cut/debian:v1"
            pull(fresh_daemon, ref)
            cut = [r for r in proxy.requests if r["cut"]]
            assert len(cut) == 2, proxy.requests
            resumed = [r for r in proxy.requests if r["range"]]
            assert resumed and all(r["range"].startswith("bytes=") for r in resumed)
        sandbox = fresh_daemon.cli_ok("create", ref).strip()
        try:
            assert fresh_daemon.cli_ok("exec", sandbox, "--", "cat", "/etc/berth-test/c") == "c\n"
        finally:
            fresh_daemon.cli_ok("rm", sandbox)


def test_daemon_killed_mid_pull_leaves_nothing_trusted(base_dir, images):
    d = Daemon(base_dir).start()
    try:
        with fx.Registry(base_dir / "registry-kill") as reg:
            fx.push_oci_layout(images["debian"].layout, "latest", reg, "kill/debian", "v1")
            with fx.CuttingProxy(reg.host, cut_after_bytes=8 << 20, cut_times=1,
                                 mode="stall") as proxy:
                ref = f"{proxy.host}/kill/debian:v1"
                puller = subprocess.Popen(
                    [str(BERTH), "pull", "--quiet", ref],
                    env={**os.environ, "BERTH_SOCKET": d.socket}, stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE, text=True)
                deadline = time.monotonic() + 60
                while proxy.cuts == 0:
                    assert time.monotonic() < deadline, "the pull never reached the stall"
                    assert puller.poll() is None, puller.communicate()
                    time.sleep(0.05)
                workers = [p for p in _children_named(d.proc.pid, "berth-images")]
                workers += [p for p in hostutil.descendants(d.proc.pid)
                            if hostutil.comm(p) == "berth-fetch"]
                assert len(workers) == 2, workers  # berth-images and the pull's fetcher
                d.kill()
                puller.wait(timeout=30)
                assert puller.returncode != 0
                for pid in workers:
                    _wait_gone(pid)
            store = d.state_dir / "images"
            d.start()
            assert image_named(d, ref) is None
            # What is left is complete blobs and layers, nothing half-written under a name.
            ingest = store / "ingest"
            assert not ingest.exists() or not any(ingest.iterdir())
            for layer in (store / "layers").iterdir():
                assert not layer.name.startswith("."), f"a temporary layer dir {layer}"
            ref = reg.ref("kill/debian", "v1")
            pull(d, ref)
            sandbox = d.cli_ok("create", ref).strip()
            assert d.cli_ok("exec", sandbox, "--", "cat", "/etc/berth-test/c") == "c\n"
            d.cli_ok("rm", sandbox)
    finally:
        d.stop()



def test_the_registry_fetcher_has_no_privilege_and_sees_no_berth_state(base_dir, fresh_daemon,
                                                                       images):
    """The process that reads a registry's bytes (berth-images' fetcher), caught while a blob
    download stalls: berthd's user, no capability in any set, no_new_privs, a seccomp filter,
    pid 1 of a pid namespace of its own, and berth's runtime and state directories empty in
    its mount namespace. The pull's cancel ends it."""
    import pwd

    d = fresh_daemon
    berth = pwd.getpwnam("berth")
    with fx.Registry(base_dir / "registry-fetcher") as reg:
        fx.push_oci_layout(images["busybox"].layout, "latest", reg, "fetch/busybox", "v1")
        with fx.CuttingProxy(reg.host, cut_after_bytes=64 << 10, cut_times=1,
                             mode="stall") as proxy:
            ref = f"{proxy.host}/fetch/busybox:v1"
            puller = subprocess.Popen(
                [str(BERTH), "pull", "--quiet", ref],
                env={**os.environ, "BERTH_SOCKET": d.socket}, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, text=True)
            try:
                deadline = time.monotonic() + 60
                while proxy.cuts == 0:
                    assert time.monotonic() < deadline, "the pull never reached the stall"
                    assert puller.poll() is None, puller.communicate()
                    time.sleep(0.05)
                fetchers = [p for p in hostutil.descendants(d.images_pid)
                            if hostutil.comm(p) == "berth-fetch"]
                assert len(fetchers) == 1, fetchers
                pid = fetchers[0]
                st = hostutil.status(pid)
                assert st["Uid"].split() == [str(berth.pw_uid)] * 4, st["Uid"]
                assert st["Gid"].split() == [str(berth.pw_gid)] * 4, st["Gid"]
                assert st["Groups"] == "", st["Groups"]
                for key in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
                    assert int(st[key], 16) == 0, f"{key} {st[key]}"
                assert st["NoNewPrivs"] == "1"
                assert st["Seccomp"] == "2"
                # Every thread (the downloads run on threads of their own).
                for t in os.listdir(f"/proc/{pid}/task"):
                    tst = hostutil.status(int(t))
                    assert int(tst["CapEff"], 16) == 0 and tst["Seccomp"] == "2", t
                assert st["NSpid"].split()[-1] == "1", st["NSpid"]
                for ns in ("pid", "mnt"):
                    assert os.readlink(f"/proc/{pid}/ns/{ns}") != \
                        os.readlink(f"/proc/{d.images_pid}/ns/{ns}"), ns
                # Its root: a read-only tmpfs with the host's /usr and /etc, four device
                # nodes and its own /proc; nothing else of the host (no /home, /tmp, /var,
                # /run; so neither berth's runtime dir with its sockets nor the store).
                root = f"/proc/{pid}/root"
                top = set(os.listdir(root))
                assert {"usr", "etc", "dev", "proc"} <= top, top
                assert top <= {"usr", "etc", "dev", "proc", "bin", "sbin", "lib", "lib64",
                               "lib32", "libx32", "run"}, top
                assert sorted(os.listdir(root + "/dev")) == ["null", "random", "urandom",
                                                             "zero"]
                for hidden in (d.runtime_dir, d.state_dir, Path("/tmp"), Path("/home")):
                    assert not os.path.exists(root + str(hidden)), hidden
                assert (d.runtime_dir / "berth.sock").exists()  # (it is there outside)
                mounts = open(f"/proc/{pid}/mountinfo").read().splitlines()
                root_mount = [m for m in mounts if m.split()[4] == "/"]
                assert root_mount and "ro" in root_mount[0].split()[5].split(","), mounts
                usr = [m for m in mounts if m.split()[4] == "/usr"]
                assert usr and "ro" in usr[0].split()[5].split(","), mounts
                # Its /proc is its namespace's: itself and nothing else.
                assert [p for p in os.listdir(root + "/proc") if p.isdigit()] == ["1"]
            finally:
                # The client goes: its pull is cancelled, and the fetcher goes with it.
                puller.kill()
                puller.wait()
            hostutil.wait_for(lambda: not hostutil.pid_alive(pid), 15,
                              what=f"the fetcher {pid} to exit once its pull was cancelled")
        assert image_named(d, ref) is None
        # The daemon still pulls through a new fetcher.
        direct = reg.ref("fetch/busybox", "v1")
        pull(d, direct)
        assert image_named(d, direct) is not None
        assert not [p for p in hostutil.descendants(d.images_pid) if hostutil.comm(p) == "berth-fetch"]


def _children_named(pid: int, name: str):

    return [p for p in hostutil.children(pid) if hostutil.comm(p) == name]


def _wait_gone(pid: int, timeout: float = 15):

    hostutil.wait_for(lambda: not hostutil.pid_alive(pid), timeout,
                      what=f"berth-images {pid} to exit once berthd was killed")


def test_registries_conf_points_docker_io_at_a_lab_registry(base_dir, images, tmp_path):
    """An offline lab: docker.io rewritten to a loopback registry, and (second daemon) a
    mirror tried before a docker.io location that does not answer."""
    with fx.Registry(base_dir / "registry-lab") as reg:
        fx.push_oci_layout(images["busybox"].layout, "latest", reg, "library/busybox", "lab")
        rewrite = tmp_path / "rewrite.conf"
        rewrite.write_text(f'[[registry]]\nprefix = "docker.io"\nlocation = "{reg.host}"\n')
        mirror = tmp_path / "mirror.conf"
        mirror.write_text('[[registry]]\nprefix = "docker.io"\nlocation = "127.0.0.1:1"\n'
                          f'[[registry.mirror]]\nlocation = "{reg.host}"\n')
        for conf in (rewrite, mirror):
            d = Daemon(base_dir, extra_args=["--registries-conf", str(conf)]).start()
            try:
                pull(d, "busybox:lab")
                assert image_named(d, "docker.io/library/busybox:lab") is not None
                assert d.cli_ok("run", "--rm", "busybox:lab", "--", "cat",
                                "/home/alice/hello.txt")
            finally:
                d.stop()
        bad = tmp_path / "bad.conf"
        bad.write_text('[[registry]]\nprefix = "docker.io"\nlocaton = "typo:5000"\n')
        d = Daemon(base_dir, extra_args=["--registries-conf", str(bad)]).start()
        try:
            r = d.cli("pull", "--quiet", "busybox:lab", timeout=60)
            assert r.returncode != 0 and "locaton" in r.stderr, r.stderr
        finally:
            d.stop()
