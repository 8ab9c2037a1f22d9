"""Platform names shared by both sides (standard library only)."""

from __future__ import annotations

import enum


class Arch(str, enum.Enum):
    """A CPU architecture in Docker's spelling, the one our artifact names use."""

    AMD64 = "amd64"
    ARM64 = "arm64"

    @classmethod
    def parse(cls, value: str) -> Arch:
        """Accept the spellings that `uname -m`, Docker and Python report, with or without
        Docker's `linux/` prefix."""
        text = value.strip().lower()
        normalized = _ALIASES.get(text.removeprefix("linux/"))
        if normalized is None:
            supported = ", ".join(a.value for a in cls)
            raise ValueError(f"unsupported architecture {value!r} (supported: {supported})")
        return normalized

    @property
    def platform(self) -> str:
        return f"linux/{self.value}"


_ALIASES = {
    "amd64": Arch.AMD64,
    "x86_64": Arch.AMD64,
    "x64": Arch.AMD64,
    "arm64": Arch.ARM64,
    "aarch64": Arch.ARM64,
    "arm64/v8": Arch.ARM64,
}


def parse_arches(values: list[str] | tuple[str, ...]) -> list[Arch]:
    """Every command's --arch/--platform: repeatable and comma lists, any known spelling,
    duplicates dropped, order kept. Raises ValueError naming the first unknown one."""
    found: dict[Arch, None] = {}
    for value in values:
        for part in value.split(","):
            if part.strip():
                found[Arch.parse(part)] = None
    return list(found)
