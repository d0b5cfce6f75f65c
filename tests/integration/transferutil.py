"""Helpers for the file-transfer tests (test_transfer_*.py): running `berth cp` with bytes,
host trees and their checksum manifests, host canaries that show whether anything outside a
sandbox was read or written.
"""
import hashlib
import io
import os
import random
import stat
import subprocess
import tarfile
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Dict, Iterable, List, Optional

import berth_proto

BERTH = berth_proto.BUILD_DIR / "src/runtime/berth"
MiB = 1 << 20


# ---- the CLI -------------------------------------------------------------------------------

def berth(daemon, *args, input: Optional[bytes] = None, user=None, group=None,
          timeout: float = 120, cwd=None) -> subprocess.CompletedProcess:
    """Runs the berth CLI against `daemon` with binary stdin/stdout (optionally as another
    host user/group)."""
    env = dict(os.environ)
    env["BERTH_SOCKET"] = daemon.socket
    extra = {}
    if user is not None:
        extra = dict(user=user, group=group, extra_groups=[])
    return subprocess.run([str(BERTH), *map(str, args)], input=input, capture_output=True,
                          timeout=timeout, env=env, cwd=cwd or "/", **extra)


def describe(args, r) -> str:
    return (f"berth {' '.join(map(str, args))} -> {r.returncode}\n"
            f"stdout: {r.stdout[:2000]!r}\nstderr: {r.stderr.decode(errors='replace')}")


def ok(daemon, *args, **kw) -> subprocess.CompletedProcess:
    r = berth(daemon, *args, **kw)
    assert r.returncode == 0, describe(args, r)
    return r


def fails(daemon, *args, needles: Iterable[str] = (), code: int = 125, **kw) -> str:
    """Runs berth, expecting exit `code` and a message on stderr starting "berth: " that
    contains every needle. Returns stderr."""
    return check_failed(args, berth(daemon, *args, **kw), needles, code)


def check_failed(args, r, needles: Iterable[str] = (), code: int = 125) -> str:
    """The failure check of fails(), for a result already in hand (so that a test can look at
    what was left behind before it looks at the message)."""
    err = r.stderr.decode(errors="replace")
    assert r.returncode == code, f"expected exit {code}\n" + describe(args, r)
    assert err.startswith("berth: "), "stderr does not start with 'berth: '\n" + \
        describe(args, r)
    for needle in needles:
        assert needle in err, f"{needle!r} not named on stderr\n" + describe(args, r)
    return err


def sh(daemon, sandbox: str, script: str, user: Optional[str] = None) -> str:
    """Runs a shell script inside the sandbox (busybox sh); returns stdout."""
    args = ["exec"] + (["-u", user] if user else []) + [sandbox, "--", "sh", "-c", script]
    return daemon.cli_ok(*args, timeout=120)


# ---- data ----------------------------------------------------------------------------------

_BASE_BLOCK = None


def pattern_chunk(i: int, seed: int = 0) -> bytes:
    """1 MiB of incompressible-looking data that differs per (i, seed): a random block made
    once per process with a varying 32-byte header."""
    global _BASE_BLOCK
    if _BASE_BLOCK is None:
        _BASE_BLOCK = os.urandom(MiB)
    head = f"berth-chunk {seed:08x} {i:012d}\n".encode()[:32].ljust(32, b"#")
    return head + _BASE_BLOCK[32:]


def write_pattern_file(path: Path, size: int, seed: int = 0) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        left, i = size, 0
        while left > 0:
            chunk = pattern_chunk(i, seed)[:left]
            view = memoryview(chunk)
            while view:
                view = view[os.write(fd, view):]
            left -= len(chunk)
            i += 1
    finally:
        os.close(fd)


def sha256_file(path, follow: bool = False) -> str:
    h = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY | (0 if follow else os.O_NOFOLLOW))
    try:
        while True:
            chunk = os.read(fd, 4 * MiB)
            if not chunk:
                break
            h.update(chunk)
    finally:
        os.close(fd)
    return h.hexdigest()


def allocated(path) -> int:
    """Bytes a file occupies on disk."""
    return os.lstat(path).st_blocks * 512


# ---- manifests -----------------------------------------------------------------------------

def _type_of(mode: int) -> str:
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISLNK(mode):
        return "symlink"
    return "other"


def manifest(root: Path, owners: bool = True, mtimes: bool = True, top: bool = True,
             hashes: bool = True) -> Dict[str, dict]:
    """Relative path -> {type, mode, size, sha256, link, mtime_ns, uid, gid, links} for every
    entry under root (root itself as "."), never following a symlink. `links` is the sorted
    group of paths sharing the inode (hardlinks) or None. Directory sizes are not recorded
    (they depend on the filesystem)."""
    out: Dict[str, dict] = {}
    by_inode = defaultdict(list)
    root = Path(root)

    def add(rel: str, full: str):
        st = os.lstat(full)
        kind = _type_of(st.st_mode)
        e = {"type": kind, "mode": oct(stat.S_IMODE(st.st_mode))}
        if kind == "file":
            e["size"] = st.st_size
            if hashes:
                e["sha256"] = sha256_file(full)
            by_inode[(st.st_dev, st.st_ino)].append(rel)
        elif kind == "symlink":
            e["link"] = os.readlink(full)
        if mtimes:
            e["mtime_ns"] = st.st_mtime_ns
        if owners:
            e["uid"], e["gid"] = st.st_uid, st.st_gid
        e["links"] = None
        out[rel] = e

    if top:
        add(".", str(root))
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            full = os.path.join(dirpath, name)
            add(os.path.relpath(full, root), full)
    for group in by_inode.values():
        if len(group) > 1:
            for rel in group:
                out[rel]["links"] = tuple(sorted(group))
    return out


def diff_manifests(want: Dict[str, dict], got: Dict[str, dict], limit: int = 25) -> List[str]:
    lines = []
    for rel in sorted(set(want) - set(got)):
        lines.append(f"missing: {rel} {want[rel]}")
    for rel in sorted(set(got) - set(want)):
        lines.append(f"extra:   {rel} {got[rel]}")
    for rel in sorted(set(want) & set(got)):
        if want[rel] != got[rel]:
            keys = sorted(k for k in set(want[rel]) | set(got[rel])
                          if want[rel].get(k) != got[rel].get(k))
            lines.append(f"differs: {rel}: " + ", ".join(
                f"{k} want {want[rel].get(k)!r} got {got[rel].get(k)!r}" for k in keys))
    if len(lines) > limit:
        lines = lines[:limit] + [f"... and {len(lines) - limit} more"]
    return lines


def assert_same_manifest(want, got, what: str):
    problems = diff_manifests(want, got)
    assert not problems, f"{what}: {len(problems)} differences\n" + "\n".join(problems)


# ---- the round-trip tree -------------------------------------------------------------------

TREE_SMALL_FILES = 5000
BIG_SIZE = 200 * MiB
SPARSE_SIZE = 64 * MiB


def make_tree(root: Path, big_size: int = BIG_SIZE, small_files: int = TREE_SMALL_FILES,
              seed: int = 1) -> None:
    """The round-trip tree: `small_files` small files in nested dirs, a big file, a sparse
    file, symlinks (relative, absolute, dangling, to dirs, a loop), hardlink groups, modes
    incl. setuid/setgid/sticky and a 0555 dir with contents, several owners, odd and long
    names, and distinct nanosecond mtimes on everything (set bottom-up)."""
    rnd = random.Random(seed)
    root.mkdir(parents=True)

    # Many small files, nested 3 levels deep.
    many = root / "many"
    n = 0
    for a in range(20):
        for b in range(5):
            d = many / f"d{a:02}" / f"e{b}"
            if b % 2:
                d = d / "deeper"
            d.mkdir(parents=True, exist_ok=True)
            for c in range(small_files // 100):
                size = rnd.choice((0, 1, 100, 511, 512, 513, 4096, 5000, 12000))
                payload = (f"{a}/{b}/{c}:".encode() * (size // 6 + 1))[:size]
                (d / f"f{c:03}.txt").write_bytes(payload)
                n += 1
    assert n == small_files

    write_pattern_file(root / "big.bin", big_size, seed=seed)

    # Sparse: data at the start, in the middle and at the end of 64 MiB.
    sp = root / "sparse.img"
    with open(sp, "wb") as f:
        f.truncate(SPARSE_SIZE)
        for off, size in ((0, 4096), (20 * MiB, MiB), (SPARSE_SIZE - 8192, 8192)):
            f.seek(off)
            f.write(pattern_chunk(off // MiB, seed=7)[:size])

    modes = root / "modes"
    modes.mkdir()
    for name, mode in (("suid", 0o4755), ("sgid", 0o2755), ("suid-sgid-sticky", 0o7755),
                       ("ro", 0o444), ("none", 0o000), ("private", 0o600),
                       ("exec", 0o755), ("odd", 0o1640)):
        p = modes / name
        p.write_text(f"mode {name}\n")
        p.chmod(mode)
    (modes / "sticky-dir").mkdir()
    (modes / "sticky-dir/in").write_text("in a sticky dir\n")
    (modes / "sticky-dir").chmod(0o1777)
    (modes / "sgid-dir").mkdir()
    (modes / "sgid-dir/in").write_text("in a setgid dir\n")
    (modes / "sgid-dir").chmod(0o2775)
    ro = modes / "ro-dir"
    (ro / "sub").mkdir(parents=True)
    (ro / "file").write_text("in a 0555 dir\n")
    (ro / "sub/nested").write_text("nested under a 0555 dir\n")
    (ro / "sub").chmod(0o500)
    ro.chmod(0o555)
    (modes / "private-dir").mkdir(mode=0o700)
    (modes / "private-dir").chmod(0o700)
    (modes / "empty-dir").mkdir()

    links = root / "links"
    links.mkdir()
    os.symlink("../modes/suid", links / "relative")
    os.symlink("/etc/passwd", links / "absolute")
    os.symlink("does/not/exist", links / "dangling")
    os.symlink("/no/such/absolute/target", links / "dangling-absolute")
    os.symlink("../many/d00", links / "to-dir")
    os.symlink("/", links / "to-root")
    os.symlink("loop", links / "loop")
    os.symlink("../../../../../../..", links / "up-a-lot")

    hard = root / "hard"
    hard.mkdir()
    (hard / "a").write_text("hardlinked a\n")
    os.link(hard / "a", hard / "b")
    (hard / "x").write_bytes(os.urandom(70000))
    os.link(hard / "x", hard / "y")
    os.link(hard / "x", many / "d03/e0/x-link")
    os.link(many / "d01/e0/f000.txt", hard / "to-small")
    (hard / "suid-linked").write_text("setuid and linked\n")
    os.chown(hard / "suid-linked", 1000, 1000)
    (hard / "suid-linked").chmod(0o4750)
    os.link(hard / "suid-linked", modes / "suid-linked-too")

    owners = root / "owners"
    owners.mkdir()
    for name, (uid, gid) in (("u1000", (1000, 1000)), ("u1234-g50", (1234, 50)),
                             ("nobody", (65534, 65534)), ("root", (0, 0))):
        p = owners / name
        p.write_text(f"owned by {uid}:{gid}\n")
        os.chown(p, uid, gid)
    (owners / "suid-1000").write_text("setuid, owned by 1000\n")
    os.chown(owners / "suid-1000", 1000, 1000)
    (owners / "suid-1000").chmod(0o4755)
    (owners / "sgid-50").write_text("setgid, group 50\n")
    os.chown(owners / "sgid-50", 0, 50)
    (owners / "sgid-50").chmod(0o2755)
    (owners / "dir-1000").mkdir()
    (owners / "dir-1000/root-inside").write_text("root's file in 1000's dir\n")
    os.chown(owners / "dir-1000", 1000, 1000)
    os.symlink("u1000", owners / "link-1000")
    os.chown(owners / "link-1000", 1000, 1000, follow_symlinks=False)

    names = root / "names"
    names.mkdir()
    for name in ("with space", "ünïcödé-名前", "-dash", ".hidden", "x" * 255,
                 "quote'\"", "tab\tin", "a.b.c.", "*star?"):
        (names / name).write_text(f"name {name!r}\n")
    deep = names / "long" / "/".join(f"component-{i:02}-abcdefghij" for i in range(12))
    deep.mkdir(parents=True)
    (deep / ("leaf-" + "y" * 200)).write_text("a path of more than 256 bytes\n")

    # Distinct mtimes with nanoseconds, children before parents, symlinks too.
    base = 1_500_000_000_123_456_789
    entries = []
    for dirpath, dirnames, filenames in os.walk(root, topdown=False):
        for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            entries.append(os.path.join(dirpath, name))
        for name in dirnames:
            if not os.path.islink(os.path.join(dirpath, name)):
                entries.append(os.path.join(dirpath, name))
    entries.append(str(root))
    seen = set()
    for i, p in enumerate(entries):
        if p in seen:
            continue
        seen.add(p)
        t = base + i * 1_000_003_001 + rnd.randrange(1_000_000_000)
        os.utime(p, ns=(t - 7_000_000_000, t), follow_symlinks=False)
    # Hardlinked inodes got the last utime of any of their names; that is what the manifest
    # records, on both sides.


def count_files(m: Dict[str, dict]) -> int:
    return sum(1 for e in m.values() if e["type"] == "file")


# ---- tar streams ---------------------------------------------------------------------------

def tar_bytes(members) -> bytes:
    """A pax tar stream from (TarInfo, data-or-None) pairs, names written as given."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        for info, data in members:
            if data is not None:
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
            else:
                t.addfile(info)
    return buf.getvalue()


def tar_file(name: str, data: bytes, mode: int = 0o644) -> tuple:
    info = tarfile.TarInfo(name)
    info.mode = mode
    info.mtime = 1_600_000_000
    return info, data


def tar_dir(name: str, mode: int = 0o755) -> tuple:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE
    info.mode = mode
    return info, None


def tar_symlink(name: str, target: str) -> tuple:
    info = tarfile.TarInfo(name)
    info.type = tarfile.SYMTYPE
    info.linkname = target
    return info, None


def tar_hardlink(name: str, target: str) -> tuple:
    info = tarfile.TarInfo(name)
    info.type = tarfile.LNKTYPE
    info.linkname = target
    return info, None


def tar_names(data: bytes) -> List[str]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as t:
        return t.getnames()


# ---- canaries ------------------------------------------------------------------------------

class Canary:
    """Host files and dirs outside every sandbox that no transfer may read or write.

    /tmp/berth-canary-XXXX/{secret, cdir/inner}: every file's atime is set older than its
    mtime and ctime, so (relatime) the first read of it moves the atime; writes move mtime or
    ctime; a new entry in a dir moves the dir's mtime. check() compares stat data only and
    never reads the files itself."""

    def __init__(self, parent: str = "/tmp"):
        self.root = Path(tempfile.mkdtemp(prefix="berth-canary-", dir=parent))
        self.root.chmod(0o755)
        self.token = os.urandom(8).hex()
        self.content = f"BERTH-CANARY-{self.token}-host-secret\n".encode()
        (self.root / "cdir").mkdir()
        self.paths = [self.root / "secret", self.root / "cdir" / "inner"]
        for p in self.paths:
            p.write_bytes(self.content)
            p.chmod(0o644)
        for p in self.paths + [self.root / "cdir", self.root]:
            st = os.lstat(p)
            os.utime(p, ns=(st.st_mtime_ns - 3600 * 10**9, st.st_mtime_ns))
        self.before = self.snapshot()

    def snapshot(self) -> Dict[str, tuple]:
        out = {}
        for p in [self.root, self.root / "cdir"] + self.paths:
            st = os.lstat(p)
            # A directory's atime moves when check() itself lists it: not recorded.
            atime = None if stat.S_ISDIR(st.st_mode) else st.st_atime_ns
            out[str(p)] = (stat.filemode(st.st_mode), st.st_uid, st.st_gid, st.st_size,
                           st.st_ino, st.st_mtime_ns, st.st_ctime_ns, atime)
        return out

    def check(self, what: str = ""):
        now = self.snapshot()
        changed = [f"{p}: before {self.before[p]} now {now[p]}"
                   for p in self.before if self.before[p] != now[p]]
        assert not changed, (f"host canary touched {what} (mode, uid, gid, size, ino, mtime, "
                             f"ctime, atime):\n" + "\n".join(changed))
        listing = sorted(str(p.relative_to(self.root)) for p in self.root.rglob("*"))
        assert listing == ["cdir", "cdir/inner", "secret"], f"canary dir changed: {listing}"

    def remove(self):
        import shutil
        shutil.rmtree(self.root, ignore_errors=True)


def assert_no_canary_data(paths: Iterable, needles: Iterable[bytes]):
    """No regular file under `paths` (walked without following symlinks) contains a needle."""
    for top in paths:
        top = Path(top)
        files = [top] if not top.is_dir() or top.is_symlink() else \
            [Path(d) / f for d, _, fs in os.walk(top) for f in fs]
        for f in files:
            if not os.path.lexists(f) or not stat.S_ISREG(os.lstat(f).st_mode):
                continue
            data = f.read_bytes()
            for needle in needles:
                assert needle not in data, f"{f} holds host data {needle!r}"


def host_hits(token: str, trees: Iterable[Path], exclude: Iterable[Path]) -> List[str]:
    """Host paths whose name contains `token`: in "/" and its children (2 levels; not /proc,
    /sys, /dev), and anywhere under `trees`, except under `exclude`."""
    exclude = [str(Path(p)) for p in exclude]

    def excluded(p: str) -> bool:
        return any(p == e or p.startswith(e + "/") for e in exclude)

    hits = []
    for top in ["/"] + [str(p) for p in Path("/").iterdir()
                        if p.is_dir() and not p.is_symlink()
                        and p.name not in ("proc", "sys", "dev")]:
        try:
            for name in os.listdir(top):
                full = os.path.join(top, name)
                if token in name and not excluded(full):
                    hits.append(full)
        except OSError:
            pass
    for tree in trees:
        for dirpath, dirnames, filenames in os.walk(tree):
            if excluded(dirpath):
                dirnames[:] = []
                continue
            for name in dirnames + filenames:
                full = os.path.join(dirpath, name)
                if token in name and not excluded(full):
                    hits.append(full)
    return sorted(set(hits))


def tree_snapshot(root: Path) -> Dict[str, tuple]:
    """lstat data of every entry under root (to show a tree was not modified)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [""] + dirnames + filenames:
            full = os.path.join(dirpath, name) if name else dirpath
            st = os.lstat(full)
            out[full] = (st.st_mode, st.st_uid, st.st_gid, st.st_size, st.st_ino,
                         st.st_mtime_ns, st.st_ctime_ns)
    return out
