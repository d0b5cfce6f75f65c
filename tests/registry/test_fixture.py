"""Self-tests of tests/registry/fixture.py: the registry serves what is pushed, basic and
token auth accept good credentials and refuse bad ones, the Debian image's layers really
hold whiteouts and an opaque marker, the listing script reads busybox and coreutils alike,
the index picks the host's platform, the proxy cuts, resumes and keeps connections alive,
and the CLI comes up and goes down.

Needs root (umoci unpacks with real ownership; busybox --install runs in a chroot): skipped
without it, failed in CI (CI=true). The layouts are cached (fixture.default_cache_dir(), or
BERTH_TEST_CACHE): the first run builds them (~1 min, the Debian image), later runs reuse.

Run: /usr/bin/python3 -m pytest -q tests/registry
"""
import base64
import hashlib
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import fixture as fx  # noqa: E402


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


@pytest.fixture(scope="session", autouse=True)
def require_root_and_tools():
    missing = [t for t in ("docker-registry", "skopeo", "umoci", "htpasswd", "openssl")
               if shutil.which(t) is None]
    reason = None
    if os.geteuid() != 0:
        reason = "needs root (umoci unpack with real owners, chroot)"
    elif missing:
        reason = f"missing tools: {missing} (scripts/install-deps installs them)"
    if reason:
        if in_ci():
            pytest.fail(f"{reason} (CI=true: failing instead of skipping)", pytrace=False)
        pytest.skip(reason)


@pytest.fixture(scope="session")
def busybox():
    return fx.busybox_layout()


@pytest.fixture(scope="session")
def debian():
    return fx.debian_layered_layout()


@pytest.fixture(scope="session")
def index(busybox):
    return fx.index_layout()


@pytest.fixture(scope="module")
def open_registry(tmp_path_factory, busybox):
    with fx.Registry(tmp_path_factory.mktemp("open-registry")) as reg:
        reg.pushed = {"busybox": fx.push_oci_layout(busybox.layout, "latest", reg,
                                                    "t/busybox", "latest")}
        yield reg
    # pytest keeps the last three runs' temp dirs: not with 200 MB of Debian blobs in them.
    shutil.rmtree(reg.root, ignore_errors=True)


def skopeo(*args, check=True):
    r = subprocess.run(["skopeo", "--insecure-policy", *args], capture_output=True,
                       text=True, timeout=300)
    if check and r.returncode != 0:
        raise AssertionError(f"skopeo {' '.join(args)} failed:\n{r.stderr}")
    return r


def inspect_raw(reg, ref, *creds):
    return skopeo("inspect", "--tls-verify=false", "--raw", *(creds or reg.skopeo_creds()),
                  f"docker://{ref}").stdout


def sha(text) -> str:
    return "sha256:" + hashlib.sha256(text.encode() if isinstance(text, str) else text) \
        .hexdigest()


def http(method, url, headers=None, data=None):
    """(status, headers, body) without raising on 4xx."""
    req = urllib.request.Request(url, method=method, headers=headers or {}, data=data)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


def basic(user, password):
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode())
            .decode()}


# ----------------------------------------------------------------------------- registry

def test_registry_serves_pushed_images(open_registry, busybox, debian):
    reg = open_registry
    # The OCI push keeps the layout's manifest byte for byte.
    assert reg.pushed["busybox"] == busybox.digest
    raw = inspect_raw(reg, reg.ref("t/busybox", "latest"))
    assert sha(raw) == busybox.digest
    assert json.loads(raw)["layers"][0]["mediaType"].endswith("tar+gzip")
    # By digest too.
    assert sha(inspect_raw(reg, reg.ref("t/busybox", busybox.digest))) == busybox.digest

    d = fx.push_oci_layout(busybox.layout, "latest", reg, "t/busybox", "v2s2", format="v2s2")
    m = json.loads(inspect_raw(reg, reg.ref("t/busybox", "v2s2")))
    assert m["mediaType"] == "application/vnd.docker.distribution.manifest.v2+json"
    assert m["layers"][0]["mediaType"] == "application/vnd.docker.image.rootfs.diff.tar.gzip"
    assert d != busybox.digest

    d = fx.push_oci_layout(busybox.layout, "zstd", reg, "t/busybox", "zstd")
    assert d == busybox.tags["zstd"]["digest"]
    m = json.loads(inspect_raw(reg, reg.ref("t/busybox", "zstd")))
    assert m["layers"][0]["mediaType"] == "application/vnd.oci.image.layer.v1.tar+zstd"

    d = fx.push_oci_layout(debian.layout, "latest", reg, "t/debian", "layered")
    assert d == debian.digest
    m = json.loads(inspect_raw(reg, reg.ref("t/debian", "layered")))
    assert len(m["layers"]) == 4


def test_blob_path_and_blob_gets(open_registry, busybox):
    reg = open_registry
    layer = fx.layout_manifest(busybox.layout, "latest")["layers"][0]
    path = reg.blob_path(layer["digest"])
    assert path.is_file() and path.stat().st_size == layer["size"]
    assert "sha256:" + fx._sha256_file(path) == layer["digest"]
    before = reg.blob_gets(layer["digest"])
    url = f"{reg.url}/v2/t/busybox/blobs/{layer['digest']}"
    for _ in range(2):
        status, _, body = http("GET", url)
        assert status == 200 and sha(body) == layer["digest"]
    assert http("HEAD", url)[0] == 200  # not a GET: not counted
    assert reg.blob_gets(layer["digest"]) == before + 2
    assert reg.blob_gets(layer["digest"], repo="t/busybox") == before + 2
    assert reg.blob_gets(layer["digest"], repo="t/other") == 0
    assert any(r["method"] == "HEAD" and r["uri"].endswith(layer["digest"])
               for r in reg.requests())


def test_corrupt_blob_is_served_corrupt(tmp_path, busybox):
    with fx.Registry(tmp_path / "reg") as reg:
        fx.push_oci_layout(busybox.layout, "latest", reg, "t/busybox", "latest")
        layer = fx.layout_manifest(busybox.layout, "latest")["layers"][0]
        reg.corrupt_blob(layer["digest"])
        status, headers, body = http("GET", f"{reg.url}/v2/t/busybox/blobs/{layer['digest']}")
        assert status == 200 and len(body) == layer["size"]
        assert headers["Docker-Content-Digest"] == layer["digest"]
        assert sha(body) != layer["digest"]


def test_basic_auth(tmp_path, busybox):
    with fx.Registry(tmp_path / "reg", auth="basic") as reg:
        user, password = reg.credentials
        assert fx.push_oci_layout(busybox.layout, "latest", reg, "t/busybox", "latest") \
            == busybox.digest
        ref = reg.ref("t/busybox", "latest")
        assert sha(inspect_raw(reg, ref)) == busybox.digest
        # No credentials, wrong ones: refused.
        r = skopeo("inspect", "--tls-verify=false", "--raw", "--no-creds", f"docker://{ref}",
                   check=False)
        assert r.returncode != 0 and "unauthorized" in r.stderr.lower(), r.stderr
        r = skopeo("inspect", "--tls-verify=false", "--raw", "--creds", f"{user}:nope",
                   f"docker://{ref}", check=False)
        assert r.returncode != 0 and "unauthorized" in r.stderr.lower(), r.stderr
        with pytest.raises(RuntimeError):
            fx.push_oci_layout(busybox.layout, "latest", reg, "t/busybox", "x", creds=False)
        # The docker config.json is what skopeo (and berth) read.
        cfg = reg.write_docker_config(tmp_path / "docker/config.json")
        assert json.loads(cfg.read_text())["auths"][reg.host]["auth"] == \
            base64.b64encode(f"{user}:{password}".encode()).decode()
        assert sha(skopeo("inspect", "--tls-verify=false", "--raw", "--authfile", str(cfg),
                          f"docker://{ref}").stdout) == busybox.digest
        # By hand.
        status, headers, _ = http("GET", reg.url + "/v2/")
        assert status == 401 and headers["WWW-Authenticate"].startswith("Basic realm=")
        assert http("GET", reg.url + "/v2/", basic(user, password))[0] == 200
        assert http("GET", reg.url + "/v2/", basic(user, "wrong"))[0] == 401
        assert http("GET", reg.url + "/v2/", basic("mallory", password))[0] == 401


def test_token_auth(tmp_path, busybox):
    with fx.Registry(tmp_path / "reg", auth="token") as reg:
        ts = reg.token_server
        user, password = reg.credentials
        assert fx.push_oci_layout(busybox.layout, "latest", reg, "t/busybox", "latest") \
            == busybox.digest
        assert any(r["user"] == user and r["status"] == 200 and
                   any("push" in a["actions"] for a in r["granted"]) for r in ts.requests)
        # The challenge.
        status, headers, _ = http("GET", reg.url + "/v2/t/busybox/manifests/latest")
        assert status == 401
        challenge = headers["WWW-Authenticate"]
        assert challenge.startswith(f'Bearer realm="{ts.realm}"')
        assert f'service="{fx.TOKEN_SERVICE}"' in challenge
        assert 'scope="repository:t/busybox:pull"' in challenge
        # The token server: bad and missing credentials refused, good ones get a token.
        q = f"{ts.realm}?service={fx.TOKEN_SERVICE}&scope=repository:t/busybox:pull"
        assert http("GET", q, basic(user, "wrong"))[0] == 401
        assert http("GET", q, basic("mallory", password))[0] == 401
        assert http("GET", q)[0] == 401
        status, _, body = http("GET", q, basic(user, password))
        assert status == 200
        token = json.loads(body)
        assert token["token"] == token["access_token"] and token["expires_in"] > 0
        header, claims = (json.loads(base64.urlsafe_b64decode(p + "=" * (-len(p) % 4)))
                          for p in token["token"].split(".")[:2])
        assert header["alg"] == "RS256" and header["x5c"]
        assert claims["access"] == [{"type": "repository", "name": "t/busybox",
                                     "actions": ["pull"]}]
        assert claims["aud"] == fx.TOKEN_SERVICE and claims["iss"] == fx.TOKEN_ISSUER
        # The registry takes it, for what it grants and nothing more.
        bearer = {"Authorization": "Bearer " + token["token"], "Accept": fx.OCI_MANIFEST}
        status, headers, body = http("GET", reg.url + "/v2/t/busybox/manifests/latest", bearer)
        assert status == 200 and sha(body) == busybox.digest
        assert headers["Docker-Content-Digest"] == busybox.digest
        assert http("POST", reg.url + "/v2/t/busybox/blobs/uploads/", bearer, b"")[0] == 401
        assert http("GET", reg.url + "/v2/t/other/manifests/latest", bearer)[0] == 401
        # Forged, expired and foreign tokens are refused.
        tampered = token["token"][:-4] + ("AAAA" if token["token"][-4:] != "AAAA" else "BBBB")
        assert http("GET", reg.url + "/v2/t/busybox/manifests/latest",
                    {"Authorization": "Bearer " + tampered})[0] == 401
        expired = ts.issue(user, claims["access"], ttl=-3600)
        assert http("GET", reg.url + "/v2/t/busybox/manifests/latest",
                    {"Authorization": "Bearer " + expired})[0] == 401
        # skopeo through the whole dance.
        ref = reg.ref("t/busybox", "latest")
        assert sha(inspect_raw(reg, ref)) == busybox.digest
        r = skopeo("inspect", "--tls-verify=false", "--raw", "--no-creds", f"docker://{ref}",
                   check=False)
        assert r.returncode != 0 and "credentials required" in r.stderr, r.stderr
        r = skopeo("inspect", "--tls-verify=false", "--raw", "--creds", f"{user}:wrong",
                   f"docker://{ref}", check=False)
        assert r.returncode != 0 and "bad username or password" in r.stderr, r.stderr


def test_token_auth_anonymous_pull(tmp_path, busybox):
    with fx.Registry(tmp_path / "reg", auth="token", anonymous_pull=True) as reg:
        fx.push_oci_layout(busybox.layout, "latest", reg, "t/busybox", "latest")
        ref = reg.ref("t/busybox", "latest")
        assert sha(inspect_raw(reg, ref, "--no-creds")) == busybox.digest
        anon = [r for r in reg.token_server.requests if r["user"] is None]
        assert anon and all(a["actions"] in (["pull"], []) for r in anon for a in r["granted"])
        with pytest.raises(RuntimeError):
            fx.push_oci_layout(busybox.layout, "latest", reg, "t/busybox", "x", creds=False)
        # Bad credentials are still refused, not downgraded to anonymous.
        r = skopeo("inspect", "--tls-verify=false", "--raw", "--creds", "berth:wrong",
                   f"docker://{ref}", check=False)
        assert r.returncode != 0


# ----------------------------------------------------------------------------- images

def tar_list(blob) -> subprocess.CompletedProcess:
    return subprocess.run(["tar", "-tzf", str(blob)], capture_output=True, text=True)


def test_debian_layers_hold_real_whiteouts(debian):
    layers = fx.layout_layers(debian.layout, "latest")
    assert len(layers) == 4
    names = [set(n for n, _ in l["entries"]) for l in layers]
    assert all(l["terminated"] for l in layers)
    assert all(l["media_type"].endswith("tar+gzip") for l in layers)
    assert "etc/debian_version" in names[0] and not any(".wh." in n for n in names[0])
    assert {"etc/.wh.motd", "etc/.wh.issue.net", "etc/.wh.rmt", "usr/share/doc/.wh.bash",
            "usr/share/doc/.wh.dpkg", "usr/share/doc/.wh.gzip"} <= names[1]
    assert {"opt/berth/.wh.hl-b", "opt/berth/.wh.empty", "usr/share/doc/.wh.tar",
            "etc/.wh.host.conf"} <= names[2]
    assert "etc/berth-test/.wh..wh..opq" in names[3]
    assert {"etc/berth-test/c", "etc/berth-test/d/"} <= names[3]  # (dirs end in /)
    assert not any(n.startswith("etc/berth-test/.wh.a") for n in names[3])
    # Layer 2 holds a hardlink entry, and a PAX long name.
    assert ("opt/berth/keep-2", "1") in layers[1]["entries"] or \
           ("opt/berth/keep-1", "1") in layers[1]["entries"]
    assert any(len(n) > 255 for n in names[1])
    # The same, seen by GNU tar.
    listing = tar_list(layers[1]["path"])
    assert listing.returncode == 0, listing.stderr
    assert "etc/.wh.motd" in listing.stdout.split()
    listing = tar_list(layers[3]["path"])
    assert listing.returncode == 0, listing.stderr
    assert "etc/berth-test/.wh..wh..opq" in listing.stdout.split()

    # "unterminated": layer 4 as umoci 0.4.7's insert wrote it (no end-of-archive blocks).
    # (Layer 1, 200 MB of tar, is read once: the other tags share it or only recompress it.)
    raw = fx.layout_manifest(debian.layout, "unterminated")["layers"]
    assert [l["digest"] for l in raw[:3]] == [l["digest"] for l in layers[:3]]
    raw4 = fx.layer_tar_entries(fx.layout_blob(debian.layout, raw[3]["digest"]))
    assert raw4["entries"] == layers[3]["entries"]
    assert not raw4["terminated"]
    # (It ends on a block boundary -- its last entry is a directory -- so GNU tar and Go's
    # archive/tar take it; a reader that insists on the end-of-archive blocks does not.)
    assert tar_list(fx.layout_blob(debian.layout, raw[3]["digest"])).returncode == 0

    zstd = fx.layout_manifest(debian.layout, "zstd")["layers"]
    assert all(l["mediaType"].endswith("tar+zstd") for l in zstd)
    for i in (1, 2, 3):
        z = fx.layer_tar_entries(fx.layout_blob(debian.layout, zstd[i]["digest"]))
        assert z["terminated"] and z["entries"] == layers[i]["entries"]
    with open(fx.layout_blob(debian.layout, zstd[0]["digest"]), "rb") as f:
        assert f.read(4) == b"\x28\xb5\x2f\xfd"


def test_debian_expected_listing(debian):
    exp = fx.read_listing(debian.listing)
    for p in fx.DEBIAN_EXPECT["absent"]:
        assert p not in exp, p
        assert not any(q.startswith(p + "/") for q in exp), p
    for p, text in fx.DEBIAN_EXPECT["present"].items():
        assert exp[p].type == "f" and exp[p].sha256 == sha(text)[7:], p
    assert sorted(p for p in exp if p.startswith("/etc/berth-test/")) == \
        ["/etc/berth-test/c", "/etc/berth-test/d"]
    e = exp["/opt/berth/modechange"]
    assert (e.mode, e.uid, e.gid) == (0o4755, 1000, 1000)
    e = exp["/opt/berth/redir"]
    assert (e.type, e.mode, e.uid, e.gid) == ("d", 0o700, 1000, 1000)
    assert exp["/opt/berth/setgid-dir"].mode == 0o2775 and exp["/opt/berth/setgid-dir"].gid == 50
    assert exp["/opt/berth/file2dir"].type == "d"
    assert exp["/opt/berth/keep-1"].link_group == exp["/opt/berth/keep-2"].link_group \
        == "/opt/berth/keep-1"
    assert exp["/opt/berth/hl-a"].link_group is None  # its partner was deleted
    assert exp["/opt/berth/sym-abs"].target == "/etc/os-release"
    assert exp["/opt/berth/sym-rel"].target == "keep-1"
    assert exp["/dev/null"].type == "c" and exp["/dev/null"].target == "1,3"
    assert any(len(p) > 255 for p in exp)
    cfg = debian.info["config"]
    assert cfg["WorkingDir"] == "/opt/berth" and cfg["Cmd"] == ["/bin/bash"]


def test_busybox_image(busybox):
    exp = fx.read_listing(busybox.listing)
    assert exp["/bin/busybox"].sha256 == fx._sha256_file(fx.BUSYBOX)
    assert exp["/bin/sh"].type == "l" and exp["/bin/sh"].target == "/bin/busybox"
    assert exp["/home/alice"].uid == 1000 and exp["/tmp"].mode == 0o1777
    assert "/proc" not in exp and "/sys" not in exp
    configs = {}
    for tag in ("latest", "alice-entrypoint", "zstd"):
        m = fx.layout_manifest(busybox.layout, tag)
        configs[tag] = json.loads(fx.layout_blob(busybox.layout, m["config"]["digest"])
                                  .read_text())["config"]
    assert configs["latest"]["Cmd"] == ["sh"] and "Entrypoint" not in configs["latest"]
    assert configs["latest"]["WorkingDir"] == "/home/alice"
    assert "BERTH_TEST_IMAGE=busybox" in configs["latest"]["Env"]
    assert configs["alice-entrypoint"]["User"] == "alice"
    assert configs["alice-entrypoint"]["Entrypoint"] == ["/bin/echo", "entrypoint:"]
    assert configs["alice-entrypoint"]["Cmd"] == ["from-cmd"]
    assert configs["zstd"] == configs["latest"]


def run_listing_script_in(root) -> dict:
    r = subprocess.run(["chroot", str(root), "/bin/sh", "-c", fx.SANDBOX_LISTING_SH],
                       capture_output=True, text=True, timeout=300, env={"PATH": fx.PATH_ENV[5:]})
    assert r.returncode == 0, r.stderr
    return fx.parse_sandbox_listing(r.stdout)


def test_listing_script_with_busybox(tmp_path, busybox):
    """The script run by busybox's sh/find/stat/sha256sum in a chroot of the unpacked
    image reads exactly the expected listing (mtimes included)."""
    fx._umoci("unpack", "--image", f"{busybox.layout}:latest", tmp_path / "b")
    seen = run_listing_script_in(tmp_path / "b/rootfs")
    expected = fx.read_listing(busybox.listing)
    fx.assert_listing_equal(expected, seen, ignore=(), fields=fx.LISTING_FIELDS)


def test_listing_script_with_coreutils():
    """The same with Debian's dash, findutils and coreutils, on the bench's extracted
    minbase (read-only here), against the Python listing of that tree."""
    root = fx.MINBASE_TAR.with_suffix("")
    if not (root / "usr/bin/find").exists():
        pytest.skip(f"{root} (bench/run-compare's rootfs) is not there")
    seen = run_listing_script_in(root)
    fx.assert_listing_equal(fx.listing_of_dir(root), seen, ignore=(),
                            fields=fx.LISTING_FIELDS)
    assert any(e.link_group for e in seen.values())


def test_compare_listings_names_differences(busybox):
    exp = fx.read_listing(busybox.listing)
    seen = dict(exp)
    del seen["/etc/passwd"]
    seen["/etc/extra"] = fx.Entry("/etc/extra", "f", 0o644, 0, 0, 1, "00" * 32)
    seen["/tmp"] = fx.Entry("/tmp", "d", 0o755, 0, 0)
    seen["/home/alice/hello.txt"] = fx.Entry("/home/alice/hello.txt", "f", 0o644, 1000, 1000,
                                             24, "ff" * 32)
    seen["/proc/1/stat"] = fx.Entry("/proc/1/stat", "f", 0o444, 0, 0, 0, "00" * 32)
    diffs = fx.compare_listings(exp, seen)
    assert diffs == ["unexpected: /etc/extra (f)", "missing: /etc/passwd (f)",
                     f"/home/alice/hello.txt: sha256 {exp['/home/alice/hello.txt'].sha256} "
                     f"expected, {'ff' * 32} seen",
                     "/tmp: mode 1777 expected, 0755 seen"]
    with pytest.raises(AssertionError, match="4 differences"):
        fx.assert_listing_equal(exp, seen)


def test_index_picks_platforms(open_registry, index, busybox):
    reg = open_registry
    doc = json.loads(fx.layout_blob(index.layout, index.digest).read_text())
    assert doc["mediaType"] == fx.OCI_INDEX
    plats = {f"{m['platform']['os']}/{m['platform']['architecture']}": m["digest"]
             for m in doc["manifests"]}
    host, other = f"linux/{fx.host_arch()}", f"linux/{fx.other_arch()}"
    assert plats == {host: busybox.digest, other: index.info["platforms"][other]}
    assert plats[other] != busybox.digest
    other_cfg = fx.layout_manifest(index.layout, index.info["platforms"][other])["config"]
    assert json.loads(fx.layout_blob(index.layout, other_cfg["digest"]).read_text())[
        "architecture"] == fx.other_arch()
    assert "/etc/berth-platform" in fx.read_listing(index.tags[fx.other_arch()]["listing"])
    assert "/etc/berth-platform" not in fx.read_listing(index.listing)

    d = fx.push_oci_layout(index.layout, "latest", reg, "t/multi", "latest")
    assert d == index.digest
    pushed = json.loads(inspect_raw(reg, reg.ref("t/multi", "latest")))
    assert [m["digest"] for m in pushed["manifests"]] == [m["digest"] for m in doc["manifests"]]
    for digest in plats.values():  # every platform's manifest is there
        assert sha(inspect_raw(reg, reg.ref("t/multi", digest))) == digest
    info = json.loads(skopeo("inspect", "--tls-verify=false", "--no-creds",
                             f"docker://{reg.ref('t/multi', 'latest')}").stdout)
    assert info["Architecture"] == fx.host_arch()

    fx.push_oci_layout(index.layout, "latest", reg, "t/multi", "v2s2", format="v2s2")
    lst = json.loads(inspect_raw(reg, reg.ref("t/multi", "v2s2")))
    assert lst["mediaType"] == "application/vnd.docker.distribution.manifest.list.v2+json"
    assert len(lst["manifests"]) == 2


# ----------------------------------------------------------------------------- the proxy

class RawClient:
    """HTTP/1.1 over one socket, by hand: keep-alive and cut connections are visible."""

    def __init__(self, host):
        h, _, p = host.rpartition(":")
        self.sock = socket.create_connection((h, int(p)), timeout=10)
        self.buf = b""

    def get(self, path, headers=()):
        hdrs = "".join(f"{k}: {v}\r\n" for k, v in headers)
        self.sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n{hdrs}\r\n".encode())
        while b"\r\n\r\n" not in self.buf:
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("closed before a response")
            self.buf += data
        head, _, self.buf = self.buf.partition(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        status = int(lines[0].split()[1])
        hmap = {k.lower(): v.strip() for k, _, v in (l.partition(":") for l in lines[1:])}
        length = int(hmap.get("content-length", 0))
        while len(self.buf) < length:
            data = self.sock.recv(65536)
            if not data:  # cut
                body, self.buf = self.buf, b""
                return status, hmap, body, False
            self.buf += data
        body, self.buf = self.buf[:length], self.buf[length:]
        return status, hmap, body, True

    def close(self):
        self.sock.close()


def test_proxy_cuts_resumes_and_keeps_alive(open_registry, busybox):
    reg = open_registry
    layer = fx.layout_manifest(busybox.layout, "latest")["layers"][0]
    config = fx.layout_manifest(busybox.layout, "latest")["config"]
    blob = f"/v2/t/busybox/blobs/{layer['digest']}"
    with fx.CuttingProxy(reg.host, 100_000, cut_times=2) as px:
        c = RawClient(px.host)
        # Several requests on one connection: a manifest, a small blob (too short to cut:
        # not counted), then the layer, cut after 100,000 body bytes.
        for _ in range(2):
            status, _, body, whole = c.get("/v2/t/busybox/manifests/latest",
                                           [("Accept", fx.OCI_MANIFEST)])
            assert status == 200 and whole and sha(body) == busybox.digest
        status, _, body, whole = c.get(f"/v2/t/busybox/blobs/{config['digest']}")
        assert status == 200 and whole and sha(body) == config["digest"]
        status, hdrs, part1, whole = c.get(blob)
        assert status == 200 and not whole and len(part1) == 100_000
        assert int(hdrs["content-length"]) == layer["size"]
        c.close()
        # The resume is cut too (cut_times=2), 100,000 bytes further.
        c = RawClient(px.host)
        status, _, part2, whole = c.get(blob, [("Range", "bytes=100000-")])
        assert status == 206 and not whole and len(part2) == 100_000
        c.close()
        # The third is whole.
        c = RawClient(px.host)
        status, hdrs, rest, whole = c.get(blob, [("Range", "bytes=200000-")])
        assert status == 206 and whole
        assert hdrs["content-range"] == f"bytes 200000-{layer['size'] - 1}/{layer['size']}"
        assert sha(part1 + part2 + rest) == layer["digest"]
        # and the connection stays usable afterwards.
        status, _, body, whole = c.get(blob)
        assert status == 200 and whole and sha(body) == layer["digest"]
        c.close()
        reqs = px.requests
        assert px.cuts == 2
        assert [(r["conn"], r["path"].rsplit("/", 1)[-1][:14], r["range"], r["status"],
                 r["cut"]) for r in reqs] == [
            (1, "latest", None, 200, False), (1, "latest", None, 200, False),
            (1, config["digest"][:14], None, 200, False),
            (1, layer["digest"][:14], None, 200, True),
            (2, layer["digest"][:14], "bytes=100000-", 206, True),
            (3, layer["digest"][:14], "bytes=200000-", 206, False),
            (3, layer["digest"][:14], None, 200, False)]
        assert [r["body_bytes"] for r in reqs[3:]] == [100_000, 100_000,
                                                        layer["size"] - 200_000, layer["size"]]


def test_proxy_match_mode_and_log(open_registry, busybox, tmp_path):
    reg = open_registry
    layer = fx.layout_manifest(busybox.layout, "latest")["layers"][0]
    blob = f"/v2/t/busybox/blobs/{layer['digest']}"
    # A path that does not match is never cut.
    with fx.CuttingProxy(reg.host, 10, match=b"/nothing-like-this/",
                         log_path=tmp_path / "px.jsonl") as px:
        c = RawClient(px.host)
        status, _, body, whole = c.get(blob)
        assert whole and sha(body) == layer["digest"] and px.cuts == 0
        c.close()
        seen = px.requests  # (waits for the record to be complete: then it is logged)
        logged = [json.loads(l) for l in (tmp_path / "px.jsonl").read_text().splitlines()]
        assert logged == seen and seen[0]["body_bytes"] == layer["size"]
    # "stall": the bytes stop, the connection stays open.
    with fx.CuttingProxy(reg.host, 5000, mode="stall") as px:
        c = RawClient(px.host)
        c.sock.settimeout(1.0)
        with pytest.raises(socket.timeout):
            c.get(blob)
        assert len(c.buf) == 5000  # the body so far (the head was consumed)
        c.close()
    # "reset": the client sees a reset (or a short read, if the RST raced the data).
    with fx.CuttingProxy(reg.host, 5000, mode="reset") as px:
        c = RawClient(px.host)
        try:
            _, _, body, whole = c.get(blob)
            assert not whole and len(body) <= 5000
        except ConnectionResetError:
            pass
        c.close()
        assert px.cuts == 1


# ----------------------------------------------------------------------------- the CLI

def read_line(proc, timeout):
    deadline = time.monotonic() + timeout
    buf = b""
    while time.monotonic() < deadline:
        r, _, _ = select.select([proc.stdout], [], [], 0.5)
        if r:
            chunk = os.read(proc.stdout.fileno(), 65536)
            if not chunk:
                break
            buf += chunk
            if b"\n" in buf:
                return buf.split(b"\n")[0].decode()
        if proc.poll() is not None:
            break
    raise AssertionError(f"no JSON line from `fixture.py up` (exit {proc.poll()}): "
                         f"{buf.decode(errors='replace')}\n{proc.stderr.read().decode()}")


def test_cli_up_and_down(tmp_path, busybox):
    proc = subprocess.Popen([sys.executable, str(HERE / "fixture.py"), "up", "--workdir",
                             str(tmp_path / "w"), "--auth", "basic", "--images", "busybox",
                             "--proxy-cut", "1000:3"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        info = json.loads(read_line(proc, 120))
        assert info["pid"] == proc.pid and info["auth"] == "basic"
        img = info["images"]["busybox"]
        assert img["digest"] == busybox.digest
        assert img["by_digest"] == f"{info['host']}/berth-test/busybox@{busybox.digest}"
        assert Path(img["listing"]).is_file()
        assert set(info["images"]) == {"busybox", "busybox-v2s2", "busybox-zstd",
                                       "busybox-entrypoint"}
        user, password = info["credentials"]
        cfg = json.loads(Path(info["docker_config"]).read_text())
        assert info["host"] in cfg["auths"]
        r = skopeo("inspect", "--tls-verify=false", "--raw", "--creds", f"{user}:{password}",
                   f"docker://{img['by_digest']}")
        assert sha(r.stdout) == busybox.digest
        # Through the proxy (skopeo retries nothing: the manifest is small enough to pass).
        assert info["proxy"]["cut_after_bytes"] == 1000 and info["proxy"]["cut_times"] == 3
        r = skopeo("inspect", "--tls-verify=false", "--raw", "--creds", f"{user}:{password}",
                   f"docker://{info['proxy']['host']}/berth-test/busybox:latest")
        assert sha(r.stdout) == busybox.digest
        assert any("/manifests/latest" in json.loads(l)["path"]
                   for l in Path(info["proxy"]["records"]).read_text().splitlines())
        registry_pid = info["registry_pid"]
        os.kill(registry_pid, 0)
    finally:
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(30)
    assert rc == 0, proc.stderr.read().decode()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(registry_pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"docker-registry {registry_pid} outlived `fixture.py up`")


def test_cli_build_images(tmp_path, busybox):
    r = subprocess.run([sys.executable, str(HERE / "fixture.py"), "build-images", "--out",
                        str(tmp_path / "out"), "--images", "busybox"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)["busybox"]
    layout = Path(info["layout"])
    assert layout == tmp_path / "out/busybox"
    assert (layout / "oci-layout").is_file() and (layout / "index.json").is_file()
    assert info["digest"] == busybox.digest
    assert fx._layout_tags(layout)["latest"]["digest"] == busybox.digest
    assert fx.read_listing(info["tags"]["latest"]["listing"]) == fx.read_listing(busybox.listing)
