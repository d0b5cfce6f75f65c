"""Images through the real berthd and berth-images: import of OCI layouts (directory and tar)
and docker-archives made by real tools (umoci-built images from tests/registry/fixture.py,
skopeo), export and re-import, listing, rmi and prune against live sandboxes, bad and hostile
input, berthd killed in the middle of an import or a bootstrap, a Debian bootstrap, and a
pull from a loopback registry.

Needs root, umoci, skopeo, docker-registry and debootstrap (scripts/install-deps)."""
import hashlib
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

import berth_proto
import hostutil
from conftest import BERTH, REPO_ROOT, Daemon

sys.path.insert(0, str(REPO_ROOT / "tests/registry"))
import fixture as fx  # noqa: E402

pb = berth_proto.pb
IGNORE = fx.DEFAULT_IGNORE + ("/etc/hosts", "/etc/hostname", "/etc/resolv.conf")


@pytest.fixture(scope="module")
def busybox():
    return fx.busybox_layout()


@pytest.fixture(scope="module")
def debian():
    return fx.debian_layered_layout()


def images_json(d: Daemon) -> list:
    return json.loads(d.cli_ok("images", "--json"))


def named(d: Daemon, name: str):
    return next((i for i in images_json(d) if i["name"] == name), None)


def layer_dirs(d: Daemon) -> list:
    p = d.state_dir / "images/layers"
    return sorted(x.name for x in p.iterdir()) if p.exists() else []


def blobs(d: Daemon) -> list:
    p = d.state_dir / "images/blobs/sha256"
    return sorted(x.name for x in p.iterdir()) if p.exists() else []


def untrusted_leftovers(d: Daemon) -> list:
    """What an interrupted import or unpack may leave: scratch dirs, half layers."""
    root = d.state_dir / "images"
    out = [str(p) for p in (root / "ingest").iterdir()] if (root / "ingest").exists() else []
    out += [n for n in layer_dirs(d) if n.startswith(".")]
    return out


def single_tag_layout(src: Path, tag: str, dest: Path) -> Path:
    """A layout holding only `tag` of `src`, by skopeo (a real tool's layout)."""
    subprocess.run(["skopeo", "--insecure-policy", "copy", "-q", f"oci:{src}:{tag}",
                    f"oci:{dest}:{tag}"], check=True, capture_output=True, timeout=120)
    return dest


def tar_of(dir_: Path, dest: Path) -> Path:
    subprocess.run(["tar", "-C", str(dir_), "-cf", str(dest), "."], check=True, timeout=120)
    return dest


def listing_in(d: Daemon, sandbox: str) -> dict:
    out = d.cli_ok("exec", sandbox, "--", "sh", "-c", fx.SANDBOX_LISTING_SH, timeout=300)
    return fx.parse_sandbox_listing(out)


def assert_daemon_serves(d: Daemon):
    assert d.alive(), d.log()
    assert hostutil.pid_alive(d.images_pid), "berth-images died"
    d.cli_ok("images")


# ---- imports from real tools ------------------------------------------------------------

def test_import_docker_archive_made_by_skopeo(daemon, busybox, tmp_path):
    archive = tmp_path / "busybox.docker.tar"
    subprocess.run(["skopeo", "--insecure-policy", "copy", "-q",
                    f"oci:{busybox.layout}:latest",
                    f"docker-archive:{archive}:berth-test/busybox:v1"],
                   check=True, capture_output=True, timeout=120)
    out = daemon.cli_ok("image", "import", archive)
    # The name the archive carries (its RepoTags), made full.
    assert "docker.io/berth-test/busybox:v1" in out, out
    image = named(daemon, "docker.io/berth-test/busybox:v1")
    assert image and image["manifest_digest"].startswith("sha256:")
    assert image["layers"] == json.loads(
        fx.layout_blob(busybox.layout, fx.layout_manifest(busybox.layout, "latest")
                       ["config"]["digest"]).read_text())["rootfs"]["diff_ids"]

    # A sandbox of it sees exactly the image's files, owners and modes.
    sid = daemon.cli_ok("create", "berth-test/busybox:v1").strip()
    try:
        fx.assert_listing_equal(fx.read_listing(busybox.listing), listing_in(daemon, sid),
                                ignore=IGNORE)
        assert daemon.cli_ok("exec", sid, "--", "cat", "/home/alice/hello.txt").strip()
    finally:
        daemon.cli_ok("rm", "-f", sid)
    daemon.cli_ok("rmi", "berth-test/busybox:v1")


def test_import_oci_layout_directory_and_tar(daemon, debian, busybox, tmp_path):
    # A directory with several tags: the name's tag picks the manifest.
    out = daemon.cli_ok("image", "import", busybox.layout, "--name", "it/bb:alice-entrypoint")
    assert busybox.tags["alice-entrypoint"]["digest"] in out, out
    insp = json.loads(daemon.cli_ok("image", "inspect", "it/bb:alice-entrypoint", "--json"))
    assert insp["config"]["entrypoint"] == ["/bin/echo", "entrypoint:"]
    assert insp["config"]["user"] == "alice"
    # Without a name, several tags are refused with what the layout has.
    r = daemon.cli("image", "import", busybox.layout)
    assert r.returncode == 125 and "alice-entrypoint" in r.stderr, r.stderr

    # The layered Debian image (whiteouts, an opaque dir) as a tar of its layout.
    layout = single_tag_layout(debian.layout, "latest", tmp_path / "debian-layout")
    tar = tar_of(layout, tmp_path / "debian-layout.tar")
    out = daemon.cli_ok("image", "import", tar, "--name", "it/debian:layered", timeout=300)
    image = named(daemon, "docker.io/it/debian:layered")
    assert image["manifest_digest"] == debian.digest, out
    assert len(image["layers"]) == 4
    sid = daemon.cli_ok("create", "it/debian:layered").strip()
    try:
        fx.assert_listing_equal(fx.read_listing(debian.listing), listing_in(daemon, sid),
                                ignore=IGNORE)
    finally:
        daemon.cli_ok("rm", "-f", sid)
    # The same layout as a directory: the same image, nothing unpacked again.
    before = layer_dirs(daemon)
    daemon.cli_ok("image", "import", layout, "--name", "it/debian:again")
    assert named(daemon, "docker.io/it/debian:again")["manifest_digest"] == debian.digest
    assert layer_dirs(daemon) == before
    daemon.cli_ok("rmi", "it/debian:layered", "it/debian:again", "it/bb:alice-entrypoint")


def test_export_then_import_gives_the_same_digest(daemon, busybox, tmp_path):
    daemon.cli_ok("image", "import", busybox.layout, "--name", "it/exp:zstd")
    digest = named(daemon, "docker.io/it/exp:zstd")["manifest_digest"]
    assert digest == busybox.tags["zstd"]["digest"]

    # To a file (a tar) and to a directory (the CLI unpacks the tar it receives).
    daemon.cli_ok("image", "export", "it/exp:zstd", tmp_path / "exp.tar")
    daemon.cli_ok("image", "export", "it/exp:zstd", str(tmp_path / "expdir") + "/")
    with tarfile.open(tmp_path / "exp.tar") as t:
        names = {m.name.lstrip("./") for m in t.getmembers()}
    assert {"oci-layout", "index.json", f"blobs/sha256/{digest[7:]}"} <= names, names
    # skopeo reads both as OCI layouts, by the image's tag.
    for src in (f"oci-archive:{tmp_path / 'exp.tar'}:zstd", f"oci:{tmp_path / 'expdir'}:zstd"):
        r = subprocess.run(["skopeo", "inspect", "--raw", src], capture_output=True, timeout=60)
        assert r.returncode == 0, r.stderr
        assert digest[7:] in (hashlib.sha256(r.stdout).hexdigest(),
                              hashlib.sha256(r.stdout.rstrip(b"\n")).hexdigest())

    # Imported again (no name needed: the export names the image in full).
    daemon.cli_ok("rmi", "it/exp:zstd")
    assert named(daemon, "docker.io/it/exp:zstd") is None
    daemon.cli_ok("image", "import", tmp_path / "exp.tar")
    assert named(daemon, "docker.io/it/exp:zstd")["manifest_digest"] == digest
    daemon.cli_ok("image", "import", tmp_path / "expdir", "--name", "it/exp:fromdir")
    assert named(daemon, "docker.io/it/exp:fromdir")["manifest_digest"] == digest

    # An image imported from a docker-archive (a manifest berth made) round-trips too.
    archive = tmp_path / "bb.docker.tar"
    subprocess.run(["skopeo", "--insecure-policy", "copy", "-q", f"oci:{busybox.layout}:latest",
                    f"docker-archive:{archive}:it/docker:1"], check=True, capture_output=True,
                   timeout=120)
    daemon.cli_ok("image", "import", archive)
    d1 = named(daemon, "docker.io/it/docker:1")["manifest_digest"]
    daemon.cli_ok("image", "export", "it/docker:1", tmp_path / "d.tar")
    daemon.cli_ok("rmi", "it/docker:1")
    daemon.cli_ok("image", "import", tmp_path / "d.tar")
    assert named(daemon, "docker.io/it/docker:1")["manifest_digest"] == d1
    daemon.cli_ok("rmi", "-f", d1[7:19], "it/exp:zstd", "it/exp:fromdir")


def test_images_listing_and_lookup(daemon, busybox):
    daemon.cli_ok("image", "import", busybox.layout, "--name", "it/list:latest")
    daemon.cli_ok("image", "import", busybox.layout, "--name", "localhost/it-local:latest")
    image = named(daemon, "docker.io/it/list:latest")
    assert set(image) >= {"name", "manifest_digest", "config_digest", "layers", "size",
                          "created"}
    assert int(image["size"]) > 500_000 and image["created"].startswith("20")
    digest = image["manifest_digest"]

    table = daemon.cli_ok("images")
    assert table.splitlines()[0].split() == ["NAME", "DIGEST", "CREATED", "SIZE"]
    row = next(line for line in table.splitlines() if "docker.io/it/list:latest" in line)
    assert digest[7:19] in row and digest not in row
    assert digest in daemon.cli_ok("images", "--digests")

    # By name, short name, name@digest, digest and digest prefix; a short name also finds a
    # localhost/ image (where bootstraps are recorded).
    for ref in ("it/list", "docker.io/it/list:latest", f"it/list@{digest}", digest,
                digest[7:17]):
        out = json.loads(daemon.cli_ok("image", "inspect", ref, "--json"))
        assert out["image"]["manifest_digest"] == digest, ref
    assert json.loads(daemon.cli_ok("image", "inspect", "it-local", "--json"))["image"][
        "name"] == "localhost/it-local:latest"
    insp = json.loads(daemon.cli_ok("image", "inspect", "it/list", "--json"))
    assert insp["config"]["cmd"] == ["sh"] and insp["config"]["working_dir"] == "/home/alice"
    assert insp["platform"].startswith("linux/")
    layer_hex = insp["image"]["layers"][0][7:]
    assert insp["lower_dirs"] == [str(daemon.state_dir / "images/layers" / layer_hex)]
    human = daemon.cli_ok("image", "inspect", "it/list")
    assert "Cmd:         sh" in human and digest in human

    r = daemon.cli("image", "inspect", "it/nothing-here")
    assert r.returncode == 125 and "no image named it/nothing-here" in r.stderr
    daemon.cli_ok("rmi", "it/list", "localhost/it-local")


# ---- rmi and prune against live sandboxes -----------------------------------------------

def test_rmi_of_an_image_in_use_is_refused_and_force_only_untags(daemon, busybox):
    daemon.cli_ok("image", "import", busybox.layout, "--name", "it/used:latest")
    image = named(daemon, "docker.io/it/used:latest")
    layer = image["layers"][0][7:]
    sid = daemon.cli_ok("create", "it/used", "--name", "uses-it").strip()
    try:
        r = daemon.cli("rmi", "it/used")
        assert r.returncode == 1
        assert sid in r.stderr and "uses-it" in r.stderr, r.stderr
        assert named(daemon, "docker.io/it/used:latest")

        out = daemon.cli_ok("rmi", "-f", "it/used")
        assert "Untagged: docker.io/it/used:latest" in out and "Deleted" not in out, out
        assert named(daemon, "docker.io/it/used:latest") is None
        # The sandbox goes on, on its layers; prune keeps them while it lives.
        daemon.cli_ok("image", "prune")
        assert layer in layer_dirs(daemon)
        assert image["manifest_digest"][7:] in blobs(daemon)
        assert daemon.cli_ok("exec", sid, "--", "cat", "/home/alice/hello.txt").strip()
    finally:
        daemon.cli_ok("rm", "-f", sid)
    out = daemon.cli_ok("image", "prune")
    assert f"layer sha256:{layer}" in out, out
    assert layer not in layer_dirs(daemon)
    assert image["manifest_digest"][7:] not in blobs(daemon)
    assert "Total reclaimed space" in out and "Total reclaimed space: 0B" not in out


def test_prune_removes_only_what_nothing_uses(daemon, busybox, debian, tmp_path):
    daemon.cli_ok("image", "prune")
    daemon.cli_ok("image", "import", busybox.layout, "--name", "it/keep:latest")
    daemon.cli_ok("image", "import", debian.layout, "--name", "it/deb:latest", timeout=300)
    deb = named(daemon, "docker.io/it/deb:latest")
    keep = named(daemon, "docker.io/it/keep:latest")
    deb_layers = [x[7:] for x in deb["layers"]]
    sid = daemon.cli_ok("create", "it/deb").strip()
    try:
        daemon.cli_ok("rmi", "-f", "it/deb")
        out = daemon.cli_ok("image", "prune")
        assert "Deleted" not in out, out  # everything is named or in use
        assert set(deb_layers) <= set(layer_dirs(daemon))
        assert keep["layers"][0][7:] in layer_dirs(daemon)
        # The sandbox sees its whole image still.
        assert daemon.cli_ok("exec", sid, "--", "cat", "/etc/debian_version").strip()
    finally:
        daemon.cli_ok("rm", "-f", sid)
    out = daemon.cli_ok("image", "prune")
    for layer in deb_layers:
        assert f"layer sha256:{layer}" in out
        assert layer not in layer_dirs(daemon)
    assert deb["manifest_digest"][7:] not in blobs(daemon)
    # The named image lost nothing, and still makes sandboxes.
    assert named(daemon, "docker.io/it/keep:latest") == keep
    assert daemon.cli_ok("run", "--rm", "it/keep", "--", "echo", "ok") == "ok\n"
    assert daemon.cli_ok("image", "prune").strip() == "Total reclaimed space: 0B"
    daemon.cli_ok("rmi", "it/keep")
    # A removed image's own content goes with it.
    assert keep["layers"][0][7:] not in layer_dirs(daemon)
    assert keep["manifest_digest"][7:] not in blobs(daemon)


# ---- bad and hostile input: a clear error, and the daemon stays up ------------------------

def expect_import_error(d: Daemon, path, *words, user_env=None):
    r = d.cli("image", "import", path, "--name", "it/bad:1", timeout=120)
    assert r.returncode == 125, (r.stdout, r.stderr)
    for w in words:
        assert w in r.stderr, (w, r.stderr)
    assert named(d, "docker.io/it/bad:1") is None
    assert_daemon_serves(d)
    return r.stderr


def test_bad_input_gives_a_clear_error(daemon, busybox, tmp_path):
    expect_import_error(daemon, tmp_path / "missing.tar", "No such file or directory",
                        "missing.tar")
    random_file = tmp_path / "random.bin"
    random_file.write_bytes(os.urandom(1 << 20))
    expect_import_error(daemon, random_file, "importing")

    archive = tmp_path / "bb.docker.tar"
    subprocess.run(["skopeo", "--insecure-policy", "copy", "-q", f"oci:{busybox.layout}:latest",
                    f"docker-archive:{archive}:it/bad:1"], check=True, capture_output=True,
                   timeout=120)
    truncated = tmp_path / "truncated.tar"
    data = archive.read_bytes()
    truncated.write_bytes(data[: len(data) // 2])
    expect_import_error(daemon, truncated, "importing")

    # A layout whose tar is not a layout at all.
    plain = tmp_path / "plain"
    (plain / "etc").mkdir(parents=True)
    (plain / "etc/x").write_text("x")
    expect_import_error(daemon, tar_of(plain, tmp_path / "plain.tar"), "neither an OCI image",
                        "docker-archive")

    # docker-archive whose manifest.json points out of the archive.
    evil = tmp_path / "evil-archive"
    evil.mkdir()
    (evil / "manifest.json").write_text(json.dumps(
        [{"Config": "../../../../etc/passwd", "RepoTags": ["it/bad:1"], "Layers": []}]))
    expect_import_error(daemon, tar_of(evil, tmp_path / "evil.tar"), "outside the archive")

    # Nothing was left half-imported by any of them.
    assert untrusted_leftovers(daemon) == []


def test_hostile_layouts_are_refused(daemon, busybox, tmp_path):
    layer = fx.layout_manifest(busybox.layout, "latest")["layers"][0]["digest"][7:]

    # A symlink inside blobs/ (to the right content, even): never followed, in a directory...
    evil = single_tag_layout(busybox.layout, "latest", tmp_path / "symlinked")
    real = tmp_path / "elsewhere-blob"
    shutil.move(evil / "blobs/sha256" / layer, real)
    (evil / "blobs/sha256" / layer).symlink_to(real)
    expect_import_error(daemon, evil, f"blobs/sha256/{layer}", "symbolic links")
    # ...nor in a tar of one (the symlink is made in the scratch dir, and refused there).
    (evil / "blobs/sha256" / layer).unlink()
    (evil / "blobs/sha256" / layer).symlink_to("/etc/shadow")
    expect_import_error(daemon, tar_of(evil, tmp_path / "symlinked.tar"),
                        f"blobs/sha256/{layer}")

    # A directory symlink on the way.
    evil2 = single_tag_layout(busybox.layout, "latest", tmp_path / "dirlink")
    shutil.move(evil2 / "blobs", tmp_path / "real-blobs")
    (evil2 / "blobs").symlink_to(tmp_path / "real-blobs")
    expect_import_error(daemon, evil2, "blobs", "symbolic links")

    # A fifo where a blob should be: an error at once, not a hang.
    fifo = single_tag_layout(busybox.layout, "latest", tmp_path / "fifo")
    (fifo / "blobs/sha256" / layer).unlink()
    os.mkfifo(fifo / "blobs/sha256" / layer)
    t0 = time.monotonic()
    expect_import_error(daemon, fifo, "not a regular file")
    assert time.monotonic() - t0 < 30

    # A tampered blob: refused by digest, nothing named.
    bad = single_tag_layout(busybox.layout, "latest", tmp_path / "tampered")
    blob = bad / "blobs/sha256" / layer
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF
    blob.chmod(0o644)
    blob.write_bytes(bytes(data))
    expect_import_error(daemon, bad, layer)
    assert untrusted_leftovers(daemon) == []


def berth_gid() -> int:
    import grp
    return grp.getgrnam("berth").gr_gid


def test_a_directory_is_read_with_the_clients_rights(daemon, busybox, base_dir):
    """berth-images is root: it must not read, for a client, what that client could not."""
    import tempfile
    base = Path(tempfile.mkdtemp(prefix="perm-", dir=base_dir))
    base.chmod(0o755)
    layout = single_tag_layout(busybox.layout, "latest", base / "layout")
    for p in [layout, *layout.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    layer = fx.layout_manifest(layout, "latest")["layers"][0]["digest"][7:]
    as_nobody = ["setpriv", f"--reuid=65534", f"--regid={berth_gid()}", "--clear-groups",
                 str(BERTH), "image", "import"]
    env = dict(os.environ, BERTH_SOCKET=daemon.socket)

    (layout / "blobs/sha256" / layer).chmod(0o600)  # root's alone now
    r = subprocess.run([*as_nobody, str(layout), "--name", "it/perm:1"], capture_output=True,
                       text=True, env=env, timeout=120)
    assert r.returncode == 125 and "Permission denied" in r.stderr, r.stderr
    assert f"blobs/sha256/{layer}" in r.stderr and "uid 65534" in r.stderr
    assert named(daemon, "docker.io/it/perm:1") is None

    (layout / "blobs/sha256" / layer).chmod(0o644)
    (layout / "blobs").chmod(0o700)  # a directory on the way that nobody may search
    r = subprocess.run([*as_nobody, str(layout), "--name", "it/perm:1"], capture_output=True,
                       text=True, env=env, timeout=120)
    assert r.returncode == 125 and "Permission denied" in r.stderr, r.stderr

    (layout / "blobs").chmod(0o755)
    r = subprocess.run([*as_nobody, str(layout), "--name", "it/perm:1"], capture_output=True,
                       text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert named(daemon, "docker.io/it/perm:1")
    daemon.cli_ok("rmi", "it/perm:1")


def test_fds_the_daemon_refuses(daemon, busybox, tmp_path):
    conn = daemon.connect()
    try:
        def refused(body, value, fds, words):
            rid = conn.request_with_fds(body, value, fds)
            with pytest.raises(berth_proto.BerthError) as e:
                conn.wait_reply(rid)
            assert e.value.code_name == "INVALID_ARGUMENT", e.value
            assert words in e.value.message, e.value.message

        imp = pb.ImportImage(name="it/fd:1")
        refused("import_image", imp, (), "expected one fd")
        path_fd = os.open(busybox.layout, os.O_PATH)
        refused("import_image", imp, [path_fd], "O_PATH")
        os.close(path_fd)
        w = os.open(tmp_path / "w", os.O_WRONLY | os.O_CREAT, 0o600)
        refused("import_image", imp, [w], "not open for reading")
        r = os.open(tmp_path / "w", os.O_RDONLY)
        refused("export_image", pb.ExportImage(reference="x"), [r], "not open for writing")
        os.close(w)
        os.close(r)
        s1, s2 = socket.socketpair()
        refused("import_image", imp, [s1.fileno()], "neither a file")
        s1.close()
        s2.close()
        refused("list_images", pb.ListImages(), [os.open("/dev/null", os.O_RDONLY)],
                "takes no fd")
    finally:
        conn.close()
    assert_daemon_serves(daemon)


def test_daemon_keeps_serving_during_a_long_import(daemon, tmp_path):
    tar = big_layout_tar(tmp_path, 400)
    proc = subprocess.Popen([str(BERTH), "image", "import", str(tar), "--name", "it/big:1"],
                            env=dict(os.environ, BERTH_SOCKET=daemon.socket),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        served = 0
        while proc.poll() is None:
            t0 = time.monotonic()
            daemon.cli_ok("images")
            daemon.cli_ok("ps")
            assert time.monotonic() - t0 < 3, "berthd stalled behind an import"
            served += 1
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        assert served >= 1, "the import was over before anything else ran"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert named(daemon, "docker.io/it/big:1")
    daemon.cli_ok("rmi", "it/big:1")


# ---- berthd killed in the middle: nothing trusted is left ---------------------------------

def big_layout_tar(tmp_path: Path, megabytes: int) -> Path:
    """An OCI layout tar with one uncompressed layer holding `megabytes` of random data: an
    import long enough to be interrupted."""
    layout = tmp_path / f"big-{megabytes}"
    out = tmp_path / f"big-{megabytes}.tar"
    if out.exists():
        return out
    blobs_dir = layout / "blobs/sha256"
    blobs_dir.mkdir(parents=True)

    def put(data: bytes) -> str:
        h = hashlib.sha256(data).hexdigest()
        (blobs_dir / h).write_bytes(data)
        return h

    layer_tmp = layout / "layer.tar"
    h = hashlib.sha256()
    with open(layer_tmp, "wb") as f:
        def write(b: bytes):
            h.update(b)
            f.write(b)
        info = tarfile.TarInfo("big.bin")
        info.size = megabytes << 20
        info.mode = 0o644
        write(info.tobuf(format=tarfile.PAX_FORMAT))
        chunk = os.urandom(1 << 20)
        for _ in range(megabytes):
            write(chunk)
        write(b"\0" * 1024)  # the end of the archive
    layer_hex = h.hexdigest()
    layer_size = layer_tmp.stat().st_size
    layer_tmp.rename(blobs_dir / layer_hex)
    arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
    config = json.dumps({"architecture": arch, "os": "linux", "config": {"Cmd": ["sh"]},
                         "rootfs": {"type": "layers", "diff_ids": [f"sha256:{layer_hex}"]}}
                        ).encode()
    config_hex = put(config)
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": f"sha256:{config_hex}", "size": len(config)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                    "digest": f"sha256:{layer_hex}", "size": layer_size}]}).encode()
    manifest_hex = put(manifest)
    (layout / "index.json").write_text(json.dumps({
        "schemaVersion": 2, "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": f"sha256:{manifest_hex}", "size": len(manifest),
            "annotations": {"org.opencontainers.image.ref.name": "latest"}}]}))
    (layout / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    tar_of(layout, out)
    shutil.rmtree(layout)
    return out


def daemon_processes_gone(d: Daemon):
    """No process of the killed daemon's image side is left: berth-images, and anything
    working in its state dir (debootstrap, dpkg, tar...)."""
    mark = str(d.dir)

    def leftovers():
        found = []
        for pid in hostutil.all_pids():
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(
                    errors="replace")
                root = os.readlink(f"/proc/{pid}/root")
            except OSError:
                continue
            if pid != os.getpid() and (mark in cmd or mark in root):
                found.append((pid, cmd[:120]))
        return found
    hostutil.wait_for(lambda: not leftovers(), 20,
                      what=f"the daemon's processes to go: {leftovers()}")


@pytest.mark.parametrize("phase", ["ingest", "unpack"])
def test_berthd_killed_mid_import_leaves_nothing_trusted(fresh_daemon, tmp_path, phase):
    d = fresh_daemon
    tar = big_layout_tar(tmp_path, 300)
    proc = subprocess.Popen([str(BERTH), "image", "import", str(tar), "--name", "it/big:1"],
                            env=dict(os.environ, BERTH_SOCKET=d.socket),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    root = d.state_dir / "images"

    def in_phase():
        if phase == "ingest":
            return any((root / "ingest").iterdir()) if (root / "ingest").exists() else False
        return any(n.startswith(".") and ".unpacking-" in n for n in layer_dirs(d))
    try:
        hostutil.wait_for(in_phase, 120, interval=0.01, what=f"the import to reach {phase}")
        d.kill()  # SIGKILL berthd; berth-images must die with it
    finally:
        proc.communicate(timeout=60)
    assert proc.returncode != 0
    daemon_processes_gone(d)

    d.start()
    # Nothing named, no half layer, no scratch left (swept when berth-images opened the store).
    assert named(d, "docker.io/it/big:1") is None
    assert untrusted_leftovers(d) == [], untrusted_leftovers(d)
    for name in layer_dirs(d):  # only complete layers, by their diff_id
        assert len(name) == 64
    # A later import of the same archive succeeds, and its file is whole.
    d.cli_ok("image", "import", tar, "--name", "it/big:1", timeout=300)
    layer = named(d, "docker.io/it/big:1")["layers"][0][7:]
    assert (root / "layers" / layer / "big.bin").stat().st_size == 300 << 20


def test_berthd_killed_mid_bootstrap_leaves_nothing(fresh_daemon):
    d = fresh_daemon
    proc = subprocess.Popen([str(BERTH), "image", "bootstrap", "debian:bookworm"],
                            env=dict(os.environ, BERTH_SOCKET=d.socket),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        def debootstrap_running():
            return [p for p in hostutil.descendants(d.images_pid)
                    if hostutil.comm(p) == "debootstrap"]
        hostutil.wait_for(debootstrap_running, 60, what="debootstrap to start")
        time.sleep(3)  # well into it: fetching, maybe unpacking
        d.kill()
    finally:
        proc.communicate(timeout=60)
    assert proc.returncode != 0
    # debootstrap and everything it started died with the pid namespace; its mounts with
    # its mount namespace (none ever showed on the host).
    daemon_processes_gone(d)
    assert str(d.state_dir) not in Path("/proc/self/mountinfo").read_text()
    d.start()
    assert images_json(d) == []
    assert untrusted_leftovers(d) == []


def test_cancel_and_a_client_leaving_stop_a_bootstrap(daemon):
    def debootstraps():
        return [p for p in hostutil.descendants(daemon.images_pid)
                if hostutil.comm(p) == "debootstrap"]

    conn = daemon.connect()
    try:
        rid = conn.request("bootstrap_image", pb.BootstrapImage(source="debian:bookworm",
                                                                name="it/cancelled:1"))
        hostutil.wait_for(debootstraps, 60, what="debootstrap to start")
        conn.cancel(rid)
        t0 = time.monotonic()
        with pytest.raises(berth_proto.BerthError) as e:
            while True:  # progress lines, then the end
                msg = conn.wait_reply(rid, timeout=60)
                assert msg.HasField("image_progress"), msg
        assert e.value.code_name == "CANCELED", e.value
        assert time.monotonic() - t0 < 15
        hostutil.wait_for(lambda: not debootstraps(), 15, what="debootstrap to be killed")
    finally:
        conn.close()
    # A client that goes away takes its request with it.
    conn = daemon.connect()
    conn.request("bootstrap_image", pb.BootstrapImage(source="debian:bookworm",
                                                      name="it/cancelled:1"))
    hostutil.wait_for(debootstraps, 60, what="debootstrap to start")
    conn.close()
    hostutil.wait_for(lambda: not debootstraps(), 15, what="debootstrap to be killed")
    hostutil.wait_for(lambda: untrusted_leftovers(daemon) == [], 15,
                      what="the bootstrap's scratch to go")
    assert named(daemon, "docker.io/it/cancelled:1") is None
    assert_daemon_serves(daemon)


@pytest.mark.parametrize("child", ["berth-images", "berth-helper"])
def test_a_dead_child_service_restarts_berthd_and_sandboxes_go_on(fresh_daemon, busybox_rootfs,
                                                                   child):
    """berthd cannot start its root children again (it is unprivileged by then): it exits
    with status 3 for its supervisor to restart the service (issue 12, item 7); the sandboxes
    run on meanwhile and the restarted berthd reattaches them."""
    d = fresh_daemon
    sid = d.create(busybox_rootfs)
    init_pid = d.inspect(sid)["sandbox"]["init_pid"]
    victim = d.images_pid if child == "berth-images" else d.helper_pid
    os.kill(victim, signal.SIGKILL)
    d.proc.wait(timeout=10)
    assert d.proc.returncode == 3, (d.proc.returncode, d.log())
    assert f"lost {child}; exiting with status 3" in d.log()
    # Nothing was left behind as a zombie, and the other child went with berthd.
    hostutil.wait_for(lambda: not os.path.exists(f"/proc/{victim}"), 10, what=f"{child} reaped")
    d._wait_helper_gone(10)
    assert hostutil.pid_alive(int(init_pid)), "the sandbox died with berthd"
    # The supervisor's restart: the sandbox is there and serves, images too.
    d.start()
    assert d.cli_ok("exec", sid, "--", "echo", "still") == "still\n"
    assert sid in d.ids()
    assert d.cli("images").returncode == 0


# ---- a Debian base, made here ------------------------------------------------------------

def test_bootstrap_debian_bookworm(daemon):
    r = daemon.cli("image", "bootstrap", "debian:bookworm", timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "debootstrap --variant=minbase bookworm" in r.stderr
    assert "localhost/debian:bookworm" in r.stdout
    image = named(daemon, "localhost/debian:bookworm")
    assert image and len(image["layers"]) == 1
    insp = json.loads(daemon.cli_ok("image", "inspect", "debian:bookworm", "--json"))
    assert insp["image"]["name"] == "localhost/debian:bookworm"  # the short name finds it
    assert insp["config"]["cmd"] == ["/bin/bash"]
    assert any(e.startswith("PATH=") for e in insp["config"]["env"])
    # `berth run debian:bookworm` finds it, offline. (Its /etc/hostname, stripped by the
    # bootstrap, is berth's own in a sandbox: a bind from the sandbox's tmpfs.)
    out = daemon.cli_ok("run", "--rm", "debian:bookworm", "--", "sh", "-c",
                        "cat /etc/debian_version; id -u; "
                        "grep -q ' /etc/hostname tmpfs ' /proc/mounts && echo ok")
    version, uid, ok = out.split()
    assert version.startswith("12.") and uid == "0" and ok == "ok"
    r = daemon.cli("image", "bootstrap", "ubuntu:noble")
    assert r.returncode == 125 and "only debian:SUITE" in r.stderr
    daemon.cli_ok("rmi", "localhost/debian:bookworm")


# ---- pull (smoke: the pull tests proper live with the registry's) -------------------------

def test_pull_from_a_loopback_registry(daemon, busybox, base_dir):
    with fx.Registry(base_dir / "registry-images-smoke") as reg:
        fx.push_oci_layout(busybox.layout, "latest", reg, "it/busybox", "v1")
        ref = reg.ref("it/busybox", "v1")
        r = daemon.cli("pull", ref, timeout=300)
        assert r.returncode == 0, r.stderr
        # Not a terminal: plain progress lines, the digest and name on stdout.
        assert "Resolved to sha256:" in r.stderr and "Unpacked" in r.stderr, r.stderr
        assert "\033[" not in r.stderr
        assert f"Digest: {busybox.digest}" in r.stdout and ref in r.stdout
        assert named(daemon, ref)["manifest_digest"] == busybox.digest
        gets = reg.blob_gets()
        assert daemon.cli_ok("pull", "-q", ref).strip() == ref
        assert reg.blob_gets() == gets  # present: no layer transferred
        assert daemon.cli_ok("run", "--rm", ref, "--", "cat", "/home/alice/hello.txt").strip()
        r = daemon.cli("pull", reg.ref("it/busybox", "nope"), timeout=120)
        assert r.returncode == 125 and "nope" in r.stderr, r.stderr
        daemon.cli_ok("rmi", ref)
    assert_daemon_serves(daemon)
