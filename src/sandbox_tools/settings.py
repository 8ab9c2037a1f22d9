"""The host's settings, each defined once, resolved by one cascade.

defaults -> `[tool.sandbox-tools]` in the nearest pyproject.toml (from the working
directory up) -> `SANDBOX_TOOLS_*` environment variables -> command-line flags (the CLI
applies those last, with `with_flags`). The cascade runs once per invocation (the CLI's
root callback) or per library entry point, and the result is passed down as a value:
nothing below reads the environment or a process-wide override. The environment is a
parameter, so tests pass a dict; an unknown key in the table gets a "did you mean", a bad value a
sentence naming where it came from. Every setting is listed in docs/CONFIGURATION.md, generated
from `SETTINGS` and checked by a test.

The in-container runtime has its own few variables (protocol.py); this is host-side.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandbox_tools.errors import ConfigurationError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

TABLE = "sandbox-tools"  # [tool.sandbox-tools]
DEFAULT_DEBIAN_MIRROR = "http://deb.debian.org/debian"
DEFAULT_ENGINE_CONCURRENCY = 32


@dataclass(frozen=True)
class Setting:
    key: str  # in [tool.sandbox-tools]
    env: str  # the SANDBOX_TOOLS_* variable
    parse: Callable[[str], Any]
    default: Any
    doc: str

    @property
    def field(self) -> str:
        return self.key.replace("-", "_")


def _bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"{text!r} is not a yes/no value (1/0, true/false)")


def _positive(text: str) -> int:
    if not text.strip().isdigit() or int(text) < 1:
        raise ValueError(f"{text!r} is not a positive whole number")
    return int(text)


def _text(text: str) -> str | None:
    return text or None


def _path(text: str) -> Path | None:
    return Path(text).expanduser() if text else None


def _names(text: str) -> tuple[str, ...]:
    """A list of names: a TOML array, or `a,b` (in the environment); empty means none."""
    names = tuple(part.strip() for part in text.split(",") if part.strip())
    for name in names:
        if any(c.isspace() for c in name):
            raise ValueError(f"{name!r} is not a name (separate names with commas)")
    return names


SETTINGS: tuple[Setting, ...] = (
    Setting(
        "dist", "SANDBOX_TOOLS_DIST", _path, None,
        "the dist/ directory the injector looks in (default: the checkout's)",
    ),
    Setting(
        "cache", "SANDBOX_TOOLS_CACHE", _path, None,
        "cache root: debootstrapped roots, fetched artifacts and the add-ons kept for local "
        "engines, `addons/` (default "
        "`$XDG_CACHE_HOME/sandbox-tools`, else `~/.cache/sandbox-tools`)",
    ),
    Setting(
        "offline", "SANDBOX_TOOLS_OFFLINE", _bool, False,
        "the injector never fetches; it uses bundled, cached or locally built artifacts",
    ),
    Setting(
        "engine-concurrency", "SANDBOX_TOOLS_ENGINE_CONCURRENCY", _positive,
        DEFAULT_ENGINE_CONCURRENCY,
        "execs (and file copies) one process runs at once against one Docker engine; "
        "more wait their turn",
    ),
    Setting(
        "keep-containers", "SANDBOX_TOOLS_KEEP_CONTAINERS", _bool, False,
        "keep the containers build, validate and the tests make, for debugging",
    ),
    Setting(
        "debian-mirror", "SANDBOX_TOOLS_DEBIAN_MIRROR", str, DEFAULT_DEBIAN_MIRROR,
        "Debian mirror for the offline base images",
    ),
    Setting(
        "debug", "SANDBOX_TOOLS_DEBUG", _bool, False,
        "the CLI shows the traceback of an internal error instead of one line (`--debug`)",
    ),
    # Where `tools release` publishes (each also a flag of the same name).
    Setting("s3-bucket", "SANDBOX_TOOLS_S3_BUCKET", _text, None, "`tools release`: the S3 bucket"),
    Setting(
        "s3-prefix", "SANDBOX_TOOLS_S3_PREFIX", str, "releases/{version}",
        "`tools release`: key prefix; {version} is replaced",
    ),
    Setting(
        "s3-region", "SANDBOX_TOOLS_S3_REGION", _text, None,
        "`tools release`: bucket region (default: AWS_REGION, else the bucket's own)",
    ),
    Setting(
        "s3-endpoint-url", "SANDBOX_TOOLS_S3_ENDPOINT_URL", _text, None,
        "`tools release`: an S3-compatible endpoint (MinIO, moto, ...)",
    ),
    Setting(
        "s3-public-read", "SANDBOX_TOOLS_S3_PUBLIC_READ", _bool, False,
        "`tools release`: upload with the public-read ACL",
    ),
    Setting(
        "s3-public-url", "SANDBOX_TOOLS_S3_PUBLIC_URL", _text, None,
        "`tools release`: public base URL of the prefix (e.g. a CDN)",
    ),
    Setting(
        "github-repo", "SANDBOX_TOOLS_GITHUB_REPO", _text, None,
        "`tools release`: publish a GitHub release in OWNER/NAME (needs GITHUB_TOKEN)",
    ),
    Setting(
        "github-tag", "SANDBOX_TOOLS_GITHUB_TAG", str, "v{version}",
        "`tools release`: the release tag; {version} is replaced",
    ),
    Setting(
        "github-api-url", "SANDBOX_TOOLS_GITHUB_API_URL", str, "https://api.github.com",
        "`tools release`: GitHub API base URL",
    ),
    Setting(
        "github-web-url", "SANDBOX_TOOLS_GITHUB_WEB_URL", str, "https://github.com",
        "`tools release`: base of the download URLs",
    ),
    # What `tools release` demands of the validate report (the flag is --require).
    Setting(
        "release-require", "SANDBOX_TOOLS_RELEASE_REQUIRE", _names, (),
        "`tools release`: matrix distributions (or families, the name before the dash: "
        "`debian` means every `debian-*` row) whose every cell must have passed for every "
        "platform, none skipped but those a shell-less image cannot run; a list, or `a,b` "
        "in the environment",
    ),
)  # fmt: skip


@dataclass(frozen=True)
class Settings:
    dist: Path | None = None
    cache: Path | None = None
    offline: bool = False
    engine_concurrency: int = DEFAULT_ENGINE_CONCURRENCY
    keep_containers: bool = False
    debian_mirror: str = DEFAULT_DEBIAN_MIRROR
    debug: bool = False
    s3_bucket: str | None = None
    s3_prefix: str = "releases/{version}"
    s3_region: str | None = None
    s3_endpoint_url: str | None = None
    s3_public_read: bool = False
    s3_public_url: str | None = None
    github_repo: str | None = None
    github_tag: str = "v{version}"
    github_api_url: str = "https://api.github.com"
    github_web_url: str = "https://github.com"
    release_require: tuple[str, ...] = ()


def find_pyproject(start: Path | None = None) -> Path | None:
    """The nearest pyproject.toml from `start` (default: the working directory) upward."""
    try:
        here = (start or Path.cwd()).resolve()
    except OSError:  # the working directory was removed under us
        return None
    for directory in (here, *here.parents):
        candidate = directory / "pyproject.toml"
        if candidate.is_file():
            return candidate
    return None


@functools.lru_cache(maxsize=8)
def _table(path: Path, mtime_ns: int) -> dict[str, Any]:
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError):
        return {}  # the user's project file, not ours to judge; our table is checked below
    table = data.get("tool", {}).get(TABLE, {})
    if not isinstance(table, dict):
        raise ConfigurationError(f"{path}: [tool.{TABLE}] must be a table")
    return table


def load_settings(
    environ: Mapping[str, str] | None = None,
    pyproject: Path | None = None,
    *,
    read_project: bool = True,
) -> Settings:
    """The cascade, without flags: defaults, then the pyproject table (unless
    `read_project` is false), then the environment."""
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    by_key = {s.key: s for s in SETTINGS}
    project = pyproject if pyproject is not None else find_pyproject() if read_project else None
    if project is not None and project.is_file():
        for key, raw in _table(project, project.stat().st_mtime_ns).items():
            setting = by_key.get(key)
            if setting is None:
                close = difflib.get_close_matches(key, by_key, n=1, cutoff=0.6)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise ConfigurationError(
                    f"{project}: [tool.{TABLE}] has an unknown key {key!r}{hint}",
                    remedy="Known keys: " + ", ".join(by_key),
                )
            values[setting.field] = _parse(setting, raw, f"{project}: [tool.{TABLE}] {key}")
    for setting in SETTINGS:
        if setting.env in environ:
            values[setting.field] = _parse(setting, environ[setting.env], setting.env)
    return Settings(**values)


def _parse(setting: Setting, raw: Any, where: str) -> Any:
    if isinstance(raw, list):  # a TOML array: only list-valued settings take one
        if setting.parse is not _names:
            raise ConfigurationError(f"{where}: a list is not a value here", remedy=setting.doc)
        if not all(isinstance(item, str) for item in raw):
            raise ConfigurationError(f"{where}: every item must be a string", remedy=setting.doc)
        raw = ",".join(raw)
    text = str(raw).lower() if isinstance(raw, bool) else str(raw)
    try:
        return setting.parse(text)
    except ValueError as exc:
        raise ConfigurationError(f"{where}: {exc}", remedy=setting.doc) from None


def with_flags(resolved: Settings, flags: Mapping[str, Any]) -> Settings:
    """The last step of the cascade for one command: the flags given (not None) win."""
    unknown = set(flags) - {f.name for f in dataclasses.fields(Settings)}
    if unknown:
        raise ValueError(f"no such settings: {', '.join(sorted(unknown))}")
    return dataclasses.replace(resolved, **{k: v for k, v in flags.items() if v is not None})
