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
