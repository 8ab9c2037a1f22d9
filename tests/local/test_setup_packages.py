"""scripts/setup.sh's choice of packages on a distribution other than Debian: Ubuntu
has no `chromium-headless-shell` (its Chromium is a snap), and the workflows' runners are
Ubuntu. The set-up skips it, saying what then goes untested, instead of failing."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
UBUNTU_NOBLE = ROOT / "tests" / "data" / "ubuntu-noble-packages.txt"  # names in 24.04's archive
# What setup.sh asks for on a machine that has none of it.
EVERYTHING = [
    "docker.io",
    "debootstrap",
    "debian-archive-keyring",
    "sudo",
    "qemu-user-static",
    "binfmt-support",
    "musl-tools",
    "gcc",
    "python3-venv",
    "chromium-headless-shell",
]


def choose(names: list[str], available: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(ROOT / "scripts" / "setup_packages.sh")],
        input="\n".join(names) + "\n",
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "SETUP_AVAILABLE_PACKAGES": str(available)},
        timeout=30,
    )


def test_on_ubuntu_the_headless_shell_is_skipped_saying_what_goes_untested() -> None:
    done = choose(EVERYTHING, UBUNTU_NOBLE)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert [line.split()[1] for line in lines if line.startswith("install ")] == EVERYTHING[:-1]
    (skipped,) = [line for line in lines if line.startswith("skip ")]
    assert skipped.startswith("skip chromium-headless-shell: not in this distribution")
    assert "test_web_browser" in skipped


def test_a_required_package_the_distribution_lacks_fails_the_set_up(tmp_path: Path) -> None:
    empty = tmp_path / "none.txt"
    empty.write_text("")
    done = choose(["musl-tools"], empty)
    assert done.returncode == 3
    assert "musl-tools: not in this distribution's packages, and the suite needs it" in done.stderr


def test_setup_asks_for_exactly_these_packages() -> None:
    """The list above is setup.sh's: a package added there is added here too."""
    script = (ROOT / "scripts" / "setup.sh").read_text()
    asked = [part.split(")")[0] for part in script.split("missing+=(")[1:]]
    assert sorted(asked) == sorted(EVERYTHING)
