"""Issue 13: every sandbox gets /etc/hosts, /etc/hostname and /etc/resolv.conf of berth's,
bind-mounted over the image's own (as Docker does): `localhost` and the sandbox's own name
resolve, and in a sandbox without a network a DNS lookup fails at once instead of retrying
for seconds. The image's files stay untouched, and a hostile image cannot use the three
paths to reach the host or to hang a create.
"""
import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest


def rootfs_copy(busybox_rootfs: Path, dest: Path) -> Path:
    shutil.copytree(busybox_rootfs, dest, symlinks=True)
    dest.chmod(0o755)
    return dest


@pytest.fixture
def fresh_rootfs(busybox_rootfs, base_dir):
    """Copies of the busybox rootfs to alter, beside it in the test dir (which the
    daemon can reach and which supports id-mapped mounts, unlike a VM's /tmp)."""
    parent = Path(tempfile.mkdtemp(prefix="netfiles-", dir=base_dir))
    parent.chmod(0o755)
    yield lambda name: rootfs_copy(busybox_rootfs, parent / name)
    shutil.rmtree(parent, ignore_errors=True)


def run(daemon, sid, script, timeout=30):
    return daemon.cli("exec", sid, "--", "sh", "-c", script, timeout=timeout)


def test_names_resolve_and_the_three_files_say_so(daemon, busybox_rootfs):
    sid = daemon.create(busybox_rootfs, "--hostname", "trialbox")
    hosts = daemon.cli_ok("exec", sid, "--", "cat", "/etc/hosts")
    assert "127.0.0.1\tlocalhost\n" in hosts and "::1\tlocalhost" in hosts, hosts
    assert "127.0.1.1\ttrialbox\n" in hosts, hosts
    assert daemon.cli_ok("exec", sid, "--", "cat", "/etc/hostname") == "trialbox\n"
    resolv = daemon.cli_ok("exec", sid, "--", "cat", "/etc/resolv.conf")
    # berth's DNS on the gateway of its bridge (the file stays right if the sandbox is later
    # switched to a network); with no route there a lookup fails at once.
    servers = [l.split()[1] for l in resolv.splitlines() if l.startswith("nameserver")]
    assert servers in ([], ["10.89.0.1"]), resolv
    # Through the C library's resolver (busybox is linked with glibc): both names reach
    # loopback.
    for name in ("localhost", "trialbox"):
        r = run(daemon, sid, f"ping -c 1 -W 2 {name}")
        assert r.returncode == 0, (name, r.stdout, r.stderr)
        assert "127.0" in r.stdout, r.stdout
    daemon.cli_ok("rm", sid)


def test_a_lookup_without_a_network_fails_at_once(daemon, busybox_rootfs):
    sid = daemon.create(busybox_rootfs)
    start = time.monotonic()
    # (ping resolves through getaddrinfo; busybox-static's wget crashes on a failed lookup.)
    r = run(daemon, sid, "ping -c 1 -W 20 files.example.org")
    took = time.monotonic() - start
    assert r.returncode != 0
    assert "bad address" in r.stderr, r.stderr
    # The gateway named and no route to it (or no server named: glibc asks 127.0.0.1): the
    # lookup is refused at once (a server that is routed but silent would cost ~5 s a try).
    assert took < 2, f"a lookup without a network took {took:.1f} s"
    daemon.cli_ok("rm", sid)


def test_the_images_files_are_untouched_and_the_sandbox_may_edit_its_own(daemon,
                                                                          fresh_rootfs):
    root = fresh_rootfs("own-etc")
    (root / "etc/hosts").write_text("192.0.2.1\timage-host\n")
    (root / "etc/resolv.conf").write_text("nameserver 192.0.2.53\n")
    sid = daemon.create(root)
    hosts = daemon.cli_ok("exec", sid, "--", "cat", "/etc/hosts")
    assert "image-host" not in hosts and "localhost" in hosts, hosts
    assert "192.0.2.53" not in daemon.cli_ok("exec", sid, "--", "cat", "/etc/resolv.conf")
    # Root inside edits its copy (as in Docker), which lives with the sandbox only.
    r = run(daemon, sid, "echo '192.0.2.9 added' >> /etc/hosts && grep added /etc/hosts")
    assert r.returncode == 0 and "added" in r.stdout, r.stderr
    assert (root / "etc/hosts").read_text() == "192.0.2.1\timage-host\n"
    assert (root / "etc/resolv.conf").read_text() == "nameserver 192.0.2.53\n"
    upper = daemon.upper_dir(sid)
    assert not (upper / "etc/hosts").exists() or (upper / "etc/hosts").stat().st_size == 0
    daemon.cli_ok("rm", sid)


def test_an_image_without_etc_gets_the_files_in_its_writable_layer(daemon, fresh_rootfs):
    root = fresh_rootfs("no-etc")
    shutil.rmtree(root / "etc")
    sid = daemon.create(root)
    assert daemon.cli_ok("exec", sid, "--", "cat", "/etc/hostname") == sid[:12] + "\n"
    assert not (root / "etc").exists()
    daemon.cli_ok("rm", sid)


def test_hostile_images_paths_stay_inside_and_cannot_hang_a_create(daemon, fresh_rootfs,
                                                                   tmp_path):
    # A symlink that would lead out of the rootfs on the host resolves inside the sandbox.
    outside = tmp_path / "berth-escape-target"
    root = fresh_rootfs("symlinked")
    (root / "etc/resolv.conf").symlink_to(f"../../../../../../..{outside}")
    (root / "etc/hosts").symlink_to("/etc/passwd")
    sid = daemon.create(root)
    assert not outside.exists(), "a provided file landed outside the rootfs"
    assert "root:x:0:0" in (root / "etc/passwd").read_text()
    # The links are replaced in the sandbox's writable layer (the image keeps them): berth's
    # files are the paths themselves, and what the links named is untouched.
    assert "localhost" in daemon.cli_ok("exec", sid, "--", "cat", "/etc/hosts")
    assert "root:x:0:0" in daemon.cli_ok("exec", sid, "--", "cat", "/etc/passwd")
    assert "# berth:" in daemon.cli_ok("exec", sid, "--", "cat", "/etc/resolv.conf")
    assert (root / "etc/hosts").is_symlink() and (root / "etc/resolv.conf").is_symlink()
    daemon.cli_ok("rm", sid)

    # A symlinked /etc: the files go where it leads inside the sandbox, never the host's.
    root = fresh_rootfs("symlinked-etc")
    shutil.move(root / "etc", root / "real-etc")
    (root / "etc").symlink_to("/real-etc")
    sid = daemon.create(root)
    assert daemon.cli_ok("exec", sid, "--", "cat", "/real-etc/hostname") == sid[:12] + "\n"
    daemon.cli_ok("rm", sid)

    # A directory or a FIFO where a file goes: a clear error, at once, and no sandbox.
    for kind in ("dir", "fifo"):
        root = fresh_rootfs(f"bad-{kind}")
        if kind == "dir":
            (root / "etc/hostname").mkdir()
        else:
            os.mkfifo(root / "etc/hostname")
        before = set(daemon.ids())
        start = time.monotonic()
        r = daemon.cli("create", "--rootfs", root, timeout=60)
        assert r.returncode != 0, r
        assert "/etc/hostname" in r.stderr and "not a regular file" in r.stderr, r.stderr
        assert time.monotonic() - start < 10
        assert set(daemon.ids()) == before
    assert daemon.cli_ok("version")
