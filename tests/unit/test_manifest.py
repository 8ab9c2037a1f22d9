from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sandbox_tools.artifacts import Artifact, ArtifactFormat
from sandbox_tools.errors import ConfigurationError
from sandbox_tools.platforms import Arch
from sandbox_tools.release.manifest import (
    Manifest,
    manifest_from_records,
    sha256sums,
)

GOLDEN = Path(__file__).parents[1] / "golden"


def records() -> list[Artifact]:
    return [
        Artifact(
            name="sandbox-tools-1.2.3-linux-arm64",
            arch=Arch.ARM64,
            format=ArtifactFormat.PORTABLE,
            size=8395066,
            sha256="b" * 64,
            build_id="sha256:" + "2" * 64,
        ),
        Artifact(
            name="sandbox-tools-1.2.3-linux-amd64",
            arch=Arch.AMD64,
            format=ArtifactFormat.PORTABLE,
            size=8703465,
            sha256="a" * 64,
            build_id="sha256:" + "1" * 64,
        ),
        Artifact(
            name="sandbox-tools-1.2.3-linux-amd64.staticx",
            arch=Arch.AMD64,
            format=ArtifactFormat.STATICX,
            size=7400000,
            sha256="c" * 64,
            build_id="sha256:" + "3" * 64,
        ),
    ]


def test_golden_manifest_and_sums() -> None:
    manifest = manifest_from_records(
        "1.2.3", records(), ["https://mirror.example/v1.2.3/", "s3://bucket/v1.2.3"]
    )
    assert manifest.dumps() == (GOLDEN / "manifest.json").read_text()
    assert sha256sums(manifest) == (GOLDEN / "SHA256SUMS").read_text()


def test_exactly_one_artifact_per_platform() -> None:
    twice = Artifact(
        arch=Arch.AMD64,
        name="x",
        format=ArtifactFormat.PORTABLE,
        size=1,
        sha256="a" * 64,
        build_id="b",
    )
    with pytest.raises(ConfigurationError, match="more than one artifact for linux/amd64"):
        Manifest(version="1", artifacts=(twice, twice))
    manifest = manifest_from_records("1.2.3", records())
    with pytest.raises(ConfigurationError, match=r"riscv64 \(supported: linux/arm64, linux/amd64"):
        manifest.for_platform("linux/riscv64")


hex64 = st.text(alphabet="0123456789abcdef", min_size=64, max_size=64)
artifacts = st.builds(
    Artifact,
    arch=st.sampled_from(list(Arch)),
    name=st.text(st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=40),
    format=st.sampled_from(list(ArtifactFormat)),
    size=st.integers(min_value=0, max_value=2**40),
    sha256=hex64,
    build_id=hex64.map(lambda h: "sha256:" + h),
    urls=st.lists(st.text(max_size=30), max_size=3).map(tuple),
)


@given(
    version=st.text(min_size=1, max_size=20),
    chosen=st.lists(artifacts, max_size=2, unique_by=lambda a: a.platform),
)
def test_any_manifest_round_trips(version: str, chosen: list[Artifact]) -> None:
    manifest = Manifest(version=version, artifacts=tuple(chosen))
    again = Manifest.loads(manifest.dumps())
    assert again.dumps() == manifest.dumps()
    assert sorted(again.artifacts, key=lambda a: a.platform) == sorted(
        chosen, key=lambda a: a.platform
    )
