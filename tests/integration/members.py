"""Host users for tests that act as members of group berth (not root) or as outsiders."""
import grp
import pwd
import subprocess

import berth_proto
from conftest import BERTH


class Member:
    """A host user and how to act as it: raw connections and the CLI."""

    def __init__(self, name: str):
        pw = pwd.getpwnam(name)
        self.name, self.uid, self.gid = name, pw.pw_uid, pw.pw_gid
        self.groups = sorted({g.gr_gid for g in grp.getgrall() if name in g.gr_mem} |
                             {self.gid})

    def connect(self, daemon) -> berth_proto.Connection:
        return berth_proto.connect_as(daemon.socket, self.uid, self.gid, self.groups)

    def cli(self, daemon, *args, input=None, timeout=60):
        env = {"PATH": "/usr/bin:/bin", "BERTH_SOCKET": daemon.socket, "HOME": "/"}
        return subprocess.run([str(BERTH), *map(str, args)], input=input, capture_output=True,
                              text=True, timeout=timeout, env=env, user=self.uid,
                              group=self.gid, extra_groups=self.groups, cwd="/")


def ensure_user(name: str, in_berth: bool) -> Member:
    try:
        pwd.getpwnam(name)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--home-dir", "/nonexistent",
                        "--shell", "/usr/sbin/nologin", "--user-group", name],
                       check=True, timeout=30)
    if in_berth and name not in grp.getgrnam("berth").gr_mem:
        subprocess.run(["usermod", "-a", "-G", "berth", name], check=True, timeout=30)
    return Member(name)


