"""Fixtures for berth's integration tests: a busybox rootfs and real berthd daemons.

Every test needs root (berthd must start as root). Without root the tests are skipped with
reason "needs root" -- except in CI (env CI=true), where that is a failure.

Run: /usr/bin/python3 -m pytest -v tests/integration
Binaries come from BERTH_BUILD_DIR (default: <repo>/build). Everything the fixtures create
(rootfs, runtime and state dirs) goes under BERTH_TEST_TMPDIR (default /tmp): berth needs a
filesystem with idmapped mounts there, which tmpfs lacks on kernels before 6.3 -- in the
cgroup v2 VM (tests/vm/run-in-vm) pass BERTH_TEST_TMPDIR=$BERTH_VM_SCRATCH.
The cgroup driver (v1 or v2) is detected like berthd does it (hostutil.CGROUP_DRIVER); with
BERTH_TEST_CGROUP_DRIVER=v1|v2 set, every test fails if the host would use the other one.
"""
import itertools
import os
from typing import List
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

import berth_proto
import hostutil

REPO_ROOT = berth_proto.REPO_ROOT
BUILD_DIR = berth_proto.BUILD_DIR
BERTHD = BUILD_DIR / "src/runtime/berthd"
BERTH = BUILD_DIR / "src/runtime/berth"
HELPER = BUILD_DIR / "src/runtime/berth-helper"
IMAGES = BUILD_DIR / "src/runtime/berth-images"
# The sanitized run (scripts/test) takes berthd, berth-helper (berth-init is the helper's
# fork) and the CLI from build-asan, and berth-images from the regular build: its workers
# run in a root without /proc, where ASan cannot find their stacks and reports nonsense.
IMAGES = Path(os.environ.get("BERTH_TEST_IMAGES_BINARY") or IMAGES)
BUSYBOX = Path("/bin/busybox")
HERE = Path(__file__).resolve().parent

DEFAULT_LEASE = 2.0
_daemon_counter = itertools.count(1)


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def _need(condition: bool, reason: str):
    """Skips outside CI, fails in CI: a CI run must never silently skip."""
    if condition:
        return
    if in_ci():
        pytest.fail(f"{reason} (CI=true: failing instead of skipping)", pytrace=False)
    pytest.skip(reason)


def pytest_report_header(config):
    return (f"berth: cgroup driver {hostutil.CGROUP_DRIVER} "
            f"({hostutil.V2_ROOT if hostutil.CGROUP_V2 else 'v1 hierarchies'}), "
            f"temp dirs under {os.environ.get('BERTH_TEST_TMPDIR') or '/tmp'}")


@pytest.fixture(scope="session", autouse=True)
def require_root():
    _need(os.geteuid() == 0, "needs root")
    for binary in (BERTHD, BERTH, HELPER, IMAGES):
        if not binary.exists():
            pytest.fail(f"{binary} is missing: build first (ninja -C {BUILD_DIR})", pytrace=False)
    if not BUSYBOX.exists():
        pytest.fail("/bin/busybox is missing: install busybox-static", pytrace=False)
    # A run meant for one driver (the VM run of scripts/test sets v2) must not silently test
    # the other one.
    want = os.environ.get("BERTH_TEST_CGROUP_DRIVER", "")
    if want and want != hostutil.CGROUP_DRIVER:
        pytest.fail(f"BERTH_TEST_CGROUP_DRIVER={want}, but berthd will use the "
                    f"{hostutil.CGROUP_DRIVER} driver on this host", pytrace=False)


@pytest.fixture(scope="session")
def base_dir(require_root):
    """A world-traversable scratch dir: berthd runs as user berth and each sandbox's root is
    an unprivileged host uid, so every parent of the runtime dir must be searchable."""
    parent = Path(os.environ.get("BERTH_TEST_TMPDIR") or "/tmp")
    if not parent.is_dir():
        pytest.fail(f"BERTH_TEST_TMPDIR={parent} is not a directory", pytrace=False)
    if not parent.stat().st_mode & 0o001:
        pytest.fail(f"BERTH_TEST_TMPDIR={parent} is not searchable by others (berthd runs as "
                    f"user berth): chmod o+x it", pytrace=False)
    d = Path(tempfile.mkdtemp(prefix="berth-it-", dir=str(parent)))
    d.chmod(0o755)
    yield d
    # Every daemon's log, those of tests that made their own included: a sanitized build
    # must not have reported anything anywhere.
    reports = []
    for log in sorted(d.glob("d*/berthd.log")):
        text = log.read_text(errors="replace")
        reports += [f"{log.parent.name}: {line}" for line in sanitizer_lines(log.parent, text)]
    shutil.rmtree(d, ignore_errors=True)
    if reports:
        pytest.fail("sanitizer reports in berthd logs:\n" + "\n".join(reports[:30]),
                    pytrace=False)


# A daemon driven out of fds on purpose (Daemon(nofile=...)) leaves this file in its dir:
# UBSan's vptr check itself needs an fd (it probes memory through a pipe) and reports every
# virtual call as "invalid vptr" while there is none. Its other reports still count.
EMFILE_MARKER = "out-of-fds-on-purpose"


def sanitizer_lines(daemon_dir: Path, text: str) -> list:
    noisy = (daemon_dir / EMFILE_MARKER).exists()
    out = []
    for line in text.splitlines():
        if "ERROR: AddressSanitizer" in line or "ERROR: LeakSanitizer" in line:
            out.append(line)
        elif "runtime error:" in line:
            if noisy and "which does not point to an object of type" in line:
                continue
            out.append(line)
    return out


def _build_probe(dest: Path):
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    assert cc, "a C compiler is needed to build the seccomp probe (tests/integration/probe.c)"
    r = subprocess.run([cc, "-static", "-O1", "-o", str(dest), str(HERE / "probe.c")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"building probe.c failed:\n{r.stderr}"


@pytest.fixture(scope="session")
def busybox_rootfs(base_dir):
    """/bin/busybox plus a symlink per applet, users root, nobody and alice, empty system dirs.
    Everything is owned by host root: the sandbox sees it as its root via the id-mapped mount."""
    root = base_dir / "rootfs"
    for d in ("bin", "etc", "proc", "sys", "dev", "tmp", "root", "home/alice"):
        (root / d).mkdir(parents=True, exist_ok=True)
    (root / "tmp").chmod(0o1777)
    shutil.copy2(BUSYBOX, root / "bin/busybox")
    applets = subprocess.run([str(BUSYBOX), "--list"], capture_output=True, text=True,
                             check=True, timeout=10).stdout.split()
    assert len(applets) > 100, applets
    for applet in applets:
        if applet == "busybox" or "/" in applet:
            continue
        link = root / "bin" / applet
        if not link.exists():
            link.symlink_to("busybox")
    (root / "etc/passwd").write_text(
        "root:x:0:0:root:/root:/bin/sh\n"
        "nobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"
        "alice:x:1000:1000:alice:/home/alice:/bin/sh\n")
    (root / "etc/group").write_text(
        "root:x:0:\n"
        "staff:x:50:alice\n"
        "alice:x:1000:\n"
        "nogroup:x:65534:\n")
    _build_probe(root / "bin/berth-probe")
    # Searchable by everyone (the sandbox's root is uid 200000 on the host).
    for p in [root, *root.rglob("*")]:
        if p.is_dir() and not p.is_symlink():
            p.chmod(p.stat().st_mode | 0o755)
    return root


class Daemon:
    """A real berthd with its own runtime dir, state dir, socket and cgroup parent."""

    def __init__(self, base: Path, lease: float = DEFAULT_LEASE, max_frame=None, extra_args=(),
                 env=None, state_dir=None, nofile=None):
        """env: extra variables for berthd's environment (BERTH_* ones included, e.g.
        BERTH_TRANSFER_RESOLVER); state_dir: where the writable layers live (default: under
        the daemon's own dir), e.g. a small tmpfs; nofile: berthd's RLIMIT_NOFILE (soft and
        hard), to drive it out of fds."""
        n = next(_daemon_counter)
        self.dir = base / f"d{n}"
        self.dir.mkdir(mode=0o755)
        self.dir.chmod(0o755)
        self.runtime_dir = self.dir / "run"
        self.state_dir = Path(state_dir) if state_dir is not None else self.dir / "state"
        self.extra_env = dict(env or {})
        self.socket = str(self.runtime_dir / "berth.sock")
        self.cgroup_parent = f"berth-it-{os.getpid()}-{n}"
        hostutil.register_daemon(self.cgroup_parent, self.runtime_dir)
        self.lease = lease
        self.max_frame = max_frame
        self.extra_args = list(extra_args)
        self.nofile = nofile
        if nofile is not None:
            (self.dir / EMFILE_MARKER).touch()
        self.log_path = self.dir / "berthd.log"
        self.proc = None
        self.helper_pid = None
        self.images_pid = None
        self.starts = 0

    # ---- lifecycle ---------------------------------------------------------------------
    def start(self, timeout: float = 15.0):
        args = [str(BERTHD), "--runtime-dir", str(self.runtime_dir),
                "--state-dir", str(self.state_dir), "--socket", self.socket,
                "--cgroup-parent", self.cgroup_parent, "--lease", str(self.lease)]
        if self.max_frame is not None:
            args += ["--max-frame", str(self.max_frame)]
        if os.environ.get("BERTH_TEST_IMAGES_BINARY"):
            args += ["--images", str(IMAGES)]
        args += self.extra_args
        env = {k: v for k, v in os.environ.items() if not k.startswith("BERTH_")}
        env.update(self.extra_env)
        log = open(self.log_path, "ab")
        log.write(f"---- start #{self.starts + 1}: {' '.join(args)}\n".encode())
        log.flush()
        nofile = self.nofile

        def limit_fds():
            if nofile is not None:
                import resource
                resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

        self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env,
                                     stdin=subprocess.DEVNULL, preexec_fn=limit_fds)
        log.close()
        self.starts += 1
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"berthd exited with {self.proc.returncode} during start:\n"
                                     f"{self.log()}")
            try:
                with berth_proto.connect(self.socket, timeout=5):
                    break
            except (OSError, berth_proto.ProtocolError, TimeoutError):
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"berthd did not serve {self.socket} within {timeout} s:\n"
                                     f"{self.log()}")
            time.sleep(0.02)
        helpers = [p for p in hostutil.children(self.proc.pid)
                   if hostutil.comm(p) == "berth-helper"]
        assert len(helpers) == 1, f"expected one berth-helper child of berthd, got {helpers}"
        self.helper_pid = helpers[0]
        images = [p for p in hostutil.children(self.proc.pid)
                  if hostutil.comm(p) == "berth-images"]
        assert len(images) == 1, f"expected one berth-images child of berthd, got {images}"
        self.images_pid = images[0]
        return self

    @property
    def pool_size(self) -> int:
        """How many sandbox shells its helper keeps ready (berthd --pool, default 4)."""
        args = self.extra_args
        for i, a in enumerate(args):
            if a == "--pool" and i + 1 < len(args):
                return int(args[i + 1])
            if a.startswith("--pool="):
                return int(a.split("=", 1)[1])
        return 4

    def wait_pool_full(self, timeout: float = 15.0) -> List[int]:
        """Waits until the helper's shell pool is full (each shell in its cgroup); returns
        the shells' pids."""
        def full():
            shells = hostutil.pool_shell_pids(self.cgroup_parent, self.ids() if
                                              hostutil.CGROUP_V2 else ())
            return shells if len(shells) == self.pool_size else None
        if self.pool_size == 0:
            return []
        return hostutil.wait_for(full, timeout, what=f"{self.pool_size} pooled shells")

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-8000:]
        except FileNotFoundError:
            return ""

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _wait_helper_gone(self, timeout: float):
        for name, pid in (("berth-helper", self.helper_pid), ("berth-images", self.images_pid)):
            if pid is None:
                continue
            hostutil.wait_for(lambda: not hostutil.pid_alive(pid), timeout,
                              what=f"{name} {pid} to exit once berthd was gone")

    def kill(self):
        """SIGKILLs berthd; its helper and berth-images must exit by themselves (socket pair
        closed; berth-images also by PR_SET_PDEATHSIG)."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)
        self._wait_helper_gone(10)

    def restart(self):
        self.kill()
        return self.start()

    def stop(self):
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
                raise AssertionError("berthd ignored SIGTERM for 10 s")
        self._wait_helper_gone(10)

    # ---- clients -----------------------------------------------------------------------
    def cli(self, *args, input=None, timeout: float = 60, env=None):
        e = dict(os.environ)
        e.pop("BERTH_SOCKET", None)
        e["BERTH_SOCKET"] = self.socket
        if env:
            e.update(env)
        return subprocess.run([str(BERTH), *map(str, args)], input=input, capture_output=True,
                              text=True, timeout=timeout, env=e)

    def cli_ok(self, *args, **kw) -> str:
        r = self.cli(*args, **kw)
        assert r.returncode == 0, (f"berth {' '.join(map(str, args))} -> {r.returncode}\n"
                                   f"stdout: {r.stdout}\nstderr: {r.stderr}")
        return r.stdout

    def connect(self, hello: bool = True, timeout: float = 30) -> berth_proto.Connection:
        return berth_proto.connect(self.socket, hello=hello, timeout=timeout)

    def create(self, rootfs, *opts) -> str:
        return self.cli_ok("create", "--rootfs", rootfs, *opts).strip()

    def ids(self):
        return self.cli_ok("ps", "-q").split()

    def inspect(self, sandbox: str) -> dict:
        import json
        return json.loads(self.cli_ok("inspect", sandbox))

    def upper_dir(self, sandbox_id: str) -> Path:
        """The sandbox's writable overlay layer on the host (what uploads create lands here)."""
        return self.state_dir / "sandboxes" / sandbox_id / "upper"

    # ---- cleanup -----------------------------------------------------------------------
    def sanitizer_reports(self) -> list:
        """Lines of AddressSanitizer and UBSan reports in berthd's log (its children's stderr
        goes there too): a sanitized build (BERTH_BUILD_DIR=build-asan) must have none."""
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return []
        return sanitizer_lines(self.dir, text)

    def cleanup(self) -> list:
        """Deletes every sandbox, stops berthd, removes the cgroup parent. Returns problems."""
        problems = []
        if not self.alive():
            problems.append(f"berthd was not running at teardown (exit {self.proc.returncode})")
            try:
                self._wait_helper_gone(10)
                self.start()
            except AssertionError as e:
                problems.append(f"could not restart berthd for cleanup: {e}")
        if self.alive():
            try:
                ids = self.ids()
                if ids:
                    r = self.cli("rm", "-f", *ids, timeout=120)
                    if r.returncode != 0:
                        problems.append(f"berth rm -f failed: {r.stderr}")
                left = self.ids()
                if left:
                    problems.append(f"sandboxes left after rm -f: {left}")
            except Exception as e:  # noqa: BLE001 - report, then clean up the host anyway
                problems.append(f"deleting sandboxes: {e}")
            try:
                self.stop()
            except AssertionError as e:
                problems.append(str(e))
        leftovers = hostutil.sandbox_cgroup_dirs(self.cgroup_parent, include_shells=True)
        if leftovers:
            problems.append(f"cgroup dirs left behind: {[str(p) for p in leftovers]}")
        for p in leftovers:
            _force_remove_cgroup(p)
        for d in hostutil.parent_dirs(self.cgroup_parent):
            if d.is_dir():
                try:
                    d.rmdir()
                except OSError as e:
                    problems.append(f"rmdir {d}: {e}")
        reports = self.sanitizer_reports()
        if reports:
            problems.append("sanitizer reports in berthd's log:\n" + "\n".join(reports[:20]))
        return problems


def _force_remove_cgroup(path: Path):
    for _ in range(100):
        try:
            pids = [int(x) for x in (path / "cgroup.procs").read_text().split()]
        except FileNotFoundError:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.05)


@pytest.hookimpl(tryfirst=True, hookwrapper=True)
def pytest_runtest_makereport(item, call):
    # Lets fixtures see whether their test failed (item.rep_call).
    outcome = yield
    rep = outcome.get_result()
    setattr(item, "rep_" + rep.when, rep)


def _daemon_fixture(base_dir, node=None, **kw):
    d = Daemon(base_dir, **kw)
    d.start()
    yield d
    problems = d.cleanup()
    rep = getattr(node, "rep_call", None) if node is not None else None
    if problems and rep is not None and rep.failed:
        # The test failed already; what it left behind is a consequence, not a second error.
        print("daemon teardown after a failed test:\n" + "\n".join(problems))
        return
    assert not problems, "daemon teardown found problems:\n" + "\n".join(problems) + \
        f"\n--- berthd log ---\n{d.log()}"


@pytest.fixture(scope="module")
def daemon(base_dir):
    """A berthd shared by the tests of one module (lease 2 s)."""
    yield from _daemon_fixture(base_dir)


@pytest.fixture
def fresh_daemon(base_dir, request):
    """A berthd of the test's own, for tests that restart it or count what it leaves behind."""
    yield from _daemon_fixture(base_dir, node=request.node)


@pytest.fixture
def make_sandbox(daemon, busybox_rootfs):
    """Creates persistent sandboxes through the CLI; deletes them after the test."""
    made = []

    def make(*opts):
        sid = daemon.create(busybox_rootfs, *opts)
        assert len(sid) == 32, sid
        made.append(sid)
        return sid

    yield make
    if daemon.alive() and made:
        daemon.cli("rm", "-f", *made, timeout=60)


@pytest.fixture
def sandbox(make_sandbox):
    return make_sandbox()


@pytest.fixture
def conn(daemon):
    c = daemon.connect()
    yield c
    c.close()
