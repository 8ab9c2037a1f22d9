from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from sandbox_tools.artifacts import (
    Artifact,
    ArtifactFormat,
    ArtifactKind,
    artifact_name,
    browser_artifact_name,
    read_build_records,
    write_build_records,
)
from sandbox_tools.build_containers import lock
from sandbox_tools.build_containers.records import build_inputs, compute_build_id
from sandbox_tools.platforms import Arch

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "sandbox_tools"


def test_artifact_names() -> None:
    assert artifact_name(Arch.AMD64, ArtifactFormat.PORTABLE, "1.2.3") == (
        "sandbox-tools-1.2.3-linux-amd64"
    )
    assert artifact_name(Arch.ARM64, ArtifactFormat.STATICX, "1.2.3") == (
        "sandbox-tools-1.2.3-linux-arm64.staticx"
    )


def test_build_id_is_stable_and_covers_every_input(tmp_path: Path) -> None:
    copy = tmp_path / "sandbox_tools"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    base = compute_build_id(Arch.AMD64, ArtifactFormat.PORTABLE, "builder", copy)
    assert base == compute_build_id(Arch.AMD64, ArtifactFormat.PORTABLE, "builder", copy)
    assert base.startswith("sha256:") and len(base) == 7 + 64
    others = {
        compute_build_id(Arch.ARM64, ArtifactFormat.PORTABLE, "builder", copy),
        compute_build_id(Arch.AMD64, ArtifactFormat.STATICX, "builder", copy),
        compute_build_id(Arch.AMD64, ArtifactFormat.PORTABLE, "other-builder", copy),
    }
    assert base not in others and len(others) == 3

    inputs = {p.relative_to(copy).as_posix() for p in build_inputs(copy)}
    assert {
        "runtime/cli.py",
        "runtime/tools/exec_remote/controller.py",
        "protocol.py",
        "build_containers/resources/launcher.c",
        "build_containers/resources/freeze.lock",
        "build_containers/package.py",
    } <= inputs
    assert not any(name.startswith(("cli/", "injector/")) for name in inputs)  # host-only code

    runtime_file = copy / "runtime" / "tools" / "exec_remote" / "controller.py"
    runtime_file.write_text(runtime_file.read_text() + "\n# changed\n")
    assert compute_build_id(Arch.AMD64, ArtifactFormat.PORTABLE, "builder", copy) != base


def record(platform: str, sha: str) -> Artifact:
    return Artifact(
        name=f"a-{platform[-5:]}",
        arch=Arch.parse(platform.removeprefix("linux/")),
        format=ArtifactFormat.PORTABLE,
        size=3,
        sha256=sha,
        build_id="sha256:x",
        tool_versions={"p": "1"},
    )


def test_records_round_trip_and_merge_per_platform(tmp_path: Path) -> None:
    write_build_records(tmp_path, [record("linux/amd64", "1"), record("linux/arm64", "2")])
    write_build_records(tmp_path, [record("linux/amd64", "3")])
    records = read_build_records(tmp_path)
    assert [(r.platform, r.sha256) for r in records] == [("linux/amd64", "3"), ("linux/arm64", "2")]
    document = json.loads((tmp_path / "build.json").read_text())
    assert document["schema"] == 1 and len(document["artifacts"]) == 2
    assert not list(tmp_path.glob("*.partial"))
    assert records[1].arch is Arch.ARM64


def test_a_browser_add_on_record_sits_beside_the_runtime_of_its_platform(tmp_path: Path) -> None:
    addon = replace(
        record("linux/amd64", "4"),
        name=browser_artifact_name(Arch.AMD64, "1.2.3"),
        format=ArtifactFormat.TAR_XZ,
        kind=ArtifactKind.BROWSER,
    )
    assert addon.name == "sandbox-tools-browser-1.2.3-linux-amd64.tar.xz"
    write_build_records(tmp_path, [record("linux/amd64", "1"), addon])
    write_build_records(tmp_path, [record("linux/amd64", "3")])  # a runtime-only rebuild
    runtime, browser = read_build_records(tmp_path)
    assert (runtime.kind, runtime.sha256) == (ArtifactKind.RUNTIME, "3")
    assert browser == addon
    written = json.loads((tmp_path / "build.json").read_text())["artifacts"]
    # A runtime record reads as before (no "kind"): manifests and older readers unchanged.
    assert [a.get("kind") for a in written] == [None, "browser"]
    assert Artifact.from_json(addon.to_json(urls=True)).kind is ArtifactKind.BROWSER
    with pytest.raises(ValueError, match="'browser-ish' is not a valid ArtifactKind"):
        Artifact.from_json({**addon.to_json(), "kind": "browser-ish"})


def test_complete_wheelhouse_is_reused_without_network(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wheelhouse = tmp_path / "wheelhouse" / "amd64" / lock.FREEZE_LOCK.stem
    wheelhouse.mkdir(parents=True)
    (wheelhouse / f".complete-{lock.sha256_file(lock.FREEZE_LOCK)[:16]}").touch()

    def no_network(*args: object, **kwargs: object) -> None:
        raise AssertionError("the wheelhouse was complete; nothing should be downloaded")

    monkeypatch.setattr(lock, "_pip_download", no_network)
    assert lock.ensure_wheelhouse(Arch.AMD64, lock.FREEZE_LOCK, tmp_path) == wheelhouse


def _kept(cache: Path, name: str, data: bytes) -> Artifact:
    """A runtime kept in the build cache as a finished build leaves it: bytes, then record."""
    from sandbox_tools.artifacts import sha256_of

    cache.mkdir(parents=True)
    (cache / name).write_bytes(data)
    record = Artifact(
        name=name,
        arch=Arch.AMD64,
        format=ArtifactFormat.PORTABLE,
        size=len(data),
        sha256=sha256_of(cache / name),
        build_id="sha256:" + "ab" * 32,
        tool_versions={"python": "3.12"},
    )
    (cache / "record.json").write_text(json.dumps(record.to_json()))
    return record


def test_a_runtime_kept_by_its_build_id_is_copied_into_another_directory(tmp_path: Path) -> None:
    from sandbox_tools.build_containers.build import copy_from_cache

    name = artifact_name(Arch.AMD64, ArtifactFormat.PORTABLE)
    kept = _kept(tmp_path / "cache", name, b"\x7fELF runtime")
    copied = copy_from_cache(tmp_path / "cache", tmp_path / "dist", name)
    assert copied == kept
    assert (tmp_path / "dist" / name).read_bytes() == b"\x7fELF runtime"
    assert (tmp_path / "dist" / name).stat().st_mode & 0o777 == 0o755
    assert (tmp_path / "cache" / name).exists()  # copied, not moved: the next build reuses it


@pytest.mark.parametrize("damage", ["bytes", "record cut", "record garbled", "another name"])
def test_a_damaged_or_unfinished_cache_entry_is_dropped_and_nothing_is_copied(
    tmp_path: Path, damage: str
) -> None:
    """A build reads the cache only through its record and the bytes it names: an entry
    a crash left without its record, or whose bytes changed since, makes it build anew
    (and the bad entry goes), never an artifact the record does not describe."""
    from sandbox_tools.build_containers.build import copy_from_cache

    name = artifact_name(Arch.AMD64, ArtifactFormat.PORTABLE)
    cache = tmp_path / "cache"
    _kept(cache, name, b"\x7fELF runtime")
    if damage == "bytes":
        (cache / name).write_bytes(b"\x7fELF runtimE")
    elif damage == "record cut":
        (cache / "record.json").unlink()
    elif damage == "record garbled":
        (cache / "record.json").write_text('{"name": ')
    else:
        name = artifact_name(Arch.ARM64, ArtifactFormat.PORTABLE)
        shutil.copy(cache / artifact_name(Arch.AMD64, ArtifactFormat.PORTABLE), cache / name)
    assert copy_from_cache(cache, tmp_path / "dist", name) is None
    assert not (tmp_path / "dist" / name).exists()
    assert cache.exists() == (damage == "record cut")  # an unfinished entry is rebuilt over


def test_a_second_maker_of_one_cache_entry_waits_for_the_first(tmp_path: Path) -> None:
    """Two builds of one build id at once (a rehearsal beside a test run) make it once:
    the second takes the entry's lock only when the first has let it go."""
    import threading

    from sandbox_tools.cache import one_builder

    entry = tmp_path / "cache" / "runtime" / "abc-portable"
    events: list[str] = []

    def second() -> None:
        with one_builder(entry):
            events.append("second made it")

    with one_builder(entry):
        waiter = threading.Thread(target=second)
        waiter.start()
        waiter.join(timeout=0.5)
        assert waiter.is_alive() and events == []  # held off while the first builds
        events.append("first made it")
    waiter.join(timeout=10)
    assert events == ["first made it", "second made it"]
