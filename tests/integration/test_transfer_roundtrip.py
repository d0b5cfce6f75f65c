"""File transfer, the happy paths: a 5,000-file tree with a 200 MB file, a sparse file,
symlinks, hardlinks, special modes and owners goes into a sandbox with `berth cp -a` and
comes back byte- and metadata-identical; ownership without -a, --user, downloads as another
host user; docker cp's destination rules both ways; tar streams on stdin/stdout; special
files skipped with a warning; `berth fs`; the raw protocol's copy, stat, mkdir and rm."""
import grp
import io
import json
import os
import shutil
import socket
import stat
import subprocess
import tarfile
from pathlib import Path

import pytest

import transferutil as tu
from transferutil import MiB, ok, fails, sh

ROOT_UID = 200000  # root inside a sandbox, on the host (conftest's berth subuid range)


@pytest.fixture(scope="session")
def src_tree(base_dir):
    """The round-trip tree and its manifest, made once per session."""
    root = base_dir / "transfer-src" / "tree"
    tu.make_tree(root)
    want = tu.manifest(root)
    assert tu.count_files(want) >= 5000, tu.count_files(want)
    return root, want


@pytest.fixture(scope="module")
def sb(daemon, busybox_rootfs):
    # nobody's (root made it for nobody, as an admin would): the tests copy as root, which
    # reaches every sandbox, and as nobody, which reaches only its own.
    return daemon.create(busybox_rootfs, "--name", "transfer-rt", "--owner", "65534")


@pytest.fixture
def host_dir(base_dir, request):
    """An empty host directory for the test's downloads."""
    d = base_dir / "transfer-dl" / request.node.name
    d.mkdir(parents=True)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def inside_stat(daemon, sandbox, top) -> dict:
    """{relative path: (type, mode, uid, gid, size, mtime_s)} as busybox stat sees it inside."""
    out = sh(daemon, sandbox,
             f"cd '{top}' && find . -exec stat -c '%n|%F|%a|%u|%g|%s|%Y' {{}} +")
    res = {}
    for line in out.splitlines():
        name, kind, mode, uid, gid, size, mtime = line.rsplit("|", 6)
        kind = ("file" if kind.startswith("regular") else "dir" if kind == "directory"
                else "symlink" if kind == "symbolic link" else kind)
        rel = "." if name == "." else name[2:]
        res[rel] = (kind, int(mode, 8), int(uid), int(gid), int(size), int(mtime))
    return res


def expected_inside(want: dict, uid_shift: int = 0) -> dict:
    res = {}
    for rel, e in want.items():
        size = e.get("size", len(e.get("link", "")))
        res[rel] = (e["type"], int(e["mode"], 8), e["uid"] + uid_shift, e["gid"] + uid_shift,
                    size, e["mtime_ns"] // 10**9)
    return res


def compare_inside(want: dict, got: dict, what: str):
    problems = []
    for rel in sorted(set(want) | set(got)):
        w, g = want.get(rel), got.get(rel)
        if w is None or g is None:
            problems.append(f"{rel}: want {w} got {g}")
            continue
        if w[0] == "dir":  # directory sizes are the filesystem's business
            w, g = w[:4] + w[5:], g[:4] + g[5:]
        if w != g:
            problems.append(f"{rel}: want {w} got {g}")
    assert not problems, f"{what}: {len(problems)} differences\n" + "\n".join(problems[:25])


def fs_stat(daemon, *args) -> dict:
    """`berth fs stat --json`, normalized: ints for the numbers (proto3 JSON writes 64-bit ones
    as strings and may leave out zeros), a lower-case type name."""
    raw = json.loads(ok(daemon, "fs", "stat", "--json", *args).stdout)
    out = {k: int(raw.get(k, 0)) for k in ("mode", "size", "uid", "gid", "mtime_ns")}
    out["type"] = {"regular": "file"}.get(str(raw.get("type", "missing")).lower(),
                                          str(raw.get("type", "missing")).lower())
    out["link_target"] = raw.get("link_target", raw.get("linkTarget", ""))
    return out


# ---- the round trip ------------------------------------------------------------------------

def test_round_trip_archive_mode(daemon, sb, src_tree, host_dir):
    root, want = src_tree
    # Upload to a missing destination whose parent is missing too: /rt/tree is created with
    # the tree's contents (and its mode and mtime).
    r = ok(daemon, "cp", "-a", root, f"{sb}:/rt/tree", timeout=300)
    assert r.stdout == b"", r.stdout
    dst = host_dir / "back"
    ok(daemon, "cp", "-a", f"{sb}:/rt/tree", dst, timeout=300)
    got = tu.manifest(dst)
    tu.assert_same_manifest(want, got, "host tree -> berth cp -a -> berth cp -a -> host")

    # Sparse files stay sparse: in the sandbox's layer and after the download.
    upper = daemon.upper_dir(sb) / "rt/tree"
    assert tu.allocated(root / "sparse.img") < 4 * MiB  # (the test's own premise)
    assert tu.allocated(upper / "sparse.img") < 4 * MiB, \
        f"sparse.img takes {tu.allocated(upper / 'sparse.img')} bytes in the sandbox"
    assert tu.allocated(dst / "sparse.img") < 4 * MiB, \
        f"sparse.img takes {tu.allocated(dst / 'sparse.img')} bytes after the download"

    # In the sandbox's layer on the host: the same tree with ids shifted into the sandbox's
    # range (root inside = 200000), setuid/setgid bits, mtimes and hardlinks intact.
    in_upper = tu.manifest(upper, hashes=False)
    shifted = {}
    for rel, e in want.items():
        e = dict(e)
        e.pop("sha256", None)
        e["uid"] += ROOT_UID
        e["gid"] += ROOT_UID
        shifted[rel] = e
    tu.assert_same_manifest(shifted, in_upper, "the uploaded tree in the sandbox's upper dir")

    # Seen from inside (busybox): owners, modes, sizes, mtimes of every entry...
    compare_inside(expected_inside(want), inside_stat(daemon, sb, "/rt/tree"),
                   "the uploaded tree seen from inside")
    # ...and every file's sha256.
    out = sh(daemon, sb, "cd /rt/tree && find . -type f -exec sha256sum {} +")
    sums = {line[66:][2:]: line[:64] for line in out.splitlines()}
    want_sums = {rel: e["sha256"] for rel, e in want.items() if e["type"] == "file"}
    assert sums == want_sums, [k for k in set(sums) ^ set(want_sums)][:10] or \
        [k for k in sums if sums[k] != want_sums[k]][:10]
    ls = sh(daemon, sb, "ls -lnd /rt/tree/owners/u1000 /rt/tree/owners/suid-1000 "
                        "/rt/tree/modes/sticky-dir")
    for line in ls.splitlines():
        fields = line.split()
        name = fields[-1]
        if name.endswith("u1000"):
            assert fields[0] == "-rw-r--r--" and fields[2:4] == ["1000", "1000"], line
        elif name.endswith("suid-1000"):
            assert fields[0] == "-rwsr-xr-x" and fields[2:4] == ["1000", "1000"], line
        else:
            assert fields[0] == "drwxrwxrwt" and fields[2:4] == ["0", "0"], line


def test_upload_owners_default_root_and_user(daemon, sb, src_tree):
    root, want = src_tree
    owners = root / "owners"
    ok(daemon, "cp", owners, f"{sb}:/own/plain")
    ok(daemon, "cp", "--user", "alice", owners, f"{sb}:/own/alice")
    ok(daemon, "cp", "-u", "4242:50", owners / "u1000", f"{sb}:/own/numeric")
    sub = {rel[len("owners/"):] if rel != "owners" else ".": e
           for rel, e in want.items() if rel == "owners" or rel.startswith("owners/")}
    for top, (uid, gid) in (("/own/plain", (0, 0)), ("/own/alice", (1000, 1000))):
        seen = inside_stat(daemon, sb, top)
        assert set(seen) == set(sub), (top, sorted(set(seen) ^ set(sub)))
        for rel, (kind, mode, u, g, size, mtime) in seen.items():
            assert (u, g) == (uid, gid), f"{top}/{rel} is {u}:{g}, want {uid}:{gid}"
            # Modes (setuid/setgid included) and mtimes are kept without -a too.
            assert mode == int(sub[rel]["mode"], 8), (top, rel, oct(mode), sub[rel]["mode"])
            assert mtime == sub[rel]["mtime_ns"] // 10**9, (top, rel)
        # The same on the host side of the sandbox's layer.
        for rel in sub:
            st = os.lstat(daemon.upper_dir(sb) / top.lstrip("/") / rel)
            assert (st.st_uid, st.st_gid) == (ROOT_UID + uid, ROOT_UID + gid), (top, rel)
    assert sh(daemon, sb, "stat -c '%u %g' /own/numeric").split() == ["4242", "50"]
    # The created parent /own belongs to root (the first upload was root's).
    assert sh(daemon, sb, "stat -c '%u %g %a' /own").split() == ["0", "0", "755"]
    ls = sh(daemon, sb, "ls -ln /own/alice").splitlines()
    rows = [line.split() for line in ls if line and not line.startswith("total")]
    assert rows and all(r[2:4] == ["1000", "1000"] for r in rows), ls


def test_download_owners(daemon, sb, src_tree, host_dir):
    root, want = src_tree
    ok(daemon, "cp", "-a", root / "owners", f"{sb}:/dl-owners")
    # As root without -a: everything belongs to the caller (root); modes and mtimes kept.
    ok(daemon, "cp", f"{sb}:/dl-owners", host_dir / "plain")
    sub = {rel: e for rel, e in want.items() if rel == "owners" or rel.startswith("owners/")}
    got = tu.manifest(host_dir / "plain")
    for rel, e in got.items():
        src = sub["owners" if rel == "." else "owners/" + rel]
        assert (e["uid"], e["gid"]) == (0, 0), (rel, e)
        assert (e["mode"], e["mtime_ns"], e.get("sha256")) == \
            (src["mode"], src["mtime_ns"], src.get("sha256")), (rel, e, src)

    # As an unprivileged host user (nobody, in group berth to reach the socket): its own
    # files, with and without -a (only root keeps the sandbox's owners).
    berth_gid = grp.getgrnam("berth").gr_gid
    mine = host_dir / "nobody"
    mine.mkdir()
    os.chown(mine, 65534, berth_gid)
    for sub_name, flags in (("plain", []), ("archive", ["-a"])):
        ok(daemon, "cp", *flags, f"{sb}:/dl-owners", mine / sub_name,
           user=65534, group=berth_gid)
        got = tu.manifest(mine / sub_name)
        assert set(got) == {"." if r == "owners" else r[len("owners/"):] for r in sub}
        for rel, e in got.items():
            src = sub["owners" if rel == "." else "owners/" + rel]
            assert (e["uid"], e["gid"]) == (65534, berth_gid), (sub_name, rel, e)
            assert e["mode"] == src["mode"], (sub_name, rel, e, src)
            assert e.get("sha256") == src.get("sha256"), (sub_name, rel)


# ---- destination rules ---------------------------------------------------------------------

def listing(daemon, sandbox, top) -> list:
    out = sh(daemon, sandbox, f"cd '{top}' && find . | sort")
    return [line for line in out.splitlines() if line != "."]


def host_listing(top: Path) -> list:
    return sorted("./" + str(p.relative_to(top)) for p in top.rglob("*"))


@pytest.fixture
def small_src(base_dir, request):
    src = base_dir / "transfer-src" / request.node.name
    (src / "dir/sub").mkdir(parents=True)
    (src / "f.txt").write_text("file f\n")
    (src / "g.txt").write_text("file g\n")
    (src / "dir/a").write_text("a\n")
    (src / "dir/sub/b").write_text("b\n")
    os.symlink("dir/sub", src / "link")
    yield src
    shutil.rmtree(src, ignore_errors=True)


def test_upload_destination_rules(daemon, sb, small_src):
    s = small_src
    sh(daemon, sb, "mkdir -p /sem/d1 /sem/d2 /sem/d3")
    ok(daemon, "cp", s / "f.txt", f"{sb}:/sem/d1")              # into an existing dir
    ok(daemon, "cp", s / "f.txt", f"{sb}:/sem/new/deep/h.txt")  # a new path, parents made
    ok(daemon, "cp", s / "g.txt", f"{sb}:/sem/d1/f.txt")        # over an existing file
    ok(daemon, "cp", s / "dir", f"{sb}:/sem/d2")                # a dir into an existing dir
    ok(daemon, "cp", f"{s}/dir/.", f"{sb}:/sem/d3")             # its contents only
    ok(daemon, "cp", s / "dir", f"{sb}:/sem/d4/new")            # to a missing path
    ok(daemon, "cp", s / "link", f"{sb}:/sem/d1")               # a symlink, as a link
    ok(daemon, "cp", s / "f.txt", f"{sb}:sem/relative.txt")      # relative to the workdir /
    assert listing(daemon, sb, "/sem") == [
        "./d1", "./d1/f.txt", "./d1/link", "./d2", "./d2/dir", "./d2/dir/a", "./d2/dir/sub",
        "./d2/dir/sub/b", "./d3", "./d3/a", "./d3/sub", "./d3/sub/b", "./d4", "./d4/new",
        "./d4/new/a", "./d4/new/sub", "./d4/new/sub/b", "./new", "./new/deep",
        "./new/deep/h.txt", "./relative.txt"]
    assert sh(daemon, sb, "cat /sem/d1/f.txt /sem/new/deep/h.txt /sem/d4/new/sub/b") == \
        "file g\nfile f\nb\n"
    assert sh(daemon, sb, "readlink /sem/d1/link").strip() == "dir/sub"
    # By unique id prefix and by name too.
    ok(daemon, "cp", s / "f.txt", f"{sb[:8]}:/sem/by-prefix")
    ok(daemon, "cp", s / "f.txt", "transfer-rt:/sem/by-name")
    assert sh(daemon, sb, "cat /sem/by-prefix /sem/by-name") == "file f\nfile f\n"


def test_download_destination_rules(daemon, sb, small_src, host_dir):
    ok(daemon, "cp", f"{small_src}/.", f"{sb}:/semdl")
    h = host_dir
    (h / "existing").mkdir()
    ok(daemon, "cp", f"{sb}:/semdl/f.txt", h / "existing")
    ok(daemon, "cp", f"{sb}:/semdl/f.txt", h / "new/deep/x.txt")
    ok(daemon, "cp", f"{sb}:/semdl/dir", h / "existing")
    (h / "contents").mkdir()
    ok(daemon, "cp", f"{sb}:/semdl/dir/.", h / "contents")
    ok(daemon, "cp", f"{sb}:/semdl/dir", h / "missing")
    ok(daemon, "cp", f"{sb}:/semdl/link", h / "existing")
    ok(daemon, "cp", f"{sb}:semdl/g.txt", h / "rel.txt")
    assert host_listing(h) == [
        "./contents", "./contents/a", "./contents/sub", "./contents/sub/b",
        "./existing", "./existing/dir", "./existing/dir/a", "./existing/dir/sub",
        "./existing/dir/sub/b", "./existing/f.txt", "./existing/link",
        "./missing", "./missing/a", "./missing/sub", "./missing/sub/b",
        "./new", "./new/deep", "./new/deep/x.txt", "./rel.txt"]
    assert (h / "new/deep/x.txt").read_text() == "file f\n"
    assert (h / "rel.txt").read_text() == "file g\n"
    assert os.readlink(h / "existing/link") == "dir/sub"
    # Downloading again overwrites.
    sh(daemon, sb, "echo changed > /semdl/dir/a")
    ok(daemon, "cp", f"{sb}:/semdl/dir/.", h / "contents")
    assert (h / "contents/a").read_text() == "changed\n"


def test_workdir_relative_paths(daemon, busybox_rootfs, small_src, host_dir):
    with daemon.connect() as c:
        sid = c.create(busybox_rootfs, persistent=True, workdir="/home/alice").id
    ok(daemon, "cp", small_src / "f.txt", f"{sid}:up.txt")
    ok(daemon, "fs", "mkdir", f"{sid}:sub")
    ok(daemon, "cp", small_src / "dir", f"{sid}:sub")
    assert sh(daemon, sid, "cat /home/alice/up.txt /home/alice/sub/dir/a") == "file f\na\n"
    ok(daemon, "cp", f"{sid}:up.txt", host_dir)
    assert (host_dir / "up.txt").read_text() == "file f\n"


def test_file_metadata_single_file(daemon, sb, base_dir):
    src = base_dir / "transfer-src" / "meta.bin"
    src.parent.mkdir(parents=True, exist_ok=True)
    src.write_bytes(b"m" * 1000)
    src.chmod(0o6711)
    os.utime(src, ns=(1_234_567_890_987_654_321, 1_234_567_890_123_456_789))
    ok(daemon, "cp", src, f"{sb}:/meta/")
    st = fs_stat(daemon, f"{sb}:/meta/meta.bin")
    assert st["type"] == "file", st
    assert st["mode"] == 0o6711, st
    assert st["size"] == 1000, st
    assert st["mtime_ns"] == 1_234_567_890_123_456_789, st
    assert (st["uid"], st["gid"]) == (0, 0), st


# ---- tar streams ---------------------------------------------------------------------------

def test_tar_stream_in_and_out(daemon, sb, host_dir, busybox_rootfs):
    data = tu.tar_bytes([
        tu.tar_dir("top", 0o750),
        tu.tar_file("top/file", b"from a tar\n", 0o4755),
        tu.tar_symlink("top/link", "/etc/passwd"),
        tu.tar_hardlink("top/hard", "top/file"),
        tu.tar_file("top/" + "n" * 200, b"long name\n"),
    ])
    r = ok(daemon, "cp", "-", f"{sb}:/tarin/x", input=data)
    assert r.stdout == b""
    out = sh(daemon, sb, "cd /tarin/x && stat -c '%n %F %a' top && "
                         "stat -c '%n %a %h %s' top/file top/hard top/link && "
                         "readlink top/link && cat top/n*")
    assert out.splitlines() == ["top directory 750", "top/file 4755 2 11",
                                "top/hard 4755 2 11", "top/link 777 1 11", "/etc/passwd",
                                "long name"], out

    # Out: a tar of the entry, named by its basename.
    r = ok(daemon, "cp", f"{sb}:/tarin/x/top", "-")
    with tarfile.open(fileobj=io.BytesIO(r.stdout)) as t:
        members = {m.name.rstrip("/"): m for m in t.getmembers()}
        assert set(members) == {"top", "top/file", "top/link", "top/hard", "top/" + "n" * 200}
        assert members["top/link"].issym() and members["top/link"].linkname == "/etc/passwd"
        # One name of the inode carries the data, the other is a hardlink to it.
        pair = sorted((members["top/file"], members["top/hard"]), key=lambda m: m.islnk())
        assert pair[0].isfile() and pair[1].islnk() and pair[1].linkname == pair[0].name, pair
        assert pair[0].mode & 0o7777 == 0o4755
        assert t.extractfile(pair[0]).read() == b"from a tar\n"
    r = ok(daemon, "cp", f"{sb}:/etc/passwd", "-")
    assert tu.tar_names(r.stdout) == ["passwd"]

    # GNU tar on the host can read what berth writes and write what berth reads.
    ok(daemon, "cp", "-", f"{sb}:/gnu", input=subprocess.run(
        ["tar", "--format=gnu", "-C", str(busybox_rootfs / "etc"), "-cf", "-",
         "passwd", "group"], capture_output=True, check=True).stdout)
    assert sh(daemon, sb, "ls /gnu").split() == ["group", "passwd"]
    r = ok(daemon, "cp", f"{sb}:/tarin/x", "-")
    subprocess.run(["tar", "-C", str(host_dir), "-xpf", "-"], input=r.stdout, check=True)
    assert (host_dir / "x/top/file").read_bytes() == b"from a tar\n"
    assert os.readlink(host_dir / "x/top/link") == "/etc/passwd"


# ---- special files -------------------------------------------------------------------------

def test_special_files_skipped_with_warning(daemon, sb, base_dir, host_dir):
    src = base_dir / "transfer-src" / "special"
    src.mkdir(parents=True)
    (src / "regular").write_text("kept\n")
    os.mkfifo(src / "fifo")
    os.mknod(src / "chardev", 0o600 | stat.S_IFCHR, os.makedev(1, 3))
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(src / "sock"))
    try:
        r = ok(daemon, "cp", src, f"{sb}:/special")
    finally:
        sock.close()
    err = r.stderr.decode()
    for name in ("fifo", "chardev", "sock"):
        assert name in err, f"no warning naming {name}: {err!r}"
    assert sh(daemon, sb, "ls -A /special").split() == ["regular"]

    # Downloads skip them too.
    sh(daemon, sb, "mkdir -p /sp && echo kept > /sp/regular && mkfifo /sp/pipe")
    r = ok(daemon, "cp", f"{sb}:/sp", host_dir)
    assert "pipe" in r.stderr.decode(), r.stderr
    assert sorted(os.listdir(host_dir / "sp")) == ["regular"]


# ---- berth fs ------------------------------------------------------------------------------

def test_fs_stat_mkdir_rm(daemon, sb):
    st = fs_stat(daemon, f"{sb}:/etc/passwd")
    assert st["type"] == "file" and st["mode"] == 0o644, st
    assert st["size"] > 0 and st["mtime_ns"] > 10**18, st
    st = fs_stat(daemon, f"{sb}:/bin/sh")
    assert st["type"] == "symlink" and st["link_target"] == "busybox", st
    st = fs_stat(daemon, "-L", f"{sb}:/bin/sh")
    assert st["type"] == "file" and st["size"] > 100000, st
    st = fs_stat(daemon, f"{sb}:/tmp")
    assert st["type"] == "directory" and st["mode"] == 0o1777, st
    r = tu.berth(daemon, "fs", "stat", f"{sb}:/no/such/thing")
    assert r.returncode == 1 and b"/no/such/thing" in r.stdout + r.stderr, \
        tu.describe(["fs stat"], r)
    # The plain output says what it is.
    assert b"directory" in ok(daemon, "fs", "stat", f"{sb}:/etc").stdout.lower()

    ok(daemon, "fs", "mkdir", "-u", "alice", "-m", "0710", f"{sb}:/mk/a/b")
    assert sh(daemon, sb, "stat -c '%n %a %u %g' /mk /mk/a /mk/a/b").splitlines() == \
        ["/mk 710 1000 1000", "/mk/a 710 1000 1000", "/mk/a/b 710 1000 1000"]
    ok(daemon, "fs", "mkdir", f"{sb}:/mk/a/b")  # exists: fine (mkdir -p)
    ok(daemon, "fs", "mkdir", f"{sb}:mk/rel")
    assert sh(daemon, sb, "stat -c '%a %u' /mk/rel").split() == ["755", "0"]
    fails(daemon, "fs", "mkdir", f"{sb}:/etc/passwd/x", needles=["/etc/passwd"])

    sh(daemon, sb, "echo x > /mk/a/b/file && ln -s /etc /mk/a/b/etc-link")
    ok(daemon, "fs", "rm", f"{sb}:/mk/a/b/etc-link")  # the link, not /etc
    assert sh(daemon, sb, "ls /etc/passwd") == "/etc/passwd\n"
    fails(daemon, "fs", "rm", f"{sb}:/mk/a", needles=["/mk/a"])  # a dir needs -r
    ok(daemon, "fs", "rm", "-r", f"{sb}:/mk/a")
    assert sh(daemon, sb, "ls -A /mk").split() == ["rel"]
    fails(daemon, "fs", "rm", f"{sb}:/mk/gone", needles=["/mk/gone"])
    fails(daemon, "fs", "rm", "-r", f"{sb}:/", needles=["/"])
    assert sh(daemon, sb, "ls /bin/busybox") == "/bin/busybox\n"


# ---- the raw protocol ----------------------------------------------------------------------

def test_protocol_copy_stat_mkdir_rm(daemon, sb, conn):
    from berth_proto import pb
    stream = tu.tar_bytes([tu.tar_dir("p"), tu.tar_file("p/one", b"1" * 100000, 0o640),
                           tu.tar_symlink("p/l", "one")])
    reply = conn.upload(sb, "/proto/in", stream)
    assert reply.entries >= 2 and reply.bytes == 100000, reply
    st = conn.stat_path(sb, "/proto/in/p/one")
    assert st.type == pb.PathStat.REGULAR and st.mode == 0o640 and st.size == 100000, st
    assert st.mtime_ns == 1_600_000_000 * 10**9 and st.uid == 0 and st.gid == 0, st
    st = conn.stat_path(sb, "/proto/in/p/l")
    assert st.type == pb.PathStat.SYMLINK and st.link_target == "one", st
    assert conn.stat_path(sb, "/proto/in/p/l", follow=True).type == pb.PathStat.REGULAR
    assert conn.stat_path(sb, "/proto/none").type == pb.PathStat.MISSING

    data, reply = conn.download(sb, "/proto/in/p")
    assert sorted(tu.tar_names(data)) == ["p", "p/l", "p/one"], tu.tar_names(data)
    assert reply.bytes == 100000, reply
    data, _ = conn.download(sb, "/proto/in/p", name="renamed")
    assert sorted(tu.tar_names(data)) == ["renamed", "renamed/l", "renamed/one"]
    data, _ = conn.download(sb, "/proto/in/p", contents_only=True)
    assert sorted(n.lstrip("./") or "." for n in tu.tar_names(data)) == [".", "l", "one"]

    # Upload ownership over the protocol: user, and preserve_owners.
    owned = tu.tar_bytes([tu.tar_file("o", b"o")])
    info = tarfile.TarInfo("kept")
    info.uid, info.gid, info.size = 1234, 4321, 1
    kept = tu.tar_bytes([(info, b"k")])
    conn.upload(sb, "/proto/own", owned, user="alice")
    conn.upload(sb, "/proto/own", kept, preserve_owners=True)
    assert (conn.stat_path(sb, "/proto/own/o").uid, conn.stat_path(sb, "/proto/own/o").gid) \
        == (1000, 1000)
    assert (conn.stat_path(sb, "/proto/own/kept").uid,
            conn.stat_path(sb, "/proto/own/kept").gid) == (1234, 4321)

    assert conn.make_dirs(sb, "/proto/m/n", mode=0o700) is True
    assert conn.make_dirs(sb, "/proto/m/n") is False
    st = conn.stat_path(sb, "/proto/m/n")
    assert st.type == pb.PathStat.DIRECTORY and st.mode == 0o700, st
    conn.remove_path(sb, "/proto/m", recursive=True)
    assert conn.stat_path(sb, "/proto/m").type == pb.PathStat.MISSING
    conn.remove_path(sb, "/proto/in/p/l")
    assert conn.stat_path(sb, "/proto/in/p/one").type == pb.PathStat.REGULAR
