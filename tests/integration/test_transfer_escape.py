"""File transfer cannot reach the host outside the sandbox, in either direction, with either
path resolver (berth-init's BERTH_TRANSFER_RESOLVER=openat2 and =walk, each with a berthd of
its own).

The host has canaries (/tmp/berth-canary-XXXX/{secret,cdir/inner}) whose stat data shows any
read (atime), write or new entry; the sandbox has a decoy at the same path with other
content, and symlinks to "/", "../../..", far more "..", /proc/self/root, /proc/1/cwd, the
canary's host path, an absolute symlink in the middle of a path. Uploads and downloads go
through all of them, and through a directory that a process inside swaps for a symlink to
"/" while copies run. Afterwards: the canaries are untouched, no downloaded byte is host data
(the canary, the host's /etc/passwd), and no uploaded name exists on the host outside the
sandbox's writable layer; the rootfs (the overlay's lower layer) is unchanged. Downloads do
not write through symlinks they made on the host earlier; hostile tar streams on stdin are
refused and leave nothing."""
import concurrent.futures
import grp
import json
import os
import socket
import struct
import threading
from pathlib import Path

import pytest

import berth_proto
import transferutil as tu
from berth_proto import pb
from conftest import _daemon_fixture
from transferutil import fails, ok, sh

RESOLVERS = ("openat2", "walk")
DECOY = b"INSIDE-DECOY\n"


def _host_passwd_needle() -> bytes:
    # A line of the host's /etc/passwd that the sandbox's (busybox rootfs) does not have.
    for line in Path("/etc/passwd").read_bytes().splitlines():
        if line.startswith(b"berth:"):
            return line
    raise AssertionError("no berth user in the host's /etc/passwd")


@pytest.fixture(scope="module", params=RESOLVERS)
def rdaemon(base_dir, request):
    yield from _daemon_fixture(base_dir, env={"BERTH_TRANSFER_RESOLVER": request.param})


@pytest.fixture(scope="module")
def canary():
    c = tu.Canary("/tmp")
    yield c
    c.remove()


class Env:
    pass


@pytest.fixture(scope="module")
def esc(rdaemon, busybox_rootfs, canary, base_dir):
    e = Env()
    e.daemon = rdaemon
    e.resolver = rdaemon.extra_env["BERTH_TRANSFER_RESOLVER"]
    e.canary = canary
    e.C = str(canary.root)            # the canary dir's absolute host path
    e.cb = canary.root.name           # its basename
    e.token = "berthpay" + os.urandom(5).hex()
    # nobody's, so that an unprivileged client's copy gets as far as the host side (root
    # reaches it anyway).
    e.sid = rdaemon.create(busybox_rootfs, "--owner", "65534")
    e.upper = rdaemon.upper_dir(e.sid)
    e.rootfs = busybox_rootfs
    e.lower_before = tu.tree_snapshot(busybox_rootfs)
    e.work = base_dir / f"escape-{e.resolver}"
    e.src = e.work / "src"
    e.dl = e.work / "dl"
    e.src.mkdir(parents=True)
    e.dl.mkdir()
    e.sandbox_passwd = (busybox_rootfs / "etc/passwd").read_bytes()
    e.needles = [canary.content, _host_passwd_needle()]
    setup_inside(e)
    return e


def setup_inside(e):
    sh(e.daemon, e.sid, f"""set -e
C='{e.C}'
rm -rf "$C" /esc
mkdir -p /esc /x /hostile /tmp/real/tmp /tmp/real/etc "$C/cdir"
printf 'INSIDE-DECOY\\n' > "$C/secret"
printf 'INSIDE-DECOY\\n' > "$C/cdir/inner"
echo REAL-DIR-PASSWD > /tmp/real/etc/passwd
ln -sfn / /esc/root
ln -sfn ../../.. /esc/up
ln -sfn ../../../../../../../../../../../../../.. /esc/deep
ln -sfn /proc/self/root /esc/procroot
ln -sfn /proc/1/cwd /esc/proc1cwd
ln -sfn "$C" /esc/canary
ln -sfn "$C/secret" /esc/canaryfile
ln -sfn /tmp /esc/mid
ln -sfn /esc/root /esc/chain
""")


def payload(e, name: str) -> Path:
    """A host file named `name` (containing the token) with the token as content."""
    p = e.src / name
    p.write_bytes(f"PAYLOAD {e.token} {name}\n".encode())
    return p


def upper_hits(e, name: str) -> list:
    return [os.path.join(d, n) for d, ds, fs in os.walk(e.upper) for n in ds + fs if name in n]


def assert_host_untouched(e, what: str):
    e.canary.check(what)
    hits = tu.host_hits(e.token, [e.canary.root, e.work.parent, e.rootfs, "/tmp", "/var/tmp"],
                        exclude=[e.upper, e.src, e.dl])
    assert not hits, f"uploaded names appeared on the host outside the sandbox {what}: {hits}"
    assert tu.tree_snapshot(e.rootfs) == e.lower_before, f"the rootfs (lower layer) changed {what}"
    tu.assert_no_canary_data([e.dl], e.needles)


def test_resolver_reaches_the_sandbox(esc):
    # berth-init takes the resolver from the environment it inherits from berthd.
    init_pid = esc.daemon.inspect(esc.sid)["sandbox"]["init_pid"]
    env = Path(f"/proc/{init_pid}/environ").read_bytes().split(b"\0")
    assert f"BERTH_TRANSFER_RESOLVER={esc.resolver}".encode() in env, \
        f"berth-init's environment has no BERTH_TRANSFER_RESOLVER={esc.resolver}"


# ---- downloads through hostile paths -------------------------------------------------------

# (path inside, what must come back): "passwd" = the sandbox's /etc/passwd, "decoy" = the
# sandbox's file at the canary's path, "refused" = exit 125 (magic links are never followed),
# "link:T" = a symlink with target T (a symlink source is copied as the link).
DOWNLOADS = [
    ("/esc/root/etc/passwd", "passwd"),
    ("/esc/up/etc/passwd", "passwd"),
    ("/esc/deep/etc/passwd", "passwd"),
    ("/esc/chain/etc/passwd", "passwd"),
    ("/esc/../../../../etc/passwd", "passwd"),
    ("esc/../../../../etc/passwd", "passwd"),
    ("/esc/procroot/etc/passwd", "refused"),
    ("/esc/proc1cwd/etc/passwd", "refused"),
    ("/proc/self/root/etc/passwd", "refused"),
    ("/proc/1/root/etc/passwd", "refused"),
    ("/proc/1/cwd/etc/passwd", "refused"),
    ("/esc/canary/secret", "decoy"),
    ("/esc/mid/{cb}/secret", "decoy"),
    ("/esc/deep{C}/secret", "decoy"),
    ("/esc/deep{C}/cdir/inner", "decoy"),
    ("/../../..{C}/secret", "decoy"),
    ("/esc/deep{C}", "decoy-dir"),
    ("/esc/canary/.", "decoy-contents"),
    ("/esc/canaryfile", "link:{C}/secret"),
    ("/esc/root", "link:/"),
    ("/esc/deep", "link:../../../../../../../../../../../../../.."),
]


@pytest.mark.parametrize("path,expect", DOWNLOADS, ids=[p for p, _ in DOWNLOADS])
def test_download_through(esc, path, expect):
    e = esc
    dst = e.dl / f"down-{DOWNLOADS.index((path, expect))}"
    dst.mkdir()
    path = path.format(C=e.C, cb=e.cb)
    expect = expect.format(C=e.C)
    if expect == "refused":
        fails(e.daemon, "cp", f"{e.sid}:{path}", dst, needles=[path])
        assert os.listdir(dst) == [], os.listdir(dst)
    elif expect == "decoy-contents":
        ok(e.daemon, "cp", f"{e.sid}:{path}", dst)
        assert sorted(os.listdir(dst)) == ["cdir", "secret"]
        assert (dst / "secret").read_bytes() == DECOY
        assert (dst / "cdir/inner").read_bytes() == DECOY
    else:
        ok(e.daemon, "cp", f"{e.sid}:{path}", dst)
        got = os.listdir(dst)
        assert len(got) == 1, got
        out = dst / got[0]
        if expect == "passwd":
            assert out.read_bytes() == e.sandbox_passwd
        elif expect == "decoy":
            assert out.read_bytes() == DECOY
        elif expect == "decoy-dir":
            assert not out.is_symlink() and out.is_dir(), out
            assert (out / "secret").read_bytes() == DECOY
            assert (out / "cdir/inner").read_bytes() == DECOY
        else:
            assert out.is_symlink(), f"{out} is not a symlink"
            assert os.readlink(out) == expect[len("link:"):]
    assert_host_untouched(e, f"by downloading {path}")


def test_download_raw_protocol_through(esc):
    e = esc
    with e.daemon.connect() as c:
        data, _ = c.download(e.sid, f"/esc/deep{e.C}/secret")
        assert DECOY in data and e.canary.content not in data
        data, _ = c.download(e.sid, "/esc/up/etc/passwd")
        assert e.sandbox_passwd in data and e.needles[1] not in data
        with pytest.raises(berth_proto.BerthError):
            c.download(e.sid, "/esc/procroot/etc/passwd")
        st = c.stat_path(e.sid, f"/esc/deep{e.C}/secret")
        assert st.size == len(DECOY), st
        st = c.stat_path(e.sid, "/esc/canaryfile", follow=True)
        assert st.size == len(DECOY), st
    assert_host_untouched(e, "by raw downloads")


# ---- uploads through hostile paths ---------------------------------------------------------

# (destination inside, where the payload must land relative to the sandbox's root — "{n}" is
# the payload's name — or "refused" (exit 125, nothing created) or "either" (a symlink as
# the destination: replaced by the file, or its target inside the sandbox written).
UPLOADS = [
    ("/esc/root/tmp/", "tmp/{n}"),
    ("/esc/up/tmp/", "tmp/{n}"),
    ("/esc/deep/tmp/", "tmp/{n}"),
    ("/esc/chain/tmp/", "tmp/{n}"),
    ("/esc/deep{C}/", "{c}/{n}"),
    ("/esc/canary/", "{c}/{n}"),
    ("/esc/mid/{cb}/cdir/", "{c}/cdir/{n}"),
    ("/../../..{C}/new-{n}", "{c}/new-{n}"),
    ("esc/../../../tmp/", "tmp/{n}"),
    ("/esc/deep{C}/cdir/inner", "{c}/cdir/inner"),
    ("/esc/deep/tmp/new/parents/{n}", "tmp/new/parents/{n}"),
    ("/esc/procroot/tmp/", "refused"),
    ("/esc/proc1cwd/tmp/", "refused"),
    ("/proc/self/root/tmp/", "refused"),
    ("/proc/1/cwd/tmp/", "refused"),
    ("/esc/canaryfile", "either"),
]


@pytest.mark.parametrize("dest,expect", UPLOADS, ids=[d for d, _ in UPLOADS])
def test_upload_through(esc, dest, expect):
    e = esc
    i = UPLOADS.index((dest, expect))
    name = f"pay-{e.token}-{i}"
    src = payload(e, name)
    dest = dest.format(C=e.C, cb=e.cb, n=name)
    c = e.C.lstrip("/")
    try:
        if expect == "refused":
            fails(e.daemon, "cp", src, f"{e.sid}:{dest}", needles=[dest.rstrip("/")])
            assert upper_hits(e, name) == []
        elif expect == "either":
            r = tu.berth(e.daemon, "cp", src, f"{e.sid}:{dest}")
            assert r.returncode in (0, 125), tu.describe(["cp", src, dest], r)
            if r.returncode == 0:
                link = e.upper / dest.lstrip("/")
                target = e.upper / c / "secret"
                written = [p for p in (link, target)
                           if p.is_file() and not p.is_symlink()
                           and p.read_bytes() == src.read_bytes()]
                assert written, "the upload reported success but is nowhere in the sandbox"
        else:
            ok(e.daemon, "cp", src, f"{e.sid}:{dest}")
            landed = e.upper / expect.format(c=c, n=name)
            assert landed.is_file() and not landed.is_symlink(), \
                f"{landed} missing; the payload is at {upper_hits(e, name)}"
            assert landed.read_bytes() == src.read_bytes()
        assert_host_untouched(e, f"by uploading to {dest}")
    finally:
        setup_inside(e)


def test_upload_dir_and_tar_through(esc):
    e = esc
    tree = e.src / f"pdir-{e.token}"
    (tree / "sub").mkdir(parents=True)
    (tree / f"a-{e.token}").write_text("a\n")
    (tree / "sub" / f"b-{e.token}").write_text("b\n")
    ok(e.daemon, "cp", tree, f"{e.sid}:/esc/deep/tmp/")
    assert (e.upper / "tmp" / tree.name / "sub" / f"b-{e.token}").read_text() == "b\n"
    ok(e.daemon, "cp", f"{tree}/.", f"{e.sid}:/esc/root{e.C}/cdir")
    assert (e.upper / e.C.lstrip("/") / "cdir" / f"a-{e.token}").read_text() == "a\n"
    data = tu.tar_bytes([tu.tar_file(f"t-{e.token}", b"via tar\n")])
    ok(e.daemon, "cp", "-", f"{e.sid}:/esc/up/tmp/tar-{e.token}", input=data)
    assert (e.upper / "tmp" / f"tar-{e.token}" / f"t-{e.token}").read_bytes() == b"via tar\n"
    fails(e.daemon, "cp", "-", f"{e.sid}:/esc/procroot/tmp/tar2-{e.token}", input=data)
    with e.daemon.connect() as c:
        c.upload(e.sid, f"/esc/deep{e.C}", tu.tar_bytes([tu.tar_file(f"raw-{e.token}", b"r")]))
        assert (e.upper / e.C.lstrip("/") / f"raw-{e.token}").read_bytes() == b"r"
        with pytest.raises(berth_proto.BerthError):
            c.upload(e.sid, "/proc/1/cwd/tmp", data)
        assert c.make_dirs(e.sid, f"/esc/deep/tmp/mk-{e.token}") is True
        assert (e.upper / "tmp" / f"mk-{e.token}").is_dir()
        with pytest.raises(berth_proto.BerthError):
            c.make_dirs(e.sid, f"/esc/procroot/tmp/mk2-{e.token}")
    assert not upper_hits(e, f"tar2-{e.token}") and not upper_hits(e, f"mk2-{e.token}")
    assert_host_untouched(e, "by directory, tar and raw uploads")
    setup_inside(e)


def test_fs_ops_through(esc):
    e = esc
    st = json.loads(ok(e.daemon, "fs", "stat", "--json", f"{e.sid}:/esc/deep{e.C}/secret").stdout)
    assert int(st["size"]) == len(DECOY) != len(e.canary.content), st
    ok(e.daemon, "fs", "mkdir", f"{e.sid}:/esc/up/tmp/fsmk-{e.token}")
    assert (e.upper / "tmp" / f"fsmk-{e.token}").is_dir()
    fails(e.daemon, "fs", "mkdir", f"{e.sid}:/proc/self/root/tmp/fsmk2-{e.token}")
    # Removing through the links removes inside the sandbox, never on the host.
    ok(e.daemon, "fs", "rm", "-r", f"{e.sid}:/esc/deep{e.C}/cdir")
    ok(e.daemon, "fs", "rm", f"{e.sid}:/esc/mid/{e.cb}/secret")
    assert sh(e.daemon, e.sid, f"ls -A '{e.C}'") == ""
    fails(e.daemon, "fs", "rm", "-r", f"{e.sid}:/esc/procroot/tmp")
    # A symlink is removed as the link.
    ok(e.daemon, "fs", "rm", "-r", f"{e.sid}:/esc/root")
    assert sh(e.daemon, e.sid, "ls /bin/busybox /etc/passwd").split() == \
        ["/bin/busybox", "/etc/passwd"]
    assert_host_untouched(e, "by fs stat/mkdir/rm")
    setup_inside(e)


# ---- a symlink swapped in while copies run -------------------------------------------------

# /x/d cycles: a real directory (with tmp/, etc/passwd and secret) -> a symlink to "/" ->
# one climbing far up -> one to /tmp/real -> one to the canary's path, each held for 0-2 ms;
# link-to-link swaps are atomic renames, dir-to-link ones leave a moment with no /x/d.
RACER = """
cd /x
while :; do
  rm -rf d.new; mkdir -p d.new/tmp d.new/etc
  echo IN-DIR > d.new/etc/passwd; echo IN-DIR > d.new/secret
  rm -rf d; mv -Tf d.new d; usleep $((RANDOM % 2000))
  ln -sfn / d.new; rm -rf d; mv -Tf d.new d; usleep $((RANDOM % 2000))
  ln -sfn ../../../../../../../../../../../../.. d.new; mv -Tf d.new d; usleep $((RANDOM % 2000))
  ln -sfn /tmp/real d.new; mv -Tf d.new d; usleep $((RANDOM % 2000))
  ln -sfn {C} d.new; mv -Tf d.new d; usleep $((RANDOM % 2000))
done
"""


def test_racing_symlink_swap(esc):
    e = esc
    T = e.token
    race_dl = e.dl / "race"
    race_dl.mkdir()
    pdir = e.src / f"racedir-{T}"
    (pdir / "s").mkdir(parents=True)
    (pdir / "s" / f"in-{T}").write_text("x\n")
    racer_conn = e.daemon.connect()
    rid = racer_conn.start_exec(e.sid, ["sh", "-c", RACER.format(C=e.C)])
    results = []
    lock = threading.Lock()

    def run(kind, i):
        if kind == "up":
            src = payload(e, f"race-{T}-{i}")
            args = ["cp", src, f"{e.sid}:/x/d/tmp/"]
        elif kind == "updir":
            args = ["cp", pdir, f"{e.sid}:/x/d/tmp/up{i}"]
        elif kind == "down":
            d = race_dl / f"f{i}"
            d.mkdir()
            args = ["cp", f"{e.sid}:/x/d/etc/passwd", d]
        elif kind == "downsecret":
            d = race_dl / f"s{i}"
            d.mkdir()
            args = ["cp", f"{e.sid}:/x/d/secret", d]
        else:
            d = race_dl / f"d{i}"
            d.mkdir()
            args = ["cp", f"{e.sid}:/x/d/tmp/.", d]
        r = tu.berth(e.daemon, *args, timeout=60)
        with lock:
            results.append((kind, args, r))

    def raw(i):
        with e.daemon.connect() as c:
            for j in range(15):
                try:
                    c.upload(e.sid, "/x/d/tmp",
                             tu.tar_bytes([tu.tar_file(f"rawrace-{T}-{i}-{j}", b"r")]))
                except berth_proto.BerthError:
                    pass
                try:
                    data, _ = c.download(e.sid, "/x/d/etc/passwd")
                    for needle in e.needles:
                        assert needle not in data
                except berth_proto.BerthError:
                    pass

    try:
        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            futures = [pool.submit(raw, i) for i in range(2)]
            for i in range(24):
                for kind in ("up", "updir", "down", "downsecret", "downtmp"):
                    futures.append(pool.submit(run, kind, i))
            for f in futures:
                f.result()
    finally:
        racer_conn.cancel(rid)
        res = racer_conn.collect_exec(rid, timeout=20)
        racer_conn.close()
    assert res.exit is not None and res.exit.canceled, f"the racer stopped early: {res}"

    bad = [(k, a, r.returncode, r.stderr[-300:]) for k, a, r in results
           if r.returncode not in (0, 125)
           or (r.returncode == 125 and not r.stderr.startswith(b"berth: "))]
    assert not bad, f"copies during the race ended badly: {bad[:5]}"
    done = {k: sum(1 for kk, _, r in results if kk == k and r.returncode == 0)
            for k in ("up", "updir", "down", "downsecret", "downtmp")}
    print(f"resolver {e.resolver}: successful copies during the race: {done}")
    assert_host_untouched(e, "by copies racing a symlink swap")
    sh(e.daemon, e.sid, "rm -rf /x/d /x/d.new")
    setup_inside(e)


# ---- the host side of downloads ------------------------------------------------------------

def test_download_never_writes_through_its_own_links(esc):
    e = esc
    T = e.token
    sh(e.daemon, e.sid, f"""set -e
mkdir -p /h/t
ln -s '{e.C}' /h/t/evil
ln -s / /h/t/evil2
ln -s '{e.C}/secret' /h/t/fileln
echo fine > /h/t/ok
""")
    contents, parent = e.dl / "hostlinks", e.dl / "hostlinks-parent"
    contents.mkdir()
    parent.mkdir()
    ok(e.daemon, "cp", f"{e.sid}:/h/t/.", contents)
    ok(e.daemon, "cp", f"{e.sid}:/h/t", parent)
    for dst in (contents, parent / "t"):
        assert os.readlink(dst / "evil") == e.C
        assert os.readlink(dst / "evil2") == "/"
        assert os.readlink(dst / "fileln") == f"{e.C}/secret"
        assert (dst / "ok").read_text() == "fine\n"
    assert_host_untouched(e, "by downloading symlinks")

    # The sandbox turns the links into directories and a file of the same names; the next
    # downloads into the same host directories must not follow the host links they made.
    sh(e.daemon, e.sid, f"""set -e
cd /h/t
rm evil evil2 fileln
mkdir -p evil/cdir evil2/tmp
echo PWNED > evil/secret
echo PWNED > evil/cdir/inner
echo PWNED > evil/new-{T}
echo PWNED > evil2/tmp/new2-{T}
echo PWNED > fileln
""")
    for src, dst in ((f"{e.sid}:/h/t/.", contents), (f"{e.sid}:/h/t", parent)):
        r = tu.berth(e.daemon, "cp", src, dst)
        assert r.returncode in (0, 125), tu.describe(["cp", src, dst], r)
        top = dst if dst == contents else dst / "t"
        if r.returncode == 0:
            # Replaced: real directories and a real file now.
            assert not (top / "evil").is_symlink() and \
                (top / "evil/secret").read_bytes() == b"PWNED\n"
            assert not (top / "evil2").is_symlink() and \
                (top / "evil2/tmp" / f"new2-{T}").read_bytes() == b"PWNED\n"
            assert not (top / "fileln").is_symlink() and \
                (top / "fileln").read_bytes() == b"PWNED\n"
        else:
            assert r.stderr.startswith(b"berth: "), r.stderr
        e.canary.check(f"by downloading {src} over host symlinks")
        assert not Path(f"/tmp/new2-{T}").exists() and not Path(f"/new2-{T}").exists()
    assert_host_untouched(e, "by downloads over host symlinks")


def test_unprivileged_client_uses_its_own_rights(esc):
    # Host files are read and written by the client, with its rights: nobody (in group berth,
    # to reach the socket) cannot upload /etc/shadow nor download into /root.
    e = esc
    gid = grp.getgrnam("berth").gr_gid
    up = ["cp", "/etc/shadow", f"{e.sid}:/tmp/"]
    r_up = tu.berth(e.daemon, *up, user=65534, group=gid)
    assert not (e.upper / "tmp/shadow").exists()
    down = ["cp", f"{e.sid}:/etc/passwd", f"/root/berth-{e.token}"]
    r_down = tu.berth(e.daemon, *down, user=65534, group=gid)
    assert not Path(f"/root/berth-{e.token}").exists()
    assert_host_untouched(e, "by an unprivileged client")
    tu.check_failed(up, r_up, needles=["/etc/shadow", "ermission denied"])
    tu.check_failed(down, r_down, needles=[f"/root/berth-{e.token}", "ermission denied"])


# ---- hostile tar streams -------------------------------------------------------------------

def hostile_cases(C):
    f, s, h, d = tu.tar_file, tu.tar_symlink, tu.tar_hardlink, tu.tar_dir
    P = b"PWNED\n"
    return {
        "dotdot": ([f("ok-{T}", b"ok\n"), f("../../x-{T}", P)], "../../x-{T}"),
        "dotdot-middle": ([f("a-{T}/../../../y-{T}", P)], "y-{T}"),
        "absolute": ([f("ok-{T}", b"ok\n"), f("/abs-{T}", P)], "/abs-{T}"),
        "absolute-canary": ([f(C + "/secret", P)], C + "/secret"),
        "link-then-through": ([f("ok-{T}", b"ok\n"), s("l", "/"), f("l/tmp/through-{T}", P)],
                              "l/tmp/through-{T}"),
        "link-to-canary-then-through": ([s("l", C), f("l/secret", P)], "l/secret"),
        "relative-link-then-through": ([s("l", "../../../../../../../.."), d("l/tmp"),
                                        f("l/tmp/rel-{T}", P)], "l/tmp"),
        # (a refused hardlink may be named by its target)
        "hardlink-absolute": ([h("h-{T}", "/etc/passwd")], "/etc/passwd"),
        "hardlink-dotdot": ([h("h-{T}", "../../../../etc/passwd")], "../../../../etc/passwd"),
        "hardlink-not-in-stream": ([h("h-{T}", "etc/passwd")], "h-{T}"),
        "hardlink-to-symlink": ([s("s", "/etc/passwd"), h("h-{T}", "s")], "h-{T}"),
        "hardlink-through-symlink": ([s("l", "/etc"), h("h-{T}", "l/passwd")], "h-{T}"),
    }


HOSTILE = list(hostile_cases("/C"))


@pytest.mark.parametrize("case", HOSTILE)
def test_hostile_tar_refused(esc, case):
    e = esc
    T = f"{e.token}h{HOSTILE.index(case)}"
    members, needle = hostile_cases(e.C)[case]
    fixed = []
    for info, data in members:
        info.name = info.name.replace("{T}", T)
        fixed.append((info, data))
    needle = needle.replace("{T}", T)
    dest = f"/hostile/{case}"
    fails(e.daemon, "cp", "-", f"{e.sid}:{dest}", input=tu.tar_bytes(fixed), needles=[needle])
    assert not (e.upper / "hostile" / case).exists(), \
        f"the failed upload left {sorted(os.listdir(e.upper / 'hostile' / case))}"
    assert upper_hits(e, T) == [], upper_hits(e, T)
    assert sh(e.daemon, e.sid, "cat /etc/passwd").encode() == e.sandbox_passwd
    assert not (e.upper / "etc/passwd").exists()
    assert_host_untouched(e, f"by the hostile tar {case}")


# ---- a hostile stream on the way down ------------------------------------------------------

class FakeDaemon:
    """A stand-in for berthd that answers a download with a hostile tar stream: what a
    compromised sandbox side could send, which the CLI extracts on the host with the
    caller's rights. It speaks just enough of the protocol for `berth cp SB:/x DST`: Hello,
    StatPath (a directory), CopyOut (writes the stream into the pipe that comes with it)."""

    def __init__(self, path: Path, stream: bytes):
        self.path = path
        self.socket = str(path)
        self.stream = stream
        self.errors = []
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(path))
        self.sock.listen(4)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        try:
            conn, _ = self.sock.accept()
        except OSError:
            return
        with conn:
            try:
                self._serve_conn(conn)
            except Exception as e:  # noqa: BLE001 - reported by close()
                self.errors.append(repr(e))

    def _serve_conn(self, conn):
        buf, fds = b"", []
        while True:
            data, new_fds, _, _ = socket.recv_fds(conn, 65536, 8)
            fds += new_fds
            if not data:
                return
            buf += data
            while len(buf) >= 4:
                (n,) = struct.unpack(">I", buf[:4])
                if len(buf) < 4 + n:
                    break
                msg = pb.ClientMessage()
                msg.ParseFromString(buf[4:4 + n])
                buf = buf[4 + n:]
                reply = pb.ServerMessage(id=msg.id)
                which = msg.WhichOneof("body")
                if which == "hello":
                    reply.hello.protocol_version = 1
                    reply.hello.server_version = "fake"
                    reply.hello.max_frame_bytes = 4 << 20
                elif which == "stat_path":
                    reply.stat_path.stat.type = pb.PathStat.DIRECTORY
                    reply.stat_path.stat.mode = 0o755
                elif which == "copy_out" and fds:
                    fd = fds.pop(0)
                    try:
                        view = memoryview(self.stream)
                        while view:
                            view = view[os.write(fd, view):]
                    except BrokenPipeError:
                        pass
                    finally:
                        os.close(fd)
                    reply.copy.entries = 1
                else:
                    reply.error.code = pb.INVALID_ARGUMENT
                    reply.error.message = f"fake berthd: {which}"
                conn.sendall(berth_proto.encode_frame(reply.SerializeToString()))

    def close(self):
        self.sock.close()
        self.thread.join(5)


def hostile_download_cases(C):
    f, s, h, d = tu.tar_file, tu.tar_symlink, tu.tar_hardlink, tu.tar_dir
    P = b"PWNED\n"
    return {
        "symlink-then-through": [s("evil", C), f("evil/secret", P)],
        "symlink-to-root-then-through": [s("evil", "/"), d("evil/tmp"),
                                         f("evil/tmp/pwn-{T}", P)],
        "dotdot": [f("ok-{T}", b"ok\n"), f("../../pwn-{T}", P)],
        "absolute": [f("/tmp/pwn-{T}", P)],
        "hardlink-to-host-file": [h("h-{T}", C + "/secret")],
        "hardlink-through-symlink": [s("l", C), h("h-{T}", "l/secret")],
        "hardlink-dotdot": [h("h-{T}", "../../../../../../.." + C + "/secret")],
    }


HOSTILE_DOWN = list(hostile_download_cases("/C"))


@pytest.mark.parametrize("case", HOSTILE_DOWN)
def test_download_of_a_hostile_stream_refused(base_dir, canary, case):
    T = "berthdown" + os.urandom(4).hex()
    members = []
    for info, data in hostile_download_cases(str(canary.root))[case]:
        info.name = info.name.replace("{T}", T)
        members.append((info, data))
    work = base_dir / "hostile-download" / case
    dst = work / "dst"
    dst.mkdir(parents=True)
    fake = FakeDaemon(work / "fake.sock", tu.tar_bytes(members))
    try:
        r = tu.berth(fake, "cp", "fake:/x/.", dst, timeout=30)
    finally:
        fake.close()
    assert not fake.errors, fake.errors
    canary.check(f"by extracting the hostile download {case}")
    hits = tu.host_hits(T, [base_dir, "/tmp", "/var/tmp"], exclude=[])
    assert not hits, f"the hostile download wrote outside its destination: {hits}"
    assert r.returncode == 125, tu.describe(["cp", "fake:/x/.", dst], r)
    assert r.stderr.startswith(b"berth: "), r.stderr
    # What the failed extraction created is removed.
    assert sorted(os.listdir(dst)) == [], sorted(os.listdir(dst))
