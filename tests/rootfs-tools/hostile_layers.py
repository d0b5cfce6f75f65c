#!/usr/bin/python3
"""Writes one hostile image layer (an uncompressed tar, pax format as registries' tools
write it) for the layer tests (layer_test.cc) and the integration tests
(tests/integration/test_images_security.py).

Usage:
  hostile_layers.py OUT devices MAJOR MINOR
      ./nodes/blk: block device MAJOR:MINOR (a loop device the test made), ./nodes/mem: char 1:1,
      ./nodes/null: char 1:3, ./nodes/zero-wh: char 0:0 (a whiteout in overlay's own form),
      ./etc/.wh.gone (a whiteout in the OCI form), ./nodes/fifo: a fifo (not under /dev: a sandbox has its own).
  hostile_layers.py OUT caps BINARY
      ./bin/capped: BINARY with security.capability v2 cap_setuid+ep (and cap_setgid),
      ./bin/capped3: BINARY with a v3 capability whose rootid is 0 (the host's root),
      ./bin/suid: BINARY setuid root (04755, uid 0), ./etc/xattrs: security.selinux,
      security.ima, trusted.berth.evil, trusted.overlay.opaque, user.ok.
  hostile_layers.py OUT unmapped
      ./bin/unmapped: 04777 owned by uid 4000000 (beyond any sandbox's range).
  hostile_layers.py OUT zeros BYTES
      ./zeros: a file of BYTES zero bytes (written in chunks: never whole in memory).
  hostile_layers.py OUT sparse BYTES
      ./sparse: a GNU sparse 1.0 file of apparent size BYTES and no data at all.
  hostile_layers.py OUT many COUNT
      COUNT empty files ./m/NNNNNNN.
"""
import io
import struct
import sys
import tarfile

MTIME = 1700000000
CAP_SETGID, CAP_SETUID = 6, 7
VFS_CAP_REVISION_2, VFS_CAP_REVISION_3, VFS_CAP_FLAGS_EFFECTIVE = 0x02000000, 0x03000000, 1


def info(name, **kw):
    ti = tarfile.TarInfo(name)
    ti.mtime = MTIME
    ti.mode = kw.pop("mode", 0o644)
    for k, v in kw.items():
        setattr(ti, k, v)
    return ti


def add_file(tar, name, data, **kw):
    ti = info(name, **kw)
    ti.size = len(data)
    tar.addfile(ti, io.BytesIO(data))


def add_dir(tar, name, **kw):
    tar.addfile(info(name, type=tarfile.DIRTYPE, mode=kw.pop("mode", 0o755), **kw))


def xattr_headers(values: dict) -> dict:
    # Binary values go as pax records with hdrcharset=BINARY (tarfile does that for
    # strings holding surrogate escapes), as GNU tar and containerd write them.
    return {"SCHILY.xattr." + k: v.decode("utf-8", "surrogateescape") if isinstance(v, bytes)
            else v for k, v in values.items()}


def caps_v2(caps):
    permitted = sum(1 << c for c in caps)
    return struct.pack("<IIIII", VFS_CAP_REVISION_2 | VFS_CAP_FLAGS_EFFECTIVE, permitted, 0, 0,
                       0)


def caps_v3(caps, rootid):
    permitted = sum(1 << c for c in caps)
    return struct.pack("<IIIIII", VFS_CAP_REVISION_3 | VFS_CAP_FLAGS_EFFECTIVE, permitted, 0, 0,
                       0, rootid)


def devices(tar, major, minor):
    add_dir(tar, "./")
    add_dir(tar, "./nodes")
    add_dir(tar, "./etc")
    tar.addfile(info("./nodes/blk", type=tarfile.BLKTYPE, devmajor=major, devminor=minor,
                     mode=0o666))
    tar.addfile(info("./nodes/mem", type=tarfile.CHRTYPE, devmajor=1, devminor=1, mode=0o666))
    tar.addfile(info("./nodes/null", type=tarfile.CHRTYPE, devmajor=1, devminor=3, mode=0o666))
    tar.addfile(info("./nodes/zero-wh", type=tarfile.CHRTYPE, devmajor=0, devminor=0,
                     mode=0o600))
    tar.addfile(info("./nodes/fifo", type=tarfile.FIFOTYPE))
    add_file(tar, "./etc/.wh.gone", b"")


def caps(tar, binary):
    data = open(binary, "rb").read()
    add_dir(tar, "./")
    add_dir(tar, "./bin")
    add_dir(tar, "./etc")
    ti = info("./bin/capped", mode=0o755)
    ti.pax_headers = xattr_headers({"security.capability": caps_v2([CAP_SETUID, CAP_SETGID])})
    ti.size = len(data)
    tar.addfile(ti, io.BytesIO(data))
    ti = info("./bin/capped3", mode=0o755)
    ti.pax_headers = xattr_headers({"security.capability":
                                    caps_v3([CAP_SETUID, CAP_SETGID], 0)})
    ti.size = len(data)
    tar.addfile(ti, io.BytesIO(data))
    add_file(tar, "./bin/suid", data, mode=0o4755, uid=0, gid=0)
    ti = info("./etc/xattrs")
    ti.pax_headers = xattr_headers({
        "security.selinux": "system_u:object_r:shadow_t:s0",
        "security.ima": b"\x03\x02\x04\x00\x00\x00\x00",
        "trusted.berth.evil": "1",
        "trusted.overlay.opaque": "y",
        "user.ok": "fine",
    })
    ti.size = 3
    tar.addfile(ti, io.BytesIO(b"ok\n"))


class Zeros(io.RawIOBase):
    def __init__(self, n):
        self.left = n

    def readable(self):
        return True

    def readinto(self, b):
        n = min(len(b), self.left)
        b[:n] = bytes(n)
        self.left -= n
        return n


def zeros(tar, nbytes):
    add_dir(tar, "./")
    ti = info("./zeros")
    ti.size = nbytes
    tar.addfile(ti, io.BufferedReader(Zeros(nbytes), 1 << 20))


def sparse(tar, nbytes):
    add_dir(tar, "./")
    # GNU sparse 1.0: the map ("0\n": no data segments) heads the data, padded to a block.
    ti = info("./GNUSparseFile.0/sparse")
    ti.pax_headers = {"GNU.sparse.major": "1", "GNU.sparse.minor": "0",
                      "GNU.sparse.name": "./sparse", "GNU.sparse.realsize": str(nbytes)}
    body = b"0\n".ljust(512, b"\0")
    ti.size = len(body)
    tar.addfile(ti, io.BytesIO(body))


def many(tar, count):
    add_dir(tar, "./")
    add_dir(tar, "./m")
    for i in range(count):
        tar.addfile(info(f"./m/{i:07d}"))


def main():
    out, kind, *args = sys.argv[1:]
    with open(out, "wb") as f, tarfile.open(fileobj=f, mode="w",
                                            format=tarfile.PAX_FORMAT) as tar:
        if kind == "devices":
            devices(tar, int(args[0]), int(args[1]))
        elif kind == "caps":
            caps(tar, args[0])
        elif kind == "unmapped":
            add_dir(tar, "./")
            add_dir(tar, "./bin")
            add_file(tar, "./bin/unmapped", b"#!/bin/sh\n", mode=0o4777, uid=4000000,
                     gid=4000000)
        elif kind == "zeros":
            zeros(tar, int(args[0]))
        elif kind == "sparse":
            sparse(tar, int(args[0]))
        elif kind == "many":
            many(tar, int(args[0]))
        else:
            sys.exit(f"unknown kind {kind}")


if __name__ == "__main__":
    main()
