"""Registry rows of the matrix pinned by digest, and the command that refreshes the pins.

A floating tag (`debian:12`) names different bytes from one week to the next, so a
validation run would not say what it validated. Each registry row carries the digest of
the manifest its tag named when the pins were last refreshed; the Docker backend pulls
`<tag>@<digest>`. Refresh where registries answer (a maintainer's machine, a CI job):

    python -m sandbox_tools.distro_matrix.pins --refresh

It asks each registry's HTTP API (anonymous bearer tokens, as `docker pull` does) for
the digest of each tag and rewrites the `digest = ...` lines of matrix.toml, keeping
everything else as written. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sandbox_tools.artifacts import atomic_write
from sandbox_tools.errors import ConfigurationError

MATRIX_TOML = Path(__file__).with_name("matrix.toml")
DOCKER_HUB = "registry-1.docker.io"
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
TIMEOUT = 30.0
# A tag names an index (several platforms) or a single manifest; the index is what we pin.
ACCEPT = ", ".join(
    (
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.docker.distribution.manifest.v2+json",
    )
)


@dataclass(frozen=True)
class Reference:
    """`debian:12` -> registry-1.docker.io, library/debian, 12."""

    host: str
    repository: str
    tag: str

    @classmethod
    def parse(cls, image: str) -> Reference:
        name, _, tag = image.rpartition(":") if ":" in image.split("/")[-1] else (image, "", "")
        first, _, rest = name.partition("/")
        if rest and ("." in first or ":" in first or first == "localhost"):
            host, repository = first, rest
        else:
            host, repository = DOCKER_HUB, name if "/" in name else f"library/{name}"
        return cls(host, repository, tag or "latest")


Lookup = Callable[[Reference], str]


def registry_lookup(base_url: str | None = None, timeout: float = TIMEOUT) -> Lookup:
    """The digest a registry gives for a reference now. `base_url` sends every reference
    to one registry (a mirror, or a stand-in in tests) instead of its own host."""

    def lookup(ref: Reference) -> str:
        base = base_url or f"https://{ref.host}"
        url = f"{base}/v2/{ref.repository}/manifests/{ref.tag}"
        try:
            return _digest(url, None, timeout)
        except _Challenge as challenge:
            token = _token(challenge.header, ref, timeout)
            return _digest(url, token, timeout)

    return lookup


class _Challenge(Exception):
    def __init__(self, header: str) -> None:
        super().__init__(header)
        self.header = header


def _digest(url: str, token: str | None, timeout: float) -> str:
    request = urllib.request.Request(url, method="HEAD", headers={"Accept": ACCEPT})
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            digest = str(response.headers.get("Docker-Content-Digest", ""))
    except urllib.error.HTTPError as exc:
        challenge = exc.headers.get("WWW-Authenticate", "") if exc.headers else ""
        if exc.code == 401 and token is None and challenge.lower().startswith("bearer "):
            raise _Challenge(challenge) from None
        raise ConfigurationError(f"{url}: the registry answered {exc.code}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise ConfigurationError(f"{url}: no answer ({reason})") from None
    if not DIGEST.fullmatch(digest):
        raise ConfigurationError(f"{url}: no sha256 digest in the answer ({digest[:80]!r})")
    return digest


def _token(challenge: str, ref: Reference, timeout: float) -> str:
    fields = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
    realm = fields.get("realm", "")
    if not realm.startswith(("https://", "http://")):
        raise ConfigurationError(f"the registry of {ref.repository} asks for a token at {realm!r}")
    query = {"scope": fields.get("scope") or f"repository:{ref.repository}:pull"}
    if "service" in fields:
        query["service"] = fields["service"]
    url = f"{realm}?{urllib.parse.urlencode(query)}"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            document = json.loads(response.read(1 << 20))
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise ConfigurationError(f"{realm}: no anonymous token ({exc})") from None
    token = (
        document.get("token") or document.get("access_token")
        if isinstance(document, dict)
        else None
    )
    if not isinstance(token, str) or not token:
        raise ConfigurationError(f"{realm}: the answer has no token")
    return token


_ROW = re.compile(r"(?ms)^\[\[distro\]\]\n(?:(?!^\[\[).)*")
_REGISTRY = re.compile(r'(?m)^registry = "([^"]+)"\n')
_DIGEST_LINE = re.compile(r'(?m)^digest = "[^"]*"\n')


def repin(text: str, lookup: Lookup) -> tuple[str, list[str]]:
    """matrix.toml with every registry row's digest line set from `lookup`, and what
    changed; comments, order and every other line stay as written."""
    changes: list[str] = []

    def row(match: re.Match[str]) -> str:
        block = match.group(0)
        registry = _REGISTRY.search(block)
        if registry is None:
            return block
        digest = lookup(Reference.parse(registry.group(1)))
        old = _DIGEST_LINE.search(block)
        line = f'digest = "{digest}"\n'
        if old is not None:
            if old.group(0) != line:
                changes.append(f"{registry.group(1)}: {digest}")
            return block[: old.start()] + line + block[old.end() :]
        changes.append(f"{registry.group(1)}: {digest}")
        return block[: registry.end()] + line + block[registry.end() :]

    return _ROW.sub(row, text), changes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Pin the matrix's registry images by digest.")
    parser.add_argument("--refresh", action="store_true", required=True)
    parser.add_argument("--matrix", type=Path, default=MATRIX_TOML)
    parser.add_argument("--registry-url", help="ask this registry for every image (a mirror)")
    args = parser.parse_args(argv)
    try:
        text, changes = repin(args.matrix.read_text(), registry_lookup(args.registry_url))
    except ConfigurationError as exc:
        print(f"error: {exc.explained()}", file=sys.stderr)
        return 2
    atomic_write(args.matrix, text)
    for change in changes:
        print(f"pinned {change}")
    print(f"{len(changes)} pin(s) changed in {args.matrix}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
