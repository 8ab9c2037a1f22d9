"""Reconnaissance: what the sandbox is, and whether an earlier install can be trusted.

Everything a sandbox prints is untrusted data (THREAT_MODEL.md): the image's shell may
lie and the agent may have planted files anywhere it can write. So:
- the scripts print only fixed keys, each once, with values from a small alphabet;
  untrusted text (os-release, user names) is reduced to `[A-Za-z0-9._+-]` in the
  sandbox and never printed raw; verdicts about paths are computed in the sandbox;
- paths and ids reach the scripts as arguments, never spliced into their text, and the
  paths printed back are only ones we passed in (by index) or the checked `$HOME`;
- scratch work happens in a private `mktemp -d` directory, never at a predictable name;
- the parser refuses unknown or repeated keys, overlong lines and malformed values, so
  a forged line cannot override a real one.
The pure parts (parsing, judging) are unit-tested without a sandbox.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import Enum

from sandbox_tools.errors import SandboxInjectionError
from sandbox_tools.platforms import Arch

# Where the runtime may be installed, best first. /opt/sandbox-tools is created by the
# probe (as the installer); the shared temporary directories are world-writable and
# used only when nothing better exists, always in a fresh directory of our own.
CANDIDATE_DIRS = ("/opt/sandbox-tools", "/var/tmp", "/tmp", "/dev/shm")
INSTALL_PREFIX = "sandbox-tools-"
# What `uname -m` says on each architecture (the probe's install tags are keyed by it).
MACHINES = {Arch.AMD64: "x86_64", Arch.ARM64: "aarch64"}
EXE_NAME = "sandbox-tools"

MAX_PROBE_OUTPUT = 64 * 1024  # the probe prints a few hundred bytes
MAX_LINE = 4096
PROBE_TIMEOUT = 60.0

# Shared by both scripts: `chain_verdict PATH UID` prints "ok" when neither PATH nor any
# of its ancestors can be replaced or renamed by a user other than root and UID (owner
# root or UID; writable by group or others only with the sticky bit, as /tmp is).
_CHAIN = r"""
chain_verdict() {
  # PATH and every ancestor up to /, in that order, read by one `stat`.
  cv_p=$1; cv_u=$2; set --
  while :; do
    set -- "$@" "$cv_p"
    [ "$cv_p" = / ] && break
    cv_p=${cv_p%/*}; [ -n "$cv_p" ] || cv_p=/
  done
  cv_all=$(stat -c '%u %a' "$@" 2>/dev/null) || { echo unreadable; return; }
  cv_v=ok; cv_n=0; set -f; cv_ifs=$IFS; IFS='
'
  for m in $cv_all; do
    cv_n=$((cv_n + 1))
    # A line no `stat` prints for one path (a pattern on megabytes costs the shell minutes).
    [ ${#m} -le 32 ] || { cv_v=unreadable; break; }
    o=${m% *}; a=${m#* }
    # `%a` drops leading zeros (0077 is "77"): three digits at least, or the group's and
    # others' bits below are never looked at.
    case $a in ?) a=00$a ;; ??) a=0$a ;; esac
    if [ "$o" != 0 ] && [ "$o" != "$cv_u" ]; then cv_v=foreign-ancestor; break; fi
    case $a in
      ????) s=${a%???}; w=${a#?} ;;
      *) s=0; w=$a ;;
    esac
    g=${w#?}; g=${g%?}; x=${w#??}
    case "$g$x" in *[2367]*)
      case $s in 1|3|5|7) ;; *) cv_v=writable-ancestor; break ;; esac ;;
    esac
  done
  IFS=$cv_ifs; set +f
  [ "$cv_v" != ok ] || [ "$cv_n" = $# ] || cv_v=unreadable
  echo "$cv_v"
}
clean() { tr -cd 'A-Za-z0-9._+-' | cut -c1-64; }
# `cleaned NAME VALUE` sets NAME to VALUE as `clean` leaves it, without a process where
# VALUE is that already (each process is a millisecond or more of the injection's one
# round trip).
cleaned() {
  case $2 in
    *[!A-Za-z0-9._+-]*) c_v=$(printf '%s' "$2" | clean) ;;
    *) c_v=$2; [ ${#c_v} -le 64 ] || c_v=$(printf '%s' "$c_v" | cut -c1-64) ;;
  esac
  eval "$1=\$c_v"
}
# `check_install PATH SHA SIZE UID` prints the verdict on an earlier install at PATH:
# "trusted" only when the type, owner and mode of the directory, its ancestors and the
# executable leave nobody else a way to swap the file, and then its digest matches.
check_install() {
  ci_p=$1; ci_v=; ci_x=$1/sandbox-tools
  if [ -L "$ci_p" ] || [ ! -d "$ci_p" ]; then echo absent; return; fi
  ci_m=$(stat -c '%u %a' "$ci_p" 2>/dev/null) || ci_m=
  case ${ci_m#* } in *[2367]?|*[2367]) ci_v=writable-by-others ;; esac
  [ -n "$ci_m" ] && [ "${ci_m% *}" != "$4" ] && ci_v=foreign-owner
  [ -z "$ci_m" ] && ci_v=unreadable
  ci_q=${ci_p%/*}; [ -n "$ci_q" ] || ci_q=/
  [ -z "$ci_v" ] && ci_c=$(chain_verdict "$ci_q" "$4") && [ "$ci_c" != ok ] && ci_v=$ci_c
  if [ -n "$ci_v" ]; then echo "$ci_v"; return; fi
  if [ -L "$ci_x" ] || [ ! -f "$ci_x" ]; then echo no-executable; return; fi
  ci_e=$(stat -c '%u %a %s' "$ci_x" 2>/dev/null) || ci_e=
  ci_o=${ci_e%% *}; ci_r=${ci_e#* }; ci_a=${ci_r% *}; ci_s=${ci_r#* }
  if [ "$ci_o" != 0 ] && [ "$ci_o" != "$4" ]; then echo foreign-executable; return; fi
  case $ci_a in *[2367]?|*[2367]) echo writable-executable; return ;; esac
  if [ "$ci_s" != "$3" ]; then echo wrong-size; return; fi
  if ! command -v sha256sum >/dev/null 2>&1; then echo unverified; return; fi
  ci_d=$(sha256sum < "$ci_x" | cut -c1-64)
  if [ "$ci_d" = "$2" ]; then echo trusted; else echo wrong-digest; fi
}
"""

# The first argument names the install directory the probe may make, per machine
# (`uname -m`): "x86_64=TAG aarch64=TAG", or nothing; "TAG:SHA256:SIZE" where the host
# has that artifact at hand. The candidates follow. Each
# candidate's own owner and mode, and whether an earlier install is there, are read
# first. With a TAG for this machine, no earlier install anywhere and a numeric uid, the
# candidates are then judged in the host's order of preference (private before shared,
# each in argument order) only until one is usable, and the install directory is made
# there: `<dir>/sandbox-tools-TAG`, or a fresh `mktemp -d` beside that name when it is
# taken, reported as `made=PATH|OWNER|MODE`; the rest are reported `untested`. Else
# every candidate is judged and nothing is made. Where an earlier install is there and
# the artifact's SHA-256 and size were given, the candidates holding installs are judged
# first, in the same order, and the install of the tag in each usable one is checked as
# CHECK_SCRIPT does, a trusted one's unpacked tree then compared with its payload
# (`verify`, run only then): `check.N=VERDICT|EXIT` ("-" unrun), for usable bases. At
# the first that matches, the rest are reported `untested`, and that base is usable
# without the write-and-run test (its check covered it and our program just ran
# there): a reuse costs no round trip of its own.
PROBE_SCRIPT = (
    _CHAIN
    + r"""
umask 022
make=$1; shift
os_id=; os_version=
if [ -f /etc/os-release ]; then
  # The first ID= and VERSION_ID= lines of its first 16 KiB, read by the shell itself.
  seen_id=; seen_version=; set -f; ifs=$IFS; IFS='
'
  for line in $(head -c 16384 /etc/os-release 2>/dev/null); do
    case $line in
      ID=*|VERSION_ID=*)
        v=${line#*=}; v=${v#[\"\']}; v=${v%[\"\']}  # quotes go anyway: saves a process
        case $line in
          ID=*) [ -n "$seen_id" ] || { seen_id=1; cleaned os_id "$v"; } ;;
          *) [ -n "$seen_version" ] || { seen_version=1; cleaned os_version "$v"; } ;;
        esac ;;
    esac
  done
  IFS=$ifs; set +f
fi
if [ -z "$os_id" ]; then
  if [ -f /etc/alpine-release ]; then
    os_id=alpine; cleaned os_version "$(head -c 64 /etc/alpine-release)"
  elif [ -f /etc/debian_version ]; then
    os_id=debian; cleaned os_version "$(head -c 64 /etc/debian_version)"
  else os_id=$(uname -s 2>/dev/null | tr 'A-Z' 'a-z' | clean); fi
fi
echo "os_id=$os_id"
echo "os_version=$os_version"
cleaned arch "$(uname -m)"
echo "arch=$arch"
libc=none
for f in /lib/ld-musl-* /usr/lib/ld-musl-*; do [ -e "$f" ] && libc=musl; done
for f in /lib*/ld-linux* /lib/*/ld-linux* /usr/lib*/ld-linux* /usr/lib/*/ld-linux*; do
  [ -e "$f" ] && libc=glibc
done
echo "libc=$libc"
cleaned uid "$(id -u 2>/dev/null)"
echo "uid=$uid"
cleaned user "$(id -un 2>/dev/null)"
echo "user=$user"
command -v sha256sum >/dev/null 2>&1 && echo "sha256sum=yes" || echo "sha256sum=no"
if [ "$(printf abc | head -c 2 2>/dev/null)" = ab ]; then echo "head_bytes=yes"
else echo "head_bytes=no"; fi
home=
case $HOME in
  /*) case $HOME in *[!A-Za-z0-9/._-]*) ;; *) [ ${#HOME} -le 1024 ] && home=$HOME ;; esac ;;
esac
while :; do case $home in */) home=${home%/} ;; *) break ;; esac; done
echo "home=$home"
tag=; sha=; size=
for pair in $make; do case $pair in "$arch="*) tag=${pair#*=} ;; esac; done
case $tag in *:*:*) size=${tag##*:}; sha=${tag#*:}; sha=${sha%:*}; tag=${tag%%:*} ;; esac
case $tag in *[!0-9a-f]*) tag= ;; esac
case $sha in *[!0-9a-f]*) sha= ;; esac
case $size in *[!0-9]*) size= ;; esac
case $uid in ''|*[!0-9]*) tag= ;; esac
known=$tag
i=0; earlier=no; present=
for d in "$@" "$home"; do
  n=$i; i=$((i + 1))
  v=; existing=no
  [ "$d" = /opt/sandbox-tools ] && mkdir -p "$d" 2>/dev/null
  if [ -z "$d" ] || [ -L "$d" ] || [ ! -d "$d" ]; then v=missing
  else
    present="$present$d
"
    for e in "$d"/sandbox-tools-*; do [ -e "$e" ] && existing=yes && earlier=yes && break; done
  fi
  eval "v_$n=\$v m_$n='|' e_$n=\$existing s_$n=no"
done
# The owner and mode of every candidate there, by one `stat` (names are ours or the
# checked $HOME: no newline, no "|"), each line given to the candidates of its name.
if [ -n "$present" ]; then
  set -f; ifs=$IFS; IFS='
'
  for line in $(stat -c '%n|%u|%a' $present 2>/dev/null); do
    [ ${#line} -le 1100 ] || continue  # longer than a name of ours and its owner and mode
    name=${line%|*|*}; meta=${line#"$name|"}
    j=0
    for d in "$@" "$home"; do
      if [ "$d" = "$name" ]; then
        eval "m_$j=\$meta"
        case ${meta#*|} in *[2367]?|*[2367]) eval "s_$j=yes" ;; esac
      fi
      j=$((j + 1))
    done
  done
  IFS=$ifs; set +f
fi
[ "$earlier" = no ] || tag=
judge() {
  chain=$(chain_verdict "$1" "$uid")
  if [ "$chain" != ok ]; then v=$chain; return; fi
  scratch=$(mktemp -d "$1/.sandbox-tools-probe.XXXXXXXX" 2>/dev/null) || scratch=
  case $scratch in
    "$1"/.sandbox-tools-probe.*) ;;
    *) v=not-writable; return ;;
  esac
  v=noexec
  if printf '#!/bin/sh\nexit 0\n' > "$scratch/x" && chmod 700 "$scratch/x"; then
    "$scratch/x" 2>/dev/null && v=ok
  else
    v=not-writable
  fi
  rm -rf "$scratch"
}
made=; reused=
if [ "$earlier" = yes ] && [ -n "$known" ] && [ -n "$sha" ] && [ -n "$size" ]; then
  for pass in no yes; do
    i=0
    for d in "$@" "$home"; do
      n=$i; i=$((i + 1))
      eval "v=\$v_$n s=\$s_$n e=\$e_$n"
      [ -z "$v" ] && [ "$s" = "$pass" ] && [ "$e" = yes ] && [ -z "$reused" ] || continue
      verdict=$(check_install "$d/sandbox-tools-$known" "$sha" "$size" "$uid")
      tree=-
      if [ "$verdict" = trusted ]; then
        "$d/sandbox-tools-$known/sandbox-tools" verify >/dev/null 2>&1 </dev/null
        tree=$?
      fi
      # An install that passed ran from this base, which its check found safe: usable
      # without a test of its own; any other base is judged as for a fresh install.
      if [ "$tree" = 0 ]; then v=ok; reused=$d; else judge "$d"; fi
      eval "v_$n=\$v"
      [ "$v" != ok ] || echo "check.$n=$verdict|$tree"
    done
  done
fi
for pass in no yes all; do
  [ -n "$tag" ] || [ "$pass" = all ] || continue
  i=0
  for d in "$@" "$home"; do
    n=$i; i=$((i + 1))
    eval "v=\$v_$n s=\$s_$n"
    [ -z "$v" ] || continue
    if [ "$pass" = all ]; then [ -z "$made$reused" ] || v=untested
    elif [ "$s" != "$pass" ] || [ -n "$made" ]; then continue; fi
    [ -n "$v" ] || judge "$d"
    if [ "$v" = ok ] && [ -n "$tag" ] && [ -z "$made" ]; then
      want=$d/sandbox-tools-$tag
      if mkdir "$want" 2>/dev/null; then made=$want
      else made=$(mktemp -d "$want-XXXXXXXX" 2>/dev/null) && chmod 755 "$made" || made=
      fi
    fi
    eval "v_$n=\$v"
  done
done
i=0
for d in "$@" "$home"; do
  n=$i; i=$((i + 1))
  eval "echo \"cand.$n=\$v_$n|\$m_$n|\$e_$n\""
done
[ -z "$made" ] || echo "made=$made|$(stat -c '%u|%a' "$made" 2>/dev/null)"
"""
)

# Run only when the probe saw an earlier install. Arguments: the artifact's SHA-256,
# its size, the runtime's uid, then the exact install paths the injector would have
# created. Nothing of an install runs before this prints "trusted" for it: the type,
# owner and mode of the directory, its ancestors and the executable are checked
# first (so nobody else can swap the file), then the digest is compared in the sandbox.
CHECK_SCRIPT = (
    _CHAIN
    + r"""
sha=$1; size=$2; uid=$3; shift 3
i=0
for p in "$@"; do
  n=$i; i=$((i + 1))
  echo "check.$n=$(check_install "$p" "$sha" "$size" "$uid")"
done
"""
)

_WORD = re.compile(r"[A-Za-z0-9._+-]{0,64}")
_DIGITS = re.compile(r"[0-9]{1,10}")
_MODE = re.compile(r"[0-7]{1,4}")  # `stat -c %a` drops leading zeros: 0077 is "77"
_HOME = re.compile(r"/[A-Za-z0-9/._-]{0,1023}")
_TAG = re.compile(r"[0-9a-f]{1,64}")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_EXIT = re.compile(r"[0-9]{1,3}")


class ProbeError(SandboxInjectionError):
    """The sandbox's answer to a fixed script is not what that script prints."""

    default_remedy = (
        "The image's shell or tools do not behave like POSIX sh and coreutils/busybox, or "
        "something in the sandbox interfered; use another image or report the message."
    )


class CandidateStatus(str, Enum):
    OK = "ok"
    NOEXEC = "noexec"
    NOT_WRITABLE = "not-writable"
    MISSING = "missing"
    FOREIGN_ANCESTOR = "foreign-ancestor"
    WRITABLE_ANCESTOR = "writable-ancestor"
    UNREADABLE = "unreadable"
    UNTESTED = "untested"  # the install directory was made in a better candidate
    UNVERIFIED = "unverified (no shell)"

    @property
    def explanation(self) -> str:
        return {
            "ok": "ok",
            "noexec": "noexec",
            "not-writable": "not writable",
            "missing": "missing",
            "foreign-ancestor": "it or a parent is owned by another user, not trusted",
            "writable-ancestor": "it or a parent is writable by others without the sticky bit",
            "unreadable": "its owner and mode cannot be read",
            "untested": "not tested: the install directory was made in a better one",
            "unverified (no shell)": "unverified (no shell)",
        }[self.value]


@dataclass(frozen=True)
class Candidate:
    path: str
    status: CandidateStatus
    owner: int | None = None
    mode: str = ""
    has_installs: bool = False

    @property
    def usable(self) -> bool:
        return self.status is CandidateStatus.OK

    @property
    def shared(self) -> bool:
        """Writable by others (a sticky /tmp): the agent can plant names here."""
        return bool(self.mode) and bool(int(self.mode, 8) & 0o022)

    @property
    def reason(self) -> str:
        return self.status.explanation


@dataclass(frozen=True)
class Pin:
    """The artifact the host has at hand for a machine: an earlier install of its tag is
    checked against these by the probe itself."""

    sha256: str
    size: int


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
    notes: tuple[str, ...] = field(default=())
    # Whether `head -c N` takes exactly N bytes from stdin: the runtime's bytes can then
    # travel on the first start's own stream instead of an upload of their own.
    has_head_bytes: bool = False
    # The probe's own checks of earlier installs (in usable bases), against the artifact
    # of SHA-256 `earlier_sha256`: a reuse needs no round trip of its own.
    earlier: tuple[EarlierInstall, ...] = ()
    earlier_sha256: str = ""
    # The install directory the probe made (in the first of `install_bases()`, checked
    # to be the name the host asked for, the runtime's uid's and 0755), or "".
    made: str = ""
    # The artifact the probe was given for its own machine (`uname -m`): what its shell
    # checks a fresh install's bytes against when they travel on the probe's own stream.
    pin: Pin | None = None

    @property
    def platform(self) -> str:
        return self.arch.platform if self.arch else f"linux/{self.raw_arch}"

    @property
    def os_name(self) -> str:
        """The distribution and its version, as far as the image says ("linux" alone where
        it has no /etc/os-release: busybox, distroless)."""
        return " ".join(part for part in (self.os_id, self.os_version) if part) or "unknown"

    def install_bases(self) -> list[Candidate]:
        """Usable directories, private ones before shared ones, each in probe order."""
        usable = [c for c in self.candidates if c.usable]
        return sorted(usable, key=lambda c: c.shared)


def _lines(output: bytes, what: str) -> list[str]:
    if len(output) > MAX_PROBE_OUTPUT:
        raise ProbeError(f"the {what} printed {len(output)} bytes, far more than it can")
    try:
        text = output.decode("ascii")
    except UnicodeDecodeError:
        raise ProbeError(f"the {what} printed bytes that are not ASCII") from None
    lines = text.splitlines()
    for line in lines:
        if len(line) > MAX_LINE:
            raise ProbeError(f"the {what} printed a line of {len(line)} characters")
    return lines


def _facts(lines: list[str], allowed: set[str], what: str) -> dict[str, str]:
    """key=value lines, each key from `allowed` and at most once."""
    facts: dict[str, str] = {}
    for line in lines:
        if not line:
            continue
        key, sep, value = line.partition("=")
        if not sep or key not in allowed:
            raise ProbeError(f"the {what} printed an unexpected line: {line[:120]!r}")
        if key in facts:
            raise ProbeError(f"the {what} printed {key!r} twice; refusing forged output")
        facts[key] = value
    return facts


def _word(facts: dict[str, str], key: str, pattern: re.Pattern[str] = _WORD) -> str:
    value = facts.get(key, "")
    if not pattern.fullmatch(value):
        raise ProbeError(f"the probe's {key!r} is malformed: {value[:120]!r}")
    return value


def _candidate(path: str, value: str) -> Candidate:
    parts = value.split("|")
    if len(parts) != 4:
        raise ProbeError(f"malformed candidate line for {path}: {value[:120]!r}")
    status_text, owner, mode, existing = parts
    try:
        status = CandidateStatus(status_text)
    except ValueError:
        raise ProbeError(f"unknown verdict for {path}: {status_text[:40]!r}") from None
    if (owner and not _DIGITS.fullmatch(owner)) or (mode and not _MODE.fullmatch(mode)):
        raise ProbeError(f"malformed owner or mode for {path}: {value[:120]!r}")
    if existing not in ("yes", "no"):
        raise ProbeError(f"malformed candidate line for {path}: {value[:120]!r}")
    return Candidate(path, status, int(owner) if owner else None, mode, existing == "yes")


def probe_make_argument(tags: Mapping[str, str], pins: Mapping[str, Pin] | None = None) -> str:
    """The probe's first argument: the install directory's tag per machine (`uname -m`),
    with the artifact's SHA-256 and size where `pins` has them."""
    words = []
    for machine, tag in tags.items():
        if not (_WORD.fullmatch(machine) and _TAG.fullmatch(tag)):
            raise ValueError(f"not a machine and an install tag: {machine!r}, {tag!r}")
        pin = (pins or {}).get(machine)
        if pin is not None and not (_SHA256.fullmatch(pin.sha256) and pin.size > 0):
            raise ValueError(f"not an artifact's SHA-256 and size: {pin!r}")
        words.append(f"{machine}={tag}" + (f":{pin.sha256}:{pin.size}" if pin else ""))
    return " ".join(words)


def parse_probe(
    output: bytes,
    dirs: tuple[str, ...] = CANDIDATE_DIRS,
    tags: Mapping[str, str] | None = None,
    pins: Mapping[str, Pin] | None = None,
) -> Recon:
    """The probe's output as facts; anything but exactly its format raises ProbeError.

    `tags`: what the probe was asked to make (`probe_make_argument`); a directory it
    reports is accepted only as exactly that, in the base the host itself would choose.
    `pins`: what it was asked to check earlier installs against (`Recon.earlier`)."""
    scalars = {
        *("os_id", "os_version", "arch", "libc", "uid", "user", "home"),
        *("sha256sum", "head_bytes"),
    }
    slots = {f"cand.{index}" for index in range(len(dirs) + 1)}
    checks = {f"check.{index}" for index in range(len(dirs) + 1)}
    facts = _facts(_lines(output, "probe"), scalars | slots | checks | {"made"}, "probe")
    missing = sorted((scalars | slots) - facts.keys())
    made = facts.pop("made", None)
    checked = {key: facts.pop(key) for key in checks & facts.keys()}
    if missing:
        raise ProbeError(f"the probe's output lacks {', '.join(missing)}")
    home = facts["home"]
    if home and not _HOME.fullmatch(home):
        raise ProbeError(f"the probe's 'home' is malformed: {home[:120]!r}")
    if facts["libc"] not in ("glibc", "musl", "none") or not all(
        facts[key] in ("yes", "no") for key in ("sha256sum", "head_bytes")
    ):
        raise ProbeError("the probe's 'libc', 'sha256sum' or 'head_bytes' is malformed")
    uid_text = _word(facts, "uid")
    uid = int(uid_text) if _DIGITS.fullmatch(uid_text) else None
    raw_arch = _word(facts, "arch")
    try:
        arch: Arch | None = Arch.parse(raw_arch)
    except ValueError:
        arch = None
    paths = (*dirs, home)
    candidates = tuple(
        _candidate(path, facts[f"cand.{index}"])
        for index, path in enumerate(paths)
        if path and path not in paths[:index]  # $HOME may be one of the fixed dirs
    )
    recon = Recon(
        arch=arch,
        raw_arch=raw_arch,
        os_id=_word(facts, "os_id") or "unknown",
        os_version=_word(facts, "os_version"),
        libc=facts["libc"],
        uid=uid,
        user=_word(facts, "user"),
        home=home,
        has_shell=True,
        has_sha256sum=facts["sha256sum"] == "yes",
        candidates=candidates,
        has_head_bytes=facts["head_bytes"] == "yes",
        pin=(pins or {}).get(raw_arch),
    )
    if checked:
        recon = _with_earlier(recon, paths, checked, (pins or {}).get(raw_arch))
    if made is None:
        return recon
    return replace(recon, made=_made_directory(recon, made, (tags or {}).get(raw_arch)))


def _with_earlier(
    recon: Recon, paths: tuple[str, ...], checked: dict[str, str], pin: Pin | None
) -> Recon:
    """The probe's checks of earlier installs: only where it was given a pin, each of a
    usable candidate with installs, a known verdict, and the tree's exit code only
    where the verdict let `verify` run."""
    if pin is None or recon.uid is None:
        raise ProbeError("the probe checked earlier installs it was given nothing to check by")
    usable = {c.path for c in recon.install_bases() if c.has_installs}
    earlier = []
    for key, value in sorted(checked.items()):
        path = paths[int(key.removeprefix("check."))]
        verdict_text, sep, tree = value.partition("|")
        try:
            verdict = InstallVerdict(verdict_text)
        except ValueError:
            raise ProbeError(f"unknown install verdict for {path}: {value[:40]!r}") from None
        ran = verdict is InstallVerdict.TRUSTED  # `verify` runs on a trusted one alone
        exit_ok = _EXIT.fullmatch(tree) is not None if ran else tree == "-"
        if path not in usable or not sep or not exit_ok:
            raise ProbeError(f"a malformed check of an earlier install in {path}: {value[:60]!r}")
        earlier.append(EarlierInstall(path, verdict, int(tree) if ran else None))
    return replace(recon, earlier=tuple(earlier), earlier_sha256=pin.sha256)


def _made_directory(recon: Recon, value: str, tag: str | None) -> str:
    """The directory the probe reports it made, if it is exactly what the host asked for:
    the tag's name (or a fresh name beside it) in the base the host would choose from
    the probe's own verdicts, owned by the runtime's uid, mode 0755."""
    path, _, rest = value.partition("|")
    bases = recon.install_bases()
    if tag is None or not bases or recon.uid is None:
        raise ProbeError(f"the probe made a directory it was not asked for: {value[:120]!r}")
    wanted = f"{bases[0].path.rstrip('/')}/{INSTALL_PREFIX}{tag}"
    if not (path == wanted or re.fullmatch(re.escape(wanted) + r"-[A-Za-z0-9]{8}", path)):
        raise ProbeError(f"the probe made {path[:120]!r}, not {wanted}[-XXXXXXXX]")
    if rest != f"{recon.uid}|755":
        raise ProbeError(
            f"the directory the probe made is not the runtime's uid's 0755: {rest[:40]!r}"
        )
    return path


@dataclass(frozen=True)
class EarlierInstall:
    """An earlier install the probe checked: its base (`sandbox-tools-TAG` in it), the
    verdict, and where that was "trusted", the exit code of its `verify`."""

    base: str
    verdict: InstallVerdict
    tree_exit: int | None


class InstallVerdict(str, Enum):
    TRUSTED = "trusted"
    UNVERIFIED = "unverified"  # all checks passed but the sandbox cannot hash: host reads
    ABSENT = "absent"
    WRITABLE_BY_OTHERS = "writable-by-others"
    FOREIGN_OWNER = "foreign-owner"
    FOREIGN_ANCESTOR = "foreign-ancestor"
    WRITABLE_ANCESTOR = "writable-ancestor"
    UNREADABLE = "unreadable"
    NO_EXECUTABLE = "no-executable"
    FOREIGN_EXECUTABLE = "foreign-executable"
    WRITABLE_EXECUTABLE = "writable-executable"
    WRONG_SIZE = "wrong-size"
    WRONG_DIGEST = "wrong-digest"


def parse_check(output: bytes, paths: tuple[str, ...]) -> dict[str, InstallVerdict]:
    """The reuse check's verdict per path; anything else raises ProbeError."""
    slots = {f"check.{index}" for index in range(len(paths))}
    facts = _facts(_lines(output, "install check"), slots, "install check")
    if facts.keys() != slots:
        raise ProbeError("the install check did not give a verdict for every path")
    verdicts: dict[str, InstallVerdict] = {}
    for index, path in enumerate(paths):
        try:
            verdicts[path] = InstallVerdict(facts[f"check.{index}"])
        except ValueError:
            raise ProbeError(
                f"unknown install verdict for {path}: {facts[f'check.{index}'][:40]!r}"
            ) from None
    return verdicts
