#!/usr/bin/python3
"""A real registry for berth's pull tests: Debian's docker-registry (distribution 2.8) on
loopback, optionally behind htpasswd basic auth or a docker token server; images built with
umoci and pushed with skopeo; a TCP proxy that cuts blob downloads; expected file listings.

Stdlib only. Shells out to docker-registry, skopeo, umoci, htpasswd, openssl, tar, chroot.
Building images needs root (umoci unpacks with real ownership, busybox --install runs in a
chroot). See tests/registry/README.md for the API, the caches and the known quirks.

As a library (from a test):

    sys.path.insert(0, str(REPO / "tests/registry")); import fixture
    img = fixture.debian_layered_layout()           # cached OCI layout + expected listing
    with fixture.Registry(tmp, auth="token") as reg:
        digest = fixture.push_oci_layout(img.layout, img.tag, reg, "berth-test/debian", "v1")
        ... berth pull reg.host + "/berth-test/debian:v1" ...
        fixture.assert_listing_equal(fixture.read_listing(img.listing),
                                     fixture.parse_sandbox_listing(output_of(SANDBOX_LISTING_SH)))

As a command (for gtests and by hand):

    python3 tests/registry/fixture.py up --workdir DIR [--auth basic|token]
        [--images busybox,debian,index] [--proxy-cut BYTES[:TIMES]]
    python3 tests/registry/fixture.py build-images --out DIR [--images ...]
"""
import argparse
import base64
import contextlib
import ctypes
import dataclasses
import fcntl
import functools
import gzip
import hashlib
import http.server
import json
import os
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[1]

# Bumped whenever a builder changes what it makes: part of every cache key.
BUILD_VERSION = "4"

MINBASE_TAR = Path(os.environ.get("BERTH_BENCH_CACHE", "/var/cache/berth-bench")) \
    / "bookworm-minbase.tar"
BUSYBOX = Path("/bin/busybox")

DEFAULT_USER = "berth"
DEFAULT_PASSWORD = "berth-test-password"
TOKEN_SERVICE = "berth-test-registry"
TOKEN_ISSUER = "berth-test-token-issuer"

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
REF_NAME = "org.opencontainers.image.ref.name"

GOARCH = {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm", "ppc64le": "ppc64le",
          "s390x": "s390x", "riscv64": "riscv64", "i686": "386"}


def host_arch() -> str:
    """The host's architecture in OCI/Go spelling (amd64, arm64, ...)."""
    m = os.uname().machine
    return GOARCH.get(m, m)


def other_arch() -> str:
    """A platform that is not the host's: what an index's decoy entry claims."""
    return "arm64" if host_arch() != "arm64" else "amd64"


# ----------------------------------------------------------------------------- helpers

def _run(cmd, **kw) -> subprocess.CompletedProcess:
    """Runs a command; on failure raises with its output (commands here are short)."""
    kw.setdefault("capture_output", True)
    kw.setdefault("timeout", 600)
    t0 = time.monotonic()
    r = subprocess.run([str(c) for c in cmd], **kw)
    if os.environ.get("BERTH_FIXTURE_TRACE"):
        print(f"fixture: {time.monotonic() - t0:6.2f}s {' '.join(map(str, cmd))[:150]}",
              file=sys.stderr)
    if r.returncode != 0:
        out = r.stdout.decode(errors="replace") if isinstance(r.stdout, bytes) else r.stdout
        err = r.stderr.decode(errors="replace") if isinstance(r.stderr, bytes) else r.stderr
        raise RuntimeError(f"{' '.join(map(str, cmd))} exited {r.returncode}:\n"
                           f"{(out or '')[-2000:]}{(err or '')[-4000:]}")
    return r


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _sha256_file(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _die_with_parent():
    """preexec_fn: the child gets SIGTERM when the process that started it exits, so a
    killed test run leaves no registry behind. (PR_SET_PDEATHSIG fires when the *thread*
    that forked exits: start registries from a thread that lives as long as they do.)"""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:
        pass


@functools.lru_cache(maxsize=None)
def _tool_version(tool) -> str:
    try:
        return subprocess.run([tool, "--version"], capture_output=True, text=True,
                              timeout=30).stdout.strip()
    except OSError:
        return "missing"


# ----------------------------------------------------------------------------- registry

class TokenServer:
    """The docker token protocol (https://distribution.github.io/distribution/spec/auth/token/)
    on 127.0.0.1, in threads of this process.

    GET /token?service=S&scope=repository:NAME:pull,push[&scope=...] with HTTP basic auth:
    good credentials get a JWT (RS256, x5c header holding the self-signed cert the registry
    trusts) granting the requested actions (those in `actions`); bad credentials get 401;
    no credentials get 401 too, unless anonymous_pull, where the token grants pull only.
    POST /token (the OAuth2 password grant docker uses with an identity token) works the
    same with form fields username/password/scope/service. Every request is recorded in
    .requests (method, user, scopes, status, granted)."""

    def __init__(self, workdir: Path, users: dict, ttl: int = 300, anonymous_pull=False,
                 actions=("pull", "push", "delete")):
        self.dir = Path(workdir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.users = dict(users)
        self.ttl = ttl
        self.anonymous_pull = anonymous_pull
        self.actions = set(actions)
        self.key = self.dir / "token-key.pem"
        self.cert = self.dir / "token-cert.pem"
        _run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-sha256",
              "-days", "3", "-subj", "/CN=berth-test-token-issuer",
              "-keyout", self.key, "-out", self.cert])
        pem = self.cert.read_text()
        body = pem.split("-----BEGIN CERTIFICATE-----")[1].split("-----END CERTIFICATE-----")[0]
        self._x5c = "".join(body.split())  # the DER, standard base64 as x5c wants
        self.requests = []
        self._lock = threading.Lock()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                u = urllib.parse.urlsplit(self.path)
                q = urllib.parse.parse_qs(u.query)
                server._answer(self, u.path, q, self.headers.get("Authorization"), None)

            def do_POST(self):
                u = urllib.parse.urlsplit(self.path)
                n = int(self.headers.get("Content-Length") or 0)
                form = urllib.parse.parse_qs(self.rfile.read(n).decode(errors="replace"))
                creds = None
                if form.get("grant_type", [""])[0] == "password":
                    creds = (form.get("username", [""])[0], form.get("password", [""])[0])
                q = {"service": form.get("service", []),
                     "scope": " ".join(form.get("scope", [])).split()}
                server._answer(self, u.path, q, self.headers.get("Authorization"),
                               creds if creds else ("", ""), post=True)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.realm = f"http://127.0.0.1:{self.port}/token"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True,
                                        name="berth-test-token-server")
        self._thread.start()

    def _answer(self, h, path, q, authz, form_creds, post=False):
        def reply(code, obj, extra=()):
            data = json.dumps(obj).encode()
            h.send_response(code)
            h.send_header("Content-Type", "application/json")
            h.send_header("Content-Length", str(len(data)))
            for k, v in extra:
                h.send_header(k, v)
            h.end_headers()
            h.wfile.write(data)

        scopes = [s for s in q.get("scope", []) for s in s.split(" ") if s]
        rec = {"method": "POST" if post else "GET", "path": path, "scopes": scopes,
               "service": (q.get("service") or [None])[0], "user": None, "status": None,
               "granted": []}
        with self._lock:
            self.requests.append(rec)
        if path != "/token":
            rec["status"] = 404
            return reply(404, {"errors": [{"code": "NOT_FOUND", "message": path}]})
        user = password = None
        if post and form_creds and form_creds[0]:
            user, password = form_creds
        elif authz and authz.lower().startswith("basic "):
            try:
                user, _, password = base64.b64decode(authz[6:].strip()).decode().partition(":")
            except Exception:
                user, password = "", None
        rec["user"] = user
        challenge = [("WWW-Authenticate", 'Basic realm="berth-test-token"')]
        if user is None:
            if not self.anonymous_pull:
                rec["status"] = 401
                return reply(401, {"errors": [{"code": "UNAUTHORIZED",
                                               "message": "credentials required"}]}, challenge)
            allowed = {"pull"}
        elif self.users.get(user) is None or self.users.get(user) != password:
            rec["status"] = 401
            return reply(401, {"errors": [{"code": "UNAUTHORIZED",
                                           "message": "bad username or password"}]}, challenge)
        else:
            allowed = self.actions
        access = []
        for s in scopes:
            typ, _, rest = s.partition(":")
            name, _, acts = rest.rpartition(":")
            if not typ or not name:
                continue
            granted = [a for a in acts.split(",") if a in allowed]
            access.append({"type": typ, "name": name, "actions": granted})
        rec["granted"] = access
        token = self.issue(user or "", access)
        rec["status"] = 200
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        body = {"access_token": token, "expires_in": self.ttl, "issued_at": now}
        if not post:
            body["token"] = token
        reply(200, body)

    def issue(self, subject: str, access: list, ttl=None) -> str:
        """A signed token for `subject` granting `access` ([{type, name, actions}]); tests
        may mint their own (an expired one: ttl=-120)."""
        now = int(time.time())
        ttl = self.ttl if ttl is None else ttl
        header = {"typ": "JWT", "alg": "RS256", "x5c": [self._x5c]}
        claims = {"iss": TOKEN_ISSUER, "sub": subject, "aud": TOKEN_SERVICE,
                  "exp": now + ttl, "nbf": now - 10, "iat": now,
                  "jti": secrets.token_hex(16), "access": access}
        signing_input = (_b64url(json.dumps(header, separators=(",", ":")).encode()) + "." +
                         _b64url(json.dumps(claims, separators=(",", ":")).encode()))
        sig = _run(["openssl", "dgst", "-sha256", "-sign", self.key],
                   input=signing_input.encode()).stdout
        return signing_input + "." + _b64url(sig)

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()


class Registry:
    """docker-registry (distribution 2.8) on 127.0.0.1:<free port>, plain HTTP, its storage
    and log under `workdir`.

    auth: None (open), "basic" (htpasswd, bcrypt) or "token" (a TokenServer in this process;
    the registry trusts its cert). Credentials (basic and token) are `credentials`,
    default ("berth", "berth-test-password"). Use as a context manager or call .stop()."""

    def __init__(self, workdir, auth=None, *, credentials=(DEFAULT_USER, DEFAULT_PASSWORD),
                 token_ttl=300, anonymous_pull=False, start=True):
        if auth not in (None, "none", "basic", "token"):
            raise ValueError(f"auth must be None, 'basic' or 'token', not {auth!r}")
        self.auth = None if auth == "none" else auth
        self.workdir = Path(workdir).resolve()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.root = self.workdir / "storage"
        self.log_path = self.workdir / "registry.log"
        self.config_path = self.workdir / "config.yml"
        self.credentials = tuple(credentials) if self.auth else None
        self.token_server = None
        self.proc = None
        self.port = None
        self._token_ttl = token_ttl
        self._anonymous_pull = anonymous_pull
        if start:
            self.start()

    # -- life cycle
    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.host}"

    @property
    def pid(self):
        return self.proc.pid if self.proc else None

    def _write_config(self):
        q = json.dumps  # a JSON string is a YAML double-quoted scalar
        lines = [
            "version: 0.1",
            "log:",
            "  level: info",
            "  formatter: json",
            "  accesslog:",
            "    disabled: true",
            "storage:",
            "  filesystem:",
            f"    rootdirectory: {q(str(self.root))}",
            "  delete:",
            "    enabled: true",
            "  maintenance:",
            "    uploadpurging:",
            "      enabled: false",
            "http:",
            f"  addr: {q(self.host)}",
            f"  secret: {q(secrets.token_hex(16))}",
        ]
        if self.auth == "basic":
            htpasswd = self.workdir / "htpasswd"
            user, password = self.credentials
            r = _run(["htpasswd", "-Bbn", user, password], text=True)
            htpasswd.write_text(r.stdout.strip() + "\n")
            lines += ["auth:", "  htpasswd:", '    realm: "berth-test"',
                      f"    path: {q(str(htpasswd))}"]
        elif self.auth == "token":
            ts = self.token_server
            lines += ["auth:", "  token:", f"    realm: {q(ts.realm)}",
                      f"    service: {q(TOKEN_SERVICE)}", f"    issuer: {q(TOKEN_ISSUER)}",
                      f"    rootcertbundle: {q(str(ts.cert))}"]
        self.config_path.write_text("\n".join(lines) + "\n")

    def start(self):
        if self.auth == "token" and self.token_server is None:
            self.token_server = TokenServer(self.workdir / "token", {self.credentials[0]:
                                                                    self.credentials[1]},
                                            ttl=self._token_ttl,
                                            anonymous_pull=self._anonymous_pull)
        last = ""
        for _ in range(5):  # the free port may be taken between our probe and its bind
            self.port = _free_port()
            self._write_config()
            log = open(self.log_path, "ab")
            self.proc = subprocess.Popen(["docker-registry", "serve", str(self.config_path)],
                                         stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent)
            log.close()
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    break
                try:
                    urllib.request.urlopen(self.url + "/v2/", timeout=2).close()
                    return self
                except urllib.error.HTTPError as e:
                    if e.code == 401:
                        return self
                except OSError:
                    pass
                time.sleep(0.05)
            last = self.log_path.read_text(errors="replace")[-3000:]
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            if "address already in use" not in last:
                break
        self.stop()
        raise RuntimeError(f"docker-registry did not come up; its log:\n{last}")

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.token_server:
            self.token_server.stop()
            self.token_server = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()

    # -- what tests look at
    def ref(self, repo: str, tag_or_digest: str = "latest") -> str:
        """HOST/repo:tag, or HOST/repo@sha256:... for a digest."""
        sep = "@" if tag_or_digest.startswith("sha256:") else ":"
        return f"{self.host}/{repo}{sep}{tag_or_digest}"

    def blob_path(self, digest: str) -> Path:
        """The file the registry serves a blob from (corrupt it to test verification)."""
        algo, _, hexd = digest.partition(":")
        return self.root / "docker/registry/v2/blobs" / algo / hexd[:2] / hexd / "data"

    def corrupt_blob(self, digest: str, offset=None) -> Path:
        """Flips one byte of a stored blob (size unchanged, so the registry still serves it
        whole with its old Content-Length and Docker-Content-Digest)."""
        p = self.blob_path(digest)
        size = p.stat().st_size
        off = size // 2 if offset is None else offset
        with open(p, "r+b") as f:
            f.seek(off)
            b = f.read(1)
            f.seek(off)
            f.write(bytes([b[0] ^ 0xFF]))
        return p

    def requests(self, settle=0.1) -> list:
        """Requests the registry has completed, from its log: dicts with method, uri,
        status, written (body bytes sent), user_agent. The registry logs a request once its
        handler returns, which can be a moment after the client saw the last byte: this
        waits until the log has not grown for `settle` seconds (at most 5 s)."""
        deadline = time.monotonic() + 5
        size = -1
        while settle and time.monotonic() < deadline:
            now = self.log_path.stat().st_size
            if now == size:
                break
            size = now
            time.sleep(settle)
        out = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            if not line.startswith("{"):
                continue
            try:
                e = json.loads(line)
            except ValueError:
                continue
            if e.get("msg") != "response completed" and "http.response.status" not in e:
                continue
            out.append({"method": e.get("http.request.method"),
                        "uri": e.get("http.request.uri"),
                        "status": e.get("http.response.status"),
                        "written": e.get("http.response.written"),
                        "user_agent": e.get("http.request.useragent"),
                        "msg": e.get("msg"), "error": e.get("err.message")})
        return out

    def blob_gets(self, digest=None, repo=None, settle=0.1) -> int:
        """How many GETs of blobs (of `digest`, in `repo`, when given) the registry served,
        whatever their status: a pull of a present image should add none."""
        n = 0
        for r in self.requests(settle):
            uri = (r["uri"] or "").split("?")[0]
            if r["method"] != "GET" or "/blobs/" not in uri or "/blobs/uploads" in uri:
                continue
            if digest and not uri.endswith("/blobs/" + digest):
                continue
            if repo and not uri.startswith(f"/v2/{repo}/blobs/"):
                continue
            n += 1
        return n

    def docker_config_json(self, credentials=None) -> str:
        """A docker config.json with an `auths` entry for this registry."""
        user, password = credentials or self.credentials or (DEFAULT_USER, DEFAULT_PASSWORD)
        auth = base64.b64encode(f"{user}:{password}".encode()).decode()
        return json.dumps({"auths": {self.host: {"auth": auth}}}, indent=2) + "\n"

    def write_docker_config(self, path, credentials=None) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.docker_config_json(credentials))
        path.chmod(0o600)
        return path

    def skopeo_creds(self, credentials=None) -> list:
        """skopeo's credential arguments (--creds U:P, or --no-creds for an open registry)."""
        c = credentials or self.credentials
        return ["--creds", f"{c[0]}:{c[1]}"] if c else ["--no-creds"]


# ----------------------------------------------------------------------------- pushing

def _layout_tags(layout) -> dict:
    idx = json.loads((Path(layout) / "index.json").read_text())
    return {m.get("annotations", {}).get(REF_NAME): m for m in idx.get("manifests", [])}


def push_oci_layout(layout_dir, tag, registry, repo, repo_tag, *, all_platforms=None,
                    format=None, creds=None) -> str:
    """skopeo copy oci:LAYOUT:TAG docker://HOST/REPO:REPO_TAG; returns the digest of what
    was pushed (the index's for an index). all_platforms: --all (default: when the tag is an
    index). format: None (keep: OCI), "v2s2" (Docker schema 2; an index becomes a manifest
    list) or "oci". creds: (user, password), False for none, None for the registry's own."""
    desc = _layout_tags(layout_dir).get(tag)
    if desc is None:
        raise KeyError(f"{layout_dir} has no tag {tag!r}")
    if all_platforms is None:
        all_platforms = desc.get("mediaType") == OCI_INDEX
    if creds is None:
        creds = registry.credentials
    with tempfile.TemporaryDirectory(prefix="berth-push-") as tmp:
        digestfile = Path(tmp) / "digest"
        cmd = ["skopeo", "--insecure-policy", "copy", "-q", "--dest-tls-verify=false",
               "--digestfile", digestfile]
        cmd += ["--dest-creds", f"{creds[0]}:{creds[1]}"] if creds else ["--dest-no-creds"]
        if all_platforms:
            cmd.append("--all")
        if format:
            cmd += ["--format", format]
        cmd += [f"oci:{Path(layout_dir)}:{tag}", f"docker://{registry.host}/{repo}:{repo_tag}"]
        _run(cmd, timeout=900)
        return digestfile.read_text().strip()


# ----------------------------------------------------------------------------- listings

LISTING_HEADER = ("# berth-test listing v1: "
                  "path type mode uid gid size sha256 target link_group mtime")
LISTING_FIELDS = ("type", "mode", "uid", "gid", "size", "sha256", "target", "link_group",
                  "mtime")
# What compare_listings checks unless told otherwise: everything but mtime.
DEFAULT_FIELDS = ("type", "mode", "uid", "gid", "size", "sha256", "target", "link_group")
# Mount points a sandbox has where the image has (or lacks) plain directories.
DEFAULT_IGNORE = ("/proc", "/sys", "/dev")

_TYPES = {stat.S_IFREG: "f", stat.S_IFDIR: "d", stat.S_IFLNK: "l", stat.S_IFCHR: "c",
          stat.S_IFBLK: "b", stat.S_IFIFO: "p", stat.S_IFSOCK: "s"}


@dataclasses.dataclass(frozen=True)
class Entry:
    """One path of a file listing. mode is the permission bits with setuid/setgid/sticky
    (0o7777 mask); size is set for files and symlinks only; sha256 for files; target is a
    symlink's target or "MAJOR,MINOR" of a device; link_group names the hardlink group of a
    file (the smallest path sharing its inode among the listed ones), else None."""
    path: str
    type: str
    mode: int
    uid: int
    gid: int
    size: int = None
    sha256: str = None
    target: str = None
    link_group: str = None
    mtime: int = None


def _entry(path, st, sha=None, target=None) -> Entry:
    t = _TYPES.get(stat.S_IFMT(st.st_mode), "?")
    size = st.st_size if t in ("f", "l") else None
    if t in ("c", "b"):
        target = f"{os.major(st.st_rdev)},{os.minor(st.st_rdev)}"
    return Entry(path, t, stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, size, sha, target,
                 None, int(st.st_mtime))


def _with_link_groups(entries: dict, inode_of: dict) -> dict:
    groups = {}
    for p, e in entries.items():
        if e.type == "f" and p in inode_of:
            groups.setdefault(inode_of[p], []).append(p)
    out = dict(entries)
    for paths in groups.values():
        if len(paths) > 1:
            g = min(paths)
            for p in paths:
                out[p] = dataclasses.replace(out[p], link_group=g)
    return out


def listing_of_dir(root) -> dict:
    """{path: Entry} of everything under `root`, with paths as seen from inside ("/" is
    root itself). Follows no symlinks."""
    root = Path(root)
    entries, inode_of = {}, {}
    st = os.lstat(root)
    entries["/"] = _entry("/", st)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            full = os.path.join(dirpath, name)
            rel = "/" + os.path.relpath(full, root)
            st = os.lstat(full)
            sha = target = None
            if stat.S_ISREG(st.st_mode):
                sha = _sha256_file(full)
                if st.st_nlink > 1:
                    inode_of[rel] = (st.st_dev, st.st_ino)
            elif stat.S_ISLNK(st.st_mode):
                target = os.readlink(full)
            entries[rel] = _entry(rel, st, sha, target)
    return _with_link_groups(entries, inode_of)


def _fmt(v):
    return "-" if v is None else str(v)


def write_listing(entries: dict, path) -> Path:
    """Writes a listing as TSV (LISTING_HEADER's columns; "-" for none; mode in octal)."""
    lines = [LISTING_HEADER]
    for p in sorted(entries):
        e = entries[p]
        if "\t" in p or "\n" in p:
            raise ValueError(f"a path with a tab or newline cannot be listed: {p!r}")
        lines.append("\t".join([p, e.type, f"{e.mode:04o}", str(e.uid), str(e.gid),
                                _fmt(e.size), _fmt(e.sha256), _fmt(e.target),
                                _fmt(e.link_group), _fmt(e.mtime)]))
    Path(path).write_text("\n".join(lines) + "\n")
    return Path(path)


def read_listing(path) -> dict:
    """The {path: Entry} a listing file holds."""
    out = {}
    for line in Path(path).read_text().splitlines():
        if not line or line.startswith("#"):
            continue
        f = line.split("\t")
        n = lambda v, conv=str: None if v == "-" else conv(v)  # noqa: E731
        out[f[0]] = Entry(f[0], f[1], int(f[2], 8), int(f[3]), int(f[4]), n(f[5], int),
                          n(f[6]), n(f[7]), n(f[8]), n(f[9], int))
    return out


# Run inside a sandbox (as root, with `sh -c`), it prints what parse_sandbox_listing reads.
# Works with busybox (find, stat, sha256sum applets) and with Debian's findutils+coreutils,
# and forks a handful of processes, not one per file. Stays on the root filesystem (-xdev):
# mount points are listed, their contents are not. Paths must not contain newlines, and
# symlinks' names must not contain " -> " or quotes (the fixture's images have none).
SANDBOX_LISTING_SH = r"""
LC_ALL=C; QUOTING_STYLE=literal; export LC_ALL QUOTING_STYLE
echo '#stat'
find / -xdev -exec stat -c '%i %f %u %g %s %h %Y %t %T %n' {} +
echo '#sha256'
find / -xdev -type f -exec sha256sum {} +
echo '#links'
find / -xdev -type l -exec stat -c '%N' {} +
echo '#end'
"""


def parse_sandbox_listing(text: str) -> dict:
    """{path: Entry} from SANDBOX_LISTING_SH's output (raises if the output is cut short)."""
    section = None
    raw, shas, links, inode_of = {}, {}, {}, {}
    ended = False
    for line in text.splitlines():
        if line in ("#stat", "#sha256", "#links", "#end"):
            section = line
            ended = line == "#end"
            continue
        if not line:
            continue
        if section == "#stat":
            f = line.split(" ", 9)
            if len(f) != 10:
                raise ValueError(f"bad stat line: {line!r}")
            ino, mode_hex, uid, gid, size, nlink, mtime, major, minor, path = f
            mode = int(mode_hex, 16)
            t = _TYPES.get(stat.S_IFMT(mode), "?")
            target = f"{int(major, 16)},{int(minor, 16)}" if t in ("c", "b") else None
            raw[path] = Entry(path, t, stat.S_IMODE(mode), int(uid), int(gid),
                              int(size) if t in ("f", "l") else None, None, target, None,
                              int(mtime))
            if t == "f" and int(nlink) > 1:
                inode_of[path] = int(ino)
        elif section == "#sha256":
            digest, path = line[:64], line[66:]
            shas[path] = digest
        elif section == "#links":
            # coreutils (QUOTING_STYLE=literal): PATH -> TARGET; busybox: 'PATH' -> 'TARGET'
            if line.startswith("'") and line.endswith("'") and "' -> '" in line:
                path, _, target = line[1:-1].partition("' -> '")
            else:
                path, _, target = line.partition(" -> ")
            links[path] = target
    if not ended:
        raise ValueError("the listing output is incomplete (no #end marker)")
    for p, d in shas.items():
        if p in raw:
            raw[p] = dataclasses.replace(raw[p], sha256=d)
    for p, t in links.items():
        if p in raw:
            raw[p] = dataclasses.replace(raw[p], target=t)
    return _with_link_groups(raw, inode_of)


def _ignored(path, ignore) -> bool:
    return any(path == i or path.startswith(i.rstrip("/") + "/") for i in ignore)


def compare_listings(expected: dict, actual: dict, ignore=DEFAULT_IGNORE,
                     fields=DEFAULT_FIELDS) -> list:
    """Differences between two listings as readable lines ([] when they agree). Paths under
    (or equal to) one in `ignore` are skipped on both sides."""
    diffs = []
    for p in sorted(set(expected) | set(actual)):
        if _ignored(p, ignore):
            continue
        e, a = expected.get(p), actual.get(p)
        if a is None:
            diffs.append(f"missing: {p} ({e.type})")
            continue
        if e is None:
            diffs.append(f"unexpected: {p} ({a.type})")
            continue
        for f in fields:
            ev, av = getattr(e, f), getattr(a, f)
            if f == "size" and e.type not in ("f", "l"):
                continue
            if ev != av:
                if f == "mode":
                    ev, av = f"{ev:04o}", f"{av:04o}"
                diffs.append(f"{p}: {f} {ev} expected, {av} seen")
    return diffs


def assert_listing_equal(expected: dict, actual: dict, ignore=DEFAULT_IGNORE,
                         fields=DEFAULT_FIELDS, show=60):
    diffs = compare_listings(expected, actual, ignore, fields)
    if diffs:
        more = f"\n... and {len(diffs) - show} more" if len(diffs) > show else ""
        raise AssertionError(f"{len(diffs)} differences:\n" + "\n".join(diffs[:show]) + more)


# ----------------------------------------------------------------------------- layer tars

def read_tar_entries(stream) -> dict:
    """Walks a tar stream: {"entries": [(name, typeflag)], "terminated": bool} where
    terminated says whether the end-of-archive zero blocks were there. PAX path and GNU
    long names are applied. Reads the whole stream."""
    entries, pending_name, terminated = [], None, False

    def read_exact(n):
        buf = b""
        while len(buf) < n:
            chunk = stream.read(n - len(buf))
            if not chunk:
                break
            buf += chunk
        return buf

    while True:
        block = read_exact(512)
        if len(block) < 512:
            break
        if block == b"\0" * 512:
            terminated = read_exact(512) == b"\0" * 512
            break
        size_field = block[124:136]
        if size_field[0] & 0x80:
            size = int.from_bytes(size_field[1:], "big")
        else:
            size = int(size_field.strip(b"\0 ") or b"0", 8)
        typeflag = chr(block[156]) if block[156] else "0"
        name = block[0:100].split(b"\0")[0]
        prefix = block[345:500].split(b"\0")[0]
        if prefix and block[257:262] == b"ustar":
            name = prefix + b"/" + name
        data = read_exact((size + 511) // 512 * 512)[:size]
        if typeflag == "x":
            for rec in _pax_records(data):
                if rec[0] == "path":
                    pending_name = rec[1]
            continue
        if typeflag == "L":
            pending_name = data.split(b"\0")[0].decode(errors="surrogateescape")
            continue
        if typeflag in ("g", "K"):
            continue
        entries.append((pending_name or name.decode(errors="surrogateescape"), typeflag))
        pending_name = None
    return {"entries": entries, "terminated": terminated}


def _pax_records(data: bytes):
    i = 0
    while i < len(data):
        sp = data.index(b" ", i)
        n = int(data[i:sp])
        k, _, v = data[sp + 1:i + n - 1].partition(b"=")
        yield k.decode(), v.decode(errors="surrogateescape")
        i += n


def layer_tar_entries(blob_path, media_type="") -> dict:
    """read_tar_entries of a layer blob (gzip, zstd via `zstd -dc`, or plain)."""
    with open(blob_path, "rb") as f:
        magic = f.read(4)
    if magic[:2] == b"\x1f\x8b":
        with gzip.open(blob_path, "rb") as f:
            return read_tar_entries(f)
    if magic == b"\x28\xb5\x2f\xfd":
        p = subprocess.Popen(["zstd", "-dc", str(blob_path)], stdout=subprocess.PIPE)
        try:
            return read_tar_entries(p.stdout)
        finally:
            p.stdout.close()
            p.wait()
    with open(blob_path, "rb") as f:
        return read_tar_entries(f)


def layout_blob(layout, digest) -> Path:
    algo, _, hexd = digest.partition(":")
    return Path(layout) / "blobs" / algo / hexd


def layout_manifest(layout, tag_or_digest, platform=None) -> dict:
    """The manifest a tag (or digest) names; an index is resolved to `platform`
    ("os/arch", default the host's)."""
    if tag_or_digest.startswith("sha256:"):
        doc = json.loads(layout_blob(layout, tag_or_digest).read_text())
    else:
        desc = _layout_tags(layout)[tag_or_digest]
        doc = json.loads(layout_blob(layout, desc["digest"]).read_text())
    if doc.get("manifests") is not None:
        want = platform or f"linux/{host_arch()}"
        for m in doc["manifests"]:
            p = m.get("platform", {})
            if f"{p.get('os')}/{p.get('architecture')}" == want:
                return layout_manifest(layout, m["digest"])
        raise KeyError(f"no {want} manifest in the index")
    return doc


def layout_layers(layout, tag_or_digest, platform=None) -> list:
    """[{digest, media_type, size, path, entries, terminated}] for each layer, in order."""
    out = []
    for d in layout_manifest(layout, tag_or_digest, platform)["layers"]:
        p = layout_blob(layout, d["digest"])
        out.append({"digest": d["digest"], "media_type": d["mediaType"], "size": d["size"],
                    "path": p, **layer_tar_entries(p, d["mediaType"])})
    return out


# ----------------------------------------------------------------------------- image cache

def default_cache_dir() -> Path:
    """BERTH_TEST_CACHE, else /var/cache/berth-tests (root), else ~/.cache/berth-tests."""
    env = os.environ.get("BERTH_TEST_CACHE")
    if env:
        return Path(env)
    if os.geteuid() == 0:
        return Path("/var/cache/berth-tests")
    return Path.home() / ".cache/berth-tests"


@dataclasses.dataclass
class BuiltImage:
    """An OCI image layout made by a builder. `tag` is the main tag, `digest` what it points
    at (a manifest, or an index for index_layout), `listing` the expected final filesystem
    of the host platform's image (read_listing), `tags` every tag of the layout:
    {tag: {"digest", "media_type", "listing"}}, `info` the builder's notes (info.json)."""
    name: str
    layout: Path
    tag: str
    digest: str
    listing: Path
    tags: dict
    info: dict


def _cache_key(name, inputs: dict) -> str:
    doc = json.dumps({"name": name, "version": BUILD_VERSION, "umoci": _tool_version("umoci"),
                      "skopeo": _tool_version("skopeo"), **inputs}, sort_keys=True)
    return hashlib.sha256(doc.encode()).hexdigest()[:16]


def _cached(name, inputs, build, cache_dir=None, out_dir=None) -> BuiltImage:
    """The image `name` from the cache, built by build(workdir) once per inputs. The cache
    entry is <cache>/<name>-<key>/{layout/, *.tsv, info.json}; builds are serialized by a
    lock file and land by rename, so a crashed build leaves nothing that looks finished.
    With out_dir, the layout is copied there (a test may alter it); else the cached one is
    returned (treat it as read-only)."""
    cache = Path(cache_dir) if cache_dir else default_cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    key = _cache_key(name, inputs)
    final = cache / f"{name}-{key}"
    with open(cache / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (final / "info.json").exists():
            work = Path(tempfile.mkdtemp(prefix=f".{name}-build-", dir=cache))
            try:
                build(work)
                # Readable by all: a daemon that drops root (berthd runs as user berth) may
                # be the one reading a layout.
                _run(["chmod", "-R", "a+rX", work])
                (work / "info.json").write_text(json.dumps(
                    {**json.loads((work / "notes.json").read_text()), "key": key,
                     "inputs": inputs}, indent=2) + "\n")
                _discard(final, cache / ".trash")
                os.rename(work, final)
            finally:
                _discard(work, cache / ".trash")
            # Older builds of the same image (another fixture version or input) go.
            for old in cache.glob(f"{name}-*"):
                if old != final and old.is_dir() and len(old.name) == len(final.name):
                    _discard(old, cache / ".trash")
            for old in cache.glob(f".{name}-build-*"):
                _discard(old, cache / ".trash")
    info = json.loads((final / "info.json").read_text())
    layout = final / "layout"
    if out_dir is not None:
        out_dir = Path(out_dir)
        if out_dir.exists() and any(out_dir.iterdir()):
            raise FileExistsError(f"{out_dir} is not empty")
        out_dir.mkdir(parents=True, exist_ok=True)
        _run(["cp", "-a", "--reflink=auto", f"{layout}/.", out_dir])
        layout = out_dir
    tags = {t: {**v, "listing": str(final / v["listing"])} for t, v in info["tags"].items()}
    main = info["main_tag"]
    return BuiltImage(name, layout, main, tags[main]["digest"], Path(tags[main]["listing"]),
                      tags, info)


def _discard(path: Path, trash: Path):
    """Moves `path` into `trash` (same filesystem) and removes it there with a detached
    `rm -rf`: deleting a 7,000-file tree takes ~10 s on a disk mounted with `discard`, and
    nobody needs to wait for it. Leftovers (a killed rm) are retried by the next call."""
    path = Path(path)
    if not path.exists():
        return
    trash.mkdir(exist_ok=True)
    dest = Path(tempfile.mkdtemp(prefix="gone-", dir=trash))
    os.rename(path, dest / "x")
    subprocess.Popen(["rm", "-rf", "--one-file-system", *map(str, trash.iterdir())],
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL, start_new_session=True)


def _umoci(*args):
    return _run(["umoci", *args])


def _reference_listing(layout, tag, dest: Path) -> dict:
    """umoci unpack of the tag into a scratch bundle (umoci applies the whiteouts itself),
    listed; the bundle is removed."""
    bundle = dest.parent / f".ref-{tag}"
    _umoci("unpack", "--image", f"{layout}:{tag}", bundle)
    try:
        entries = listing_of_dir(bundle / "rootfs")
    finally:
        _discard(bundle, dest.parent.parent / ".trash")
    write_listing(entries, dest)
    return entries


def _tag_notes(layout, tags_listings: dict) -> dict:
    t = _layout_tags(layout)
    return {tag: {"digest": t[tag]["digest"], "media_type": t[tag]["mediaType"],
                  "listing": listing} for tag, listing in tags_listings.items()}


def _need_root(what):
    if os.geteuid() != 0:
        raise PermissionError(f"{what} needs root (umoci unpacks with real ownership)")


def _add_zstd_tag(layout: Path, tag: str, new_tag: str, work: Path):
    """new_tag = tag with every layer recompressed as zstd by skopeo. (skopeo copies into a
    fresh layout: into the same one it would reuse the gzip blobs it finds there.)"""
    tmp = work / f"zstd-{new_tag}"
    _run(["skopeo", "--insecure-policy", "copy", "-q", "--dest-compress",
          "--dest-compress-format", "zstd", f"oci:{layout}:{tag}", f"oci:{tmp}:{new_tag}"])
    for blob in (tmp / "blobs/sha256").iterdir():
        dest = layout / "blobs/sha256" / blob.name
        if not dest.exists():
            shutil.copy2(blob, dest)
    idx = json.loads((layout / "index.json").read_text())
    idx["manifests"] = [m for m in idx["manifests"]
                        if m.get("annotations", {}).get(REF_NAME) != new_tag]
    idx["manifests"].append(_layout_tags(tmp)[new_tag])
    (layout / "index.json").write_text(json.dumps(idx))
    shutil.rmtree(tmp)


PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _build_busybox(work: Path):
    _need_root("busybox_layout")
    layout, bundle = work / "layout", work / "bundle"
    img = f"{layout}:latest"
    _umoci("init", "--layout", layout)
    _umoci("new", "--image", img)
    _umoci("unpack", "--image", img, bundle)
    r = bundle / "rootfs"
    # Like the official busybox image: no /proc or /sys (a runtime makes its mount points).
    for d in ("bin", "dev", "etc", "home", "root", "tmp", "usr", "var"):
        (r / d).mkdir(exist_ok=True)
    (r / "root").chmod(0o700)
    (r / "tmp").chmod(0o1777)
    shutil.copy2(BUSYBOX, r / "bin/busybox")
    _run(["chroot", r, "/bin/busybox", "--install", "-s", "/bin"])
    (r / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/sh\n"
                                  "alice:x:1000:1000:alice:/home/alice:/bin/sh\n"
                                  "nobody:x:65534:65534:nobody:/nonexistent:/bin/false\n")
    (r / "etc/group").write_text("root:x:0:\nalice:x:1000:\nnogroup:x:65534:\n")
    (r / "etc/berth-test-image").write_text("busybox\n")
    home = r / "home/alice"
    home.mkdir()
    (home / "hello.txt").write_text("hello from alice's home\n")
    os.chown(home / "hello.txt", 1000, 1000)
    os.chown(home, 1000, 1000)
    home.chmod(0o750)
    _umoci("repack", "--image", img, "--history.created_by",
           "berth-test: busybox-static with applet symlinks", bundle)
    _umoci("config", "--image", img, "--os", "linux", "--architecture", host_arch(),
           "--config.env", PATH_ENV, "--config.env", "BERTH_TEST_IMAGE=busybox",
           "--config.cmd", "sh", "--config.workingdir", "/home/alice",
           "--history.created_by", "berth-test: config")
    # Same layer, other run settings: User, Entrypoint+Cmd.
    _umoci("config", "--image", img, "--tag", "alice-entrypoint", "--config.user", "alice",
           "--config.entrypoint", "/bin/echo", "--config.entrypoint", "entrypoint:",
           "--clear", "config.cmd", "--config.cmd", "from-cmd",
           "--history.created_by", "berth-test: user alice, entrypoint echo")
    # The same image with its layer recompressed as zstd, by skopeo.
    _add_zstd_tag(layout, "latest", "zstd", work)
    _umoci("gc", "--layout", layout)
    _discard(bundle, work.parent / ".trash")
    _reference_listing(layout, "latest", work / "expected.tsv")
    notes = {"main_tag": "latest",
             "tags": _tag_notes(layout, {"latest": "expected.tsv",
                                         "alice-entrypoint": "expected.tsv",
                                         "zstd": "expected.tsv"}),
             "config": {"Env": [PATH_ENV, "BERTH_TEST_IMAGE=busybox"], "Cmd": ["sh"],
                        "WorkingDir": "/home/alice", "User": None, "Entrypoint": None},
             "config_alice_entrypoint": {"User": "alice",
                                         "Entrypoint": ["/bin/echo", "entrypoint:"],
                                         "Cmd": ["from-cmd"], "WorkingDir": "/home/alice"}}
    (work / "notes.json").write_text(json.dumps(notes, indent=2))


def busybox_layout(dir=None, cache_dir=None) -> BuiltImage:
    """One-layer busybox image (made by umoci): /bin/busybox with absolute applet symlinks
    (`busybox --install -s /bin` in a chroot), /etc/passwd+group with root, alice (1000) and
    nobody, /home/alice (1000:1000, 0750) with hello.txt, /tmp 1777, /root 0700, no /proc or
    /sys. Config: Env PATH + BERTH_TEST_IMAGE=busybox, Cmd ["sh"], WorkingDir /home/alice,
    no User, no Entrypoint. Tags: latest; alice-entrypoint (same layer, User alice,
    Entrypoint ["/bin/echo", "entrypoint:"], Cmd ["from-cmd"]); zstd (latest with a zstd
    layer, by skopeo)."""
    inputs = {"busybox_sha256": _sha256_file(BUSYBOX), "arch": host_arch()}
    return _cached("busybox", inputs, _build_busybox, cache_dir, dir)


# What the Debian image's later layers do, and what the final filesystem must show. (The
# listing file is the full truth; this is for reading and for the self-tests.)
DEBIAN_EXPECT = {
    "absent": ["/etc/motd", "/etc/issue.net", "/etc/rmt", "/etc/host.conf",
               "/usr/share/doc/bash", "/usr/share/doc/dpkg", "/usr/share/doc/gzip",
               "/usr/share/doc/tar", "/etc/berth-test/a", "/etc/berth-test/b",
               "/opt/berth/hl-b", "/opt/berth/empty"],
    "present": {
        "/etc/berth-test/c": "c\n",
        "/opt/berth/overwrite": "version 2, longer than the first\n",
        "/opt/berth/file2dir/inner": "inner\n",
        "/opt/berth/sym2file": "a file where a symlink was\n",
        "/opt/berth/redir/x": "x\n",
    },
}
LONG_DIR = "long-" + "d" * 120
LONG_NAME = "name-" + "n" * 150


def _build_debian(work: Path):
    _need_root("debian_layered_layout")
    if not MINBASE_TAR.exists():
        _ensure_minbase()
    layout, bundle = work / "layout", work / "bundle"
    img = f"{layout}:latest"
    r = bundle / "rootfs"

    def repack(what):
        _umoci("repack", "--refresh-bundle", "--image", img, "--history.created_by",
               f"berth-test: {what}", bundle)

    def write(rel, text, mode=0o644, owner=(0, 0)):
        p = r / rel.lstrip("/")
        p.write_text(text)
        os.chown(p, *owner)
        p.chmod(mode)

    _umoci("init", "--layout", layout)
    _umoci("new", "--image", img)
    _umoci("unpack", "--image", img, bundle)
    # Layer 1: the debootstrapped Debian 12 minbase.
    _run(["tar", "--numeric-owner", "--xattrs", "--xattrs-include=*", "-xpf", MINBASE_TAR,
          "-C", r])
    repack("debian bookworm minbase (debootstrap)")

    # Layer 2: deletions (whiteouts of files, a symlink and whole directories) and new
    # files of every kind.
    for d in ("bash", "dpkg", "gzip"):
        shutil.rmtree(r / "usr/share/doc" / d)
    for f in ("etc/motd", "etc/issue.net", "etc/rmt"):
        (r / f).unlink()
    with open(r / "etc/passwd", "a") as f:
        f.write("alice:x:1000:1000:alice:/home/alice:/bin/bash\n")
    with open(r / "etc/group", "a") as f:
        f.write("alice:x:1000:\n")
    (r / "home/alice").mkdir()
    os.chown(r / "home/alice", 1000, 1000)
    (r / "etc/berth-test").mkdir()
    write("etc/berth-test/a", "a\n")
    write("etc/berth-test/b", "b\n")
    o = r / "opt/berth"
    o.mkdir()
    write("opt/berth/modechange", "my mode and owner change in layer 3\n", 0o644)
    write("opt/berth/hl-a", "hardlink a/b, b goes in layer 3\n")
    os.link(o / "hl-a", o / "hl-b")
    write("opt/berth/keep-1", "hardlink pair kept to the end\n")
    os.link(o / "keep-1", o / "keep-2")
    os.symlink("keep-1", o / "sym-rel")
    os.symlink("/etc/os-release", o / "sym-abs")
    os.symlink("/nonexistent/target", o / "sym-dangling")
    write("opt/berth/file2dir", "a file that becomes a directory\n")
    os.symlink("keep-1", o / "sym2file")
    (o / "redir").mkdir()
    write("opt/berth/redir/x", "x\n")
    write("opt/berth/overwrite", "version 1\n")
    write("opt/berth/with space", "a name with a space\n")
    write("opt/berth/empty", "")
    (o / "empty-dir").mkdir()
    (o / "setgid-dir").mkdir()
    os.chown(o / "setgid-dir", 0, 50)
    (o / "setgid-dir").chmod(0o2775)
    (o / LONG_DIR).mkdir()
    write(f"opt/berth/{LONG_DIR}/{LONG_NAME}", "a path longer than 255 bytes\n")
    write("opt/berth/exec.sh", "#!/bin/sh\necho exec\n", 0o755)
    repack("delete docs, motd, issue.net, rmt; add /etc/berth-test/{a,b}, /opt/berth")

    # Layer 3: metadata-only changes, a whiteout of a layer-2 name, type changes.
    os.chown(o / "modechange", 1000, 1000)  # (chown first: it clears setuid)
    (o / "modechange").chmod(0o4755)
    os.chown(o / "redir", 1000, 1000)
    (o / "redir").chmod(0o700)
    (o / "hl-b").unlink()
    (o / "empty").unlink()
    write("opt/berth/overwrite", DEBIAN_EXPECT["present"]["/opt/berth/overwrite"])
    (o / "file2dir").unlink()
    (o / "file2dir").mkdir()
    write("opt/berth/file2dir/inner", "inner\n")
    (o / "sym2file").unlink()
    write("opt/berth/sym2file", "a file where a symlink was\n")
    shutil.rmtree(r / "usr/share/doc/tar")
    (r / "etc/host.conf").unlink()
    repack("chmod/chown, whiteouts of layer-2 names, file->dir, symlink->file")

    # Layer 4: /etc/berth-test replaced wholesale -- an opaque directory, by
    # `umoci insert --opaque`. umoci 0.4.7 does not close its tar writer there (umoci #436,
    # fixed by PR #534 after 0.4.7): the layer lacks the two zero blocks that end a tar (and
    # the last file's padding), which GNU tar, Python's tarfile and berth's reader refuse.
    # The tag "unterminated" keeps that layer as umoci wrote it; "latest" gets the same
    # entries with the end-of-archive marker, added by `umoci raw add-layer`.
    src = work / "opaque-src"
    src.mkdir()
    (src / "c").write_text("c\n")
    (src / "d").mkdir()  # ends the entries on a block boundary (see above)
    src.chmod(0o755)
    _umoci("insert", "--image", img, "--tag", "unterminated", "--opaque",
           "--history.created_by", "berth-test: umoci insert --opaque /etc/berth-test",
           src, "/etc/berth-test")
    raw_layer = layout_manifest(layout, "unterminated")["layers"][-1]
    with gzip.open(layout_blob(layout, raw_layer["digest"]), "rb") as f:
        data = f.read()
    data += b"\0" * ((-len(data)) % 512) + b"\0" * 1024
    fixed = work / "opaque-layer.tar"
    fixed.write_bytes(data)
    _umoci("raw", "add-layer", "--image", img, "--history.created_by",
           "berth-test: umoci insert --opaque /etc/berth-test (end-of-archive added)", fixed)
    # The bundle follows, for the cross-check below.
    shutil.rmtree(r / "etc/berth-test")
    _run(["cp", "-a", src, r / "etc/berth-test"])

    for tag in ("latest", "unterminated"):
        _umoci("config", "--image", f"{layout}:{tag}", "--os", "linux", "--architecture",
               host_arch(), "--config.env", PATH_ENV, "--config.env", "LANG=C.UTF-8",
               "--config.cmd", "/bin/bash", "--config.workingdir", "/opt/berth",
               "--history.created_by", "berth-test: config")
    _add_zstd_tag(layout, "latest", "zstd", work)
    _umoci("gc", "--layout", layout)

    expected = _reference_listing(layout, "latest", work / "expected.tsv")
    # umoci's own unpack of the image must agree with the tree it was made from.
    diffs = compare_listings(listing_of_dir(r), expected, ignore=())
    if diffs:
        raise RuntimeError("umoci unpack of the Debian image differs from its bundle:\n"
                           + "\n".join(diffs[:40]))
    for p in DEBIAN_EXPECT["absent"]:
        assert p not in expected, p
    _discard(bundle, work.parent / ".trash")
    layers = layout_layers(layout, "latest")
    notes = {"main_tag": "latest",
             "tags": _tag_notes(layout, {"latest": "expected.tsv", "zstd": "expected.tsv",
                                         "unterminated": "expected.tsv"}),
             "config": {"Env": [PATH_ENV, "LANG=C.UTF-8"], "Cmd": ["/bin/bash"],
                        "WorkingDir": "/opt/berth", "User": None, "Entrypoint": None},
             "layers": [{"digest": l["digest"], "size": l["size"],
                         "whiteouts": [n for n, _ in l["entries"]
                                       if os.path.basename(n).startswith(".wh.")]}
                        for l in layers],
             "expect": DEBIAN_EXPECT}
    (work / "notes.json").write_text(json.dumps(notes, indent=2))


def _ensure_minbase():
    """The bench's debootstrapped minbase tar (bench/berthbench makes and caches it)."""
    sys.path.insert(0, str(REPO_ROOT / "bench"))
    try:
        from berthbench.main import ensure_rootfs
    except ImportError as e:
        raise FileNotFoundError(f"{MINBASE_TAR} is missing and bench/berthbench cannot "
                                f"make it ({e}): run bench/run-compare --quick once") from e
    ensure_rootfs()


def debian_layered_layout(dir=None, cache_dir=None) -> BuiltImage:
    """A 4-layer Debian 12 image made by umoci from the bench's cached minbase tar:
    1 the rootfs; 2 (repack) deletes /usr/share/doc/{bash,dpkg,gzip}, /etc/motd,
    /etc/issue.net, the symlink /etc/rmt -> .wh. whiteouts, adds alice (1000) to
    passwd/group, /etc/berth-test/{a,b} and /opt/berth (hardlink pairs, relative, absolute
    and dangling symlinks, a name with a space, a >255-byte path, an empty file and dir, a
    setgid dir); 3 (repack) chown+chmod 4755 of a file, chown+chmod 0700 of a directory,
    whiteouts of layer-2 names, file->dir, symlink->file, more layer-1 deletions;
    4 (umoci insert --opaque) /etc/berth-test replaced by {c, d/} -> .wh..wh..opq.
    Config: Env PATH, LANG; Cmd ["/bin/bash"]; WorkingDir /opt/berth.
    Tags: latest; zstd (its layers recompressed by skopeo); unterminated (layer 4 exactly as
    umoci 0.4.7 wrote it, without the tar end-of-archive blocks -- see README)."""
    st = MINBASE_TAR.stat() if MINBASE_TAR.exists() else None
    inputs = {"minbase": [str(MINBASE_TAR), st.st_size, st.st_mtime_ns] if st else None,
              "arch": host_arch()}
    img = _cached("debian", inputs, _build_debian, cache_dir, dir)
    return img


def _build_index(work: Path, busybox: BuiltImage):
    _need_root("index_layout")
    layout, bundle = work / "layout", work / "bundle"
    _run(["cp", "-a", "--reflink=auto", busybox.layout, layout])
    # Only the busybox image itself stays; its other tags go.
    idx = json.loads((layout / "index.json").read_text())
    idx["manifests"] = [m for m in idx["manifests"] if m["annotations"][REF_NAME] == "latest"]
    (layout / "index.json").write_text(json.dumps(idx))
    other = other_arch()
    _umoci("unpack", "--image", f"{layout}:latest", bundle)
    (bundle / "rootfs/etc/berth-platform").write_text(f"linux/{other}\n")
    _umoci("repack", "--image", f"{layout}:{other}", "--history.created_by",
           f"berth-test: the {other} decoy", bundle)
    _discard(bundle, work.parent / ".trash")
    _umoci("config", "--image", f"{layout}:{other}", "--architecture", other,
           "--history.created_by", f"berth-test: architecture {other}")
    _umoci("gc", "--layout", layout)
    tags = _layout_tags(layout)
    mine, theirs = tags["latest"], tags[other]
    index = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [
        {"mediaType": OCI_MANIFEST, "digest": mine["digest"], "size": mine["size"],
         "platform": {"architecture": host_arch(), "os": "linux"}},
        {"mediaType": OCI_MANIFEST, "digest": theirs["digest"], "size": theirs["size"],
         "platform": {"architecture": other, "os": "linux",
                      **({"variant": "v8"} if other == "arm64" else {})}}]}
    data = json.dumps(index, indent=2).encode()
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    layout_blob(layout, digest).write_bytes(data)
    idx = json.loads((layout / "index.json").read_text())
    for m in idx["manifests"]:
        if m["annotations"][REF_NAME] == "latest":
            m["annotations"][REF_NAME] = host_arch()
    idx["manifests"].insert(0, {"mediaType": OCI_INDEX, "digest": digest, "size": len(data),
                                "annotations": {REF_NAME: "latest"}})
    (layout / "index.json").write_text(json.dumps(idx))
    shutil.copy(busybox.listing, work / "expected.tsv")
    _reference_listing(layout, other, work / f"expected-{other}.tsv")
    notes = {"main_tag": "latest",
             "tags": _tag_notes(layout, {"latest": "expected.tsv",
                                         host_arch(): "expected.tsv",
                                         other: f"expected-{other}.tsv"}),
             "platforms": {f"linux/{host_arch()}": mine["digest"],
                           f"linux/{other}": theirs["digest"]},
             "host_platform": f"linux/{host_arch()}"}
    (work / "notes.json").write_text(json.dumps(notes, indent=2))


def index_layout(dir=None, cache_dir=None) -> BuiltImage:
    """An OCI layout whose tag "latest" is an OCI index of two images: linux/<host arch> =
    the busybox image's manifest (same digest), and linux/arm64 (linux/amd64 on an arm64
    host) = busybox plus /etc/berth-platform, config architecture arm64. A pull must pick the
    host's; the other image's file tells if it did not. Tags "amd64"/"arm64" name the two
    manifests. info["platforms"] maps "os/arch" to manifest digests."""
    busybox = busybox_layout(cache_dir=cache_dir)
    inputs = {"busybox": busybox.info["key"], "arch": host_arch()}
    return _cached("index", inputs, lambda w: _build_index(w, busybox), cache_dir, dir)


BUILDERS = {"busybox": busybox_layout, "debian": debian_layered_layout, "index": index_layout}


# ----------------------------------------------------------------------------- the proxy

class CuttingProxy:
    """A TCP proxy on 127.0.0.1:<free port> in front of `upstream` ("host:port") that drops
    connections in the middle of responses.

    For each request whose target contains `match`, a 2xx response whose body is longer than
    `cut_after_bytes` is cut -- the first `cut_times` such responses only: the status line,
    headers and exactly `cut_after_bytes` of body are forwarded, then both connections are
    closed (mode "close": FIN; "reset": RST, so bytes in flight may be lost; "stall": nothing
    more is sent and the connections stay open until the client gives up or the proxy stops).
    Everything else is forwarded whole. Each request is recorded in .requests as a dict:
    method, path, range (the Range header or None), status, body_bytes (body bytes forwarded),
    cut (bool), conn (connection number); with log_path, also appended there as JSON lines.

    Limits: one upstream connection per client connection, requests handled one at a time
    (no pipelining -- curl and Go's client do not pipeline); request bodies must have a
    Content-Length (chunked uploads are not supported; "Expect: 100-continue" is answered
    by the proxy itself); no CONNECT/Upgrade; a chunked response's bytes are counted as sent
    on the wire, chunk framing included."""

    def __init__(self, upstream: str, cut_after_bytes: int, cut_times: int = 1,
                 match=b"/blobs/", mode="close", log_path=None):
        if mode not in ("close", "reset", "stall"):
            raise ValueError(mode)
        self.upstream = upstream
        self.cut_after = int(cut_after_bytes)
        self.cuts_left = int(cut_times)
        self.match = match.encode() if isinstance(match, str) else match
        self.mode = mode
        self.log_path = Path(log_path) if log_path else None
        self._records = []
        self._inflight = 0
        self.cuts = 0
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._conns = set()
        self._stopping = threading.Event()
        self._conn_seq = 0
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self._thread = threading.Thread(target=self._accept, daemon=True,
                                        name="berth-test-cutting-proxy")
        self._thread.start()

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def requests(self) -> list:
        """The requests seen so far (copies). A client can have read a whole response a
        moment before the proxy notes how many bytes it forwarded: this waits (up to 5 s)
        until no response is being forwarded."""
        with self._idle:
            self._idle.wait_for(lambda: self._inflight == 0, timeout=5)
            return [{k: v for k, v in r.items() if k != "_done"} for r in self._records]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()

    def stop(self):
        self._stopping.set()
        try:
            self.sock.close()
        except OSError:
            pass
        with self._lock:
            conns = list(self._conns)
        for s in conns:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                s.close()

    def _accept(self):
        while not self._stopping.is_set():
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            with self._lock:
                self._conn_seq += 1
                n = self._conn_seq
            threading.Thread(target=self._serve, args=(client, n), daemon=True).start()

    def _begin(self, rec):
        with self._lock:
            self._records.append(rec)
            self._inflight += 1

    def _finish(self, rec):
        """A request's record is complete (forwarded, cut, or its connection died)."""
        with self._lock:
            if rec.get("_done"):
                return
            rec["_done"] = True
            self._inflight -= 1
            self._idle.notify_all()
            if self.log_path:
                with open(self.log_path, "a") as f:
                    f.write(json.dumps({k: v for k, v in rec.items() if k != "_done"}) + "\n")

    def _take_cut(self) -> bool:
        with self._lock:
            if self.cuts_left > 0:
                self.cuts_left -= 1
                self.cuts += 1
                return True
            return False

    def _serve(self, client, conn_no):
        host, _, port = self.upstream.rpartition(":")
        try:
            up = socket.create_connection((host, int(port)), timeout=30)
        except OSError:
            client.close()
            return
        up.settimeout(None)
        with self._lock:
            self._conns.update((client, up))
        cbuf = _Buf(client)
        ubuf = _Buf(up)
        rec = None
        try:
            while not self._stopping.is_set():
                head = cbuf.read_head()
                if head is None:
                    return
                reqline, headers = _parse_head(head)
                method, target = (reqline.split(" ") + ["", ""])[:2]
                hmap = {k.lower(): v for k, v in headers}
                if "chunked" in hmap.get("transfer-encoding", "").lower():
                    raise ConnectionError("chunked request bodies are not supported")
                if hmap.get("expect", "").lower() == "100-continue":
                    headers = [(k, v) for k, v in headers if k.lower() != "expect"]
                    client.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
                body = cbuf.read_exact(int(hmap.get("content-length") or 0))
                rec = {"conn": conn_no, "method": method, "path": target,
                       "range": hmap.get("range"), "status": None, "body_bytes": 0,
                       "cut": False}
                self._begin(rec)
                up.sendall(_build_head(reqline, headers) + body)
                while True:  # 1xx answers are forwarded and the real one follows
                    rhead = ubuf.read_head()
                    if rhead is None:
                        raise ConnectionError("upstream closed")
                    status_line, rheaders = _parse_head(rhead)
                    status = int(status_line.split(" ")[1])
                    if status >= 200 or status == 101:
                        break
                    client.sendall(rhead)
                rec["status"] = status
                rmap = {k.lower(): v for k, v in rheaders}
                if method == "HEAD" or status in (204, 304):
                    length = 0
                elif "chunked" in rmap.get("transfer-encoding", "").lower():
                    length = "chunked"
                elif "content-length" in rmap:
                    length = int(rmap["content-length"])
                else:
                    length = "close"
                cut = (self.match in target.encode() and 200 <= status < 300
                       and (length in ("chunked", "close") or length > self.cut_after)
                       and self._take_cut())
                client.sendall(rhead)
                limit = self.cut_after if cut else None
                self._forward_body(ubuf, client, length, limit, rec)
                if cut:
                    rec["cut"] = True
                    self._finish(rec)
                    self._cut(client, up)
                    return
                self._finish(rec)
                conn_hdr = (rmap.get("connection", "") + "," +
                            hmap.get("connection", "")).lower()
                if length == "close" or "close" in conn_hdr:
                    return
        except (OSError, ConnectionError, ValueError):
            return
        finally:
            if rec is not None:
                self._finish(rec)
            with self._lock:
                self._conns.difference_update((client, up))
            for s in (client, up):
                with contextlib.suppress(OSError):
                    s.close()

    def _forward_body(self, ubuf, client, length, limit, rec) -> int:
        """Forwards a response body (all of it, or `limit` bytes), counting the bytes sent
        in rec["body_bytes"] as it goes; returns that count."""
        sent = 0

        def send(data):
            nonlocal sent
            if limit is not None and sent + len(data) > limit:
                data = data[:limit - sent]
            if data:
                client.sendall(data)
                sent += len(data)
                rec["body_bytes"] = sent
            return limit is not None and sent >= limit

        if length == "chunked":
            while True:
                line = ubuf.read_line()
                if send(line):
                    return sent
                size = int(line.split(b";")[0].strip(), 16)
                if size == 0:
                    while True:  # trailers, then the empty line
                        t = ubuf.read_line()
                        if send(t) or t in (b"\r\n", b"\n"):
                            return sent
                for chunk in ubuf.iter_exact(size + 2):
                    if send(chunk):
                        return sent
        elif length == "close":
            for chunk in ubuf.iter_until_close():
                if send(chunk):
                    return sent
        else:
            for chunk in ubuf.iter_exact(length):
                if send(chunk):
                    return sent
        return sent

    def _cut(self, client, up):
        if self.mode == "stall":
            # Nothing more is sent; wait for the client to close, or for stop().
            client.settimeout(0.5)
            while not self._stopping.is_set():
                try:
                    if client.recv(65536) == b"":
                        return
                except socket.timeout:
                    continue
                except OSError:
                    return
            return
        if self.mode == "reset":
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\1\0\0\0\0\0\0\0")
        else:
            with contextlib.suppress(OSError):
                client.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            up.shutdown(socket.SHUT_RDWR)


class _Buf:
    """Buffered reads from a socket: HTTP heads, lines, exact byte counts."""

    def __init__(self, sock):
        self.sock = sock
        self.buf = b""

    def _fill(self) -> bool:
        data = self.sock.recv(1 << 16)
        if not data:
            return False
        self.buf += data
        return True

    def read_head(self):
        while b"\r\n\r\n" not in self.buf:
            if self.buf[:1] == b"\x16":
                # A TLS ClientHello (skopeo tries https first, then http): hang up at once,
                # as docker-registry's plain HTTP server does, rather than wait for a head.
                raise ConnectionError("TLS on a plain HTTP port")
            if len(self.buf) > 1 << 20:
                raise ValueError("HTTP head too long")
            if not self._fill():
                if self.buf:
                    raise ConnectionError("connection closed inside a head")
                return None
        i = self.buf.index(b"\r\n\r\n") + 4
        head, self.buf = self.buf[:i], self.buf[i:]
        return head

    def read_line(self) -> bytes:
        while b"\n" not in self.buf:
            if not self._fill():
                raise ConnectionError("connection closed inside a line")
        i = self.buf.index(b"\n") + 1
        line, self.buf = self.buf[:i], self.buf[i:]
        return line

    def read_exact(self, n) -> bytes:
        return b"".join(self.iter_exact(n))

    def iter_exact(self, n):
        while n > 0:
            if not self.buf and not self._fill():
                raise ConnectionError("connection closed inside a body")
            chunk, self.buf = self.buf[:n], self.buf[n:]
            n -= len(chunk)
            yield chunk

    def iter_until_close(self):
        while True:
            if self.buf:
                chunk, self.buf = self.buf, b""
                yield chunk
            if not self._fill():
                return


def _parse_head(head: bytes):
    lines = head.decode("latin-1").split("\r\n")
    headers = []
    for line in lines[1:]:
        if not line:
            continue
        k, _, v = line.partition(":")
        headers.append((k.strip(), v.strip()))
    return lines[0], headers


def _build_head(first_line, headers) -> bytes:
    return (first_line + "\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers) +
            "\r\n").encode("latin-1")


# ----------------------------------------------------------------------------- the CLI

# name -> (builder, layout tag, repo, repo tag, skopeo --format)
PUSHES = {
    "busybox": [("busybox", "latest", "berth-test/busybox", "latest", None),
                ("busybox-v2s2", "latest", "berth-test/busybox", "v2s2", "v2s2"),
                ("busybox-zstd", "zstd", "berth-test/busybox", "zstd", None),
                ("busybox-entrypoint", "alice-entrypoint", "berth-test/busybox",
                 "alice-entrypoint", None)],
    "debian": [("debian", "latest", "berth-test/debian", "layered", None),
               ("debian-zstd", "zstd", "berth-test/debian", "zstd", None),
               ("debian-unterminated", "unterminated", "berth-test/debian", "unterminated",
                None)],
    "index": [("index", "latest", "berth-test/multiarch", "latest", None),
              ("index-v2s2", "latest", "berth-test/multiarch", "v2s2", "v2s2")],
}


def _image_names(arg):
    names = [n.strip() for n in arg.split(",") if n.strip()]
    bad = [n for n in names if n not in BUILDERS]
    if bad:
        raise SystemExit(f"unknown image(s) {bad}; known: {sorted(BUILDERS)}")
    return names


def cmd_up(args):
    workdir = Path(args.workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    names = _image_names(args.images)
    built = {n: BUILDERS[n](cache_dir=args.cache) for n in names}
    reg = Registry(workdir / "registry", auth=args.auth)
    stop = threading.Event()

    def on_signal(*_):
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    proxy = None
    try:
        images = {}
        for n in names:
            b = built[n]
            for name, tag, repo, repo_tag, fmt in PUSHES[n]:
                digest = push_oci_layout(b.layout, tag, reg, repo, repo_tag, format=fmt)
                images[name] = {"ref": reg.ref(repo, repo_tag),
                                "by_digest": reg.ref(repo, digest), "digest": digest,
                                "repo": repo, "tag": repo_tag, "listing": b.tags[tag]["listing"],
                                "layout": str(b.layout), "layout_tag": tag,
                                "format": fmt or "oci"}
        out = {"host": reg.host, "pid": os.getpid(), "registry_pid": reg.pid,
               "auth": reg.auth, "credentials": list(reg.credentials or []) or None,
               "docker_config": None, "log": str(reg.log_path), "storage": str(reg.root),
               "token_realm": reg.token_server.realm if reg.token_server else None,
               "images": images}
        if reg.credentials:
            out["docker_config"] = str(reg.write_docker_config(workdir / "docker/config.json"))
        if args.proxy_cut:
            n, _, times = args.proxy_cut.partition(":")
            proxy = CuttingProxy(reg.host, int(n), int(times or 1),
                                 log_path=workdir / "proxy.jsonl")
            out["proxy"] = {"host": proxy.host, "cut_after_bytes": int(n),
                            "cut_times": int(times or 1), "records": str(proxy.log_path)}
        print(json.dumps(out), flush=True)
        while not stop.wait(0.5):
            if reg.proc.poll() is not None:
                print(f"fixture: docker-registry exited ({reg.proc.returncode}); see "
                      f"{reg.log_path}", file=sys.stderr)
                return 1
        return 0
    finally:
        if proxy:
            proxy.stop()
        reg.stop()


def cmd_build_images(args):
    out_dir = Path(args.out).resolve() if args.out else None
    result = {}
    for n in _image_names(args.images):
        t0 = time.monotonic()
        b = BUILDERS[n](dir=out_dir / n if out_dir else None, cache_dir=args.cache)
        listings = {}
        for tag, v in b.tags.items():
            src = Path(v["listing"])
            if out_dir:
                dest = out_dir / f"{n}.{tag}.listing.tsv"
                shutil.copy(src, dest)
                src = dest
            listings[tag] = str(src)
        result[n] = {"layout": str(b.layout), "tag": b.tag, "digest": b.digest,
                     "tags": {t: {"digest": v["digest"], "media_type": v["media_type"],
                                  "listing": listings[t]} for t, v in b.tags.items()},
                     "seconds": round(time.monotonic() - t0, 2)}
    print(json.dumps(result), flush=True)
    return 0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="start a registry, push images, print one JSON line, "
                                   "stay until killed (SIGTERM/SIGINT)")
    up.add_argument("--workdir", required=True)
    up.add_argument("--auth", choices=["none", "basic", "token"], default="none")
    up.add_argument("--images", default="busybox,debian,index")
    up.add_argument("--proxy-cut", metavar="BYTES[:TIMES]",
                    help="also start a CuttingProxy in front of the registry")
    up.add_argument("--cache", help="image cache dir (default: BERTH_TEST_CACHE or "
                                    "/var/cache/berth-tests)")
    b = sub.add_parser("build-images", help="build (or take from the cache) the layouts")
    b.add_argument("--out", help="copy the layouts and listings here (default: only the "
                                 "cache)")
    b.add_argument("--images", default="busybox,debian,index")
    b.add_argument("--cache")
    args = p.parse_args(argv)
    return {"up": cmd_up, "build-images": cmd_build_images}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
