"""Issue 13: two sandboxes reach each other only if both are `public` and their owner put
them in one peer group (`--peer-group`); every other pair is isolated, another user's
sandbox naming the same group included. Needs root and the kernel's nftables."""
import json
import time

from test_network_public import net_daemon, sh  # noqa: F401


def serve(d, sid, port):
    addr = d.inspect(sid)["sandbox"]["address"]
    d.cli_ok("exec", sid, "--", "sh", "-c", f"nc -ll -p {port} -e echo hi >/dev/null 2>&1 &")
    deadline = time.monotonic() + 5
    while "hi" not in d.cli("exec", sid, "--", "sh", "-c", f"nc -w 2 {addr} {port}").stdout:
        assert time.monotonic() < deadline, "the server did not start"
        time.sleep(0.1)
    return addr


def reaches(d, sid, addr, port):
    r = d.cli("exec", sid, "--", "sh", "-c", f"echo | nc -w 2 {addr} {port}", timeout=30)
    return "hi" in r.stdout


def elements(bridge, family, name):
    out = json.loads(sh("nft", "-j", "list", "set", family, bridge, name).stdout)
    for item in out["nftables"]:
        if "set" in item:
            return item["set"].get("elem", [])
    return []


def test_peers_reach_each_other_and_no_one_else(net_daemon, busybox_rootfs):
    d = net_daemon
    pub = ("--network", "public")
    a = d.create(busybox_rootfs, *pub, "--peer-group", "g1")
    b = d.create(busybox_rootfs, *pub, "--peer-group", "g1")
    loner = d.create(busybox_rootfs, *pub)
    other_group = d.create(busybox_rootfs, *pub, "--peer-group", "g2")
    other_user = d.create(busybox_rootfs, *pub, "--peer-group", "g1", "--owner", "4242")
    assert d.inspect(a)["sandbox"]["peer_group"] == "g1"
    b_addr = serve(d, b, 9000)
    a_addr = serve(d, a, 9001)
    assert reaches(d, a, b_addr, 9000) and reaches(d, b, a_addr, 9001)
    for outsider in (loner, other_group, other_user):
        assert not reaches(d, outsider, b_addr, 9000), outsider
        assert not reaches(d, outsider, a_addr, 9001), outsider
    # Both must be public: a switched to none, or to an allowlist, is no one's peer.
    d.cli_ok("network", "set", a, "none")
    assert not reaches(d, a, b_addr, 9000) and not reaches(d, b, a_addr, 9001)
    d.cli_ok("network", "set", a, "allowlist", "--allow", "198.18.0.1")
    assert not reaches(d, a, b_addr, 9000) and not reaches(d, b, a_addr, 9001)
    d.cli_ok("network", "set", a, "public")
    assert reaches(d, a, b_addr, 9000)
    # A member made later pairs with those already there; a deleted one leaves no pair.
    c = d.create(busybox_rootfs, *pub, "--peer-group", "g1")
    assert reaches(d, c, b_addr, 9000) and reaches(d, c, a_addr, 9001)
    assert len(elements(d.bridge, "bridge", "peers")) == 6  # 3 pairs, both directions
    assert len(elements(d.bridge, "inet", "peers4")) == 6
    d.cli_ok("rm", b)
    assert len(elements(d.bridge, "bridge", "peers")) == 2
    d.cli_ok("rm", a, c, loner, other_group, other_user)
    assert elements(d.bridge, "bridge", "peers") == []
    assert elements(d.bridge, "inet", "peers4") == []


def test_a_restarted_helper_puts_the_pairs_back(net_daemon, busybox_rootfs):
    d = net_daemon
    a = d.create(busybox_rootfs, "--network", "public", "--peer-group", "p")
    b = d.create(busybox_rootfs, "--network", "public", "--peer-group", "p")
    b_addr = serve(d, b, 9000)
    assert reaches(d, a, b_addr, 9000)
    d.restart()
    assert d.inspect(a)["sandbox"]["peer_group"] == "p"
    assert reaches(d, a, b_addr, 9000)
    assert len(elements(d.bridge, "bridge", "peers")) == 2
    d.cli_ok("rm", a, b)


def test_bad_peer_group_is_refused(net_daemon, busybox_rootfs):
    d = net_daemon
    for bad in ("a/b", "x" * 65, "semi;colon", "sp ace"):
        r = d.cli("create", "--rootfs", str(busybox_rootfs), "--network", "public",
                  "--peer-group", bad)
        assert r.returncode != 0 and "peer_group" in r.stderr, (bad, r.stderr)
    assert d.ids() == []
