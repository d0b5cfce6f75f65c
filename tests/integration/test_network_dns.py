"""Issue 13: names. berth's DNS on the bridge's gateway serves the sandboxes: in `public` it
forwards to the host's resolvers (here berthd --dns names the test zone's server), in
`allowlist` it answers only the allowed names -- NXDOMAIN for the rest, never asked
upstream -- and opens the addresses it hands out for their TTL, so that an allowed name
whose address changes keeps working and an address never handed out stays closed.

The test zone is dnsmasq's, in the test host's network namespace (test_network_public),
with a TTL of 1 s; its HTTP servers answer on 198.18.7.2 and on a second address,
198.18.7.6, routed to the test host. No packet leaves this machine."""
import os
import subprocess
import time

import pytest

from conftest import Daemon
from test_network_public import SERVER, http_get, sh, test_host  # noqa: F401

MOVED = "198.18.7.6"


@pytest.fixture
def zone(test_host, tmp_path):
    """dnsmasq for *.zone.test on the test host (198.18.7.2:53), and an http.server on
    every address of the test host, port 8082 (198.18.7.6 added and routed)."""
    ns = test_host
    hosts = tmp_path / "zone.hosts"
    hosts.write_text(f"{SERVER} a.zone.test b.zone.test moving.zone.test x.wild.test\n")
    sh("ip", "-n", ns, "addr", "add", f"{MOVED}/32", "dev", "eth0")
    sh("ip", "route", "add", f"{MOVED}/32", "via", SERVER)
    log = tmp_path / "dnsmasq.log"
    dns = subprocess.Popen(
        ["ip", "netns", "exec", ns, "dnsmasq", "--no-daemon", "--user=root",
         f"--listen-address={SERVER}", "--bind-interfaces", "--port=53", "--no-resolv",
         "--no-hosts", f"--addn-hosts={hosts}", "--local=/zone.test/", "--local=/wild.test/",
         "--local-ttl=1", "--log-queries",
         f"--log-facility={log}", "--pid-file="],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    (tmp_path / "www").mkdir()
    (tmp_path / "www" / "hello").write_text("hello from the zone\n")
    web = subprocess.Popen(["ip", "netns", "exec", ns, "python3", "-m", "http.server", "--bind",
                            "0.0.0.0", "--directory", str(tmp_path / "www"), "8082"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while subprocess.run(["curl", "-s", "-m", "1", f"http://{MOVED}:8082/hello"],
                         capture_output=True).returncode != 0:
        assert time.monotonic() < deadline, "the zone's web server did not start"
        time.sleep(0.1)

    class Zone:
        def move(self, name, address):
            hosts.write_text(hosts.read_text().replace(f" {name}", "") +
                             f"{address} {name}\n")
            dns.send_signal(1)  # SIGHUP: dnsmasq reads its hosts files again

        def asked(self, name):
            return log.exists() and f"query[A] {name}" in log.read_text()

    yield Zone()
    for p in (dns, web):
        p.kill()
        p.wait()
    sh("ip", "route", "del", f"{MOVED}/32", check=False)


@pytest.fixture
def dns_daemon(base_dir):
    n = os.getpid() % 250
    bridge = f"bd{os.getpid() % 100000}"
    d = Daemon(base_dir, extra_args=["--bridge", bridge, "--subnet", f"10.232.{n}.0/24",
                                     "--dns", SERVER]).start()
    d.bridge = bridge
    d.gateway = f"10.232.{n}.1"
    yield d
    problems = d.cleanup()
    sh("ip", "link", "del", bridge, check=False)
    for family in ("inet", "bridge"):
        sh("nft", "delete", "table", family, bridge, check=False)
    assert not problems, "\n".join(problems)


def get(d, sid, host, port=8082):
    r = http_get(d, sid, host, port, "/hello", timeout=5)
    return "hello from" in r.stdout, r


def lookup(d, sid, name):
    start = time.monotonic()
    r = d.cli("exec", sid, "--", "nslookup", name, timeout=30)
    return r, time.monotonic() - start


def test_public_resolves_through_berths_dns(dns_daemon, busybox_rootfs, zone):
    d = dns_daemon
    sid = d.create(busybox_rootfs, "--network", "public")
    resolv = d.cli_ok("exec", sid, "--", "cat", "/etc/resolv.conf")
    assert f"nameserver {d.gateway}\n" in resolv, resolv
    ok, r = get(d, sid, "a.zone.test")
    assert ok, r
    assert get(d, sid, SERVER, 8080)[0]  # and by address
    r, _ = lookup(d, sid, "b.zone.test")
    assert r.returncode == 0 and SERVER in r.stdout, r
    # Switched to none: berth's DNS refuses it at once.
    d.cli_ok("network", "set", sid, "none")
    r, took = lookup(d, sid, "a.zone.test")
    assert r.returncode != 0 and took < 3, (r, took)


def test_allowlist_answers_only_its_names_and_opens_what_it_hands_out(dns_daemon, busybox_rootfs,
                                                                       zone):
    d = dns_daemon
    sid = d.create(busybox_rootfs, "--network", "allowlist", "--allow", "a.zone.test:8082",
                   "--allow", "*.wild.test")
    # Before any lookup, the allowed name's address is closed: only an answer opens it.
    start = time.monotonic()
    assert not get(d, sid, SERVER)[0] and time.monotonic() - start < 3
    ok, r = get(d, sid, "a.zone.test")
    assert ok, r
    allow4 = sh("nft", "list", "set", "inet", d.bridge, "allow4").stdout
    assert SERVER in allow4 and "8082" in allow4, allow4
    # The port is the entry's: server A's other port stays refused, at once.
    start = time.monotonic()
    assert not get(d, sid, SERVER, 8080)[0] and time.monotonic() - start < 3
    # A name not listed: NXDOMAIN, at once, and never asked upstream.
    r, took = lookup(d, sid, "b.zone.test")
    assert r.returncode != 0 and "NXDOMAIN" in r.stdout + r.stderr and took < 3, (r, took)
    assert not zone.asked("b.zone.test")
    # A wildcard matches names below it.
    r, _ = lookup(d, sid, "x.wild.test")
    assert r.returncode == 0 and SERVER in r.stdout, r
    r, _ = lookup(d, sid, "wild.test")
    assert r.returncode != 0, r


def test_an_allowed_name_whose_address_changes_keeps_working(dns_daemon, busybox_rootfs, zone):
    d = dns_daemon
    sid = d.create(busybox_rootfs, "--network", "allowlist", "--allow", "moving.zone.test:8082")
    assert get(d, sid, "moving.zone.test")[0]
    # Its next address is closed while no answer has named it ...
    assert not get(d, sid, MOVED)[0]
    zone.move("moving.zone.test", MOVED)
    time.sleep(2)  # the TTL (1 s) passes
    r, _ = lookup(d, sid, "moving.zone.test")
    assert MOVED in r.stdout, r
    # ... and open once it has.
    ok, r = get(d, sid, "moving.zone.test")
    assert ok, r
    assert get(d, sid, MOVED)[0]


def test_a_switch_to_allowlist_narrows_names_too(dns_daemon, busybox_rootfs, zone):
    d = dns_daemon
    sid = d.create(busybox_rootfs, "--network", "public")
    assert get(d, sid, "b.zone.test")[0]
    d.cli_ok("network", "set", sid, "allowlist", "--allow", "a.zone.test")
    r, _ = lookup(d, sid, "b.zone.test")
    assert r.returncode != 0, r
    assert get(d, sid, "a.zone.test")[0]
