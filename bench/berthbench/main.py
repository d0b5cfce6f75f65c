"""bench/run-compare: berth and its peers, same run, same rootfs. See bench/README.md."""
import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from . import peers as peer_mod
from . import report, workloads
from .data import make_data, tree_stats
from .util import (MNT_DETACH, MiB, children, log, rss_kib, run, umount,
                   unmount_all_under, unshare_mounts)

REPO = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("BERTH_BENCH_CACHE", "/var/cache/berth-bench"))
CGROUP_PARENT = "berth-bench-compare"

# Debian packages each peer comes from.
PACKAGES = {"bwrap": ["bubblewrap"], "runc": ["runc"], "crun": ["crun"],
            "podman": ["podman", "uidmap", "slirp4netns"], "docker": ["docker.io"],
            "floor": ["util-linux"]}

MODES = {
    # rounds x samples per round (round robin over the peers), copy iterations, copy data
    # (files, tree bytes, big file bytes), containers for the memory figures.
    "full": dict(cold=(5, 4), exec=(5, 10), copies=3, data=(5000, 200 * MiB, 500 * MiB),
                 trial=(5, 2), parallel=(3, 1), parallel_trials=16, memory=64),
    "quick": dict(cold=(2, 1), exec=(2, 2), copies=1, data=(200, 8 * MiB, 16 * MiB),
                  trial=(1, 1), parallel=(1, 1), parallel_trials=4, memory=4),
}


class Context:
    def __init__(self, work: Path, rootfs: Path, rootfs_tar: Path):
        self.work = work
        self.rootfs = rootfs
        self.rootfs_tar = rootfs_tar
        self.berth_bin = REPO / "build/src/runtime"
        self.berth_socket = work / "berth-run/berth.sock"
        self.berth_state = work / "berth-state"
        self.trial_file = work / "trial-1MiB.bin"
        self.berthd = None
        self.berthd_fresh_rss_kib = {}

    def berth_daemon_pids(self):
        if not self.berthd or self.berthd.poll() is not None:
            return []
        return [("berthd", self.berthd.pid),
                *[c for c in children(self.berthd.pid) if c[0] == "berth-helper"]]


def enter_private_mounts():
    """Everything runs in a mount namespace of its own: the overlays this harness mounts,
    podman's and docker's, vanish with it, whatever happens. In it the cgroup2 mount of a
    hybrid host is taken away: crun refuses hybrid hosts ("cgroups in hybrid mode not
    supported, drop all controllers from cgroupv2": hugetlb sits on cgroup2 here) and runs
    on the v1 controllers once it sees none. Nobody else is affected: berth, runc, podman
    and docker use v1 on this host either way."""
    unshare_mounts()
    unified = Path("/sys/fs/cgroup/unified")
    if os.path.ismount(unified) and os.path.ismount("/sys/fs/cgroup/memory"):
        umount(unified, MNT_DETACH)
        return "hybrid: cgroup2 at /sys/fs/cgroup/unified unmounted in the benchmark's " \
               "mount namespace so crun runs (on the v1 controllers)"
    return "unchanged"


def install_missing(names, require_all):
    wanted = []
    for name in names:
        cls = next(c for c in peer_mod.ALL if c.name == name)
        if peer_mod.missing_commands(cls):
            wanted += PACKAGES.get(name, [])
    if not wanted:
        return
    log(f"installing {' '.join(wanted)} (apt-get)")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for argv in (["apt-get", "update", "-qq"],
                 ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *wanted]):
        r = subprocess.run(argv, env=env, capture_output=True)
        if r.returncode != 0:
            msg = f"{' '.join(argv)} failed: {r.stderr.decode(errors='replace')[-1000:]}"
            if require_all:
                raise SystemExit(msg)
            log(msg)
    # docker.io's postinst may start a system dockerd; ours has its own root and socket.


def apt_mirror():
    """The host's own Debian mirror (debootstrap's default otherwise)."""
    for f in [Path("/etc/apt/sources.list"), *Path("/etc/apt/sources.list.d").glob("*")]:
        try:
            text = f.read_text()
        except OSError:
            continue
        for line in text.splitlines():
            parts = line.split()
            if parts[:1] == ["deb"] and "bookworm" in parts and "security" not in line:
                return next(p for p in parts[1:] if "://" in p)
            if parts[:1] == ["URIs:"] and "security" not in line and "debian" in line:
                return parts[1]
    return None


def ensure_rootfs():
    """A debootstrapped Debian 12 minbase, made once and kept in the cache, with a tarball
    of it for podman and docker to import."""
    rootfs = CACHE / "bookworm-minbase"
    tar = CACHE / "bookworm-minbase.tar"
    if not (rootfs / "etc/debian_version").exists():
        if shutil.which("debootstrap") is None:
            subprocess.run(["apt-get", "install", "-y", "-qq", "debootstrap"], check=True,
                           env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"))
        CACHE.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix="rootfs.", dir=CACHE))
        log(f"debootstrap --variant=minbase bookworm {tmp} (about a minute)")
        mirror = apt_mirror()
        r = subprocess.run(["debootstrap", "--variant=minbase", "bookworm", tmp,
                            *([mirror] if mirror else [])], capture_output=True)
        if r.returncode != 0:
            shutil.rmtree(tmp, ignore_errors=True)
            raise SystemExit("debootstrap failed:\n" + r.stdout.decode(errors="replace")[-3000:])
        shutil.rmtree(rootfs, ignore_errors=True)
        tmp.rename(rootfs)
        tar.unlink(missing_ok=True)
    rootfs.chmod(0o755)
    if not tar.exists():
        part = tar.with_suffix(".part")
        run(["tar", "-C", rootfs, "--numeric-owner", "-cf", part, "."])
        part.rename(tar)
    return rootfs, tar


def start_berthd(ctx):
    env = {k: v for k, v in os.environ.items() if not k.startswith("BERTH_")}
    env["BERTH_RUNTIME_DIR"] = str(ctx.berth_socket.parent)
    env["BERTH_STATE_DIR"] = str(ctx.berth_state)
    log_file = open(ctx.work / "berthd.log", "wb")
    ctx.berthd = subprocess.Popen([str(ctx.berth_bin / "berthd"), "--cgroup-parent",
                                   CGROUP_PARENT], stdout=log_file, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, env=env)
    log_file.close()
    for _ in range(400):
        if ctx.berth_socket.exists():
            time.sleep(0.2)  # past its start-up
            ctx.berthd_fresh_rss_kib = {name: rss_kib(pid) for name, pid in
                                        ctx.berth_daemon_pids()}
            return
        if ctx.berthd.poll() is not None:
            break
        time.sleep(0.025)
    raise SystemExit("berthd did not start:\n" + (ctx.work / "berthd.log").read_text())


def stop_berthd(ctx):
    if ctx.berthd and ctx.berthd.poll() is None:
        ctx.berthd.send_signal(signal.SIGTERM)
        try:
            ctx.berthd.wait(30)
        except subprocess.TimeoutExpired:
            ctx.berthd.kill()
            ctx.berthd.wait()
    for d in [Path("/sys/fs/cgroup") / CGROUP_PARENT,
              *Path("/sys/fs/cgroup").glob(f"*/{CGROUP_PARENT}")]:
        try:
            d.rmdir()
        except OSError:
            pass


def machine_facts(cgroup_note):
    cpu = ""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    mem = Path("/proc/meminfo").read_text().split()[1]
    return {"kernel": platform.release(), "cpu": cpu, "cores": os.cpu_count(),
            "memory_gib": round(int(mem) / (1 << 20), 1),
            "os": Path("/etc/debian_version").read_text().strip(),
            "cgroups": cgroup_note, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def main(argv=None):
    ap = argparse.ArgumentParser(prog="bench/run-compare", description=__doc__)
    ap.add_argument("--quick", action="store_true",
                    help="few iterations and small data: shows the harness works (CI)")
    ap.add_argument("--peers", default=",".join(c.name for c in peer_mod.ALL),
                    help="comma-separated subset of: %(default)s")
    ap.add_argument("--skip", default="", help="workloads to leave out: cold,exec,copies,"
                    "trial,parallel,memory")
    ap.add_argument("--no-build", action="store_true")
    ap.add_argument("--require-all", action="store_true",
                    help="fail if a peer cannot be installed or started (CI)")
    ap.add_argument("--out", help="results prefix (default bench/results, or "
                    "bench/out/results-quick with --quick)")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("bench/run-compare runs as root (it mounts overlays and runs runtimes)")
    mode = MODES["quick" if args.quick else "full"]
    names = [n for n in args.peers.split(",") if n]
    unknown = set(names) - {c.name for c in peer_mod.ALL}
    if unknown:
        raise SystemExit(f"unknown peers: {', '.join(sorted(unknown))}")
    skip = set(filter(None, args.skip.split(",")))
    out = Path(args.out) if args.out else (
        REPO / "bench/out/results-quick" if args.quick else REPO / "bench/results")

    install_missing(names, args.require_all)
    if not args.no_build:
        log("building berth")
        run([REPO / "scripts/build"])
    rootfs, rootfs_tar = ensure_rootfs()
    cgroup_note = enter_private_mounts()

    work = Path(tempfile.mkdtemp(prefix="berth-compare.", dir="/var/tmp"))
    work.chmod(0o755)
    ctx = Context(work, rootfs, rootfs_tar)
    results = {"mode": "quick" if args.quick else "full", "machine": machine_facts(cgroup_note),
               "peers": {}, "skipped_peers": {}, "workloads": {}}
    live = []
    try:
        start_berthd(ctx)
        with open(ctx.trial_file, "wb") as f:
            f.write(os.urandom(MiB))
        for cls in peer_mod.ALL:
            if cls.name not in names:
                continue
            missing = peer_mod.missing_commands(cls)
            if missing:
                reason = f"not installed: {', '.join(missing)}"
            else:
                try:
                    p = cls(ctx)
                    p.setup()
                    live.append(p)
                    results["peers"][p.name] = {"label": p.label, "version": p.version()}
                    log(f"peer {p.name}: {results['peers'][p.name]['version']}")
                    continue
                except Exception as e:  # noqa: BLE001
                    reason = f"setup failed: {e}"
            if args.require_all:
                raise SystemExit(f"peer {cls.name}: {reason}")
            results["skipped_peers"][cls.name] = reason
            log(f"peer {cls.name} skipped: {reason}")

        w = results["workloads"]
        if "cold" not in skip:
            w["cold"] = workloads.cold(live, *mode["cold"])
        if "exec" not in skip:
            for key, r in workloads.exec_round_trip(live, *mode["exec"]).items():
                w[f"exec_{key}"] = r
        if "copies" not in skip:
            data = work / "data"
            data.mkdir()
            tree, big = make_data(data, *mode["data"])
            files, size = tree_stats(tree)
            results["copy_data"] = {"tree_files": files, "tree_bytes": size,
                                    "big_bytes": big.stat().st_size}
            scratch = work / "copies"
            scratch.mkdir()
            w.update(workloads.copies(live, mode["copies"], tree, big, scratch))
            shutil.rmtree(data)
        scratch = work / "trials"
        scratch.mkdir()
        if "trial" not in skip:
            w["trial"] = workloads.trials(live, *mode["trial"], ctx.trial_file, scratch)
        if "parallel" not in skip:
            n = mode["parallel_trials"]
            w[f"trials_{n}_at_once"] = workloads.trials(live, *mode["parallel"],
                                                        ctx.trial_file, scratch, parallel=n)
        if "memory" not in skip:
            results["memory"] = workloads.memory(live, mode["memory"])
        results["berthd_fresh_rss_kib"] = ctx.berthd_fresh_rss_kib
    finally:
        for p in reversed(live):
            try:
                p.teardown()
            except Exception as e:  # noqa: BLE001
                log(f"teardown {p.name}: {e}")
        stop_berthd(ctx)
        unmount_all_under(work)
        shutil.rmtree(work, ignore_errors=True)

    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(results, indent=1))
    text = report.markdown(results)
    out.with_suffix(".md").write_text(text)
    print(text)
    failures = report.failure_count(results)
    if failures:
        log(f"{failures} failed steps (see the tables)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
