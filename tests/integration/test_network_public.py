"""Issue 13: `--network public` gives a sandbox egress through NAT on berth's bridge; `none`
(the default) keeps loopback only. Needs root and the kernel's nftables.

The "internet" is a test host in a network namespace this test makes (a veth from the host,
addresses from 198.18.0.0/15, the range RFC 2544 sets aside for tests), running
python3's http.server: no packet leaves this machine.
"""
import json
import os
import subprocess
import time
from pathlib import Path

import pytest

import berth_proto
from conftest import Daemon

SERVER = "198.18.7.2"
HOST_SIDE = "198.18.7.1"


def sh(*args, check=True):
    return subprocess.run(args, capture_output=True, text=True, check=check, timeout=30)


@pytest.fixture
def test_host(tmp_path):
    """A netns `btsrv-PID` reached over veth btsrvh<->eth0, serving tmp_path on :8080."""
    ns = f"btsrv{os.getpid() % 100000}"
    host_if = f"bts{os.getpid() % 100000}"
    sh("ip", "netns", "add", ns)
    try:
        sh("ip", "link", "add", host_if, "type", "veth", "peer", "name", "eth0", "netns", ns)
        sh("ip", "addr", "add", f"{HOST_SIDE}/30", "dev", host_if)
        sh("ip", "link", "set", host_if, "up")
        sh("ip", "-n", ns, "addr", "add", f"{SERVER}/30", "dev", "eth0")
        sh("ip", "-n", ns, "link", "set", "eth0", "up")
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        (tmp_path / "hello").write_text("hello from the test host\n")
        server = subprocess.Popen(
            ["ip", "netns", "exec", ns, "python3", "-m", "http.server", "--bind", SERVER,
             "--directory", str(tmp_path), "8080"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            r = subprocess.run(["curl", "-s", "-m", "1", f"http://{SERVER}:8080/hello"],
                               capture_output=True, text=True)
            if r.returncode == 0:
                break
            time.sleep(0.1)
        yield ns
        server.kill()
        server.wait()
    finally:
        sh("ip", "link", "del", host_if, check=False)
        sh("ip", "netns", "del", ns, check=False)


def shell_links():
    """Host ends of the veths pooled shells were given ("bs" + 12 hex: root_network.cc)."""
    out = json.loads(sh("ip", "-j", "link", "show").stdout or "[]")
    return {l["ifname"] for l in out if l["ifname"].startswith("bs") and len(l["ifname"]) == 14}


@pytest.fixture
def net_daemon(base_dir):
    n = os.getpid() % 250
    bridge = f"bt{os.getpid() % 100000}"
    links_before = shell_links()
    d = Daemon(base_dir, extra_args=["--bridge", bridge, "--subnet", f"10.231.{n}.0/24"]).start()
    d.bridge = bridge
    yield d
    problems = d.cleanup()
    # The pooled shells' veths went with the shells (their netns) when the helper stopped.
    deadline = time.monotonic() + 10
    while shell_links() - links_before and time.monotonic() < deadline:
        time.sleep(0.1)
    if shell_links() - links_before:
        problems.append(f"pooled shells' links left: {sorted(shell_links() - links_before)}")
    sh("ip", "link", "del", bridge, check=False)
    sh("nft", "delete", "table", "inet", bridge, check=False)
    sh("nft", "delete", "table", "bridge", bridge, check=False)
    assert not problems, "\n".join(problems)


def http_get(d, sid, host, port, path, timeout=10):
    # (nc, not busybox-static's wget: that one crashes in a sandbox.)
    return d.cli("exec", sid, "--", "sh", "-c",
                 f"printf 'GET {path} HTTP/1.0\\r\\n\\r\\n' | nc -w 5 {host} {port}",
                 timeout=timeout + 20)


def fetch(d, sid, timeout=10):
    start = time.monotonic()
    r = http_get(d, sid, SERVER, 8080, "/hello", timeout)
    return r, time.monotonic() - start


def test_public_reaches_the_test_host_and_none_does_not(net_daemon, busybox_rootfs, test_host):
    d = net_daemon
    pub = d.create(busybox_rootfs, "--network", "public")
    info = d.inspect(pub)
    assert info["sandbox"]["network"] == "NETWORK_PUBLIC", info
    address = info["sandbox"]["address"]
    assert address.startswith("10.231."), info
    r, _ = fetch(d, pub)
    assert r.returncode == 0 and r.stdout.startswith("HTTP/1.0 200") and r.stdout.endswith("\n\nhello from the test host\n"), r
    # Its address is its own (eth0), its name resolves to it, and its default route is the
    # bridge's address.
    hosts = d.cli_ok("exec", pub, "--", "cat", "/etc/hosts")
    assert f"{address}\t{pub[:12]}\n" in hosts, hosts
    assert address in d.cli_ok("exec", pub, "--", "ip", "-4", "addr", "show", "eth0")

    none = d.create(busybox_rootfs)
    assert d.inspect(none)["sandbox"]["network"] == "NETWORK_NONE"
    r, took = fetch(d, none)
    assert r.returncode != 0 and took < 3, (r, took)

    # No CAP_NET_ADMIN: the sandbox may not change its addresses, routes or links (Docker's
    # default capabilities), so it cannot take another address to get around the rules.
    n = os.getpid() % 250
    for cmd in (["ip", "addr", "add", f"10.231.{n}.250/24", "dev", "eth0"],
                ["ip", "route", "replace", "default", "via", f"10.231.{n}.1"],
                ["ip", "link", "set", "eth0", "down"]):
        r = d.cli("exec", pub, "--", *cmd)
        assert r.returncode != 0 and "not permitted" in r.stderr, (cmd, r)
    assert "hello from" in fetch(d, pub)[0].stdout  # still through its own address

    # doctor names what public sandboxes get.
    doctor = d.cli("doctor").stdout
    assert f"bridge {d.bridge} " in doctor and f"10.231.{n}.0/24" in doctor, doctor

    host_link = "bh" + pub[:12]
    assert sh("ip", "link", "show", host_link, check=False).returncode == 0
    table = sh("nft", "list", "set", "inet", d.bridge, "public4").stdout
    assert address in table, table
    d.cli_ok("rm", pub, none)
    deadline = time.monotonic() + 10
    while sh("ip", "link", "show", host_link, check=False).returncode == 0:
        assert time.monotonic() < deadline, "the sandbox's veth outlived it"
        time.sleep(0.1)
    table = sh("nft", "list", "set", "inet", d.bridge, "public4").stdout
    assert address not in table, table


def test_public_sandboxes_do_not_reach_each_other_or_the_hosts_services(
        net_daemon, busybox_rootfs, test_host):
    d = net_daemon
    a = d.create(busybox_rootfs, "--network", "public")
    b = d.create(busybox_rootfs, "--network", "public")
    b_addr = d.inspect(b)["sandbox"]["address"]
    d.cli_ok("exec", b, "--", "sh", "-c", "nc -ll -p 9000 -e echo hi >/dev/null 2>&1 &")
    # (b serves: it answers itself.)
    deadline = time.monotonic() + 5
    while "hi" not in d.cli("exec", b, "--", "sh", "-c", f"nc -w 2 {b_addr} 9000").stdout:
        assert time.monotonic() < deadline, "b's server did not start"
        time.sleep(0.1)
    r = d.cli("exec", a, "--", "sh", "-c", f"echo | nc -w 2 {b_addr} 9000", timeout=30)
    assert "hi" not in r.stdout, r
    # The host's own services on the bridge's address and on its other addresses: refused.
    listener = subprocess.Popen(["python3", "-m", "http.server", "--bind", "0.0.0.0", "18089"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.5)
        for target in ("10.231.%d.1" % (os.getpid() % 250), HOST_SIDE):
            start = time.monotonic()
            r = http_get(d, a, target, 18089, "/")
            assert "HTTP/1.0 200" not in r.stdout, (target, r)
            assert time.monotonic() - start < 3, f"{target}: not refused at once"
    finally:
        listener.kill()
        listener.wait()
    d.cli_ok("rm", a, b)


def test_bad_network_input_is_refused(net_daemon, busybox_rootfs, base_dir):
    d = net_daemon
    r = d.cli("create", "--rootfs", busybox_rootfs, "--network", "everywhere")
    assert r.returncode != 0 and "--network" in r.stderr, r
    # A mode number no berth knows, sent as is: refused before anything is made.
    before = set(d.ids())
    with d.connect() as c:
        with pytest.raises(berth_proto.BerthError) as e:
            c.call("create", berth_proto.pb.CreateSandbox(rootfs=str(busybox_rootfs), network=77))
        assert e.value.code_name == "INVALID_ARGUMENT" and "network mode" in str(e.value), e.value
    assert set(d.ids()) == before
    # A subnet that overlaps a host route: berthd does not start, and says why.
    route = sh("ip", "-4", "route", "show", "scope", "link").stdout.split()
    if route:
        bad = Daemon(base_dir, extra_args=["--bridge", "btbad", "--subnet", route[0]])
        with pytest.raises(AssertionError) as info:
            bad.start(timeout=10)
        assert "overlaps" in str(info.value), str(info.value)[-800:]
    assert d.cli_ok("version")


def test_a_default_subnet_the_host_routes_leaves_only_loopback(base_dir, busybox_rootfs):
    """The defaults (bridge berth0, 10.89.0.0/16) clash with a host route (a VPN's, here a
    dummy link's): berthd still starts, sandboxes get `none`, and `public` says why."""
    dummy = f"btdum{os.getpid() % 10000}"  # (a veth: this kernel may lack the dummy driver)
    sh("ip", "link", "add", dummy, "type", "veth", "peer", "name", dummy + "p")
    try:
        sh("ip", "link", "set", dummy, "up")
        sh("ip", "route", "add", "10.89.0.0/16", "dev", dummy)
        d = Daemon(base_dir).start()
        try:
            assert "no public network" in d.log() and "overlaps" in d.log(), d.log()
            sid = d.create(busybox_rootfs)
            r = d.cli("create", "--rootfs", busybox_rootfs, "--network", "public")
            assert r.returncode != 0 and "offers no network" in r.stderr, r
            d.cli_ok("rm", sid)
        finally:
            problems = d.cleanup()
        assert not problems, problems
    finally:
        sh("ip", "link", "del", dummy, check=False)
