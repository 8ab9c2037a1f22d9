"""The pin refresh against a registry on loopback that speaks the distribution API with
anonymous bearer tokens, as Docker Hub does: the command a maintainer runs, as written
in its docstring, with `--registry-url` pointing at the stand-in."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from sandbox_tools.distro_matrix.matrix import load_matrix

DIGESTS = {"library/debian:12": "sha256:" + "1" * 64, "library/alpine:3.18": "sha256:" + "2" * 64}
TOKEN = "anonymous-pull-token"


class _Registry(BaseHTTPRequestHandler):
    seen: list[str] = []

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        if self.path.startswith("/token?"):
            body = json.dumps({"token": TOKEN}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self.send_error(404)

    def do_HEAD(self) -> None:
        self.seen.append(self.path)
        if self.headers.get("Authorization") != f"Bearer {TOKEN}":
            host = f"http://127.0.0.1:{self.server.server_address[1]}"
            self.send_response(401)
            self.send_header(
                "WWW-Authenticate",
                f'Bearer realm="{host}/token",service="stand-in",scope="repository:x:pull"',
            )
            self.end_headers()
            return
        _, _, rest = self.path.partition("/v2/")
        repository, _, tag = rest.partition("/manifests/")
        digest = DIGESTS.get(f"{repository}:{tag}")
        self.send_response(200 if digest else 404)
        if digest:
            self.send_header("Docker-Content-Digest", digest)
        self.end_headers()


@pytest.fixture
def registry() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Registry)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


ROWS = """[[distro]]
name = "debian-12"
registry = "debian:12"

[[distro]]
name = "alpine-3.18"
registry = "alpine:3.18"
"""


def refresh(matrix: Path, registry: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "sandbox_tools.distro_matrix.pins", "--refresh"]
    command += ["--matrix", str(matrix), "--registry-url", registry]
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


def test_refreshing_pins_asks_the_registry_with_a_token_and_rewrites_the_matrix(
    registry: str, tmp_path: Path
) -> None:
    matrix = tmp_path / "matrix.toml"
    matrix.write_text(ROWS)
    done = refresh(matrix, registry)
    assert done.returncode == 0, done.stderr
    assert "2 pin(s) changed" in done.stdout
    pulled = {d.name: d.pull_reference for d in load_matrix(matrix.read_text()).distros}
    assert pulled == {
        "debian-12": f"debian:12@{DIGESTS['library/debian:12']}",
        "alpine-3.18": f"alpine:3.18@{DIGESTS['library/alpine:3.18']}",
    }


def test_a_tag_the_registry_does_not_know_changes_nothing_and_says_which(
    registry: str, tmp_path: Path
) -> None:
    matrix = tmp_path / "matrix.toml"
    matrix.write_text(ROWS.replace("alpine:3.18", "alpine:9.99"))
    done = refresh(matrix, registry)
    assert done.returncode == 2
    assert "library/alpine/manifests/9.99" in done.stderr and "404" in done.stderr
    assert "Traceback" not in done.stderr
    assert matrix.read_text() == ROWS.replace("alpine:3.18", "alpine:9.99")  # untouched


def test_a_registry_that_does_not_answer_is_one_line(tmp_path: Path) -> None:
    matrix = tmp_path / "matrix.toml"
    matrix.write_text(ROWS)
    done = refresh(matrix, "http://127.0.0.1:9")  # discard port: nothing listens
    assert done.returncode == 2
    assert "no answer" in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
