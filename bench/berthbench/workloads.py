"""The workloads, each run over every peer in the same rounds (round robin, so that this
machine's slow spells fall on all of them alike). A failed step is counted and reported,
never timed."""
import shutil
import subprocess
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .util import (du_bytes, log, mem_available_kib, prime_memory, rss_kib, summary, timed,
                   warm)

TRIAL_EXECS = 20


class Tally:
    """Samples and failures of one workload for one peer."""

    def __init__(self):
        self.samples, self.failures, self.errors = [], 0, []
        self.phases = {}  # where a sample's time went, when the runtime says (client_bench)

    def fail(self, what):
        self.failures += 1
        if len(self.errors) < 5:
            self.errors.append(str(what)[-600:])
            log(f"  failure: {str(what)[-300:]}")

    def attempt(self, fn, *args):
        try:
            self.samples.append(timed(fn, *args))
        except Exception as e:  # noqa: BLE001 - every failure is counted and shown
            self.fail(e if str(e) else traceback.format_exc())

    def result(self):
        r = {"summary": summary(self.samples), "samples_ms": self.samples,
             "failures": self.failures, "errors": self.errors}
        if self.phases:
            r["phases"] = {k: summary(v) for k, v in self.phases.items()}
        return r


def batch_only(p):
    """berth's C++ client runs whole batches itself (bench/client_bench)."""
    return getattr(p, "batch_only", False)


def run_batch(tally, p, workload, n, *extra, **kw):
    try:
        _batch_into(tally, p.batch(workload, n, *extra, **kw))
    except Exception as e:  # noqa: BLE001
        tally.fail(e)


def _batch_into(tally, out):
    tally.samples += out["samples_ms"]
    for phase, samples in out.get("phases_ms", {}).items():
        tally.phases.setdefault(phase, []).extend(samples)
    for e in out["errors"]:
        tally.fail(e)
    tally.failures += out["failures"] - len(out["errors"])


def cold(peers, rounds, per_round):
    tallies = {p.name: Tally() for p in peers}
    for r in range(rounds):
        log(f"cold: round {r + 1}/{rounds}")
        for p in peers:
            t = tallies[p.name]
            if batch_only(p):
                run_batch(t, p, "cold", per_round)
                continue
            for _ in range(per_round):
                t.attempt(p.cold)
    return {name: t.result() for name, t in tallies.items()}


COMMANDS = {"true": (["true"], None), "echo": (["sh", "-c", "echo hi"], b"hi\n")}


def exec_round_trip(peers, rounds, per_round):
    """exec of `true` and of `sh -c 'echo hi'` (its output checked) into a running
    container."""
    results = {}
    handles, broken = {}, {}
    try:
        for p in peers:
            if not batch_only(p):
                try:
                    handles[p.name] = p.start()
                    p.exec(handles[p.name], ["true"])  # warm
                except Exception as e:  # noqa: BLE001 - that peer's rows show it
                    broken[p.name] = e
        for key, (argv, expect) in COMMANDS.items():
            tallies = {p.name: Tally() for p in peers}
            for name, e in broken.items():
                tallies[name].fail(f"could not start a container: {e}")
            for r in range(rounds):
                log(f"exec {key}: round {r + 1}/{rounds}")
                for p in peers:
                    if p.name in broken:
                        continue
                    t = tallies[p.name]
                    if batch_only(p):
                        extra = ["--expect", expect.decode()] if expect else []
                        run_batch(t, p, "exec", per_round, *extra, "--", *argv)
                        continue
                    for _ in range(per_round):
                        def step():
                            out = p.exec(handles[p.name], argv)
                            if expect is not None and out != expect:
                                raise RuntimeError(f"printed {out!r}, expected {expect!r}")
                        t.attempt(step)
            results[key] = {name: t.result() for name, t in tallies.items()}
    finally:
        for p in peers:
            if p.name in handles:
                p.stop(handles[p.name])
    return results


def copies(peers, iterations, tree: Path, big: Path, scratch: Path):
    """Into a fresh container: the tree, then the big file; then both out again. Page cache
    warm, dirty data synced and free memory primed before each timed step."""
    steps = ("tree_in", "big_in", "tree_out", "big_out")
    peers = [p for p in peers if not batch_only(p)]  # the same copy path as the CLI
    tallies = {s: {p.name: Tally() for p in peers} for s in steps}
    for i in range(iterations):
        log(f"copies: round {i + 1}/{iterations}")
        for p in peers:
            try:
                h = p.start()
            except Exception as e:  # noqa: BLE001
                tallies["tree_in"][p.name].fail(f"could not start a container: {e}")
                continue
            out = scratch / f"{p.name}-{i}"
            try:
                for step, fn, args in (
                        ("tree_in", p.copy_in, (h, tree, "/root")),
                        ("big_in", p.copy_in, (h, big, "/root")),
                        ("tree_out", p.copy_out, (h, "/root/" + tree.name, out / "t")),
                        ("big_out", p.copy_out, (h, "/root/" + big.name, out / "b"))):
                    warm(tree, big)
                    subprocess.run(["sync"], check=True)
                    prime_memory()
                    tallies[step][p.name].attempt(fn, *args)
                for got, want in ((out / "t" / tree.name, tree), (out / "b" / big.name, big)):
                    if not same_size(got, want):
                        tallies["tree_out"][p.name].fail(f"{got} differs from {want}")
            finally:
                p.stop(h)
                shutil.rmtree(out, ignore_errors=True)
    return {s: {name: t.result() for name, t in by_peer.items()}
            for s, by_peer in tallies.items()}


def same_size(a: Path, b: Path) -> bool:
    if b.is_file():
        return a.is_file() and a.stat().st_size == b.stat().st_size
    return a.is_dir() and du_tree(a) == du_tree(b)


def du_tree(root: Path):
    n = size = 0
    for f in root.rglob("*"):
        if f.is_file():
            n += 1
            size += f.stat().st_size
    return n, size


def one_trial(p, file: Path, out: Path):
    """create, 20 execs of `true`, copy a 1 MiB file in, copy /etc out, delete."""
    h = p.start()
    try:
        for _ in range(TRIAL_EXECS):
            p.exec(h, ["true"])
        p.copy_in(h, file, "/root")
        p.copy_out(h, "/etc", out)
    finally:
        p.stop(h)
    if not (out / "etc" / "passwd").is_file():
        raise RuntimeError(f"{p.name}: /etc was not copied out to {out}")


def trials(peers, rounds, per_round, file: Path, scratch: Path, parallel=1):
    """One trial at a time (parallel=1), or `parallel` at once timed as a batch."""
    tallies = {p.name: Tally() for p in peers}
    for r in range(rounds):
        log(f"trial x{parallel}: round {r + 1}/{rounds}")
        for p in peers:
            t = tallies[p.name]
            if batch_only(p):
                run_batch(t, p, "trial", per_round, parallel=parallel)
                continue
            for k in range(per_round):
                outs = [scratch / f"{p.name}-{r}-{k}-{j}" for j in range(parallel)]
                if parallel == 1:
                    t.attempt(one_trial, p, file, outs[0])
                else:
                    errors = []

                    def batch():
                        with ThreadPoolExecutor(parallel) as pool:
                            futures = [pool.submit(one_trial, p, file, o) for o in outs]
                            for f in futures:
                                try:
                                    f.result()
                                except Exception as e:  # noqa: BLE001
                                    errors.append(e)
                    t.samples.append(timed(batch))
                    for e in errors:
                        t.fail(e)
                for o in outs:
                    shutil.rmtree(o, ignore_errors=True)
    return {name: t.result() for name, t in tallies.items()}


def settle():
    """Written back, caches dropped and a pause: the memory figures then count what the
    containers hold, not page cache that happens to be around."""
    subprocess.run(["sync"], check=True)
    Path("/proc/sys/vm/drop_caches").write_text("3\n")
    time.sleep(1)


def steady_mem_available_kib():
    """The median of a few readings (the kernel's own background work moves it)."""
    readings = []
    for _ in range(5):
        readings.append(mem_available_kib())
        time.sleep(0.2)
    return sorted(readings)[len(readings) // 2]


def memory(peers, count):
    """`count` idle containers per peer, each having run `true` once: host memory and disk
    per container, and the peer's daemon RSS before and with them."""
    results = {}
    for p in peers:
        if batch_only(p) or p.name == "host":
            continue
        log(f"memory: {count} {p.name} containers")
        settle()
        before = steady_mem_available_kib()
        disk_before = du_bytes(*p.disk_paths())
        rss_idle = {name: rss_kib(pid) for name, pid in p.daemon_pids()}
        handles, failures, errors = [], 0, []
        for _ in range(count):
            try:
                h = p.start()
                handles.append(h)
                p.exec(h, ["true"])
            except Exception as e:  # noqa: BLE001
                failures += 1
                errors.append(str(e)[-300:])
        settle()
        after = steady_mem_available_kib()
        disk_after = du_bytes(*p.disk_paths())
        rss_loaded = {name: rss_kib(pid) for name, pid in p.daemon_pids()}
        alive = max(1, len(handles))
        results[p.name] = {
            "containers": len(handles), "failures": failures, "errors": errors[:5],
            "host_memory_per_container_kib": (before - after) / alive,
            "disk_per_container_bytes": (disk_after - disk_before) / alive,
            "daemon_rss_idle_kib": rss_idle, "daemon_rss_loaded_kib": rss_loaded,
        }
        for h in handles:
            try:
                p.stop(h)
            except Exception as e:  # noqa: BLE001
                log(f"  stop failed: {e}")
    return results
