from __future__ import annotations

import re

import pytest

from sandbox_tools.distro_matrix.matrix import load_matrix
from sandbox_tools.errors import ConfigurationError
from sandbox_tools.platforms import Arch


def test_packaged_matrix_has_the_required_rows_and_scenarios() -> None:
    matrix = load_matrix()
    names = {d.name for d in matrix.distros}
    assert {
        "ubuntu-20.04",
        "ubuntu-22.04",
        "ubuntu-24.04",
        "debian-11",
        "debian-12",
        "debian-13",
        "kali-rolling",
        "alpine-3.18",
        "alpine-latest",
        "busybox",
        "distroless",
    } <= names
    offline = {d.name: str(d.offline) for d in matrix.distros if d.offline}
    assert offline["debian-13"] == "debootstrap:trixie" and offline["busybox"] == "busybox-static"
    scenarios = {s.name: s for s in matrix.scenarios}
    assert scenarios["nonroot"].user == "1000:1000"
    assert scenarios["readonly-noexec"].expect_failure and scenarios["readonly-noexec"].read_only


def test_only_accepts_names_registry_spellings_and_prefixes() -> None:
    matrix = load_matrix()
    assert [d.name for d in matrix.select(["debian:12"]).distros] == ["debian-12"]
    assert [d.name for d in matrix.select(["debian"]).distros] == [
        "debian-11",
        "debian-12",
        "debian-13",
    ]
    assert len(matrix.select(None).distros) == len(matrix.distros)


def test_which_cells_modal_can_run() -> None:
    from sandbox_tools.distro_matrix.modal_backend import modal_skip

    matrix = load_matrix()
    distros = {d.name: d for d in matrix.distros}
    scenarios = {s.name: s for s in matrix.scenarios}
    assert modal_skip(distros["ubuntu-24.04"], scenarios["root"], Arch.AMD64) is None
    assert "amd64" in (modal_skip(distros["ubuntu-24.04"], scenarios["root"], Arch.ARM64) or "")
    assert "Docker options" in (
        modal_skip(distros["ubuntu-24.04"], scenarios["readonly-noexec"], Arch.AMD64) or ""
    )
    assert "registry" in (modal_skip(distros["no-shell"], scenarios["root"], Arch.AMD64) or "")


@pytest.mark.parametrize(
    ("toml", "words"),
    [
        ('[[distro]]\nname = "x"\nregistyr = "a"', "did you mean 'registry'"),
        ('[[distro]]\nregistry = "a"', "missing 'name'"),
        ('[[distro]]\nname = "x"\nshell = "yes"', "'shell' is str, expected bool"),
        ('[[scenario]]\nname = "s"\ndescription = "d"\ntmpfs = 3', "'tmpfs' is int"),
        ("[[distro]\n", "not valid TOML"),
        ('[[distro]]\nname = "x"\noffline = "debootstrap"', "none of debootstrap:<suite>"),
    ],
)
def test_a_bad_matrix_row_is_one_sentence(toml: str, words: str) -> None:
    """A misspelled key was a TypeError traceback from Distro(**row)."""
    with pytest.raises(ConfigurationError, match=re.escape(words)):
        load_matrix(toml)
