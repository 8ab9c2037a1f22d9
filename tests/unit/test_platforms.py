import pytest

from sandbox_tools.platforms import Arch


@pytest.mark.parametrize(
    ("spelling", "arch"),
    [("x86_64", Arch.AMD64), ("amd64", Arch.AMD64), ("AARCH64", Arch.ARM64), ("arm64", Arch.ARM64)],
)
def test_parse_normalises_spellings(spelling: str, arch: Arch) -> None:
    assert Arch.parse(spelling) is arch
    assert arch.platform == f"linux/{arch.value}"


def test_unsupported_architecture_names_the_supported_list() -> None:
    with pytest.raises(ValueError, match=r"riscv64.*supported: amd64, arm64"):
        Arch.parse("riscv64")


def test_one_parser_for_every_arch_and_platform_option() -> None:
    """Fetch --platform x86_64 was rejected while build/validate accepted it."""
    from sandbox_tools.platforms import parse_arches

    assert parse_arches(["x86_64,linux/arm64", "amd64", " aarch64 "]) == [Arch.AMD64, Arch.ARM64]
    assert parse_arches([]) == []
    with pytest.raises(ValueError, match="'sparc'"):
        parse_arches(["amd64,sparc"])
