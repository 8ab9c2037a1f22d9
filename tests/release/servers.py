"""Real HTTP servers on 127.0.0.1 for the release and fetch tests.

- moto's S3 in server mode, spoken to by real boto3.
- `GitHubReleasesServer`: the GitHub REST endpoints `tools release` and `tools fetch` call,
  with GitHub's behaviour where it matters (an upload cut off mid-way leaves a "starter"
  asset, a second asset of the same name is a 422, API downloads redirect to a public
  URL that honours Range, a tag is a git ref that exists only once pushed, and a release
  that becomes public without its tag makes GitHub create the tag at the default
  branch's head).
- `FaultProxy`: a forwarding proxy that can stall a request (so a test can kill the
  client at an exact point), cut a response short, or flip a byte of one.
- `ShortFileServer`: a mirror whose file is complete and short (a wrong size, not a cut).
- `SilentServer`, `refused_url`: mirrors that accept and never answer, or refuse.
- `python -m tests.release.servers github --token T`: the GitHub stand-in on its own
  (scripts/release_rehearsal.sh), with POST git/refs to push a tag.

Faults are switched on by tests; untouched, every server behaves like the real thing.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import re
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse

HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
    "expect",
    "proxy-connection",
}


def read_body(handler: BaseHTTPRequestHandler) -> bytes:
    if handler.headers.get("Transfer-Encoding", "").lower() == "chunked":
        body = bytearray()
        while True:
            size = int(handler.rfile.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while handler.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass
                return bytes(body)
            body += handler.rfile.read(size)
            handler.rfile.readline()
    length = int(handler.headers.get("Content-Length") or 0)
    return handler.rfile.read(length) if length else b""


def byte_range(header: str | None, size: int) -> tuple[int, int] | None:
    match = re.fullmatch(r"bytes=(\d+)-(\d*)", header or "")
    if not match:
        return None
    start = int(match.group(1))
    end = int(match.group(2)) if match.group(2) else size - 1
    return start, min(end, size - 1)


@dataclass
class Faults:
    """Switches shared by the servers; all off by default."""

    hold_after: int | None = None  # let this many matching uploads through, then stall
    held: threading.Event = field(default_factory=threading.Event)
    release_hold: threading.Event = field(default_factory=threading.Event)
    uploads: int = 0
    truncate: dict[str, list[int]] = field(default_factory=dict)  # name -> byte counts, once each
    corrupt: set[str] = field(default_factory=set)  # names whose downloads get a flipped byte
    log: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def stall_upload(self) -> bool:
        with self.lock:
            if self.hold_after is not None and self.uploads >= self.hold_after:
                self.held.set()
                return True
            self.uploads += 1
            return False

    def shape_download(self, name: str, data: bytes) -> tuple[bytes, bool]:
        """(bytes to send, cut the connection after them)."""
        if name in self.corrupt and data:
            data = bytes([data[0] ^ 0xFF]) + data[1:]
        with self.lock:
            cuts = self.truncate.get(name)
            if cuts:
                return data[: cuts.pop(0)], True
        return data, False


def send_payload(
    handler: BaseHTTPRequestHandler, data: bytes, faults: Faults, name: str, content_type: str
) -> None:
    """200 or 206 with Range, shaped by the faults (the headers always promise it all)."""
    size = len(data)
    wanted = byte_range(handler.headers.get("Range"), size)
    if wanted is not None and wanted[0] >= size:
        handler.send_response(416)
        handler.send_header("Content-Range", f"bytes */{size}")
        handler.send_header("Content-Length", "0")
        handler.end_headers()
        return
    start, end = wanted if wanted else (0, size - 1)
    body, cut = faults.shape_download(name, data[start : end + 1])
    handler.send_response(206 if wanted else 200)
    if wanted:
        handler.send_header("Content-Range", f"bytes {start}-{end}/{size}")
    handler.send_header("Accept-Ranges", "bytes")
    handler.send_header("Content-Type", content_type)
    handler.send_header("Content-Length", str(end - start + 1))
    if cut:
        handler.send_header("Connection", "close")
    handler.end_headers()
    handler.wfile.write(body)
    if cut:
        handler.wfile.flush()
        handler.close_connection = True


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


class _Running:
    def __init__(
        self, handler: type[BaseHTTPRequestHandler], faults: Faults, port: int = 0
    ) -> None:
        self.faults = faults
        self.httpd = _Server(("127.0.0.1", port), handler)
        self.httpd.owner = self  # type: ignore[attr-defined]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        port = self.httpd.server_address[1]
        return f"http://127.0.0.1:{port}"

    def stop(self) -> None:
        self.faults.release_hold.set()
        self.httpd.shutdown()
        self.httpd.server_close()


# -- GitHub releases ----------------------------------------------------------------------


@dataclass
class Asset:
    id: int
    release_id: int
    name: str
    state: str = "starter"
    data: bytes = b""


DEFAULT_BRANCH_HEAD = "d" * 40  # the commit GitHub tags when a release creates its tag


class GitHubReleasesServer(_Running):
    def __init__(self, token: str = "test-token", port: int = 0) -> None:
        self.token = token
        self.releases: dict[int, dict[str, Any]] = {}
        self.assets: dict[int, Asset] = {}
        self.tags: dict[tuple[str, str], str] = {}  # (owner/name, tag) -> commit
        # Tags GitHub made itself because a release was published (or created public)
        # for a tag that did not exist: on github.com they point at whatever the default
        # branch's head was, which `tools release` must never cause.
        self.tags_made_by_releases: list[tuple[str, str]] = []
        self._ids = iter(range(1000, 10**9))
        self.state_lock = threading.Lock()
        super().__init__(_GitHubHandler, Faults(), port)

    def next_id(self) -> int:
        with self.state_lock:
            return next(self._ids)

    def release_json(self, release: dict[str, Any]) -> dict[str, Any]:
        owner_repo = release["repo"]
        return {
            "id": release["id"],
            "tag_name": release["tag"],
            "name": release["name"],
            "draft": release.get("draft", False),
            "prerelease": False,
            "html_url": f"{self.url}/{owner_repo}/releases/tag/{release['tag']}",
            "upload_url": f"{self.url}/uploads/repos/{owner_repo}/releases/{release['id']}"
            "/assets{?name,label}",
        }

    def asset_json(self, asset: Asset) -> dict[str, Any]:
        release = self.releases[asset.release_id]
        return {
            "id": asset.id,
            "name": asset.name,
            "state": asset.state,
            "size": len(asset.data),
            "url": f"{self.url}/repos/{release['repo']}/releases/assets/{asset.id}",
            "browser_download_url": f"{self.url}/{release['repo']}/releases/download/"
            f"{release['tag']}/{asset.name}",
        }

    def push_tag(self, repo: str, tag: str, commit: str = "c" * 40) -> None:
        """What `git push origin <tag>` does to the repository."""
        self.tags[(repo, tag)] = commit

    def made_public(self, release: dict[str, Any], target: str | None = None) -> None:
        """A release stops being a draft: as on GitHub, a missing tag is created at
        `target` (target_commitish), else at the default branch's head."""
        key = (release["repo"], release["tag"])
        if key not in self.tags:
            self.tags[key] = target if target and len(target) == 40 else DEFAULT_BRANCH_HEAD
            self.tags_made_by_releases.append(key)

    def uploaded(self, tag: str) -> dict[str, bytes]:
        """Complete assets of the release for `tag`, by name."""
        return {
            a.name: a.data
            for a in self.assets.values()
            if a.state == "uploaded" and self.releases[a.release_id]["tag"] == tag
        }

    def published(self, tag: str) -> bool:
        """Whether a release for `tag` exists and is no longer a draft."""
        return any(r["tag"] == tag and not r.get("draft") for r in self.releases.values())


class _Handler(BaseHTTPRequestHandler):
    """HTTP/1.1 (keep-alive, Range, 100-continue) and a request log instead of stderr."""

    protocol_version = "HTTP/1.1"
    server: _Server

    @property
    def running(self) -> _Running:
        owner = self.server.owner  # type: ignore[attr-defined]
        assert isinstance(owner, _Running)
        return owner

    def log_message(self, format: str, *args: Any) -> None:
        line = f"{self.command} {self.path} {self.headers.get('Range', '')}"
        self.running.faults.log.append(line)


class _GitHubHandler(_Handler):
    @property
    def gh(self) -> GitHubReleasesServer:
        assert isinstance(self.running, GitHubReleasesServer)
        return self.running

    def _json(self, status: int, document: Any) -> None:
        body = json.dumps(document).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _authorised(self) -> bool:
        if self.headers.get("Authorization") == f"Bearer {self.gh.token}":
            return True
        read_body(self)
        self._json(401, {"message": "Bad credentials"})
        return False

    def _route(self, method: str) -> Callable[..., None] | None:
        routes: list[tuple[str, str, Callable[..., None]]] = [
            ("GET", r"/repos/([^/]+/[^/]+)/releases/tags/([^/]+)", self.get_release_by_tag),
            ("GET", r"/repos/([^/]+/[^/]+)/git/ref/tags/(.+)", self.get_tag_ref),
            ("POST", r"/repos/([^/]+/[^/]+)/git/refs", self.create_ref),
            ("POST", r"/repos/([^/]+/[^/]+)/releases", self.create_release),
            ("GET", r"/repos/([^/]+/[^/]+)/releases", self.list_releases),
            ("PATCH", r"/repos/([^/]+/[^/]+)/releases/(\d+)", self.update_release),
            ("GET", r"/repos/([^/]+/[^/]+)/releases/(\d+)/assets", self.list_assets),
            ("GET", r"/repos/([^/]+/[^/]+)/releases/assets/(\d+)", self.get_asset),
            ("DELETE", r"/repos/([^/]+/[^/]+)/releases/assets/(\d+)", self.delete_asset),
            ("POST", r"/uploads/repos/([^/]+/[^/]+)/releases/(\d+)/assets", self.upload_asset),
            ("GET", r"/([^/]+/[^/]+)/releases/download/([^/]+)/([^/]+)", self.download),
            ("GET", r"/signed/(\d+)", self.signed_download),
        ]
        path = urlparse(self.path).path
        for verb, pattern, handler in routes:
            match = re.fullmatch(pattern, path)
            if verb == method and match:
                return lambda: handler(*match.groups())
        return None

    def _dispatch(self, method: str) -> None:
        handler = self._route(method)
        if handler is None:
            read_body(self)
            self._json(404, {"message": "Not Found"})
            return
        handler()

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def do_PATCH(self) -> None:
        self._dispatch("PATCH")

    # -- endpoints

    def get_release_by_tag(self, repo: str, tag: str) -> None:
        if not self._authorised():
            return
        for release in self.gh.releases.values():
            # As on GitHub: a draft has no tag yet, so it is not found by one.
            if release["repo"] == repo and release["tag"] == tag and not release.get("draft"):
                self._json(200, self.gh.release_json(release))
                return
        self._json(404, {"message": "Not Found"})

    def get_tag_ref(self, repo: str, tag: str) -> None:
        """GET /repos/{owner}/{repo}/git/ref/tags/{tag}: the ref, or 404 (an exact match,
        unlike the plural git/refs, which lists refs by prefix)."""
        if not self._authorised():
            return
        tag = unquote(tag)
        commit = self.gh.tags.get((repo, tag))
        if commit is None:
            self._json(404, {"message": "Not Found", "status": "404"})
            return
        base = f"{self.gh.url}/repos/{repo}/git"
        self._json(
            200,
            {
                "ref": f"refs/tags/{tag}",
                "url": f"{base}/refs/tags/{tag}",
                "object": {"sha": commit, "type": "commit", "url": f"{base}/commits/{commit}"},
            },
        )

    def create_ref(self, repo: str) -> None:
        """POST /repos/{owner}/{repo}/git/refs: a tag pushed (what `git push origin TAG`
        does), for a process that cannot call `push_tag` (the release rehearsal)."""
        if not self._authorised():
            return
        request = json.loads(read_body(self) or b"{}")
        ref, sha = str(request.get("ref", "")), str(request.get("sha", ""))
        if not ref.startswith("refs/tags/") or not re.fullmatch(r"[0-9a-f]{40}", sha):
            self._json(422, {"message": "Validation Failed"})
            return
        tag = ref.removeprefix("refs/tags/")
        if (repo, tag) in self.gh.tags:
            self._json(422, {"message": "Reference already exists"})
            return
        self.gh.push_tag(repo, tag, sha)
        base = f"{self.gh.url}/repos/{repo}/git"
        self._json(
            201,
            {
                "ref": ref,
                "url": f"{base}/refs/tags/{tag}",
                "object": {"sha": sha, "type": "commit", "url": f"{base}/commits/{sha}"},
            },
        )

    def list_releases(self, repo: str) -> None:
        if not self._authorised():
            return
        mine = [self.gh.release_json(r) for r in self.gh.releases.values() if r["repo"] == repo]
        self._json(200, mine)

    def update_release(self, repo: str, release_id: str) -> None:
        if not self._authorised():
            return
        request = json.loads(read_body(self))
        release = self.gh.releases.get(int(release_id))
        if release is None or release["repo"] != repo:
            self._json(404, {"message": "Not Found"})
            return
        if "draft" in request:
            if release.get("draft") and not request["draft"]:
                self.gh.made_public(release, request.get("target_commitish"))
            release["draft"] = bool(request["draft"])
        self._json(200, self.gh.release_json(release))

    def create_release(self, repo: str) -> None:
        if not self._authorised():
            return
        request = json.loads(read_body(self))
        if any(
            r["repo"] == repo and r["tag"] == request["tag_name"] for r in self.gh.releases.values()
        ):
            self._json(
                422, {"message": "Validation Failed", "errors": [{"code": "already_exists"}]}
            )
            return
        release = {
            "id": self.gh.next_id(),
            "repo": repo,
            "tag": request["tag_name"],
            "name": request.get("name") or request["tag_name"],
            "draft": bool(request.get("draft", False)),
        }
        if not release["draft"]:
            self.gh.made_public(release, request.get("target_commitish"))
        self.gh.releases[release["id"]] = release
        self._json(201, self.gh.release_json(release))

    def list_assets(self, repo: str, release_id: str) -> None:
        if not self._authorised():
            return
        query = parse_qs(urlparse(self.path).query)
        per_page = int(query.get("per_page", ["30"])[0])
        page = int(query.get("page", ["1"])[0])
        mine = [a for a in self.gh.assets.values() if a.release_id == int(release_id)]
        window = mine[(page - 1) * per_page : page * per_page]
        self._json(200, [self.gh.asset_json(a) for a in window])

    def get_asset(self, repo: str, asset_id: str) -> None:
        if not self._authorised():
            return
        asset = self.gh.assets.get(int(asset_id))
        if asset is None:
            self._json(404, {"message": "Not Found"})
        elif self.headers.get("Accept") == "application/octet-stream":
            # As GitHub does: a short-lived signed URL, which serves drafts' assets too.
            self.send_response(302)
            self.send_header("Location", f"{self.gh.url}/signed/{asset.id}")
            self.send_header("Content-Length", "0")
            self.end_headers()
        else:
            self._json(200, self.gh.asset_json(asset))

    def delete_asset(self, repo: str, asset_id: str) -> None:
        if not self._authorised():
            return
        if self.gh.assets.pop(int(asset_id), None) is None:
            self._json(404, {"message": "Not Found"})
            return
        self.send_response(204)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def upload_asset(self, repo: str, release_id: str) -> None:
        if not self._authorised():
            return
        name = parse_qs(urlparse(self.path).query)["name"][0]
        if any(a.release_id == int(release_id) and a.name == name for a in self.gh.assets.values()):
            read_body(self)
            self._json(
                422,
                {
                    "message": "Validation Failed",
                    "errors": [{"resource": "ReleaseAsset", "code": "already_exists"}],
                },
            )
            return
        asset = Asset(id=self.gh.next_id(), release_id=int(release_id), name=name)
        self.gh.assets[asset.id] = asset  # visible as "starter" while the bytes arrive
        if self.gh.faults.stall_upload():
            self.gh.faults.release_hold.wait()
            self.close_connection = True
            return
        expected = int(self.headers["Content-Length"])
        data = self.rfile.read(expected)
        if len(data) != expected:
            self.close_connection = True  # the client went away: the asset stays "starter"
            return
        asset.data, asset.state = data, "uploaded"
        self._json(201, self.gh.asset_json(asset))

    def signed_download(self, asset_id: str) -> None:
        asset = self.gh.assets.get(int(asset_id))
        if asset is None or asset.state != "uploaded":
            self._json(404, {"message": "Not Found"})
            return
        send_payload(self, asset.data, self.gh.faults, asset.name, "application/octet-stream")

    def download(self, repo: str, tag: str, name: str) -> None:
        for asset in self.gh.assets.values():
            release = self.gh.releases[asset.release_id]
            wanted = (release["repo"], release["tag"], asset.name) == (repo, tag, name)
            if wanted and asset.state == "uploaded" and not release.get("draft"):
                send_payload(self, asset.data, self.gh.faults, name, "application/octet-stream")
                return
        self._json(404, {"message": "Not Found"})


# -- a forwarding proxy with faults (in front of moto's S3) --------------------------------


class FaultProxy(_Running):
    """Forwards to `upstream`; object PUTs count as uploads, GETs as downloads."""

    def __init__(self, upstream: str) -> None:
        self.upstream = urlparse(upstream)
        super().__init__(_ProxyHandler, Faults())


class _ProxyHandler(_Handler):
    @property
    def proxy(self) -> FaultProxy:
        assert isinstance(self.running, FaultProxy)
        return self.running

    def _forward(self) -> None:
        body = read_body(self)
        path = urlparse(self.path).path
        is_object = path.strip("/").count("/") >= 1
        faults = self.proxy.faults
        if self.command == "PUT" and is_object and faults.stall_upload():
            faults.release_hold.wait()
            self.close_connection = True
            return
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
        headers["Content-Length"] = str(len(body))
        upstream = http.client.HTTPConnection(
            self.proxy.upstream.hostname or "127.0.0.1", self.proxy.upstream.port, timeout=60
        )
        try:
            upstream.request(self.command, self.path, body=body, headers=headers)
            response = upstream.getresponse()
            data = response.read()
            reply_headers = [
                (k, v) for k, v in response.getheaders() if k.lower() not in HOP_BY_HOP
            ]
            status = response.status
        finally:
            upstream.close()
        name = path.rsplit("/", 1)[-1]
        cut = False
        if self.command == "GET" and status in (200, 206):
            data, cut = faults.shape_download(name, data)
        upstream_length = next(
            (v for k, v in reply_headers if k.lower() == "content-length"), str(len(data))
        )
        self.send_response(status)
        for key, value in reply_headers:
            if key.lower() not in ("content-length", "date", "server"):
                self.send_header(key, value)
        # HEAD and a cut-off GET promise what upstream promised; the rest send what they say.
        promised = upstream_length if self.command == "HEAD" or cut else str(len(data))
        self.send_header("Content-Length", promised)
        if cut:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _forward


# -- a mirror with a complete but short file ----------------------------------------------


class ShortFileServer(_Running):
    """Serves `size` bytes at every path, whole and well-formed (a Content-Length it keeps):
    a mirror holding a short, wrong file. `ranges`: honours Range (206, 416 past the end)
    or ignores it (always 200)."""

    def __init__(self, size: int = 1000, ranges: bool = True) -> None:
        self.data = b"s" * size
        self.ranges = ranges
        super().__init__(_ShortFileHandler, Faults())


class _ShortFileHandler(_Handler):
    def do_GET(self) -> None:
        owner = self.running
        assert isinstance(owner, ShortFileServer)
        if owner.ranges:
            send_payload(self, owner.data, owner.faults, self.path, "application/octet-stream")
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(owner.data)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(owner.data)
        self.close_connection = True


# -- mirrors that never answer ------------------------------------------------------------


class SilentServer:
    """Accepts every connection and never answers (a dead proxy, a half-open tunnel): the
    connections stay open until `stop`. Counts them."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.held: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    @property
    def connections(self) -> int:
        return len(self.held)

    def _serve(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                connection, _ = self.listener.accept()
                self.held.append(connection)

    def stop(self) -> None:
        self.listener.close()
        for connection in self.held:
            connection.close()


def refused_url() -> str:
    """A URL on a loopback port nobody listens on: connecting is refused at once."""
    with socket.create_server(("127.0.0.1", 0)) as probe:
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def hold_until(event: threading.Event, timeout: float) -> None:
    if not event.wait(timeout):
        raise AssertionError(f"the expected request did not arrive within {timeout}s")


# -- started on its own (scripts/release_rehearsal.sh) ------------------------------------


def main(argv: list[str] | None = None) -> None:
    """`python -m tests.release.servers github --token T [--port P]`: the GitHub stand-in on
    127.0.0.1 until stopped (SIGTERM, Ctrl-C); prints its URL once it listens."""
    import argparse
    import signal

    parser = argparse.ArgumentParser(prog="python -m tests.release.servers")
    parser.add_argument("server", choices=["github"])
    parser.add_argument("--token", required=True, help="the token API requests must carry")
    parser.add_argument("--port", type=int, default=0, help="default: any free port")
    args = parser.parse_args(argv)
    server = GitHubReleasesServer(token=args.token, port=args.port)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    print(server.url, flush=True)
    try:
        stop.wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()


if __name__ == "__main__":
    main()
