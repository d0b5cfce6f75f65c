"""Host-side observation helpers for the integration tests: /proc, cgroups, polling.

The cgroup helpers work with either of berth's cgroup drivers, chosen the way berth chooses:
v2 if the cgroup2 hierarchy's root cgroup.controllers lists memory, cpu and pids; v1 otherwise.
  v1: one directory per hierarchy, <mount of controller>/<parent>/<id> (memory, cpu, cpuacct,
      pids, freezer; cpuacct and freezer are optional in berth).
  v2: one directory, <cgroup2 mount>/<parent>/<id>.
"""
import json
import os
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

REQUIRED_CONTROLLERS = ("memory", "cpu", "pids")
V1_CONTROLLERS = ("memory", "cpu", "cpuacct", "pids", "freezer")
_V1_MOUNT_FLAGS = {"rw", "ro", "all", "none", "noprefix", "clone_children", "xattr",
                   "favordynmods", "cpuset_v2_mode"}


def _unescape(s: str) -> str:
    # mountinfo writes space, tab, newline and backslash as \ooo octal escapes.
    out, i = [], 0
    while i < len(s):
        if s[i] == "\\" and i + 3 < len(s):
            out.append(chr(int(s[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(s[i])
            i += 1
    return "".join(out)


def _read_mounts() -> Tuple[Optional[Path], Dict[str, Path]]:
    """(first cgroup2 mount point or None, {v1 controller: its hierarchy's mount point}), as
    berth reads them from /proc/self/mountinfo."""
    unified, v1 = None, {}
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        f = line.split(" ")
        try:
            dash = f.index("-", 6)
        except ValueError:
            continue
        if dash + 3 >= len(f):
            continue
        fstype, mountpoint = f[dash + 1], Path(_unescape(f[4]))
        if fstype == "cgroup2" and unified is None:
            unified = mountpoint
        elif fstype == "cgroup":
            for opt in f[dash + 3].split(","):
                if "=" not in opt and opt not in _V1_MOUNT_FLAGS:
                    v1.setdefault(opt, mountpoint)
    return unified, v1


def _detect():
    unified, v1 = _read_mounts()
    if unified is not None:
        try:
            have = (unified / "cgroup.controllers").read_text().split()
        except OSError:
            have = []
        if all(c in have for c in REQUIRED_CONTROLLERS):
            return "v2", unified, {}
    return "v1", unified, {c: v1[c] for c in V1_CONTROLLERS if c in v1}


# "v1" or "v2": the driver berthd picks on this host.
CGROUP_DRIVER, V2_ROOT, V1_MOUNTS = _detect()
CGROUP_V2 = CGROUP_DRIVER == "v2"
# Where v1 hierarchies are usually mounted (only a fallback for one that is not).
CGROUP_ROOT = Path("/sys/fs/cgroup")


def wait_for(cond: Callable[[], object], timeout: float, interval: float = 0.05,
             what: str = "condition"):
    """Polls cond() until it returns something truthy; returns it. Raises AssertionError
    naming `what` on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:.1f} s waiting for {what}")
        time.sleep(interval)


def pid_alive(pid: int) -> bool:
    """True if pid exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return False
    state = stat[stat.rfind(")") + 2:].split(" ", 1)[0]
    return state not in ("Z", "X")


def comm(pid: int) -> Optional[str]:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except (FileNotFoundError, ProcessLookupError):
        return None


def status(pid: int) -> Dict[str, str]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        out[key] = value.strip()
    return out


def children(pid: int) -> List[int]:
    out = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except (FileNotFoundError, ProcessLookupError):
        return out
    for t in tasks:
        try:
            text = Path(f"/proc/{pid}/task/{t}/children").read_text()
        except (FileNotFoundError, ProcessLookupError):
            continue
        out.extend(int(x) for x in text.split())
    return out


def descendants(pid: int) -> List[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        for c in children(p):
            out.append(c)
            todo.append(c)
    return out


def ns_link(pid, ns: str) -> str:
    return os.readlink(f"/proc/{pid}/ns/{ns}")


def all_pids() -> List[int]:
    return [int(d) for d in os.listdir("/proc") if d.isdigit()]


def count_lines(path: str) -> int:
    with open(path) as f:
        return sum(1 for _ in f)


def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def net_namespaces() -> set:
    """Distinct network namespace links of all processes on the host."""
    out = set()
    for pid in all_pids():
        try:
            out.add(os.readlink(f"/proc/{pid}/ns/net"))
        except OSError:
            pass
    return out


def cgroup_hierarchies() -> List[Path]:
    """The root of every hierarchy berth uses: the cgroup2 mount (v2), or the mount of each v1
    controller berth uses (v1)."""
    return [V2_ROOT] if CGROUP_V2 else list(dict.fromkeys(V1_MOUNTS.values()))


def parent_dirs(parent: str) -> List[Path]:
    """The cgroup parent's directory in every hierarchy (existing or not)."""
    return [h / parent for h in cgroup_hierarchies()]


# cgroup parent -> the runtime dir of the berthd using it (conftest.Daemon registers itself):
# where the helper's state file says what a sandbox's cgroup is called.
_RUNTIME_DIRS: Dict[str, Path] = {}


def register_daemon(parent: str, runtime_dir: Path):
    _RUNTIME_DIRS[parent] = Path(runtime_dir)


def cgroup_name(parent: str, sandbox_id: str) -> str:
    """The name of a sandbox's cgroup under the parent: its id on v1 (the helper renames its
    shell's cgroup), its shell's name on v2 (cgroup2 cannot rename), as the helper's state
    file records it; the id when there is no state file (yet)."""
    run = _RUNTIME_DIRS.get(parent)
    if run is not None and sandbox_id:
        try:
            state = json.loads((run / "sandboxes" / sandbox_id / "state.json").read_text())
            return state.get("cgroup_name") or sandbox_id
        except (OSError, ValueError):
            pass
    return sandbox_id


def cgroup_dirs(parent: str, sandbox_id: str) -> List[Path]:
    """A sandbox's cgroup directories: one on v2, one per hierarchy on v1 (existing or not)."""
    name = cgroup_name(parent, sandbox_id)
    return [p / name for p in parent_dirs(parent)]


def is_shell_cgroup(name: str) -> bool:
    """A sandbox shell's cgroup (runtime/helper/shell.h): "shell-" and 24 hex digits."""
    return name.startswith("shell-") and len(name) == 30


def sandbox_cgroup_dirs(parent: str, include_shells: bool = False) -> List[Path]:
    """Every sandbox directory that exists under the cgroup parent, in all hierarchies; with
    include_shells, the pooled shells' too (on v2 a sandbox's may be named like one)."""
    out = []
    for p in parent_dirs(parent):
        if p.is_dir():
            out.extend(sorted(x for x in p.iterdir() if x.is_dir() and
                              (include_shells or not is_shell_cgroup(x.name) or CGROUP_V2)))
    return out


def pool_shell_pids(parent: str, sandbox_ids=()) -> List[int]:
    """The pid of each pooled shell that is in its cgroup (one process each), from the pids
    hierarchy; on v2, `sandbox_ids`' cgroups (named like shells) are not counted."""
    kept = {cgroup_name(parent, sid) for sid in sandbox_ids}
    base = cgroup_dir("pids", parent)
    out = []
    for p in sorted(base.iterdir()) if base.is_dir() else []:
        if not is_shell_cgroup(p.name) or p.name in kept:
            continue
        try:
            pids = [int(x) for x in (p / "cgroup.procs").read_text().split()]
        except FileNotFoundError:
            continue
        if len(pids) == 1:
            out.append(pids[0])
    return out


def shell_cgroup_dirs(parent: str) -> List[Path]:
    """The cgroups of pooled shells (v1: every shell-* dir, sandboxes being named by id)."""
    return [p for p in sandbox_cgroup_dirs(parent, include_shells=True) if is_shell_cgroup(p.name)]


def cgroup_exists(parent: str, sandbox_id: str) -> bool:
    """Whether any of the sandbox's cgroup directories still exists."""
    return any(p.exists() for p in cgroup_dirs(parent, sandbox_id))


def cgroup_dir(controller: str, parent: str, sandbox_id: str = "") -> Path:
    """The directory holding `controller`'s files for the sandbox (or the parent itself when
    sandbox_id is empty): <controller's v1 hierarchy>/... on v1, the one v2 directory on v2."""
    base = V2_ROOT if CGROUP_V2 else V1_MOUNTS.get(controller, CGROUP_ROOT / controller)
    p = base / parent
    return p / cgroup_name(parent, sandbox_id) if sandbox_id else p


def cgroup_file(controller: str, parent: str, sandbox_id: str, name: str) -> Path:
    return cgroup_dir(controller, parent, sandbox_id) / name


def read_int(path) -> int:
    return int(Path(path).read_text().strip())


def read_keyed(path) -> Dict[str, int]:
    """A flat keyed file (cpu.stat, memory.events, pids.events, memory.oom_control)."""
    out = {}
    for line in Path(path).read_text().splitlines():
        key, _, value = line.partition(" ")
        try:
            out[key] = int(value)
        except ValueError:
            pass
    return out


def _max_or_int(text: str) -> Optional[int]:
    text = text.strip()
    return None if text == "max" else int(text)


def cgroup_procs(parent: str, sandbox_id: str, controller: str = "pids") -> List[int]:
    """The pids in the sandbox's cgroup (in `controller`'s hierarchy on v1)."""
    text = cgroup_file(controller, parent, sandbox_id, "cgroup.procs").read_text()
    return [int(x) for x in text.split()]


def pids_current(parent: str, sandbox_id: str) -> int:
    return read_int(cgroup_file("pids", parent, sandbox_id, "pids.current"))


def pids_max(parent: str, sandbox_id: str) -> Optional[int]:
    """pids.max; None for "max"."""
    return _max_or_int(cgroup_file("pids", parent, sandbox_id, "pids.max").read_text())


def pids_refused(parent: str, sandbox_id: str) -> int:
    """How many forks the pids limit refused ("max N" in pids.events, both drivers)."""
    return read_keyed(cgroup_file("pids", parent, sandbox_id, "pids.events")).get("max", 0)


# v1 reports "no limit" as the largest page-aligned value (9223372036854771712).
_V1_UNLIMITED = 1 << 60


def memory_limit(parent: str, sandbox_id: str) -> Optional[int]:
    """The memory limit in bytes; None if unlimited."""
    if CGROUP_V2:
        return _max_or_int(cgroup_file("memory", parent, sandbox_id, "memory.max").read_text())
    v = read_int(cgroup_file("memory", parent, sandbox_id, "memory.limit_in_bytes"))
    return None if v >= _V1_UNLIMITED else v


def swap_limit(parent: str, sandbox_id: str) -> Optional[Tuple[str, Optional[int]]]:
    """How swap is limited, if the kernel accounts swap: ("memsw", memory+swap limit) on v1,
    ("swap", swap-only limit) on v2; None without swap accounting."""
    if CGROUP_V2:
        f = cgroup_file("memory", parent, sandbox_id, "memory.swap.max")
        return ("swap", _max_or_int(f.read_text())) if f.exists() else None
    f = cgroup_file("memory", parent, sandbox_id, "memory.memsw.limit_in_bytes")
    if not f.exists():
        return None
    v = read_int(f)
    return ("memsw", None if v >= _V1_UNLIMITED else v)


def memory_usage(parent: str, sandbox_id: str) -> int:
    name = "memory.current" if CGROUP_V2 else "memory.usage_in_bytes"
    return read_int(cgroup_file("memory", parent, sandbox_id, name))


def oom_kills(parent: str, sandbox_id: str) -> int:
    """Processes the OOM killer killed in the sandbox's memory cgroup ("oom_kill N" in
    memory.events on v2, in memory.oom_control on v1)."""
    name = "memory.events" if CGROUP_V2 else "memory.oom_control"
    return read_keyed(cgroup_file("memory", parent, sandbox_id, name)).get("oom_kill", 0)


def cpu_limit(parent: str, sandbox_id: str) -> Tuple[Optional[int], int]:
    """(quota in us or None if unlimited, period in us)."""
    if CGROUP_V2:
        quota, period = cgroup_file("cpu", parent, sandbox_id, "cpu.max").read_text().split()
        return _max_or_int(quota), int(period)
    quota = read_int(cgroup_file("cpu", parent, sandbox_id, "cpu.cfs_quota_us"))
    period = read_int(cgroup_file("cpu", parent, sandbox_id, "cpu.cfs_period_us"))
    return (None if quota < 0 else quota), period


def cpu_throttled(parent: str, sandbox_id: str) -> int:
    """Periods in which the quota throttled the sandbox (nr_throttled in cpu.stat)."""
    return read_keyed(cgroup_file("cpu", parent, sandbox_id, "cpu.stat"))["nr_throttled"]


def cpu_usage_ns(parent: str, sandbox_id: str) -> int:
    """CPU time used by the sandbox: cpu.stat usage_usec (v2) or cpuacct.usage (v1)."""
    if CGROUP_V2:
        return read_keyed(cgroup_file("cpu", parent, sandbox_id, "cpu.stat"))["usage_usec"] * 1000
    return read_int(cgroup_file("cpuacct", parent, sandbox_id, "cpuacct.usage"))


# berth's own processes in a sandbox when no exec runs: init (PID 1 inside) and at most one
# idle spare shim that init forks ahead of the next exec (a direct child of init, named
# berth-spare -- or still berth-init in the instant between its fork and its rename).
SPARE_COMMS = ("berth-spare", "berth-init")


def idle_spares(init_pid: int, pids) -> List[int]:
    out = []
    for p in pids:
        try:
            if p != init_pid and comm(p) in SPARE_COMMS and int(status(p)["PPid"]) == init_pid:
                out.append(p)
        except (FileNotFoundError, ProcessLookupError, KeyError):
            pass
    return out


def workload_procs(parent: str, sandbox_id: str, init_pid: int) -> List[int]:
    """Host pids in a sandbox's cgroup that are neither init nor an idle spare shim: the
    processes of execs (shims included). Raises if spares pile up."""
    pids = [p for p in cgroup_procs(parent, sandbox_id) if p != init_pid]
    spares = idle_spares(init_pid, pids)
    assert len(spares) <= 1, f"{len(spares)} idle spare shims in sandbox {sandbox_id}"
    return [p for p in pids if p not in spares]


def strip_spare(ps_output: str) -> List[str]:
    """The sorted process names in `ps -o pid,ppid,comm` output from inside a sandbox, minus
    at most one idle spare shim (a child of PID 1 named like SPARE_COMMS)."""
    rows = [line.split() for line in ps_output.splitlines()[1:]]
    spares = [r for r in rows if r[0] != "1" and r[1] == "1" and r[2] in SPARE_COMMS]
    assert len(spares) <= 1, f"several spare shims: {ps_output}"
    return sorted(r[2] for r in rows if r not in spares)
