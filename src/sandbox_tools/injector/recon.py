"""Reconnaissance: what the sandbox is, in one round trip.

One POSIX sh script reports every fact as `key=value` lines: OS, architecture, libc,
user, each candidate install directory (writable? allows execution?) and any existing
install of this build with the facts needed to decide whether to trust it. Paths and
ids reach the script as arguments, never spliced into its text.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sandbox_tools.platforms import Arch

CANDIDATE_DIRS = ("/opt/sandbox-tools", "/var/tmp", "/tmp", "/dev/shm")

PROBE_SCRIPT = r"""
tag="$1"; shift
os_id=; os_version=
if [ -r /etc/os-release ]; then
  os_id=$(sed -n 's/^ID=//p' /etc/os-release | tr -d '"')
  os_version=$(sed -n 's/^VERSION_ID=//p' /etc/os-release | tr -d '"')
fi
if [ -z "$os_id" ]; then
  if [ -r /etc/kali_version ]; then os_id=kali; os_version=$(cat /etc/kali_version)
  elif [ -r /etc/alpine-release ]; then os_id=alpine; os_version=$(cat /etc/alpine-release)
  elif [ -r /etc/debian_version ]; then os_id=debian; os_version=$(cat /etc/debian_version)
  else os_id=$(uname -s 2>/dev/null | tr 'A-Z' 'a-z'); fi
fi
echo "os_id=$os_id"
echo "os_version=$os_version"
echo "arch=$(uname -m)"
libc=none
for f in /lib/ld-musl-* /usr/lib/ld-musl-*; do [ -e "$f" ] && libc=musl; done
for f in /lib*/ld-linux* /lib/*/ld-linux* /usr/lib*/ld-linux* /usr/lib/*/ld-linux*; do
  [ -e "$f" ] && libc=glibc
done
echo "libc=$libc"
echo "uid=$(id -u 2>/dev/null)"
echo "user=$(id -un 2>/dev/null)"
echo "home=$HOME"
command -v sha256sum >/dev/null 2>&1 && echo "sha256sum=yes" || echo "sha256sum=no"
for d in "$@" "$HOME"; do
  [ -n "$d" ] || continue
  [ "$d" = /opt/sandbox-tools ] && mkdir -p "$d" 2>/dev/null
  if [ ! -d "$d" ]; then echo "candidate=$d|missing"; continue; fi
  probe="$d/.sandbox-tools-probe-$$"
  meta="$(stat -c %u "$d" 2>/dev/null)|$(stat -c %a "$d" 2>/dev/null)"
  if ! ( : > "$probe" ) 2>/dev/null; then echo "candidate=$d|not writable|$meta"; continue; fi
  printf '#!/bin/sh\nexit 0\n' > "$probe" && chmod 700 "$probe"
  status=noexec
  "$probe" 2>/dev/null && status=ok
  echo "candidate=$d|$status|$meta"
  rm -f "$probe"
  for inst in "$d"/sandbox-tools-"$tag"*; do
    [ -d "$inst" ] || continue
    owner=$(stat -c %u "$inst" 2>/dev/null); mode=$(stat -c %a "$inst" 2>/dev/null)
    marker=$(cat "$inst/.installed" 2>/dev/null)
    digest=
    if [ -f "$inst/sandbox-tools" ] && command -v sha256sum >/dev/null 2>&1; then
      digest=$(sha256sum "$inst/sandbox-tools" | cut -d' ' -f1)
    fi
    echo "install=$inst|$owner|$mode|$marker|$digest"
  done
done
"""


@dataclass(frozen=True)
class Candidate:
    path: str
    status: str  # "ok", "noexec", "not writable", "missing", or why it is not safe
    owner: int | None = None
    mode: str = ""

    @property
    def usable(self) -> bool:
        return self.status == "ok"


def judge_candidate(candidate: Candidate, uid: int | None) -> Candidate:
    """A directory another user controls could have our files swapped under us."""
    if candidate.status != "ok" or candidate.owner is None or not candidate.mode:
        return candidate
    mode = int(candidate.mode, 8)
    if candidate.owner not in (0, uid):
        return Candidate(
            candidate.path,
            f"owned by uid {candidate.owner}, not trusted",
            candidate.owner,
            candidate.mode,
        )
    if mode & 0o002 and not mode & 0o1000:
        return Candidate(
            candidate.path,
            "writable by everyone without the sticky bit",
            candidate.owner,
            candidate.mode,
        )
    return candidate


@dataclass(frozen=True)
class ExistingInstall:
    path: str
    owner: int | None
    mode: str
    marker: str
    sha256: str


@dataclass(frozen=True)
class Recon:
    arch: Arch | None
    raw_arch: str
    os_id: str
    os_version: str
    libc: str
    uid: int | None
    user: str
    home: str
    has_shell: bool
    has_sha256sum: bool
    candidates: tuple[Candidate, ...]
    installs: tuple[ExistingInstall, ...] = field(default=())
    notes: tuple[str, ...] = field(default=())

    @property
    def platform(self) -> str:
        return self.arch.platform if self.arch else f"linux/{self.raw_arch}"


def parse_probe(output: str) -> Recon:
    facts: dict[str, str] = {}
    candidates: list[Candidate] = []
    installs: list[ExistingInstall] = []
    for line in output.splitlines():
        key, _, value = line.partition("=")
        if key == "candidate":
            path, status, owner, mode = [*value.split("|"), "", "", ""][:4]
            candidates.append(
                Candidate(path, status, int(owner) if owner.isdigit() else None, mode)
            )
        elif key == "install":
            path, owner, mode, marker, digest = [*value.split("|"), "", "", "", "", ""][:5]
            installs.append(
                ExistingInstall(path, int(owner) if owner.isdigit() else None, mode, marker, digest)
            )
        elif key:
            facts[key] = value
    raw_arch = facts.get("arch", "")
    try:
        arch: Arch | None = Arch.parse(raw_arch)
    except ValueError:
        arch = None
    uid_text = facts.get("uid", "")
    uid = int(uid_text) if uid_text.isdigit() else None
    return Recon(
        arch=arch,
        raw_arch=raw_arch,
        os_id=facts.get("os_id", "") or "unknown",
        os_version=facts.get("os_version", ""),
        libc=facts.get("libc", "none"),
        uid=uid,
        user=facts.get("user", ""),
        home=facts.get("home", ""),
        has_shell=True,
        has_sha256sum=facts.get("sha256sum") == "yes",
        candidates=tuple(judge_candidate(c, uid) for c in candidates),
        installs=tuple(installs),
    )
