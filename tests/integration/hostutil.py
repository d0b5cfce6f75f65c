"""Host-side observation helpers for the integration tests: /proc, cgroups, polling."""
import os
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional

# The v1 hierarchies berth uses (cpuacct and freezer are optional in berth, but mounted here).
CGROUP_ROOT = Path("/sys/fs/cgroup")
CGROUP_CONTROLLERS = ("memory", "cpu", "cpuacct", "pids", "freezer")


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


def cgroup_dir(controller: str, parent: str, sandbox_id: str = "") -> Path:
    p = CGROUP_ROOT / controller / parent
    return p / sandbox_id if sandbox_id else p


def sandbox_cgroup_dirs(parent: str) -> List[Path]:
    """Every sandbox directory under the cgroup parent, in all hierarchies berth uses."""
    out = []
    for c in CGROUP_CONTROLLERS:
        p = cgroup_dir(c, parent)
        if p.is_dir():
            out.extend(sorted(x for x in p.iterdir() if x.is_dir()))
    return out


def cgroup_procs(controller: str, parent: str, sandbox_id: str) -> List[int]:
    text = (cgroup_dir(controller, parent, sandbox_id) / "cgroup.procs").read_text()
    return [int(x) for x in text.split()]


def read_int(path) -> int:
    return int(Path(path).read_text().strip())


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


def workload_procs(controller: str, parent: str, sandbox_id: str, init_pid: int) -> List[int]:
    """Host pids in a sandbox's cgroup that are neither init nor an idle spare shim: the
    processes of execs (shims included). Raises if spares pile up."""
    pids = [p for p in cgroup_procs(controller, parent, sandbox_id) if p != init_pid]
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
