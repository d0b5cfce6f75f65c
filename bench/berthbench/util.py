"""Small helpers shared by the benchmark programs: running commands, timing, statistics."""
import ctypes
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MiB = 1 << 20


def log(msg):
    print(msg, file=sys.stderr, flush=True)


class CommandFailed(RuntimeError):
    pass


def run(argv, *, input=None, env=None, timeout=600, stdin=None, cwd=None) -> bytes:
    """Runs argv to its end and returns stdout; raises CommandFailed with stderr if it
    fails (a benchmark step that fails is counted, never timed as if it worked)."""
    argv = [str(a) for a in argv]
    r = subprocess.run(argv, input=input, stdin=stdin, capture_output=True, env=env,
                       timeout=timeout, cwd=cwd)
    if r.returncode != 0:
        raise CommandFailed(f"{' '.join(argv)} -> exit {r.returncode}: "
                            f"{r.stderr.decode(errors='replace').strip()[-800:]}")
    return r.stdout


def run_detaching(argv, *, timeout=120):
    """Runs a command that leaves a process behind holding its stdio (`runc run --detach`):
    output goes to a file, not a pipe whose end would never come."""
    argv = [str(a) for a in argv]
    with tempfile.TemporaryFile() as err:
        r = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                           stderr=err, timeout=timeout)
        if r.returncode != 0:
            err.seek(0)
            raise CommandFailed(f"{' '.join(argv)} -> exit {r.returncode}: "
                                f"{err.read().decode(errors='replace').strip()[-800:]}")


def pipe(producer, consumer, *, env=None, timeout=600):
    """producer | consumer, both must succeed (a tar stream through a container's exec)."""
    producer = [str(a) for a in producer]
    consumer = [str(a) for a in consumer]
    p1 = subprocess.Popen(producer, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    p2 = subprocess.Popen(consumer, stdin=p1.stdout, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, env=env)
    p1.stdout.close()
    _, err2 = p2.communicate(timeout=timeout)
    _, err1 = p1.communicate(timeout=timeout)
    for argv, p, err in ((producer, p1, err1), (consumer, p2, err2)):
        if p.returncode != 0:
            raise CommandFailed(f"{' '.join(argv)} -> exit {p.returncode}: "
                                f"{err.decode(errors='replace').strip()[-800:]}")


def timed(fn, *args) -> float:
    """Milliseconds fn(*args) took."""
    t0 = time.perf_counter()
    fn(*args)
    return (time.perf_counter() - t0) * 1000


def summary(samples):
    """median [min-max] of a list of milliseconds (None if there are none)."""
    if not samples:
        return None
    return {"median_ms": statistics.median(samples), "min_ms": min(samples),
            "max_ms": max(samples), "n": len(samples)}


_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
_libc.unshare.argtypes = [ctypes.c_int]
MNT_DETACH = 2
CLONE_NEWNS = 0x00020000
MS_REC, MS_PRIVATE = 0x4000, 1 << 18


def mount(source, target, fstype, flags=0, data=None):
    """mount(2) without a process (the peers' overlays are made in the timed path)."""
    if _libc.mount(str(source).encode(), str(target).encode(),
                   fstype.encode() if fstype else None, flags,
                   data.encode() if data else None) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"mount {fstype} on {target}: {os.strerror(e)}")


def umount(target, flags=0):
    if _libc.umount2(str(target).encode(), flags) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"umount {target}: {os.strerror(e)}")


def unshare_mounts():
    if _libc.unshare(CLONE_NEWNS) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"unshare(CLONE_NEWNS): {os.strerror(e)}")
    mount("none", "/", None, MS_REC | MS_PRIVATE, None)


def mounts_under(path: Path):
    """Mount points at or under path, deepest first (for teardown)."""
    prefix = str(path)
    points = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            mp = line.split()[4].replace("\\040", " ")
            if mp == prefix or mp.startswith(prefix + "/"):
                points.append(mp)
    return sorted(set(points), key=len, reverse=True)


def unmount_all_under(path: Path):
    for mp in mounts_under(path):
        try:
            umount(mp, MNT_DETACH)
        except OSError as e:
            log(f"warning: {e}")


def mem_available_kib() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1])
    raise RuntimeError("no MemAvailable in /proc/meminfo")


def children(pid: int):
    """(comm, pid) of pid's children, whichever of its threads started them."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        if int(stat[stat.rindex(")") + 2:].split()[1]) == pid:
            found.append((comm, int(entry.name)))
    return found


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def du_bytes(*paths) -> int:
    """Disk blocks used under paths (st_blocks, hard links once, not crossing mounts)."""
    seen, total = set(), 0
    for p in paths:
        p = Path(p)
        if not p.exists():
            continue
        dev = p.lstat().st_dev
        for dirpath, dirs, files in os.walk(p):
            for name in dirs + files:
                try:
                    st = os.lstat(os.path.join(dirpath, name))
                except FileNotFoundError:
                    continue
                if st.st_dev != dev or (st.st_dev, st.st_ino) in seen:
                    continue
                seen.add((st.st_dev, st.st_ino))
                total += st.st_blocks * 512
            dirs[:] = [d for d in dirs
                       if os.lstat(os.path.join(dirpath, d)).st_dev == dev]
    return total


def prime_memory(mib: int = 1024):
    """Allocates and frees page cache (a file in /dev/shm). This VM hands free guest memory
    back to its host and the first touch of such a page is slow: without this, whichever
    command happens to write fresh pages pays for it (see bench/run-transfer)."""
    shm = Path(f"/dev/shm/berth-bench-prime.{os.getpid()}")  # runs may overlap
    try:
        subprocess.run(["dd", "if=/dev/zero", f"of={shm}", "bs=1M", f"count={mib}",
                        "status=none"], check=True)
    finally:
        shm.unlink(missing_ok=True)


def warm(*paths):
    """Reads files back into the page cache (this VM reclaims it on its own)."""
    for p in paths:
        subprocess.run(["sh", "-c", f"find '{p}' -type f -exec cat {{}} + > /dev/null"],
                       check=True)
