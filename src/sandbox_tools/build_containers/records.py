"""Artifacts as typed records: naming, build ids and dist/build.json.

Build id = digest of everything that determines the artifact's bytes: the runtime's
sources, the locked build dependencies, the build recipe (launcher, freeze script,
packer), the builder image recipe, the format and the architecture. An unchanged
build id means there is nothing to build.
"""

from __future__ import annotations

import enum
import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sandbox_tools._version import __version__
from sandbox_tools.platforms import Arch

BUILD_RECORD_FILE = "build.json"
RECORD_SCHEMA = 1
_PACKAGE_ROOT = Path(__file__).resolve().parent.parent  # src/sandbox_tools


class ArtifactFormat(str, enum.Enum):
    PORTABLE = "portable"  # static launcher + onedir tree with its own glibc, unpacked once
    STATICX = "staticx"  # PyInstaller onefile + StaticX: unpacks itself on every start

    @property
    def suffix(self) -> str:
        return "" if self is ArtifactFormat.PORTABLE else ".staticx"


def artifact_name(arch: Arch, fmt: ArtifactFormat, version: str = __version__) -> str:
    return f"sandbox-tools-{version}-linux-{arch.value}{fmt.suffix}"


def build_inputs(package_root: Path = _PACKAGE_ROOT) -> list[Path]:
    """Every file whose content goes into an artifact (sorted, for a stable digest)."""
    shared = [
        package_root / name
        for name in ("__init__.py", "_version.py", "protocol.py", "platforms.py")
    ]
    runtime = sorted((package_root / "runtime").rglob("*.py"))
    build_containers = package_root / "build_containers"
    recipe = sorted(p for p in (build_containers / "resources").iterdir() if p.is_file())
    packer = [build_containers / "package.py", build_containers / "builder.py"]
    return sorted({*shared, *runtime, *recipe, *packer})


def compute_build_id(
    arch: Arch, fmt: ArtifactFormat, builder_digest: str, package_root: Path = _PACKAGE_ROOT
) -> str:
    digest = hashlib.sha256()
    header = {
        "version": __version__,
        "arch": arch.value,
        "format": fmt.value,
        "builder": builder_digest,
        "schema": RECORD_SCHEMA,
    }
    digest.update(json.dumps(header, sort_keys=True).encode())
    for path in build_inputs(package_root):
        if "__pycache__" in path.parts:
            continue
        digest.update(path.relative_to(package_root).as_posix().encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return "sha256:" + digest.hexdigest()


def tree_id(build_id: str) -> str:
    """The 32-character id the launcher names its unpacked tree by."""
    return build_id.removeprefix("sha256:")[:32]


@dataclass(frozen=True, kw_only=True)
class ArtifactRecord:
    name: str
    platform: str
    format: str
    size: int
    sha256: str
    build_id: str
    tool_versions: dict[str, str] = field(default_factory=dict)

    @property
    def arch(self) -> Arch:
        return Arch.parse(self.platform.removeprefix("linux/"))

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ArtifactRecord:
        return cls(
            name=str(data["name"]),
            platform=str(data["platform"]),
            format=str(data["format"]),
            size=int(data["size"]),
            sha256=str(data["sha256"]),
            build_id=str(data["build_id"]),
            tool_versions={str(k): str(v) for k, v in data.get("tool_versions", {}).items()},
        )


def read_records(out_dir: Path) -> list[ArtifactRecord]:
    path = out_dir / BUILD_RECORD_FILE
    if not path.exists():
        return []
    data = json.loads(path.read_text())
    return [ArtifactRecord.from_json(item) for item in data.get("artifacts", [])]


def write_records(out_dir: Path, records: list[ArtifactRecord]) -> Path:
    """Replace the records of the same platform+format; keep the others (atomic write)."""
    merged = {(r.platform, r.format): r for r in read_records(out_dir)}
    merged.update({(r.platform, r.format): r for r in records})
    ordered = [merged[key] for key in sorted(merged)]
    document = {
        "schema": RECORD_SCHEMA,
        "version": __version__,
        "artifacts": [r.to_json() for r in ordered],
    }
    path = out_dir / BUILD_RECORD_FILE
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
    partial.replace(path)
    return path


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
