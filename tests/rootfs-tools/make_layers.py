#!/usr/bin/python3
"""Writes the image layers layer_test unpacks, made with Python's tarfile as registries'
tools make them (pax, ./ names): OUT/layer1.tar.gz, OUT/layer2.tar.zst, OUT/layer2.tar,
and hostile ones OUT/bad-*.tar. Usage: make_layers.py OUT"""
import io
import subprocess
import sys
import tarfile
from pathlib import Path

out = Path(sys.argv[1])


def add(tar, name, data=None, **kw):
    info = tarfile.TarInfo(name)
    info.mtime = 1700000000
    info.mode = kw.pop("mode", 0o644 if data is not None else 0o755)
    for k, v in kw.items():
        setattr(info, k, v)
    if data is not None and info.type == tarfile.REGTYPE:
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    else:
        tar.addfile(info)


def layer(path, build):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        build(tar)
    path.write_bytes(buf.getvalue())
    return buf.getvalue()


def layer1(tar):
    add(tar, "./", type=tarfile.DIRTYPE)
    for d in ("etc", "data", "usr", "usr/bin", "dev", "home", "home/user"):
        add(tar, f"./{d}", type=tarfile.DIRTYPE)
    add(tar, "./etc/a", b"a1\n")
    add(tar, "./etc/b", b"b1\n")
    add(tar, "./data/old1", b"old\n")
    add(tar, "./data/old2", b"old\n")
    add(tar, "./usr/bin/tool", b"#!/bin/sh\n", mode=0o4755)
    add(tar, "./usr/bin/tool2", type=tarfile.LNKTYPE, linkname="./usr/bin/tool")
    add(tar, "./lnk", type=tarfile.SYMTYPE, linkname="/etc/a")
    add(tar, "./home/user/file", b"mine\n", uid=1000, gid=1000)
    info = tarfile.TarInfo("./etc/xattr")
    info.size, info.mtime, info.mode = 2, 1700000000, 0o644
    info.pax_headers = {"SCHILY.xattr.user.test": "hello",
                        "SCHILY.xattr.trusted.overlay.redirect": "/evil"}
    tar.addfile(info, io.BytesIO(b"x\n"))
    add(tar, "./dev/null", type=tarfile.CHRTYPE, devmajor=1, devminor=3, mode=0o666)
    add(tar, "./dev/fifo", type=tarfile.FIFOTYPE)
    add(tar, "./data/" + "n" * 150, b"long name\n")


def layer2(tar):
    add(tar, "./etc", type=tarfile.DIRTYPE)
    add(tar, "./etc/a", b"a2\n")
    add(tar, "./etc/.wh.b", b"")
    add(tar, "./data", type=tarfile.DIRTYPE)
    add(tar, "./data/.wh..wh..opq", b"")
    add(tar, "./data/new", b"new\n")
    add(tar, "./usr/bin/.wh.tool2", b"")


layer1_tar = layer(out / "layer1.tar", layer1)
subprocess.run(["gzip", "-kf", str(out / "layer1.tar")], check=True)
layer(out / "layer2.tar", layer2)
subprocess.run(["zstd", "-qf", str(out / "layer2.tar"), "-o", str(out / "layer2.tar.zst")],
               check=True)

layer(out / "bad-dotdot.tar", lambda t: add(t, "../escape", b"x"))
layer(out / "bad-absolute.tar", lambda t: add(t, "/abs", b"x"))
layer(out / "bad-whiteout.tar", lambda t: add(t, "./.wh...", b""))
layer(out / "bad-hardlink.tar",
      lambda t: add(t, "./h", type=tarfile.LNKTYPE, linkname="../../etc/passwd"))


# An OCI image layout of the two layers (OUT/layout), tagged "v1", and a copy whose
# layer blob has been tampered with (OUT/layout-bad).
def blob(layout, data):
    import hashlib
    digest = hashlib.sha256(data).hexdigest()
    (layout / "blobs/sha256").mkdir(parents=True, exist_ok=True)
    (layout / "blobs/sha256" / digest).write_bytes(data)
    return {"digest": "sha256:" + digest, "size": len(data)}


def make_layout(layout):
    import hashlib
    import json
    layout.mkdir()
    (layout / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    l1 = blob(layout, (out / "layer1.tar.gz").read_bytes())
    l2 = blob(layout, (out / "layer2.tar.zst").read_bytes())
    diff_ids = ["sha256:" + hashlib.sha256((out / n).read_bytes()).hexdigest()
                for n in ("layer1.tar", "layer2.tar")]
    config = blob(layout, json.dumps({
        "architecture": "amd64", "os": "linux", "created": "2026-11-29T00:00:00Z",
        "config": {"Env": ["PATH=/usr/bin"], "Cmd": ["/bin/sh"], "WorkingDir": "/data"},
        "rootfs": {"type": "layers", "diff_ids": diff_ids}}).encode())
    manifest = blob(layout, json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **config},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", **l1},
                   {"mediaType": "application/vnd.oci.image.layer.v1.tar+zstd", **l2}]}).encode())
    (layout / "index.json").write_text(json.dumps({
        "schemaVersion": 2, "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json", **manifest,
            "annotations": {"org.opencontainers.image.ref.name": "v1"}}]}))
    return l2


make_layout(out / "layout")
bad = make_layout(out / "layout-bad")
p = out / "layout-bad/blobs/sha256" / bad["digest"].split(":")[1]
p.write_bytes(p.read_bytes()[:-1] + b"\0")


# A docker-archive (docker save's format) of the same image: OUT/image.docker.tar, with
# one plain and one zstd layer; and one whose manifest.json points outside itself.
def make_docker_archive(path, layer_names):
    import hashlib
    import json
    diff_ids = ["sha256:" + hashlib.sha256((out / n).read_bytes()).hexdigest()
                for n in ("layer1.tar", "layer2.tar")]
    config = json.dumps({"architecture": "amd64", "os": "linux", "config": {"Cmd": ["/bin/sh"]},
                         "rootfs": {"type": "layers", "diff_ids": diff_ids}}).encode()
    chex = hashlib.sha256(config).hexdigest()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        def put(name, data):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        put(f"{chex}.json", config)
        put("a/layer.tar", (out / "layer1.tar").read_bytes())
        put("b/layer.tar.zst", (out / "layer2.tar.zst").read_bytes())
        put("manifest.json", json.dumps([{"Config": f"{chex}.json", "RepoTags": ["test/app:v1"],
                                          "Layers": layer_names}]).encode())
    path.write_bytes(buf.getvalue())


make_docker_archive(out / "image.docker.tar", ["a/layer.tar", "b/layer.tar.zst"])
make_docker_archive(out / "bad.docker.tar", ["a/layer.tar", "../../../../etc/hostname"])
