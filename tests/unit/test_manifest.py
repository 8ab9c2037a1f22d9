from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sandbox_tools.artifacts import Artifact, ArtifactFormat, ArtifactKind
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


def browser(arch: Arch, digit: str) -> Artifact:
    return Artifact(
        name=f"sandbox-tools-browser-1.2.3-linux-{arch.value}.tar.xz",
        arch=arch,
        format=ArtifactFormat.TAR_XZ,
        kind=ArtifactKind.BROWSER,
        size=101744988,
        sha256=digit * 64,
        build_id="sha256:" + digit * 64,
    )


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
    with pytest.raises(ConfigurationError, match=r"riscv64 \(supported: linux/amd64, linux/arm64"):
        manifest.for_platform("linux/riscv64")


def test_golden_manifest_with_a_browser_add_on() -> None:
    """The add-on goes in `addons`, beside the runtimes, and SHA256SUMS lists it."""
    manifest = manifest_from_records(
        "1.2.3", [*records(), browser(Arch.AMD64, "d")], ["https://mirror.example/v1.2.3/"]
    )
    assert manifest.dumps() == (GOLDEN / "manifest-with-browser.json").read_text()
    assert sha256sums(manifest) == (GOLDEN / "SHA256SUMS-with-browser").read_text()
    assert [a.platform for a in manifest.runtimes] == ["linux/amd64", "linux/arm64"]
    (addon,) = manifest.addons
    assert manifest.for_platform("linux/amd64", ArtifactKind.BROWSER) == addon
    assert addon.urls == ("https://mirror.example/v1.2.3/" + addon.name,)


def test_a_reader_of_the_old_schema_sees_the_runtimes_as_before() -> None:
    """Old readers take every entry of `artifacts` for a runtime and ignore other keys: the
    add-on must stay out of `artifacts`, and a manifest without one is unchanged."""
    with_addon = json.loads((GOLDEN / "manifest-with-browser.json").read_text())
    without = json.loads((GOLDEN / "manifest.json").read_text())
    assert with_addon["schema"] == without["schema"] == 1
    assert with_addon.pop("addons") and "addons" not in without
    strip = [{**a, "urls": a["urls"][:1]} for a in without["artifacts"]]
    assert with_addon == {**without, "artifacts": strip}
    old = Manifest.loads((GOLDEN / "manifest.json").read_text())  # written before add-ons
    assert old.addons == () and len(old.runtimes) == 2
    assert old.find("linux/amd64", ArtifactKind.BROWSER) is None


def test_at_most_one_artifact_per_platform_and_kind() -> None:
    runtime = manifest_from_records("1.2.3", records()).for_platform("linux/amd64")
    addon = browser(Arch.AMD64, "d")
    both = Manifest(version="1.2.3", artifacts=(runtime, addon))  # two kinds: fine
    assert both.find("linux/amd64") == runtime
    assert both.find("linux/amd64", ArtifactKind.BROWSER) == addon
    with pytest.raises(ConfigurationError, match="more than one browser add-on for linux/amd64"):
        Manifest(version="1.2.3", artifacts=(runtime, addon, replace(addon, sha256="e" * 64)))
    with pytest.raises(ConfigurationError) as missing:
        both.for_platform("linux/arm64", ArtifactKind.BROWSER)
    assert missing.value.message == (
        "sandbox-tools 1.2.3 carries no browser add-on for linux/arm64 (it carries one for: "
        "linux/amd64)"
    )


def test_loading_refuses_an_add_on_among_the_runtimes_and_skips_unknown_kinds() -> None:
    document = json.loads((GOLDEN / "manifest-with-browser.json").read_text())
    moved = {**document, "artifacts": [*document["artifacts"], *document["addons"]]}
    del moved["addons"]
    with pytest.raises(ValueError, match="artifact 3 is a browser add-on: add-ons belong in"):
        Manifest.loads(json.dumps(moved))
    runtime_as_addon = {**document, "addons": document["artifacts"][:1]}
    with pytest.raises(ValueError, match="add-on 1 has no 'kind'"):
        Manifest.loads(json.dumps(runtime_as_addon))
    later = {**document["addons"][0], "kind": "video", "name": "a-later-add-on.tar.xz"}
    loaded = Manifest.loads(json.dumps({**document, "addons": [*document["addons"], later]}))
    assert [a.name for a in loaded.addons] == [document["addons"][0]["name"]]


hex64 = st.text(alphabet="0123456789abcdef", min_size=64, max_size=64)
artifacts = st.builds(
    Artifact,
    arch=st.sampled_from(list(Arch)),
    name=st.text(st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=40),
    format=st.sampled_from(list(ArtifactFormat)),
    kind=st.sampled_from(list(ArtifactKind)),
    size=st.integers(min_value=0, max_value=2**40),
    sha256=hex64,
    build_id=hex64.map(lambda h: "sha256:" + h),
    urls=st.lists(st.text(max_size=30), max_size=3).map(tuple),
)


@given(
    version=st.text(min_size=1, max_size=20),
    chosen=st.lists(artifacts, max_size=4, unique_by=lambda a: (a.platform, a.kind)),
)
def test_any_manifest_round_trips(version: str, chosen: list[Artifact]) -> None:
    manifest = Manifest(version=version, artifacts=tuple(chosen))
    again = Manifest.loads(manifest.dumps())
    assert again.dumps() == manifest.dumps()
    assert sorted(again.artifacts, key=lambda a: (a.kind, a.platform)) == sorted(
        chosen, key=lambda a: (a.kind, a.platform)
    )


def test_the_schema_doc_example_with_an_add_on_is_a_manifest() -> None:
    """docs/SCHEMAS.md shows a manifest with the browser add-on: it must be one."""
    text = (Path(__file__).parents[2] / "docs" / "SCHEMAS.md").read_text()
    example = text.split("reads this example as a manifest):", 1)[1]
    block = example.split("```json\n", 1)[1].split("```", 1)[0]
    manifest = Manifest.loads(block)
    assert [a.platform for a in manifest.runtimes] == ["linux/amd64", "linux/arm64"]
    (addon,) = manifest.addons
    assert (addon.kind, addon.format, addon.platform) == (
        ArtifactKind.BROWSER,
        ArtifactFormat.TAR_XZ,
        "linux/amd64",
    )
    assert json.loads(manifest.dumps()) == json.loads(block)  # the shape tools write
