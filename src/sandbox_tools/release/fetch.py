"""`tools fetch`: obtain the manifest's artifacts, verified, where the injector looks.

Trust comes from the manifest this installation carries (or one the user names), never
from the source: a mirror, a directory or a bundle only supplies bytes, and bytes are
kept only when their size and SHA-256 are the manifest's. Downloads go to a hidden
partial file in the destination directory and are renamed into place after
verification, so a reader sees either nothing or a verified artifact. An interrupted
HTTP transfer resumes with a Range request; a failed one leaves nothing behind. A
server that sends nothing back (refused, unreachable, silent for FIRST_BYTE_TIMEOUT) is
given up at once, with a few words saying why, and not asked again during the fetch.
Concurrent fetches into the same directory serialise on a lock of that directory.
When a source cannot supply an artifact, the reason is said (`Transfers.note`) before
the next source is tried, never skipped over in silence.

Only the runtimes are fetched by default. The browser add-on (optional, about 100 MB a
platform) comes too when asked for (`with_browser`), or when the bundle fetched from
holds it: a bundle is carried in on purpose, with or without it. It is checked and
resumed exactly like a runtime.
"""

from __future__ import annotations

import contextlib
import fcntl
import http.client
import os
import socket
import ssl
import tarfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Protocol
from urllib.parse import unquote, urlparse

import requests

from sandbox_tools.artifacts import Artifact, ArtifactKind, place, remember_digest, sha256_of
from sandbox_tools.errors import ConfigurationError, FetchError
from sandbox_tools.release.manifest import Manifest
from sandbox_tools.release.progress import NoProgress, Transfers

CHUNK = 1 << 16
HTTP_ATTEMPTS = 5  # per mirror, once it has answered; each resumes where the last stopped
CONNECT_TIMEOUT = 10.0  # seconds to open the connection
# Seconds a server may stay silent (requests has one read timeout for both cases). Before
# the first byte of its answer: the server is given up at once, without another attempt
# (it would wait as long again, for every artifact), and the next source is tried; a
# mirror that accepted the connection and never answered used to hold each artifact for
# five minutes (5 attempts of 60 s). Mid-transfer: the attempt ends, and the next one
# resumes from the bytes held. pip waits 15 s too.
FIRST_BYTE_TIMEOUT = 15.0


class _SourceFailed(Exception):
    """One source could not supply the bytes; the next source is tried."""


class _Unanswered(_SourceFailed):
    """The server sent nothing back (refused, unreachable, silent past FIRST_BYTE_TIMEOUT):
    it is not asked again during this fetch, for any artifact."""

    def __init__(self, url: str, why: str) -> None:
        super().__init__(f"{url}: {why}")
        self.server = _server(url)
        self.why = why


def _server(url: str) -> str:
    parsed = urlparse(url)
    return f"{parsed.scheme}://{parsed.netloc}"


class Source(Protocol):
    @property
    def label(self) -> str: ...

    def fetch_into(self, partial: Path, artifact: Artifact, progress: Transfers) -> None:
        """Leave the artifact's bytes in `partial` (possibly resuming what is there)."""


def _write_blocks(
    blocks: Iterable[bytes],
    partial: Path,
    artifact: Artifact,
    label: str,
    progress: Transfers,
    offset: int = 0,
) -> None:
    """Write `blocks` into `partial` from `offset` (appending when resuming), refusing to
    grow past the manifest's size."""
    advance = progress.start(artifact.name, artifact.size, offset)
    with partial.open("ab" if offset else "wb") as out:
        for block in blocks:
            offset += len(block)
            if offset > artifact.size:
                raise _SourceFailed(f"{label}: larger than the manifest's {artifact.size} bytes")
            out.write(block)
            advance(len(block))


def _blocks(stream: IO[bytes]) -> Iterator[bytes]:
    return iter(lambda: stream.read(CHUNK), b"")


@dataclass(frozen=True)
class FileSource:
    path: Path

    @property
    def label(self) -> str:
        return str(self.path)

    def fetch_into(self, partial: Path, artifact: Artifact, progress: Transfers) -> None:
        try:
            with self.path.open("rb") as stream:
                _write_blocks(_blocks(stream), partial, artifact, self.label, progress)
        except OSError as exc:
            raise _SourceFailed(f"{self.label}: {exc.strerror or exc}") from None


@dataclass(frozen=True)
class BundleSource:
    """A member of a bundle made by `tools bundle create`; read, never extracted by path."""

    bundle: Path

    @property
    def label(self) -> str:
        return f"{self.bundle} (bundle)"

    def fetch_into(self, partial: Path, artifact: Artifact, progress: Transfers) -> None:
        try:
            with tarfile.open(self.bundle) as tar:
                member = next(
                    (
                        m
                        for m in tar.getmembers()
                        if m.name.lstrip("./").split("/")[-1] == artifact.name
                        and m.name.count("/") <= 1
                    ),
                    None,
                )
                if member is None or not member.isreg():
                    raise _SourceFailed(
                        f"{self.label}: has no file named {artifact.name} (a bundle of "
                        "another version?)"
                    )
                stream = tar.extractfile(member)
                assert stream is not None  # a regular member always has a stream
                _write_blocks(_blocks(stream), partial, artifact, self.label, progress)
        except OSError as exc:
            raise _SourceFailed(f"{self.label}: cannot read it ({exc.strerror or exc})") from None
        except tarfile.TarError:
            # tarfile's own words ("method gz: ReadError('invalid header')") help nobody.
            raise _SourceFailed(f"{self.label}: not a bundle, or a damaged one") from None


class _CutShort(Exception):
    """The source answered, then the transfer stopped: another attempt resumes it."""


def _causes(exc: BaseException) -> list[BaseException]:
    """`exc` and everything it wraps (requests -> urllib3 -> the socket's OSError)."""
    found: list[BaseException] = []
    pending: list[BaseException | None] = [exc]
    while pending:
        current = pending.pop(0)
        if current is None or any(current is seen for seen in found):
            continue
        found.append(current)
        pending += [arg for arg in current.args if isinstance(arg, BaseException)]
        reason = getattr(current, "reason", None)
        pending += [reason if isinstance(reason, BaseException) else None]
        pending += [current.__cause__, current.__context__]
    return found


def _no_answer(exc: requests.RequestException, url: str) -> str:
    """Why a source sent nothing back, in a few words (never urllib3's repr)."""
    causes = _causes(exc)
    if isinstance(exc, requests.exceptions.ProxyError):
        # Behind a proxy the environment names, the mirror was never reached: say so, or
        # the user looks for a fault in the mirror.
        proxy = requests.utils.select_proxy(url, requests.utils.get_environ_proxies(url))
        why = _no_answer(requests.ConnectionError(*exc.args), proxy or url)
        return f"the proxy {proxy or '(from the environment)'} did not pass it on: {why}"
    if isinstance(exc, requests.ConnectTimeout):
        return f"no connection within {CONNECT_TIMEOUT:g} s"
    if isinstance(exc, requests.ReadTimeout):
        return f"no answer within {FIRST_BYTE_TIMEOUT:g} s"
    for cause in causes:
        if isinstance(cause, ConnectionRefusedError):
            return "connection refused"
        if isinstance(cause, socket.gaierror):
            return f"cannot resolve {urlparse(url).hostname}"
        if isinstance(cause, http.client.RemoteDisconnected):
            return "closed the connection without answering"
        if isinstance(cause, ssl.SSLCertVerificationError):
            return f"TLS: {cause.verify_message or 'certificate verify failed'}"
        if isinstance(cause, ssl.SSLError):
            return f"TLS: {cause.reason or 'handshake failed'}"
        if isinstance(cause, ConnectionResetError):
            return "connection reset without an answer"
    errors = [c for c in causes if isinstance(c, OSError) and c.strerror]
    if errors:
        return f"cannot connect ({errors[-1].strerror})"
    return f"no answer ({type(exc).__name__})"


def _cut_short(exc: requests.RequestException) -> str:
    """Why a transfer that had begun stopped, in a few words."""
    if any(isinstance(c, (TimeoutError, socket.timeout)) for c in _causes(exc)):
        return f"no data for {FIRST_BYTE_TIMEOUT:g} s"
    return "the connection closed early"


@dataclass(frozen=True)
class HttpSource:
    url: str

    @property
    def label(self) -> str:
        return self.url

    def fetch_into(self, partial: Path, artifact: Artifact, progress: Transfers) -> None:
        """Up to HTTP_ATTEMPTS transfers, each resuming what the previous one left. A
        source that does not answer at all is given up at once (`_SourceFailed`)."""
        why = "the connection closed early"
        with requests.Session() as session:
            for _attempt in range(HTTP_ATTEMPTS):
                have = partial.stat().st_size if partial.exists() else 0
                if have > artifact.size:
                    partial.unlink()
                    have = 0
                if have == artifact.size:
                    return
                if have:
                    progress.note(f"{self.url}: resuming at {have:,} of {artifact.size:,} bytes")
                try:
                    self._transfer(session, partial, artifact, have, progress)
                except _CutShort as exc:
                    why = str(exc)
                    continue
                if partial.stat().st_size == artifact.size:
                    return
        have = partial.stat().st_size if partial.exists() else 0
        raise _SourceFailed(
            f"{self.url}: transfer stopped at {have:,} of {artifact.size:,} bytes after "
            f"{HTTP_ATTEMPTS} attempts ({why})"
        )

    def _transfer(
        self,
        session: requests.Session,
        partial: Path,
        artifact: Artifact,
        have: int,
        progress: Transfers,
    ) -> None:
        headers = {"Range": f"bytes={have}-"} if have else {}
        try:
            response = session.get(
                self.url,
                headers=headers,
                stream=True,
                timeout=(CONNECT_TIMEOUT, FIRST_BYTE_TIMEOUT),
            )
        except requests.RequestException as exc:
            # Not one byte came back: asking again would wait as long again, for every
            # artifact. The next source is tried now.
            raise _Unanswered(self.url, _no_answer(exc, self.url)) from None
        with response:
            resumed = response.status_code == 206 and response.headers.get(
                "Content-Range", ""
            ).startswith(f"bytes {have}-")
            if response.status_code == 416 or (response.status_code == 206 and not resumed):
                partial.unlink(missing_ok=True)  # the server disagrees about what we hold
                raise _CutShort(f"HTTP {response.status_code} for a resume")
            if response.status_code not in (200, 206):
                why = {
                    401: " (the mirror refuses anonymous downloads)",
                    403: " (the mirror refuses anonymous downloads)",
                    404: " (not published there)",
                }.get(response.status_code, "")
                raise _SourceFailed(
                    f"{self.url}: HTTP {response.status_code} {response.reason}{why}"
                )
            offset = have if resumed else 0
            declared = _declared_size(response, resumed)
            if declared is not None and declared != artifact.size:
                # The server says how long its file is, and it is not the manifest's: a
                # complete answer of the wrong size, not a transfer to resume.
                raise _SourceFailed(
                    f"{self.url}: {declared:,} bytes, the manifest pins {artifact.size:,}"
                )
            try:
                blocks = response.iter_content(CHUNK)
                _write_blocks(blocks, partial, artifact, self.url, progress, offset)
            except requests.RequestException as exc:
                raise _CutShort(_cut_short(exc)) from None
            held = partial.stat().st_size if partial.exists() else 0
            if held < artifact.size and not resumed and _delimited(response):
                # The answer ended where its own length said (urllib3 raises when a body
                # stops short of its Content-Length): complete, and short.
                raise _SourceFailed(
                    f"{self.url}: {held:,} bytes, the manifest pins {artifact.size:,}"
                )


def _delimited(response: requests.Response) -> bool:
    """Whether the body's end is marked (a length, or chunked): a clean end is its end,
    not a dropped connection."""
    headers = response.headers
    if headers.get("Content-Encoding", "identity").lower() not in ("", "identity"):
        return False
    return "Content-Length" in headers or "chunked" in headers.get("Transfer-Encoding", "")


def _declared_size(response: requests.Response, resumed: bool) -> int | None:
    """The size of the whole file as the server states it (Content-Length of a 200, the
    total of a 206's Content-Range), or None when it does not say."""
    headers = response.headers
    if headers.get("Content-Encoding", "identity").lower() not in ("", "identity"):
        return None  # the length is of the encoded body
    text = (
        headers.get("Content-Range", "").rsplit("/", 1)[-1]
        if resumed
        else headers.get("Content-Length", "")
    )
    return int(text) if text.strip().isdigit() else None


def source_for(location: str) -> Source:
    """A download source for an http(s) or file URL (mirrors and the manifest's URLs)."""
    parsed = urlparse(location)
    if parsed.scheme in ("http", "https"):
        return HttpSource(location)
    if parsed.scheme == "file":
        return FileSource(Path(unquote(parsed.path)))
    raise ConfigurationError(
        f"cannot fetch from {location!r}: only http(s):// and file:// URLs are supported",
        remedy="Give an HTTP(S) mirror with --mirror, or a directory/bundle with --from.",
    )


def sources_for(
    artifact: Artifact, mirrors: Sequence[str] = (), origin: Path | None = None
) -> list[Source]:
    """Where to look, in order: --from, else --mirror bases, then the manifest's URLs."""
    if origin is not None:
        if origin.is_dir():
            return [FileSource(origin / artifact.name)]
        if origin.is_file():
            check_bundle(origin)
            return [BundleSource(origin)]
        raise ConfigurationError(f"--from {origin}: no such directory or bundle")
    locations = [f"{m.rstrip('/')}/{artifact.name}" for m in mirrors] + list(artifact.urls)
    if not locations:
        raise ConfigurationError(
            f"the manifest lists no mirror for {artifact.name}",
            remedy="Pass --mirror URL, or --from DIR/BUNDLE for offline installs.",
        )
    return [source_for(location) for location in locations]


def bundle_holds(bundle: Path) -> set[str]:
    """The names of the files a bundle holds, as `BundleSource` finds them."""
    check_bundle(bundle)
    try:
        with tarfile.open(bundle) as tar:
            return {
                m.name.lstrip("./").split("/")[-1]
                for m in tar.getmembers()
                if m.isreg() and m.name.count("/") <= 1
            }
    except (OSError, tarfile.TarError):
        raise ConfigurationError(
            f"--from {bundle}: not a bundle, or a damaged one",
            remedy="Make a new bundle with `tools bundle create` where the artifacts are.",
        ) from None


def wanted_artifacts(
    manifest: Manifest,
    platforms: Sequence[str] = (),
    with_browser: bool = False,
    origin: Path | None = None,
) -> list[Artifact]:
    """What to fetch: the runtime of each platform (default: every platform the release
    has), and its browser add-on when `with_browser`, or when `origin` is a bundle that
    holds it. Bad input, said before anything is fetched: an add-on for a platform named
    in `platforms` that the release lacks, a release without any add-on, a bundle without
    the add-ons asked for. Without `platforms`, every add-on the release has is wanted."""
    chosen = list(dict.fromkeys(platforms)) or [a.platform for a in manifest.runtimes]
    runtimes = [manifest.for_platform(p) for p in chosen]
    addons = [a for p in chosen if (a := manifest.find(p, ArtifactKind.BROWSER)) is not None]
    bundle = origin if origin is not None and origin.is_file() else None
    held = bundle_holds(bundle) if bundle is not None else None
    if not with_browser:
        return runtimes + [a for a in addons if held is not None and a.name in held]
    lacking = [p for p in chosen if manifest.find(p, ArtifactKind.BROWSER) is None]
    if lacking and (platforms or not addons):
        have = [a.platform for a in manifest.of_kind(ArtifactKind.BROWSER)]
        raise ConfigurationError(
            f"--with-browser: sandbox-tools {manifest.version} carries no browser add-on for "
            + ", ".join(lacking),
            remedy=(
                f"Fetch it where the release has one (--platform {','.join(have)} "
                "--with-browser) and the runtime alone elsewhere (without --with-browser)"
                if have
                else "Fetch without --with-browser (the add-on is optional)"
            )
            + "; or build the add-on locally: `tools build --with-browser`.",
        )
    not_held = [a for a in addons if held is not None and a.name not in held]
    if not_held:
        raise ConfigurationError(
            f"--with-browser: the bundle {bundle} holds no browser add-on for "
            + ", ".join(a.platform for a in not_held),
            remedy="Make the bundle with `tools bundle create --with-browser` where the "
            "released add-on is, or fetch from this one without --with-browser.",
        )
    return runtimes + addons


def check_bundle(path: Path) -> None:
    """Bad input before anything is fetched: `--from` names a file that is no tarball."""
    remedy = (
        "Give the .tar file `tools bundle create` wrote (sandbox-tools-<version>-artifacts.tar), "
        "or a directory holding the artifacts."
    )
    try:
        is_tar = tarfile.is_tarfile(path)
    except OSError as exc:
        raise ConfigurationError(
            f"--from {path}: cannot read it ({exc.strerror or exc})", remedy=remedy
        ) from None
    if not is_tar:
        raise ConfigurationError(
            f"--from {path} is not a bundle (not a tar archive)", remedy=remedy
        )


def _remedy(sources: Sequence[Source], artifact: Artifact) -> str | None:
    """What to do next, given where the bytes were sought: never the thing just done."""
    if sources and all(isinstance(s, BundleSource) for s in sources):
        return (
            f"This bundle cannot supply {artifact.name}: it is damaged, or not the release "
            "this installation trusts. Make a new bundle from the released artifacts "
            "(`tools bundle create` where they are), carry it in, and fetch from that."
        )
    files = [s for s in sources if isinstance(s, FileSource)]
    if files and len(files) == len(sources):
        directory = files[0].path.parent
        return (
            f"Put the released {artifact.name} in {directory} (e.g. `tools fetch --out "
            f"{directory}` where the mirrors are reachable), or fetch from a bundle made by "
            "`tools bundle create` with --from BUNDLE."
        )
    return None  # mirrors: FetchError's own remedy (another mirror, or a bundle)


@dataclass(frozen=True)
class FetchOutcome:
    artifact: Artifact
    path: Path
    action: str  # "present" (re-verified), "fetched", "replaced" (a stale file was there)
    source: str = ""


@contextlib.contextmanager
def _directory_lock(directory: Path) -> Iterator[None]:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def fetch_artifact(
    artifact: Artifact,
    dest: Path,
    sources: Sequence[Source],
    progress: Transfers,
    unanswered: dict[str, str] | None = None,
) -> FetchOutcome:
    """Caller holds the directory lock. `unanswered`: servers that sent nothing back
    earlier in this fetch, and why; they are skipped, and those that do not answer now
    are added."""
    unanswered = {} if unanswered is None else unanswered
    target = dest / artifact.name
    if artifact.matches(target):
        return FetchOutcome(artifact, target, "present")
    stale = target.exists()
    partial = dest / f".{artifact.name}.partial"
    failures: list[str] = []
    # A partial left by a killed run is resumed; if it then fails verification it may hold
    # another mirror's bytes, so that source gets one more try from zero.
    attempts: list[tuple[Source, bool]] = [(source, partial.exists()) for source in sources]

    named: list[Source] = []  # the source last said to be tried next

    def refused(reason: str) -> None:
        """A source gave up: said now, with the one tried next (the error lists them all)."""
        failures.append(reason)
        if attempts:
            named.append(attempts[0][0])
            progress.note(f"{artifact.name}: {reason}; trying {attempts[0][0].label}")

    try:
        while attempts:
            source, resumed = attempts.pop(0)
            server = _server(source.label) if isinstance(source, HttpSource) else None
            if server in unanswered:
                refused(f"{source.label}: not asked ({server}: {unanswered[server]}, just before)")
                continue
            if not named or named[-1] is not source:
                # Before a source that may stay silent for FIRST_BYTE_TIMEOUT: never a
                # blank terminal. The next ones are named by the line saying why.
                named.append(source)
                progress.note(f"{artifact.name}: trying {source.label}")
            try:
                source.fetch_into(partial, artifact, progress)
            except _Unanswered as exc:
                unanswered[exc.server] = exc.why
                partial.unlink(missing_ok=True)
                refused(str(exc))
                continue
            except _SourceFailed as exc:
                partial.unlink(missing_ok=True)
                refused(str(exc))
                continue
            finally:
                progress.finish(artifact.name)
            size = partial.stat().st_size
            digest = sha256_of(partial) if size == artifact.size else None
            if digest is not None and digest == artifact.sha256:
                # A runtime is executed as it is; an add-on is an archive to unpack.
                place(partial, target, 0o755 if artifact.kind is ArtifactKind.RUNTIME else 0o644)
                remember_digest(target, digest)
                action = "replaced" if stale else "fetched"
                return FetchOutcome(artifact, target, action, source.label)
            partial.unlink()
            if resumed:
                attempts.insert(0, (source, False))
                continue
            if digest is None:
                refused(f"{source.label}: {size:,} bytes, the manifest pins {artifact.size:,}")
            else:
                refused(f"{source.label}: sha256 {digest}, the manifest pins {artifact.sha256}")
    except BaseException:
        partial.unlink(missing_ok=True)  # interrupted: nothing half-written stays behind
        raise
    raise FetchError(
        f"no source supplied {artifact.name} ({artifact.platform}) with the pinned size and "
        "SHA-256:\n  " + "\n  ".join(failures),
        remedy=_remedy(sources, artifact),
    )


def fetch(
    manifest: Manifest,
    dest: Path,
    platforms: Sequence[str] = (),
    mirrors: Sequence[str] = (),
    origin: Path | None = None,
    progress: Transfers | None = None,
    with_browser: bool = False,
) -> list[FetchOutcome]:
    """Make `dest` hold a verified copy of each wanted platform's runtime, and of its
    browser add-on as `wanted_artifacts` says."""
    wanted = wanted_artifacts(manifest, platforms, with_browser, origin)
    return fetch_artifacts(wanted, dest, mirrors, origin, progress)


def fetch_artifacts(
    wanted: Sequence[Artifact],
    dest: Path,
    mirrors: Sequence[str] = (),
    origin: Path | None = None,
    progress: Transfers | None = None,
) -> list[FetchOutcome]:
    """Make `dest` hold a verified copy of each of these artifacts (records of a trusted
    manifest), and nothing more."""
    progress = progress or NoProgress()
    plan = [(artifact, sources_for(artifact, mirrors, origin)) for artifact in wanted]
    dest.mkdir(parents=True, exist_ok=True)
    unanswered: dict[str, str] = {}  # a server silent for one artifact is for the next
    outcomes: list[FetchOutcome] = []
    failed: list[tuple[Artifact, FetchError]] = []
    with _directory_lock(dest):
        for artifact, sources in plan:
            try:
                outcomes.append(fetch_artifact(artifact, dest, sources, progress, unanswered))
            except FetchError as exc:
                # Said now; the others are still tried, and the error names them all.
                rest = len(plan) - len(outcomes) - len(failed) - 1
                if rest:
                    progress.note(
                        f"{artifact.name}: no source supplied it (why: below); "
                        f"going on with the {rest} other artifact{'s' if rest > 1 else ''}"
                    )
                failed.append((artifact, exc))
    if not failed:
        return outcomes
    if len(failed) == 1 and not outcomes:
        raise failed[0][1]
    names = ", ".join(f"{a.name} ({a.platform})" for a, _ in failed)
    got = ", ".join(o.artifact.name for o in outcomes)
    raise FetchError(
        f"{len(failed)} of {len(plan)} artifacts could not be fetched: {names}"
        + (f" ({got} verified in {dest})" if got else "")
        + ":\n  "
        + "\n  ".join(exc.message.replace("\n", "\n  ") for _, exc in failed),
        remedy=failed[0][1].remedy,
    )
