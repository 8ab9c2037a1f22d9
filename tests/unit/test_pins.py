"""Registry rows pinned by digest: references read as docker reads them, and a refresh
that changes only the digest lines of matrix.toml."""

from __future__ import annotations

import pytest

from sandbox_tools.distro_matrix.matrix import load_matrix
from sandbox_tools.distro_matrix.pins import DOCKER_HUB, Reference, repin
from sandbox_tools.errors import ConfigurationError

A = "sha256:" + "a" * 64
B = "sha256:" + "b" * 64


@pytest.mark.parametrize(
    ("image", "expected"),
    [
        ("debian:12", (DOCKER_HUB, "library/debian", "12")),
        ("alpine", (DOCKER_HUB, "library/alpine", "latest")),
        ("kalilinux/kali-rolling", (DOCKER_HUB, "kalilinux/kali-rolling", "latest")),
        ("gcr.io/distroless/static-debian12", ("gcr.io", "distroless/static-debian12", "latest")),
        ("localhost:5000/x/y:1.0", ("localhost:5000", "x/y", "1.0")),
    ],
)
def test_references_name_the_registry_docker_would_ask(
    image: str, expected: tuple[str, str, str]
) -> None:
    ref = Reference.parse(image)
    assert (ref.host, ref.repository, ref.tag) == expected


MATRIX = """# a comment that stays
[[distro]]
name = "debian-12"
registry = "debian:12"
offline = "debootstrap:bookworm"

[[distro]]
name = "alpine-3.18"
registry = "alpine:3.18"
digest = "{old}"

[[distro]]
name = "noshell"
offline = "noshell"
shell = false
"""


def test_a_refresh_writes_only_digest_lines_and_says_what_changed() -> None:
    asked: list[Reference] = []

    def lookup(ref: Reference) -> str:
        asked.append(ref)
        return A if ref.repository == "library/debian" else B

    before = MATRIX.format(old=B)
    text, changes = repin(before, lookup)
    assert changes == [f"debian:12: {A}"]  # alpine's pin was already current
    assert text == before.replace(
        'registry = "debian:12"\n', f'registry = "debian:12"\ndigest = "{A}"\n'
    )
    assert [r.repository for r in asked] == ["library/debian", "library/alpine"]
    rows = {d.name: d for d in load_matrix(text).distros}
    assert rows["debian-12"].pull_reference == f"debian:12@{A}"
    assert rows["noshell"].pull_reference is None
    again, none = repin(text, lookup)
    assert (again, none) == (text, [])


def test_a_malformed_pin_is_refused_with_the_refresh_command() -> None:
    with pytest.raises(ConfigurationError, match="not sha256") as refused:
        load_matrix(MATRIX.format(old="sha256:short"))
    assert "pins --refresh" in refused.value.remedy
