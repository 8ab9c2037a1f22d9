"""The version manifest and SHA256SUMS, both generated from the same artifact records.

The manifest is the one statement of which artifact is valid for (version, platform):
exactly one per platform, with name, format, size, SHA-256, build id and mirror URLs.
SHA256SUMS says the same in `sha256sum` format (sorted by name, two spaces), so that
`sha256sum -c SHA256SUMS` works in dist/.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any

from sandbox_tools.artifacts import Artifact, ArtifactFormat, atomic_write, file_digest
from sandbox_tools.errors import ConfigurationError

MANIFEST_SCHEMA = 1
MANIFEST_FILE = "manifest.json"
SUMS_FILE = "SHA256SUMS"
# The released manifest is committed here after `tools release` and ships in the package,
# so git-ref installs know which bytes to fetch and wheels know which bytes they carry.
PUBLISHED_DIR = "published"


@dataclass(frozen=True, kw_only=True)
class Manifest:
    version: str
    artifacts: tuple[Artifact, ...] = field(default=())

    def __post_init__(self) -> None:
        platforms = [a.platform for a in self.artifacts]
        duplicates = sorted({p for p in platforms if platforms.count(p) > 1})
        if duplicates:
            raise ConfigurationError(
                f"the manifest lists more than one artifact for {', '.join(duplicates)}",
                remedy="Exactly one artifact is valid per version and platform.",
            )

    def for_platform(self, platform: str) -> Artifact:
        for artifact in self.artifacts:
            if artifact.platform == platform:
                return artifact
        supported = ", ".join(a.platform for a in self.artifacts) or "none"
        raise ConfigurationError(
            f"sandbox-tools {self.version} has no artifact for {platform} (supported: {supported})"
        )

    def to_json(self) -> dict[str, Any]:
        ordered = sorted(self.artifacts, key=lambda a: a.platform)
        return {
            "schema": MANIFEST_SCHEMA,
            "version": self.version,
            "artifacts": [a.to_json(urls=True) for a in ordered],
        }

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
        entries = data.get("artifacts", [])
        if not isinstance(entries, list):
            raise ValueError("'artifacts' must be a list of objects")
        return cls(
            version=str(data["version"]),
            artifacts=tuple(
                Artifact.from_json(entry, f"artifact {n}") for n, entry in enumerate(entries, 1)
            ),
        )


def read_manifest(path: Path) -> Manifest:
    """A manifest from a file; every way it can be wrong is a ConfigurationError naming it."""
    try:
        return Manifest.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigurationError(f"no manifest at {path}") from None
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
    """One artifact per platform: the default format's record (portable)."""
    mirror_list = [m.rstrip("/") for m in mirrors]
    chosen = [r for r in records if r.format is ArtifactFormat.PORTABLE]
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
            for r in chosen
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
