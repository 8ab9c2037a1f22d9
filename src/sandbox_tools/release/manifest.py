"""The version manifest and SHA256SUMS, both generated from the same artifact records.

The manifest is the one statement of which artifacts are valid for (version, platform):
exactly one runtime per platform and at most one optional add-on of each kind (the
browser add-on), each with name, format, size, SHA-256, build id and mirror URLs.
SHA256SUMS says the same in `sha256sum` format (sorted by name, two spaces), so that
`sha256sum -c SHA256SUMS` works in dist/.

In the JSON the runtimes stay in `artifacts`, as before add-ons existed, and the add-ons
go in a list of their own, `addons`, written only when there is one: a reader of
schema 1 that knows nothing of add-ons sees the runtimes exactly as before (it would
take a tar.xz in `artifacts` for a runtime), and a release without add-ons writes the
same bytes as it always did.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any

from sandbox_tools.artifacts import (
    Artifact,
    ArtifactFormat,
    ArtifactKind,
    atomic_write,
    file_digest,
)
from sandbox_tools.errors import ConfigurationError

MANIFEST_SCHEMA = 1
MANIFEST_FILE = "manifest.json"
SUMS_FILE = "SHA256SUMS"
# The released manifest is committed here after `tools release` and ships in the package,
# so git-ref installs know which bytes to fetch and wheels know which bytes they carry.
PUBLISHED_DIR = "published"
ADDONS_KEY = "addons"  # the JSON list of add-ons, beside `artifacts` (the runtimes)


def kind_label(kind: ArtifactKind) -> str:
    """How messages name an artifact of this kind."""
    return "browser add-on" if kind is ArtifactKind.BROWSER else "artifact"


@dataclass(frozen=True, kw_only=True)
class Manifest:
    """A release: `artifacts` holds every record, runtimes and add-ons alike, at most one
    per (platform, kind); `runtimes` and `addons` are the two queries most callers want."""

    version: str
    artifacts: tuple[Artifact, ...] = field(default=())

    def __post_init__(self) -> None:
        keys = [(a.kind, a.platform) for a in self.artifacts]
        for kind in ArtifactKind:
            duplicates = sorted({p for k, p in keys if k is kind and keys.count((k, p)) > 1})
            if duplicates:
                raise ConfigurationError(
                    f"the manifest lists more than one {kind_label(kind)} for "
                    f"{', '.join(duplicates)}",
                    remedy="Exactly one artifact of each kind is valid per version and platform.",
                )

    @property
    def runtimes(self) -> tuple[Artifact, ...]:
        return self.of_kind(ArtifactKind.RUNTIME)

    @property
    def addons(self) -> tuple[Artifact, ...]:
        return tuple(a for a in self.artifacts if a.kind is not ArtifactKind.RUNTIME)

    def of_kind(self, kind: ArtifactKind) -> tuple[Artifact, ...]:
        return tuple(a for a in self.artifacts if a.kind is kind)

    def find(self, platform: str, kind: ArtifactKind = ArtifactKind.RUNTIME) -> Artifact | None:
        """The artifact of `kind` for `platform`, or None when the release has none."""
        return next((a for a in self.of_kind(kind) if a.platform == platform), None)

    def for_platform(self, platform: str, kind: ArtifactKind = ArtifactKind.RUNTIME) -> Artifact:
        """The artifact of `kind` for `platform`; a ConfigurationError naming what there is."""
        found = self.find(platform, kind)
        if found is not None:
            return found
        there = ", ".join(a.platform for a in self.of_kind(kind)) or "none"
        if kind is ArtifactKind.RUNTIME:
            raise ConfigurationError(
                f"sandbox-tools {self.version} has no artifact for {platform} (supported: {there})"
            )
        raise ConfigurationError(
            f"sandbox-tools {self.version} carries no {kind_label(kind)} for {platform} "
            f"(it carries one for: {there})"
        )

    def only(self, chosen: Iterable[Artifact]) -> Manifest:
        """This release restricted to `chosen` (what a bundle or a wheel holds)."""
        names = {a.name for a in chosen}
        return replace(self, artifacts=tuple(a for a in self.artifacts if a.name in names))

    def to_json(self) -> dict[str, Any]:
        def ordered(items: Iterable[Artifact]) -> list[dict[str, Any]]:
            return [a.to_json(urls=True) for a in sorted(items, key=_canonical)]

        document: dict[str, Any] = {
            "schema": MANIFEST_SCHEMA,
            "version": self.version,
            "artifacts": ordered(self.runtimes),
        }
        if self.addons:  # absent without add-ons: the same bytes as before add-ons existed
            document[ADDONS_KEY] = ordered(self.addons)
        return document

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=2, sort_keys=True) + "\n"

    @classmethod
    def loads(cls, text: str) -> Manifest:
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError(f"expected a JSON object, found {type(data).__name__}")
        if data.get("schema") != MANIFEST_SCHEMA:
            raise ConfigurationError(f"unsupported manifest schema {data.get('schema')!r}")

        if "version" not in data:
            raise ValueError("the manifest has no 'version'")
        return cls(
            version=str(data["version"]),
            artifacts=(*_runtime_entries(data), *_addon_entries(data)),
        )


def _canonical(artifact: Artifact) -> tuple[bool, str, str]:
    """Runtimes first, then add-ons by kind; by platform within each."""
    kind = artifact.kind
    return (kind is not ArtifactKind.RUNTIME, kind.value, artifact.platform)


def _entries(data: dict[str, Any], key: str) -> list[Any]:
    entries = data.get(key, [])
    if not isinstance(entries, list):
        raise ValueError(f"{key!r} must be a list of objects")
    return entries


def _runtime_entries(data: dict[str, Any]) -> list[Artifact]:
    found = []
    for n, entry in enumerate(_entries(data, "artifacts"), 1):
        artifact = Artifact.from_json(entry, f"artifact {n}")
        if artifact.kind is not ArtifactKind.RUNTIME:
            raise ValueError(
                f"artifact {n} is a {kind_label(artifact.kind)}: add-ons belong in "
                f"{ADDONS_KEY!r} (a reader without add-ons would take it for a runtime)"
            )
        found.append(artifact)
    return found


def _addon_entries(data: dict[str, Any]) -> list[Artifact]:
    known = {k.value for k in ArtifactKind}
    found = []
    for n, entry in enumerate(_entries(data, ADDONS_KEY), 1):
        where = f"add-on {n}"
        if isinstance(entry, dict) and "kind" not in entry:
            raise ValueError(f"{where} has no 'kind'")
        if isinstance(entry, dict) and str(entry["kind"]) not in known:
            continue  # an add-on of a later version, of a kind this one cannot use
        artifact = Artifact.from_json(entry, where)
        if artifact.kind is ArtifactKind.RUNTIME:
            raise ValueError(f"{where} is a runtime: runtimes belong in 'artifacts'")
        found.append(artifact)
    return found


def read_manifest(path: Path) -> Manifest:
    """A manifest from a file; every way it can be wrong is a ConfigurationError naming it."""
    try:
        return Manifest.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigurationError(
            f"no manifest at {path}",
            remedy="`tools release` writes the manifest (as dist/manifest.json) once a release "
            "is made, and `tools manifest write` from a build's records; give the path of "
            "one you have.",
        ) from None
    except IsADirectoryError:
        raise ConfigurationError(f"{path} is a directory; give the manifest file") from None
    except OSError as exc:
        raise ConfigurationError(f"cannot read {path}: {exc.strerror or exc}") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigurationError(f"{path} is not a valid manifest: {exc}") from None


def packaged_manifest() -> Manifest | None:
    """The manifest this installation was released with, or None (an unreleased checkout)."""
    resource = resources.files("sandbox_tools.release") / PUBLISHED_DIR / MANIFEST_FILE
    if not resource.is_file():
        return None
    return Manifest.loads(resource.read_text())


def published_dir() -> Path:
    """Where `tools release` writes the manifest to commit (the checkout's package dir)."""
    return Path(__file__).resolve().parent / PUBLISHED_DIR


def manifest_from_records(
    version: str, records: Iterable[Artifact], mirrors: Iterable[str] = ()
) -> Manifest:
    """One runtime per platform, the default format's record (portable), and the optional
    browser add-on of each platform that has one."""
    mirror_list = [m.rstrip("/") for m in mirrors]
    chosen = [
        r
        for r in records
        if (r.kind is ArtifactKind.RUNTIME and r.format is ArtifactFormat.PORTABLE)
        or r.kind is ArtifactKind.BROWSER
    ]
    return Manifest(
        version=version,
        artifacts=tuple(
            replace(
                r,
                tool_versions={},
                urls=tuple(f"{m}/{r.name}" for m in mirror_list),
                path=None,
                provenance=None,
            )
            for r in sorted(chosen, key=_canonical)
        ),
    )


def sha256sums(manifest: Manifest) -> str:
    """`sha256sum -c` format, one line per artifact, sorted by file name."""
    lines = [f"{a.sha256}  {a.name}" for a in sorted(manifest.artifacts, key=lambda a: a.name)]
    return "".join(line + "\n" for line in lines)


def write_release_files(directory: Path, manifest: Manifest) -> tuple[Path, Path]:
    """Write manifest.json and SHA256SUMS, each whole or not at all."""
    paths = []
    for name, text in ((MANIFEST_FILE, manifest.dumps()), (SUMS_FILE, sha256sums(manifest))):
        atomic_write(directory / name, text)
        paths.append(directory / name)
    return paths[0], paths[1]


def verify_local(directory: Path, manifest: Manifest) -> list[str]:
    """Problems with the local copies of the manifest's artifacts; empty when all match."""
    problems = []
    for artifact in manifest.artifacts:
        path = directory / artifact.name
        if not path.is_file():
            problems.append(f"{artifact.name}: missing in {directory}")
        elif path.stat().st_size != artifact.size:
            problems.append(
                f"{artifact.name}: {path.stat().st_size} bytes, manifest says {artifact.size}"
            )
        elif not artifact.matches(path):
            problems.append(
                f"{artifact.name}: sha256 {file_digest(path)}, manifest says {artifact.sha256}"
            )
    return problems
