"""What a hostile image layer can do to the host, through the real berthd and berth-images
(issue 11, holes 1, 2 and the unpacked-size bound of 5), each attack as written and now
getting nothing:
- a layer holding a block device (a real loop device the test makes) and /dev/mem,
  /dev/null: nothing of it is a device in the store, and a sandbox writing there does not
  reach the loop file;
- a layer file with security.capability v2 cap_setuid+ep (and a v3 naming the host's root)
  and a setuid-root file: stored namespaced (v3, rootid = the sandboxes' root) and shifted;
  a host user outside group berth cannot reach the store, and even a reachable copy does
  not make it uid 0;
- STATE's modes are 0700 again at every start;
- an image whose layer expands past the bound (zeros, many entries) is refused with the
  layer and the limit named, nothing left, the daemon up.

Needs root, losetup, getcap and a C compiler (scripts/install-deps)."""
import gzip
import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO_ROOT, Daemon

sys.path.insert(0, str(REPO_ROOT / "tests/registry"))
import fixture as fx  # noqa: E402

HOSTILE = REPO_ROOT / "tests/rootfs-tools/hostile_layers.py"
NOBODY = 65534

SETUID_PROGRAM = r"""
#include <stdio.h>
#include <unistd.h>
int main(void) {
    int rc = setuid(0);
    printf("setuid=%d uid=%d euid=%d\n", rc, (int)getuid(), (int)geteuid());
    return 0;
}
"""


@pytest.fixture(scope="module")
def busybox():
    return fx.busybox_layout()


def hostile_layer(out: Path, *args) -> Path:
    subprocess.run([sys.executable, str(HOSTILE), str(out), *map(str, args)], check=True,
                   timeout=300)
    return out


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def layout_on_busybox(busybox, dest: Path, layer_tar: Path, compress=False) -> tuple:
    """An OCI layout (tag latest): busybox's layers, then `layer_tar` (gzip'd when
    `compress`). Returns (layout, the hostile layer's diff_id hex)."""
    src = busybox.layout
    index = json.loads((src / "index.json").read_text())
    desc = next(m for m in index["manifests"]
                if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == "latest")
    blob = lambda d: src / "blobs/sha256" / d.split(":")[1]  # noqa: E731
    manifest = json.loads(blob(desc["digest"]).read_bytes())
    config = json.loads(blob(manifest["config"]["digest"]).read_bytes())
    blobs = dest / "blobs/sha256"
    blobs.mkdir(parents=True)
    for layer in manifest["layers"]:
        shutil.copyfile(blob(layer["digest"]), blobs / layer["digest"].split(":")[1])

    def put(data: bytes) -> str:
        hexd = hashlib.sha256(data).hexdigest()
        (blobs / hexd).write_bytes(data)
        return hexd

    diff_id = _sha256(layer_tar)
    if compress:
        gz = layer_tar.with_suffix(".tar.gz")
        with open(layer_tar, "rb") as fin, gzip.open(gz, "wb", compresslevel=1) as fout:
            shutil.copyfileobj(fin, fout, 1 << 20)
        layer_blob, media = gz, "application/vnd.oci.image.layer.v1.tar+gzip"
    else:
        layer_blob, media = layer_tar, "application/vnd.oci.image.layer.v1.tar"
    layer_hex = _sha256(layer_blob)
    shutil.copyfile(layer_blob, blobs / layer_hex)
    config["rootfs"]["diff_ids"].append(f"sha256:{diff_id}")
    config_bytes = json.dumps(config).encode()
    manifest["config"] = {"mediaType": "application/vnd.oci.image.config.v1+json",
                          "digest": f"sha256:{put(config_bytes)}", "size": len(config_bytes)}
    manifest["layers"].append({"mediaType": media, "digest": f"sha256:{layer_hex}",
                               "size": layer_blob.stat().st_size})
    manifest_bytes = json.dumps(manifest).encode()
    (dest / "index.json").write_text(json.dumps({
        "schemaVersion": 2, "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": f"sha256:{put(manifest_bytes)}", "size": len(manifest_bytes),
            "annotations": {"org.opencontainers.image.ref.name": "latest"}}]}))
    (dest / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    return dest, diff_id


class LoopDevice:
    def __init__(self, backing: Path):
        self.backing = backing
        backing.write_bytes(b"L" * (1 << 20))
        self.dev = subprocess.run(["losetup", "--find", "--show", str(backing)], check=True,
                                  capture_output=True, text=True, timeout=30).stdout.strip()

    def close(self):
        subprocess.run(["losetup", "-d", self.dev], check=False, timeout=30)


def as_nobody(*cmd) -> subprocess.CompletedProcess:
    # Every id dropped before the exec (not setpriv, which keeps its capabilities through
    # the exec's own path lookup: it would reach the 0700 store).
    return subprocess.run(list(map(str, cmd)), capture_output=True, text=True, timeout=30,
                          user=NOBODY, group=NOBODY, extra_groups=[])


def mode(p: Path) -> int:
    return stat.S_IMODE(os.stat(p).st_mode)


def test_a_layers_devices_are_not_devices_and_reach_no_device(daemon, busybox, tmp_path):
    d = daemon
    loop = LoopDevice(tmp_path / "loop-backing")
    try:
        st = os.stat(loop.dev)
        assert stat.S_ISBLK(st.st_mode)
        tar = hostile_layer(tmp_path / "devices.tar", "devices", os.major(st.st_rdev),
                            os.minor(st.st_rdev))
        layout, diff_id = layout_on_busybox(busybox, tmp_path / "layout", tar)
        d.cli_ok("image", "import", layout, "--name", "it/devices:1")
        layer = d.state_dir / "images/layers" / diff_id
        assert layer.is_dir()
        nodes = {}
        for p in layer.rglob("*"):
            s = os.lstat(p)
            if stat.S_ISBLK(s.st_mode) or stat.S_ISCHR(s.st_mode):
                nodes[str(p.relative_to(layer))] = (os.major(s.st_rdev), os.minor(s.st_rdev))
        # Only whiteouts: overlay's own 0/0 form from the tar, and the OCI .wh. one.
        assert nodes == {"nodes/zero-wh": (0, 0), "etc/gone": (0, 0)}, nodes
        assert not (layer / "nodes/blk").exists() and not (layer / "nodes/mem").exists()

        sid = d.cli_ok("create", "it/devices:1").strip()
        try:
            out = d.cli_ok("exec", sid, "--", "sh", "-c",
                           "echo written-from-the-sandbox > /nodes/blk; "
                           "echo x > /nodes/mem; stat -c %F /nodes/blk; cat /nodes/blk")
            assert out == "regular file\nwritten-from-the-sandbox\n", out
            r = d.cli("exec", sid, "--", "sh", "-c", "ls /nodes")
            assert "blk" in r.stdout
        finally:
            d.cli_ok("rm", sid)
        assert loop.backing.read_bytes() == b"L" * (1 << 20), "the loop file was written"
        with open(loop.dev, "rb") as f:
            assert f.read(1 << 20) == b"L" * (1 << 20), "the loop device was written"
    finally:
        loop.close()


def test_a_layers_file_capabilities_and_setuid_give_a_host_user_nothing(daemon, busybox,
                                                                         tmp_path):
    d = daemon
    src = tmp_path / "setuid0.c"
    src.write_text(SETUID_PROGRAM)
    binary = tmp_path / "setuid0"
    # Static: it runs in the busybox image too.
    subprocess.run(["cc", "-static", "-O1", "-o", str(binary), str(src)], check=True,
                   timeout=120)
    tar = hostile_layer(tmp_path / "caps.tar", "caps", binary)
    layout, diff_id = layout_on_busybox(busybox, tmp_path / "layout", tar)
    d.cli_ok("image", "import", layout, "--name", "it/caps:1")
    layer = d.state_dir / "images/layers" / diff_id
    shift = os.stat(layer).st_uid  # the layer's / belongs to the sandboxes' root
    assert shift != 0

    # The store is root's alone, all the way down.
    for p in (d.state_dir, d.state_dir / "images", d.state_dir / "images/layers",
              d.state_dir / "sandboxes"):
        assert mode(p) == 0o700 and os.stat(p).st_uid == 0, (p, oct(mode(p)))
    for name in ("capped", "capped3"):
        getcap = subprocess.run(["getcap", "-n", str(layer / "bin" / name)],
                                capture_output=True, text=True, timeout=30).stdout
        assert f"[rootid={shift}]" in getcap and "cap_setgid,cap_setuid=ep" in getcap, getcap
    suid = os.stat(layer / "bin/suid")
    assert suid.st_uid == shift and stat.S_IMODE(suid.st_mode) == 0o4755
    # An owner beyond the sandboxes' id range: the unpack worker's user namespace has no
    # such uid, so the layer is refused (as podman does), never stored under a host uid
    # outside the range.
    bad = hostile_layer(tmp_path / "unmapped.tar", "unmapped")
    bad_layout, bad_diff = layout_on_busybox(busybox, tmp_path / "bad-layout", bad)
    r = d.cli("image", "import", bad_layout, "--name", "it/unmapped:1")
    assert r.returncode != 0 and "bin/unmapped" in r.stderr, r
    assert not (d.state_dir / "images/layers" / bad_diff).exists()
    assert d.alive()

    # A host user outside group berth cannot reach the store's files at all...
    # (subprocess reports the child's failed exec as the parent's PermissionError.)
    for name in ("capped", "suid"):
        with pytest.raises(PermissionError):
            r = as_nobody(layer / "bin" / name)
            print(f"nobody ran {name} from the store: {r.stdout} {r.stderr}")
    # ...and a copy it can reach, with every xattr, makes it no one more than itself
    # (the setuid one: the sandboxes' root uid, never 0).
    reach = Path(f"/var/tmp/berth-it-caps-{os.getpid()}")
    reach.mkdir(mode=0o755)
    try:
        reach.chmod(0o755)
        for name in ("capped", "capped3", "suid"):
            subprocess.run(["cp", "-a", str(layer / "bin" / name), str(reach / name)],
                           check=True, timeout=30)
        for name in ("capped", "capped3"):
            assert f"rootid={shift}" in subprocess.run(
                ["getcap", "-n", str(reach / name)], capture_output=True, text=True).stdout
            r = as_nobody(reach / name)
            assert r.stdout == f"setuid=-1 uid={NOBODY} euid={NOBODY}\n", (r.stdout, r.stderr)
        r = as_nobody(reach / "suid")
        assert r.stdout == f"setuid=-1 uid={NOBODY} euid={shift}\n", (r.stdout, r.stderr)
        # The control: the same program with a host-wide (v2) capability does become root,
        # which is what the store used to make of such a layer.
        shutil.copyfile(binary, reach / "control")
        (reach / "control").chmod(0o755)
        subprocess.run(["setcap", "cap_setuid+ep", str(reach / "control")], check=True)
        assert as_nobody(reach / "control").stdout == "setuid=0 uid=0 euid=0\n"
    finally:
        shutil.rmtree(reach)

    # Inside a sandbox: the capability is the image's own as the sandbox sees it (the
    # kernel shows a v3 whose rootid is the namespace's root as a plain one), but every
    # command runs with no_new_privs, so neither it nor the setuid bit raise a process
    # (layer_security_test shows the namespaced capability working in a user namespace
    # rooted at the sandboxes' root without no_new_privs).
    sid = d.cli_ok("create", "it/caps:1").strip()
    try:
        assert d.cli_ok("exec", "-u", "1000", sid, "--", "/bin/capped") == \
            "setuid=-1 uid=1000 euid=1000\n"
        assert d.cli_ok("exec", "-u", "1000", sid, "--", "/bin/suid") == \
            "setuid=-1 uid=1000 euid=1000\n"
        assert d.cli_ok("exec", sid, "--", "/bin/capped") == "setuid=0 uid=0 euid=0\n"
    finally:
        d.cli_ok("rm", sid)


def test_state_modes_are_enforced_at_every_start(fresh_daemon, busybox):
    d = fresh_daemon
    d.cli_ok("image", "import", busybox.layout, "--name", "it/bb:latest")
    dirs = [d.state_dir, d.state_dir / "images", d.state_dir / "images/layers",
            d.state_dir / "sandboxes"]
    for p in dirs:
        assert mode(p) == 0o700, (p, oct(mode(p)))
        p.chmod(0o755)  # as an older berth, or an admin, left them
    d.restart()
    for p in dirs:
        assert mode(p) == 0o700, f"{p} is {oct(mode(p))} after a restart"
    # And sandboxes from images still work under them (the overlay looks up its lower and
    # upper layers with the mounter's credentials, root's, not the sandbox root's).
    sid = d.cli_ok("create", "it/bb:latest").strip()
    try:
        assert d.cli_ok("exec", sid, "--", "sh", "-c", "echo hi > /tmp/x; cat /tmp/x") == "hi\n"
        assert d.cli_ok("exec", "-u", "1000", sid, "--", "cat", "/home/alice/hello.txt")
    finally:
        d.cli_ok("rm", sid)


def test_an_image_past_the_unpacked_bound_is_refused_and_leaves_nothing(base_dir, busybox,
                                                                         tmp_path):
    d = Daemon(base_dir, extra_args=["--max-image-size", "64M", "--max-image-entries", "5000"])
    d.start()
    try:
        layers = d.state_dir / "images/layers"
        # 256 MiB of zeros, gzip'd to a few hundred KiB.
        tar = hostile_layer(tmp_path / "zeros.tar", "zeros", 256 << 20)
        layout, diff_id = layout_on_busybox(busybox, tmp_path / "zeros-layout", tar,
                                            compress=True)
        tar.unlink()
        before = shutil.disk_usage(d.state_dir).used
        r = d.cli("image", "import", layout, "--name", "it/zeros:1", timeout=300)
        assert r.returncode != 0, r.stdout
        assert f"layer sha256:{diff_id}" in r.stderr, r.stderr
        assert "at most 67108864 bytes" in r.stderr and "--max-image-size" in r.stderr, \
            r.stderr
        assert "refused at zeros" in r.stderr, r.stderr
        assert not (layers / diff_id).exists()
        assert [p.name for p in layers.iterdir() if p.name.startswith(".")] == []
        # Refused before its data was written (the store's disk did not take the 256 MiB).
        assert shutil.disk_usage(d.state_dir).used - before < (64 << 20)

        tar = hostile_layer(tmp_path / "many.tar", "many", 20000)
        layout, diff_id = layout_on_busybox(busybox, tmp_path / "many-layout", tar)
        r = d.cli("image", "import", layout, "--name", "it/many:1", timeout=300)
        assert r.returncode != 0 and "5000 entries" in r.stderr, r.stderr
        assert f"layer sha256:{diff_id}" in r.stderr
        assert not (layers / diff_id).exists()
        assert [p.name for p in layers.iterdir() if p.name.startswith(".")] == []

        # Nothing was named, and the daemon is up and imports what fits.
        names = [i["name"] for i in json.loads(d.cli_ok("images", "--json"))]
        assert not any("zeros" in n or "many" in n for n in names), names
        d.cli_ok("image", "import", busybox.layout, "--name", "it/bb:latest")
        assert d.alive()
    finally:
        problems = d.cleanup()
        assert not problems, problems
