"""The runtimes measured, each behind one small interface, driven from their CLIs the way a
trial runner would. Every container gets its own overlay on the same Debian rootfs: peers
without an image store (runc, crun, bwrap, the floor) get one this harness mounts with
mount(2) inside the timed path; podman, docker and berth make their own.

A peer offers:
  cold()                     new container, run `true`, remove it
  start() -> handle          a running container (idle)
  exec(h, argv) -> stdout    run argv in it, to its end
  copy_in(h, src, dir)       host file or tree `src` into directory `dir` inside
  copy_out(h, path, dest)    `path` inside to host directory `dest` (created)
  stop(h)                    remove the container and what it used
"""
import itertools
import json
import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

from .util import (CommandFailed, MNT_DETACH, du_bytes, mount, pipe, run, run_detaching,
                   umount, unmount_all_under, children)

IDLE = ["sleep", "infinity"]


class Overlay:
    """lower = the shared rootfs; upper, work and the merged mount per container."""

    def __init__(self, base: Path, lower: Path):
        self.dir = base
        self.merged = base / "merged"
        for d in ("upper", "work", "merged"):
            (base / d).mkdir(parents=True)
        mount("overlay", self.merged, "overlay", 0,
              f"lowerdir={lower},upperdir={base / 'upper'},workdir={base / 'work'}")

    def remove(self):
        umount(self.merged, MNT_DETACH)
        shutil.rmtree(self.dir)


class Peer:
    name = label = ""
    needs = ()  # commands that must exist

    def __init__(self, ctx):
        self.ctx = ctx
        self.work = ctx.work / self.name
        self.work.mkdir()
        self._ids = itertools.count()
        self._lock = threading.Lock()

    def new_name(self):
        with self._lock:
            return f"bb{os.getpid()}-{next(self._ids)}"

    def version(self) -> str:
        return ""

    def setup(self):
        pass

    def teardown(self):
        pass

    # Memory and disk accounting: the peer's daemons, as (name, pid), and where its
    # containers' files are.
    def daemon_pids(self):
        return []

    def disk_paths(self):
        return [self.work]



class Host(Peer):
    """The physical floor: no container at all; spawn and cp on the host."""
    name, label = "host", "host (no container)"

    def cold(self):
        run(["true"])

    def start(self):
        d = self.work / self.new_name()
        d.mkdir()
        return d

    def exec(self, h, argv):
        return run(argv, cwd=h)

    def copy_in(self, h, src, dest):
        target = h / dest.lstrip("/")
        target.mkdir(parents=True, exist_ok=True)
        run(["cp", "-a", src, target])

    def copy_out(self, h, path, dest):
        Path(dest).mkdir(parents=True, exist_ok=True)
        src = self.ctx.rootfs / path.lstrip("/") if path == "/etc" else h / path.lstrip("/")
        run(["cp", "-a", src, dest])

    def stop(self, h):
        shutil.rmtree(h)


class OverlayPeer(Peer):
    """A runtime that is handed a directory: the harness makes the overlay."""

    def overlay(self, name):
        return Overlay(self.work / name, self.ctx.rootfs)


class Floor(OverlayPeer):
    """unshare + chroot (unshare --root) + nsenter: namespaces and nothing else."""
    name, label = "floor", "unshare+chroot+nsenter"
    needs = ("unshare", "nsenter")
    NS = ["--mount", "--uts", "--ipc", "--net", "--pid", "--fork"]

    def version(self):
        return run(["unshare", "--version"]).decode().strip()

    def cold(self):
        ov = self.overlay(self.new_name())
        try:
            run(["unshare", *self.NS, "--root", ov.merged, "true"])
        finally:
            ov.remove()

    def start(self):
        ov = self.overlay(self.new_name())
        # --kill-child: the container's PID 1 (unshare's child) dies with unshare.
        p = subprocess.Popen(["unshare", *self.NS, "--kill-child", "--mount-proc", "--root",
                              ov.merged, *IDLE],
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
        # unshare --fork: the container's PID 1 is unshare's child.
        for _ in range(500):
            kids = Path(f"/proc/{p.pid}/task/{p.pid}/children").read_text().split()
            if kids:
                return (ov, p, int(kids[0]))
            time.sleep(0.002)
        p.kill()
        raise CommandFailed("unshare: no child appeared")

    def _enter(self, h):
        return ["nsenter", "--target", h[2], "--mount", "--uts", "--ipc", "--net", "--pid",
                "--root", "--wd"]

    def exec(self, h, argv):
        return run([*self._enter(h), *argv])

    def copy_in(self, h, src, dest):
        src = Path(src)
        pipe(["tar", "-C", src.parent, "-c", src.name],
             [*self._enter(h), "tar", "-x", "-C", dest, "-f", "-"])

    def copy_out(self, h, path, dest):
        Path(dest).mkdir(parents=True, exist_ok=True)
        p = Path(path)
        pipe([*self._enter(h), "tar", "-C", p.parent, "-c", p.name],
             ["tar", "-x", "-C", dest, "-f", "-"])

    def stop(self, h):
        ov, p, pid1 = h
        os.kill(pid1, signal.SIGKILL)  # the namespace's init: the kernel kills the rest
        p.kill()
        p.wait()
        ov.remove()


class Bwrap(OverlayPeer):
    """bubblewrap has no running container to exec into: every command is a new bwrap
    over the same overlay, and files go in and out through the overlay on the host."""
    name, label = "bwrap", "bubblewrap"
    needs = ("bwrap",)

    def version(self):
        return run(["bwrap", "--version"]).decode().strip()

    def _bwrap(self, merged):
        return ["bwrap", "--bind", merged, "/", "--proc", "/proc", "--dev", "/dev",
                "--unshare-all", "--die-with-parent", "--new-session", "--chdir", "/"]

    def cold(self):
        ov = self.overlay(self.new_name())
        try:
            run([*self._bwrap(ov.merged), "true"])
        finally:
            ov.remove()

    def start(self):
        ov = self.overlay(self.new_name())
        # Something alive for the memory figures; commands do not go through it.
        p = subprocess.Popen([*self._bwrap(ov.merged), *IDLE], stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return (ov, p)

    def exec(self, h, argv):
        return run([*self._bwrap(h[0].merged), *argv])

    def copy_in(self, h, src, dest):
        run(["cp", "-a", src, h[0].merged / dest.lstrip("/")])

    def copy_out(self, h, path, dest):
        Path(dest).mkdir(parents=True, exist_ok=True)
        run(["cp", "-a", h[0].merged / path.lstrip("/"), dest])

    def stop(self, h):
        ov, p = h
        p.kill()
        p.wait()
        ov.remove()


class OciRuntime(OverlayPeer):
    """runc and crun: an OCI bundle per container (config from `spec`, root = overlay)."""
    needs = ()

    def __init__(self, ctx):
        super().__init__(ctx)
        self.state = self.work / "state"
        self.state.mkdir()
        spec_dir = self.work / "spec"
        spec_dir.mkdir()
        run([self.binary, "spec"], cwd=spec_dir)
        self.spec = json.loads((spec_dir / "config.json").read_text())
        self.spec["process"]["terminal"] = False
        # The host's hard RLIMIT_NOFILE is below what `spec` asks for, and root here lacks
        # CAP_SYS_RESOURCE: keep what the host has.
        self.spec["process"]["rlimits"] = [
            {"type": "RLIMIT_NOFILE", "hard": 20000, "soft": 20000}]

    @property
    def cli(self):
        return [self.binary, "--root", self.state]

    def version(self):
        return run([self.binary, "--version"]).decode().splitlines()[0]

    def _bundle(self, name, args):
        ov = self.overlay(name)
        spec = json.loads(json.dumps(self.spec))
        spec["root"] = {"path": str(ov.merged), "readonly": False}
        spec["process"]["args"] = args
        spec["hostname"] = name
        (ov.dir / "config.json").write_text(json.dumps(spec))
        return ov

    def cold(self):
        name = self.new_name()
        ov = self._bundle(name, ["true"])
        try:
            run([*self.cli, "run", "--bundle", ov.dir, name], stdin=subprocess.DEVNULL)
        finally:
            ov.remove()

    def start(self):
        name = self.new_name()
        ov = self._bundle(name, IDLE)
        try:
            run_detaching([*self.cli, "run", "--detach", "--bundle", ov.dir, name])
        except Exception:
            ov.remove()
            raise
        return (ov, name)

    def exec(self, h, argv):
        return run([*self.cli, "exec", h[1], *argv], stdin=subprocess.DEVNULL)

    def copy_in(self, h, src, dest):
        src = Path(src)
        pipe(["tar", "-C", src.parent, "-c", src.name],
             [*self.cli, "exec", h[1], "tar", "-x", "-C", dest, "-f", "-"])

    def copy_out(self, h, path, dest):
        Path(dest).mkdir(parents=True, exist_ok=True)
        p = Path(path)
        pipe([*self.cli, "exec", h[1], "tar", "-C", p.parent, "-c", p.name],
             ["tar", "-x", "-C", dest, "-f", "-"])

    def stop(self, h):
        ov, name = h
        run([*self.cli, "delete", "--force", name])
        ov.remove()


class Runc(OciRuntime):
    name, label, binary = "runc", "runc", "runc"
    needs = ("runc",)


class Crun(OciRuntime):
    name, label, binary = "crun", "crun", "crun"
    needs = ("crun",)


class CpCommand:
    """copy_in/copy_out through the runtime's own `cp` (podman, docker, berth)."""

    def copy_in(self, h, src, dest):
        run([*self.cli, "cp", src, f"{h}:{dest}"])

    def copy_out(self, h, path, dest):
        Path(dest).mkdir(parents=True, exist_ok=True)
        run([*self.cli, "cp", f"{h}:{path}", dest])


class Podman(CpCommand, Peer):
    """podman with the cgroupfs manager, its store under the work dir, no network."""
    name, label = "podman", "podman"
    needs = ("podman",)

    def __init__(self, ctx):
        super().__init__(ctx)
        self.cli = ["podman", "--root", self.work / "root", "--runroot", self.work / "run",
                    "--cgroup-manager", "cgroupfs", "--storage-driver", "overlay",
                    "--events-backend", "none", "--log-level", "error"]
        # The host's hard limits (no CAP_SYS_RESOURCE to raise them).
        self.run_opts = ["--network", "none", "--ulimit", "nofile=20000:20000",
                         "--ulimit", "nproc=4096:4096", "--log-driver", "none"]

    def version(self):
        return run(["podman", "--version"]).decode().strip()

    def setup(self):
        with open(self.ctx.rootfs_tar, "rb") as f:
            run([*self.cli, "import", "-", "berth-bench:latest"], stdin=f)

    def teardown(self):
        try:
            run([*self.cli, "rm", "--all", "--force", "--time", "0"])
        finally:
            unmount_all_under(self.work)

    def cold(self):
        run([*self.cli, "run", "--rm", *self.run_opts, "berth-bench:latest", "true"])

    def start(self):
        return run([*self.cli, "run", "--detach", *self.run_opts, "berth-bench:latest",
                    *IDLE]).decode().strip()

    def exec(self, h, argv):
        return run([*self.cli, "exec", h, *argv])

    def stop(self, h):
        run([*self.cli, "rm", "--force", "--time", "0", h])


class Docker(Podman):
    """dockerd started here with its own data root, exec root and socket; stopped after."""
    name, label = "docker", "docker"
    needs = ("dockerd",)

    def __init__(self, ctx):
        Peer.__init__(self, ctx)
        client = "/usr/bin/docker" if Path("/usr/bin/docker").exists() else "docker"
        self.sock = self.work / "docker.sock"
        self.cli = [client, "-H", f"unix://{self.sock}"]
        self.run_opts = ["--network", "none", "--log-driver", "none"]
        self.daemon = None

    def version(self):
        return "docker " + run([*self.cli, "version", "--format",
                                "{{.Server.Version}}"]).decode().strip()

    def setup(self):
        log_file = open(self.work / "dockerd.log", "wb")
        self.daemon = subprocess.Popen(
            ["dockerd", "--data-root", self.work / "data", "--exec-root", self.work / "exec",
             "--pidfile", self.work / "dockerd.pid", "-H", f"unix://{self.sock}",
             "--bridge", "none", "--iptables=false", "--ip6tables=false", "--ip-masq=false",
             "--userland-proxy=false", "--storage-driver", "overlay2",
             "--default-ulimit", "nofile=20000:20000", "--default-ulimit", "nproc=4096:4096"],
            stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True)
        log_file.close()
        for _ in range(300):
            if self.daemon.poll() is not None:
                raise CommandFailed("dockerd exited: " +
                                    (self.work / "dockerd.log").read_text()[-2000:])
            if self.sock.exists() and subprocess.run(
                    [*self.cli, "info"], capture_output=True).returncode == 0:
                break
            time.sleep(0.1)
        else:
            raise CommandFailed("dockerd did not come up in 30 s")
        super().setup()

    def teardown(self):
        try:
            if self.daemon and self.daemon.poll() is None:
                subprocess.run([*self.cli, "rm", "--force",
                                *run([*self.cli, "ps", "-aq"]).decode().split()],
                               capture_output=True)
        finally:
            if self.daemon and self.daemon.poll() is None:
                self.daemon.send_signal(signal.SIGTERM)
                try:
                    self.daemon.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(self.daemon.pid, signal.SIGKILL)
                    self.daemon.wait()
            unmount_all_under(self.work)

    def daemon_pids(self):
        if not self.daemon or self.daemon.poll() is not None:
            return []
        # and the containerd it started (not the shims: they are per container)
        return [("dockerd", self.daemon.pid),
                *[c for c in children(self.daemon.pid) if c[0] == "containerd"]]

    def cold(self):
        run([*self.cli, "run", "--rm", *self.run_opts, "berth-bench:latest", "true"])

    def start(self):
        return run([*self.cli, "run", "--detach", *self.run_opts, "berth-bench:latest",
                    *IDLE]).decode().strip()

    def stop(self, h):
        run([*self.cli, "rm", "--force", h])


class BerthCli(CpCommand, Peer):
    """berth from its CLI, one process per step (against the harness's own berthd)."""
    name, label = "berth", "berth (CLI)"

    def __init__(self, ctx):
        super().__init__(ctx)
        self.cli = [ctx.berth_bin / "berth", "--socket", ctx.berth_socket]

    def version(self):
        return run([*self.cli, "version"]).decode().splitlines()[0]

    def daemon_pids(self):
        return self.ctx.berth_daemon_pids()

    def disk_paths(self):
        return [self.ctx.berth_state]

    def cold(self):
        run([*self.cli, "run", "--rm", "--rootfs", self.ctx.rootfs, "--", "true"])

    def start(self):
        return run([*self.cli, "create", "--rootfs", self.ctx.rootfs]).decode().strip()

    def exec(self, h, argv):
        return run([*self.cli, "exec", h, "--", *argv])

    def stop(self, h):
        run([*self.cli, "rm", "--force", h])


class BerthClient(Peer):
    """berth through its C++ client library (bench/client_bench): no process per step.
    Runs whole batches of a workload itself (see workloads.py)."""
    name, label = "berth-cxx", "berth (C++ client)"
    batch_only = True

    def version(self):
        return "same build"

    def batch(self, workload, n, *extra, parallel=1, warmup=1):
        argv = [self.ctx.berth_bin.parent.parent / "bench/client_bench",
                "--socket", self.ctx.berth_socket, "--rootfs", self.ctx.rootfs,
                "--workload", workload, "-n", n, "--warmup", warmup,
                "--parallel", parallel, "--copy-file", self.ctx.trial_file,
                "--out-dir", self.work, *extra]
        r = subprocess.run([str(a) for a in argv], capture_output=True, timeout=1800)
        try:
            out = json.loads(r.stdout.decode().strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise CommandFailed(f"client_bench -> exit {r.returncode}: "
                                f"{r.stderr.decode(errors='replace')[-800:]}")
        return out


ALL = [Host, Floor, Bwrap, Runc, Crun, Podman, Docker, BerthCli, BerthClient]


def missing_commands(cls):
    return [c for c in cls.needs if shutil.which(c) is None]


__all__ = ["ALL", "Overlay", "missing_commands", "du_bytes"]
