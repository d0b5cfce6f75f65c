"""Issue 13: the allowlist mode, switching a running sandbox's mode (`berth network set`),
and host ports (host.berth.internal). Needs root and the kernel's nftables.

The test host is the network namespace of test_network_public (198.18.7.2), serving HTTP on
8080 and a second server on 8081; the host's loopback servers are this test's own. No packet
leaves this machine.
"""
import json
import os
import socket
import subprocess
import threading
import time

import pytest

from test_network_public import SERVER, fetch, http_get, net_daemon, sh, test_host  # noqa: F401


@pytest.fixture
def second_server(test_host, tmp_path):
    """Server B: another http.server on the test host, port 8081."""
    d = tmp_path / "b"
    d.mkdir()
    (d / "hello").write_text("hello from server B\n")
    p = subprocess.Popen(["ip", "netns", "exec", test_host, "python3", "-m", "http.server",
                          "--bind", SERVER, "--directory", str(d), "8081"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while subprocess.run(["curl", "-s", "-m", "1", f"http://{SERVER}:8081/hello"],
                         capture_output=True).returncode != 0:
        assert time.monotonic() < deadline, "server B did not start"
        time.sleep(0.1)
    yield 8081
    p.kill()
    p.wait()


ECHO = ("import socketserver\n"
        "class H(socketserver.StreamRequestHandler):\n"
        "    def handle(self):\n"
        "        for line in self.rfile:\n"
        "            self.wfile.write(line)\n"
        "socketserver.ThreadingTCPServer.allow_reuse_address = True\n"
        "socketserver.ThreadingTCPServer(('%s', 9001), H).serve_forever()\n" % SERVER)


@pytest.fixture
def echo_server(test_host):
    """A line echo server on the test host, port 9001: a connection that stays open."""
    p = subprocess.Popen(["ip", "netns", "exec", test_host, "python3", "-c", ECHO],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection((SERVER, 9001), timeout=1).close()
            break
        except OSError:
            assert time.monotonic() < deadline, "the echo server did not start"
            time.sleep(0.1)
    yield 9001
    p.kill()
    p.wait()


def reaches(d, sid, port, host=SERVER):
    r = http_get(d, sid, host, port, "/hello", timeout=5)
    return r.returncode == 0 and "hello from" in r.stdout


def refused_at_once(d, sid, port, host=SERVER):
    start = time.monotonic()
    r = http_get(d, sid, host, port, "/hello", timeout=5)
    took = time.monotonic() - start
    return r.returncode != 0 and "hello from" not in r.stdout and took < 3


def test_allowlist_of_an_address_and_port_allows_that_port_only(
        net_daemon, busybox_rootfs, test_host, second_server):
    d = net_daemon
    sid = d.create(busybox_rootfs, "--network", "allowlist", "--allow", f"{SERVER}:8080")
    info = d.inspect(sid)["sandbox"]
    assert info["network"] == "NETWORK_ALLOWLIST" and info["allow"] == [f"{SERVER}:8080"], info
    assert reaches(d, sid, 8080)
    assert refused_at_once(d, sid, 8081)  # the same address, another port: server B
    # The whole test network on 8081 only: now B, and not A.
    d.cli_ok("network", "set", sid, "allowlist", "--allow", "198.18.0.0/15:8081")
    assert reaches(d, sid, 8081) and refused_at_once(d, sid, 8080)
    table = sh("nft", "list", "set", "inet", d.bridge, "allow4").stdout
    assert "198.18.0.0/15" in table and "8081" in table, table
    d.cli_ok("rm", sid)
    table = sh("nft", "list", "set", "inet", d.bridge, "allow4").stdout
    assert "198.18.0.0/15" not in table, table


def test_switching_cuts_restores_and_narrows(net_daemon, busybox_rootfs, test_host,
                                             second_server, echo_server):
    d = net_daemon
    sid = d.create(busybox_rootfs, "--network", "public")
    assert reaches(d, sid, 8080)
    # An established connection: nc to the echo server, sending a line each 0.2 s.
    d.cli_ok("exec", sid, "--", "sh", "-c",
             f"(while true; do echo x; sleep 0.2; done) | nc {SERVER} {echo_server} "
             ">/dev/null 2>&1 &")
    time.sleep(0.5)
    assert "nc" in d.cli_ok("exec", sid, "--", "ps"), "the long connection did not start"

    t0 = time.monotonic()
    d.cli_ok("network", "set", sid, "none")
    switch = time.monotonic() - t0
    assert d.inspect(sid)["sandbox"]["network"] == "NETWORK_NONE"
    assert refused_at_once(d, sid, 8080)
    # The established one is cut: its next segment gets a reset, and nc ends.
    deadline = time.monotonic() + 5
    while " nc " in d.cli_ok("exec", sid, "--", "ps") + " ":
        assert time.monotonic() < deadline, "the established connection outlived `none`"
        time.sleep(0.2)

    d.cli_ok("network", "set", sid, "public")
    assert reaches(d, sid, 8080) and reaches(d, sid, 8081)
    d.cli_ok("network", "set", sid, "allowlist", "--allow", f"{SERVER}:8081")
    assert reaches(d, sid, 8081) and refused_at_once(d, sid, 8080)
    assert switch < 5, switch  # (the CLI's whole round trip; bench/ has the figure)


def test_a_none_sandbox_gets_a_network_when_switched(net_daemon, busybox_rootfs, test_host):
    d = net_daemon
    sid = d.create(busybox_rootfs)
    info = d.inspect(sid)["sandbox"]
    assert info["address"] == "" and info["network"] == "NETWORK_NONE", info
    assert "eth0" not in d.cli_ok("exec", sid, "--", "ip", "link")
    d.cli_ok("network", "set", sid, "public")
    info = d.inspect(sid)["sandbox"]
    assert info["address"].startswith("10.231."), info
    assert reaches(d, sid, 8080)
    # A restarted daemon (and helper) puts its rules back.
    d.restart()
    assert d.inspect(sid)["sandbox"]["network"] == "NETWORK_PUBLIC"
    assert reaches(d, sid, 8080)
    d.cli_ok("network", "set", sid, "none")
    assert refused_at_once(d, sid, 8080)
    d.restart()
    assert refused_at_once(d, sid, 8080)


class LoopbackServer:
    """A TCP server on the host's 127.0.0.1 that answers each connection with a line."""

    def __init__(self, text):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.text = text
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.sendall(self.text.encode())

    def close(self):
        self.sock.close()


def test_host_ports_in_every_mode_and_nothing_else_of_the_host(
        net_daemon, busybox_rootfs, test_host):
    d = net_daemon
    given, other = LoopbackServer("gateway says hi\n"), LoopbackServer("secret\n")
    try:
        for mode in (["--network", "none"], ["--network", "public"],
                     ["--network", "allowlist", "--allow", f"{SERVER}:8080"]):
            sid = d.create(busybox_rootfs, *mode, "--host-port", str(given.port))
            hosts = d.cli_ok("exec", sid, "--", "cat", "/etc/hosts")
            assert "host.berth.internal" in hosts, (mode, hosts)
            r = d.cli("exec", sid, "--", "nc", "-w", "3", "host.berth.internal",
                      str(given.port), timeout=20)
            assert r.stdout == "gateway says hi\n", (mode, r)
            start = time.monotonic()
            r = d.cli("exec", sid, "--", "nc", "-w", "3", "host.berth.internal",
                      str(other.port), timeout=20)
            assert "secret" not in r.stdout and time.monotonic() - start < 3, (mode, r)
            # Nor by the host's own loopback address (that is the sandbox's loopback).
            r = d.cli("exec", sid, "--", "nc", "-w", "2", "127.0.0.1", str(given.port),
                      timeout=20)
            assert "gateway says" not in r.stdout, (mode, r)
            d.cli_ok("rm", sid)
    finally:
        given.close()
        other.close()


def test_bad_network_input_is_refused_and_the_daemon_stays_up(net_daemon, busybox_rootfs):
    d = net_daemon
    cases = [
        (["--network", "allowlist", "--allow", "10.0.0.1/24"], "host bits"),
        (["--network", "allowlist", "--allow", "10.0.0.0/33"], "prefix"),
        (["--network", "allowlist", "--allow", "a.com:99999"], "port"),
        (["--network", "allowlist", "--allow", "a.com;flush ruleset"], "hostname"),
        (["--network", "allowlist", "--allow", "2001:db8::1"], "IPv6"),
        (["--network", "public", "--allow", "a.com"], "allowlist mode"),
        (["--host-port", "0"], "host port 0"),
        (["--host-port", "70000"], "host port"),
    ]
    for args, said in cases:
        r = d.cli("create", "--rootfs", str(busybox_rootfs), *args)
        assert r.returncode != 0 and said in r.stderr, (args, r)
    # 10,000 entries (the protocol's way: the CLI would pass them all the same).
    many = []
    for i in range(10000):
        many += ["--allow", f"10.{i // 256}.{i % 256}.1"]
    r = d.cli("create", "--rootfs", str(busybox_rootfs), "--network", "allowlist", *many)
    assert r.returncode != 0 and "10000 entries" in r.stderr, r.stderr[-300:]
    sid = d.create(busybox_rootfs)
    r = d.cli("network", "set", sid, "allowlist", "--allow", "not a host")
    assert r.returncode != 0 and "hostname" in r.stderr, r
    r = d.cli("network", "set", sid, "sideways")
    assert r.returncode != 0 and "none, public or allowlist" in r.stderr, r
    assert d.inspect(sid)["sandbox"]["network"] == "NETWORK_NONE"
    # Nothing of the refused ones was made, and the daemon answers.
    assert d.cli_ok("exec", sid, "--", "echo", "up") == "up\n"
    assert len(d.cli_ok("ps", "-q").split()) == 1


def test_a_published_port_is_reachable_from_the_host_and_held(net_daemon, busybox_rootfs):
    d = net_daemon
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    host_port = probe.getsockname()[1]
    probe.close()
    sid = d.create(busybox_rootfs, "-p", f"{host_port}:8000")
    info = d.inspect(sid)["sandbox"]
    assert info["publish"] == [{"host_ip": "127.0.0.1", "host_port": host_port, "port": 8000}], info
    d.cli_ok("exec", sid, "--", "sh", "-c", "nc -ll -p 8000 -e echo served >/dev/null 2>&1 &")

    def read_from(port):
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            return s.recv(100).decode()

    deadline = time.monotonic() + 5
    while ":8000" not in d.cli_ok("exec", sid, "--", "netstat", "-ltn"):
        assert time.monotonic() < deadline, "the sandbox's server did not start"
        time.sleep(0.1)
    assert read_from(host_port) == "served\n"
    # The host port is held: no host program can take it while it is published ...
    taker = socket.socket()
    with pytest.raises(OSError):
        taker.bind(("127.0.0.1", host_port))
    taker.close()
    # ... nor can a second sandbox publish it, and one in use on the host is refused.
    r = d.cli("create", "--rootfs", str(busybox_rootfs), "-p", f"{host_port}:9000")
    assert r.returncode != 0 and "in use on the host" in r.stderr, r
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    r = d.cli("create", "--rootfs", str(busybox_rootfs), "-p", f"{busy.getsockname()[1]}:80")
    assert r.returncode != 0 and "in use on the host" in r.stderr, r
    busy.close()
    for spec, said in (("0.0.0.0:8001:80", "0.0.0.0"), ("8001:0", "not a port"),
                       ("1.2.3:8001:80", "not an IPv4"), ("x:y", "not a port")):
        r = d.cli("create", "--rootfs", str(busybox_rootfs), "-p", spec)
        assert r.returncode != 0 and said in r.stderr, (spec, r)
    # Another sandbox cannot reach it through the host (sandboxes never reach each other).
    other = d.create(busybox_rootfs, "--network", "public")
    gateway = d.inspect(other)["sandbox"]["address"].rsplit(".", 1)[0] + ".1"
    r = d.cli("exec", other, "--", "nc", "-w", "2", gateway, str(host_port), timeout=20)
    assert "served" not in r.stdout, r
    # Deleting it frees the port and its map entry.
    d.cli_ok("rm", sid)
    again = socket.socket()
    again.bind(("127.0.0.1", host_port))
    again.close()
    assert str(host_port) not in sh("nft", "list", "map", "inet", d.bridge, "published4").stdout


def test_set_network_over_the_protocol_refuses_what_it_does_not_know(net_daemon, busybox_rootfs):
    import berth_proto
    d = net_daemon
    sid = d.create(busybox_rootfs, "--network", "public")
    with d.connect() as c:
        for req, code, said in (
                (berth_proto.pb.SetNetwork(sandbox=sid, network=77), "INVALID_ARGUMENT",
                 "network mode"),
                (berth_proto.pb.SetNetwork(sandbox=sid, network=berth_proto.pb.NETWORK_PUBLIC,
                                           allow=["a.com"]), "INVALID_ARGUMENT", "allowlist mode"),
                (berth_proto.pb.SetNetwork(sandbox="f" * 32, network=1), "NOT_FOUND", ""),
                (berth_proto.pb.SetNetwork(sandbox=sid, network=berth_proto.pb.NETWORK_ALLOWLIST,
                                           allow=["x"] * 1025), "INVALID_ARGUMENT", "1025 entries")):
            with pytest.raises(berth_proto.BerthError) as e:
                c.call("set_network", req)
            assert e.value.code_name == code and said in str(e.value), e.value
        # The reply is the sandbox as it is now.
        reply = c.call("set_network", berth_proto.pb.SetNetwork(
            sandbox=sid, network=berth_proto.pb.NETWORK_ALLOWLIST, allow=["A.example.COM:443"]))
        assert list(reply.set_network.sandbox.allow) == ["a.example.com:443"]
    info = d.inspect(sid)["sandbox"]
    assert info["network"] == "NETWORK_ALLOWLIST" and info["allow"] == ["a.example.com:443"]


def test_only_root_publishes_a_port_below_1024(net_daemon):
    from members import ensure_user
    member = ensure_user("berth-it-m1", True)
    r = member.cli(net_daemon, "create", "-p", "80:80", "no-such-image")
    assert r.returncode != 0 and "below 1024: only root" in r.stderr, r
    # The port was the reason: the same request with a high port gets as far as the image.
    r = member.cli(net_daemon, "create", "-p", "8080:80", "no-such-image")
    assert r.returncode != 0 and "below 1024" not in r.stderr, r
