"""Where releases are published: S3 (boto3) and GitHub releases (REST API via requests).

Both answer the same questions for the release flow: what is there already
(`remote_size`), put these bytes there without ever replacing different ones
(`upload`), give them back (`download`, with the maintainer's credentials), the public
URL the manifest will list, and whether a user can download from it (`user_access`,
`user_download`). S3 uploads are conditional (`If-None-Match: *`), so even two
maintainers racing cannot overwrite an object; GitHub refuses a second asset of the same
name by itself.

Users download anonymously (`tools fetch` sends no credentials), so an S3 object is
checked, and verified, the way they get it: a plain HTTP GET of its public URL. A bucket
the maintainer can read but users cannot would otherwise pass every check and serve
nobody.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol
from urllib.parse import quote

import requests

from sandbox_tools.errors import ConfigurationError, ReleaseRefusedError
from sandbox_tools.settings import Settings

CHUNK = 1 << 16


class PublishConflict(Exception):
    """The object appeared between our look and our upload: re-run to compare bytes."""


class TargetError(Exception):
    """Talking to the target failed (network, permissions, an integrity check on the way)."""


class Target(Protocol):
    @property
    def label(self) -> str:
        """Where, for humans: s3://bucket/prefix, github:owner/repo@tag."""

    @property
    def public_base_url(self) -> str:
        """Artifacts are downloadable at <public_base_url>/<name>."""

    def prepare(self) -> None:
        """Connect and look at what is there; creates nothing (the GitHub release is
        created by the first upload, once every refusal check has passed)."""

    def refusal(self) -> ReleaseRefusedError | None:
        """Why this target would refuse the release (only reading): e.g. a GitHub release
        to publish on a tag that does not exist. Asked before anything is uploaded."""

    def remote_size(self, name: str) -> int | None:
        """Size of a complete object of that name, or None when there is none."""

    def upload(self, name: str, path: Path, advance: Callable[[int], None]) -> None: ...

    def download(self, name: str) -> Iterator[bytes]:
        """The object's bytes, fetched with the maintainer's credentials."""

    def user_download(self, name: str) -> Iterator[bytes]:
        """The object's bytes as a user gets them (for S3: anonymously, from the public URL)."""

    def user_access(self, name: str) -> str | None:
        """Why a user cannot download `name` (a cheap check), or None when they can."""

    @property
    def grants_access(self) -> bool:
        """Whether `grant_access` can make an object downloadable (S3 --s3-public-read)."""

    def grant_access(self, name: str) -> None:
        """Make `name` downloadable by users (it exists, with the right bytes)."""

    def access_remedy(self) -> str:
        """What the maintainer does when users cannot download the objects."""

    def finalize(self) -> str | None:
        """Make what was uploaded and verified public (a GitHub draft is published); a
        line for the maintainer on where that leaves the target, or None."""


class _Reading:
    """A file for an HTTP body that reports progress once per byte, however often the
    client rewinds it (botocore reads bodies once for checksums, then again to send)."""

    def __init__(self, handle: IO[bytes], advance: Callable[[int], None]) -> None:
        self._handle = handle
        self._advance = advance
        self._reported = 0

    def read(self, size: int = -1) -> bytes:
        data = self._handle.read(size)
        position = self._handle.tell()
        if position > self._reported:
            self._advance(position - self._reported)
            self._reported = position
        return data

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._handle.seek(offset, whence)

    def tell(self) -> int:
        return self._handle.tell()

    def __len__(self) -> int:
        current = self._handle.tell()
        end = self._handle.seek(0, os.SEEK_END)
        self._handle.seek(current)
        return end


@dataclass
class S3Target:
    bucket: str
    prefix: str = ""
    # None: AWS_REGION / AWS_DEFAULT_REGION, else the bucket's own (asked once): the public
    # URLs in the manifest must name the region the bucket is really in.
    region: str | None = None
    endpoint_url: str | None = None
    public_read: bool = False
    public_url: str | None = None  # e.g. a CDN in front of the bucket
    _client: Any = field(default=None, init=False, repr=False)

    def _key(self, name: str) -> str:
        prefix = self.prefix.strip("/")
        return f"{prefix}/{name}" if prefix else name

    @property
    def label(self) -> str:
        return f"s3://{self.bucket}/{self.prefix.strip('/')}".rstrip("/")

    @property
    def public_base_url(self) -> str:
        if self.public_url:
            return self.public_url.rstrip("/")
        prefix = self.prefix.strip("/")
        if self.endpoint_url:
            base = f"{self.endpoint_url.rstrip('/')}/{self.bucket}"
        else:
            base = f"https://{self.bucket}.s3.{self._region()}.amazonaws.com"
        return f"{base}/{quote(prefix)}" if prefix else base

    def _region(self) -> str:
        if self.region is None:
            self.region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
        if self.region is None:
            self.region = _bucket_region(self.bucket, self.endpoint_url)
        return self.region

    def prepare(self) -> None:
        try:
            import boto3
        except ImportError:
            raise ConfigurationError(
                "publishing to S3 needs boto3",
                remedy="pip install 'sandbox-tools[release]'",
            ) from None
        region = self._region() if not self.endpoint_url else self.region
        self._client = boto3.client("s3", region_name=region, endpoint_url=self.endpoint_url)
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self._client.head_bucket(Bucket=self.bucket)
        except (ClientError, BotoCoreError) as exc:
            raise ReleaseRefusedError(
                f"cannot reach S3 bucket {self.bucket!r}: {exc}",
                remedy="Check --s3-bucket, --s3-endpoint-url, the region and AWS credentials.",
            ) from None

    def remote_size(self, name: str) -> int | None:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            head = self._client.head_object(Bucket=self.bucket, Key=self._key(name))
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return None
            raise TargetError(f"{self.label}/{name}: {exc}") from None
        except BotoCoreError as exc:
            raise TargetError(f"{self.label}/{name}: {exc}") from None
        return int(head["ContentLength"])

    def upload(self, name: str, path: Path, advance: Callable[[int], None]) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        extra: dict[str, Any] = {"ACL": "public-read"} if self.public_read else {}
        with path.open("rb") as handle:
            try:
                self._client.put_object(
                    Bucket=self.bucket,
                    Key=self._key(name),
                    Body=_Reading(handle, advance),
                    ContentLength=path.stat().st_size,
                    ContentType="application/octet-stream",
                    IfNoneMatch="*",
                    **extra,
                )
            except ClientError as exc:
                code = exc.response.get("Error", {}).get("Code")
                if code in ("PreconditionFailed", "412", "ConditionalRequestConflict"):
                    raise PublishConflict(f"{self.label}/{name} appeared during upload") from None
                raise TargetError(f"{self.label}/{name}: {exc}") from None
            except BotoCoreError as exc:
                raise TargetError(f"{self.label}/{name}: {exc}") from None

    def download(self, name: str) -> Iterator[bytes]:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            body = self._client.get_object(Bucket=self.bucket, Key=self._key(name))["Body"]
            try:
                yield from body.iter_chunks(CHUNK)
            finally:
                body.close()
        except (BotoCoreError, ClientError) as exc:
            # botocore checks the CRC S3 returns: corruption on the wire lands here.
            raise TargetError(f"{self.label}/{name}: {exc}") from None

    def _public_url(self, name: str) -> str:
        return f"{self.public_base_url}/{quote(name)}"

    def user_download(self, name: str) -> Iterator[bytes]:
        url = self._public_url(name)
        try:
            with requests.get(url, stream=True, timeout=(10, 600)) as response:
                if response.status_code != 200:
                    raise TargetError(
                        f"{self.label}/{name}: HTTP {response.status_code} {response.reason} "
                        f"from {url} (downloading it anonymously, as users do)"
                    )
                yield from response.iter_content(CHUNK)
        except requests.RequestException as exc:
            raise TargetError(f"{self.label}/{name}: {url}: {exc}") from None

    def user_access(self, name: str) -> str | None:
        url = self._public_url(name)
        try:
            # One byte, no credentials: what `tools fetch` sends, minus the transfer.
            with requests.get(
                url, headers={"Range": "bytes=0-0"}, stream=True, timeout=(10, 60)
            ) as response:
                status, reason = response.status_code, response.reason
        except requests.RequestException as exc:
            return f"users cannot download it: {url}: {exc}"
        if status in (200, 206):
            return None
        what = {
            401: "the bucket refuses anonymous downloads",
            403: "the bucket refuses anonymous downloads",
            404: "the public URL does not serve this object",
        }.get(status, "the public URL does not serve it")
        return f"users cannot download it: HTTP {status} {reason} from {url} ({what})"

    @property
    def grants_access(self) -> bool:
        return self.public_read

    def grant_access(self, name: str) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self._client.put_object_acl(Bucket=self.bucket, Key=self._key(name), ACL="public-read")
        except (ClientError, BotoCoreError) as exc:
            raise TargetError(f"{self.label}/{name}: setting the public-read ACL: {exc}") from None

    def access_remedy(self) -> str:
        objects = f"arn:aws:s3:::{self.bucket}/{self._key('*')}"
        again = "then run the same `tools release` again (what was uploaded is compared and kept)."
        if self.public_url:
            return (
                f"Users download from {self.public_base_url}/ without credentials: make it "
                f"serve the objects of {self.label} (e.g. give the CDN read access to the "
                f"bucket), {again}"
            )
        policy = f'a policy allowing "s3:GetObject" on "{objects}" to "Principal": "*"'
        if self.public_read:
            return (
                "The objects carry the public-read ACL, yet anonymous reads are refused: the "
                "bucket's Block Public Access settings ignore public ACLs. Allow public ACLs "
                f"for this bucket, or give the bucket {policy} (and turn off "
                f"BlockPublicPolicy); {again}"
            )
        return (
            "Users download without credentials. Pass --s3-public-read (each object gets the "
            f"public-read ACL; the bucket must allow ACLs), or give the bucket {policy}; "
            f"{again}"
        )

    def refusal(self) -> ReleaseRefusedError | None:
        return None  # a bucket users cannot read shows on the first object: access_remedy

    def finalize(self) -> str | None:
        """Objects are public as they land; the manifest, uploaded last, points at them."""
        return None


@dataclass
class GitHubTarget:
    """A GitHub release, created as a draft and published only once every asset is
    uploaded and verified (goreleaser's order): nobody downloads a half-made release.

    A release is published only on a tag that exists: when a release becomes public
    and its tag does not exist, GitHub creates the tag itself, at the head of the
    default branch, which may be neither the commit that was built nor the one that
    carries the manifest. A draft needs no tag (`keep_draft`).
    """

    repo: str  # owner/name
    tag: str
    token: str
    api_url: str = "https://api.github.com"
    web_url: str = "https://github.com"
    release_name: str = ""
    keep_draft: bool = False  # leave the release a draft: a later run publishes it
    _release: dict[str, Any] | None = field(default=None, init=False, repr=False)
    _assets: dict[str, dict[str, Any]] = field(default_factory=dict, init=False, repr=False)
    _session: requests.Session = field(default_factory=requests.Session, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.repo.count("/") != 1:
            raise ConfigurationError(f"--github-repo must be OWNER/NAME, not {self.repo!r}")
        self._session.headers.update(
            {
                "Authorization": f"Bearer {self.token}",
                "Accept": "application/vnd.github+json",
                "X-GitHub-Api-Version": "2022-11-28",
            }
        )

    @property
    def label(self) -> str:
        return f"github:{self.repo}@{self.tag}"

    @property
    def public_base_url(self) -> str:
        return f"{self.web_url.rstrip('/')}/{self.repo}/releases/download/{quote(self.tag)}"

    def _api(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        try:
            response = self._session.request(
                method, f"{self.api_url.rstrip('/')}{path}", timeout=60, **kwargs
            )
        except requests.RequestException as exc:
            raise TargetError(f"{self.label}: {method} {path}: {exc}") from None
        if response.status_code in (401, 403):
            raise ReleaseRefusedError(
                f"GitHub refused {method} {path}: HTTP {response.status_code} "
                f"{response.text[:200]}",
                remedy="Set GITHUB_TOKEN to a token with contents:write on the repository.",
            )
        return response

    @property
    def _published(self) -> bool:
        return self._release is not None and not self._release.get("draft")

    def prepare(self) -> None:
        response = self._api("GET", f"/repos/{self.repo}/releases/tags/{quote(self.tag)}")
        if response.status_code == 404:
            # Drafts have no tag yet: an interrupted release (or --github-draft) left one
            # to continue. None at all: the first upload creates the draft.
            self._release = self._find_draft()
        else:
            _check(response, self.label)
            self._release = response.json()
        self._load_assets()

    def tag_exists(self) -> bool:
        """Whether the tag is a ref of the repository (GET git/ref is an exact match)."""
        response = self._api("GET", f"/repos/{self.repo}/git/ref/tags/{quote(self.tag)}")
        if response.status_code == 404:
            return False
        _check(response, f"{self.label}: looking up the tag")
        return True

    def _missing_tag(self) -> ReleaseRefusedError:
        return ReleaseRefusedError(
            f"{self.label}: the tag {self.tag} does not exist in {self.repo}, and publishing "
            "the GitHub release would make GitHub create it at the head of the default "
            "branch (which may be neither the released commit nor the manifest's)",
            remedy=f"Push the tag first (git push origin {self.tag}, on the commit that "
            "carries the manifest: RELEASING.md step 5), or pass --github-draft to upload "
            "and verify a draft now; the same command without it publishes the draft once "
            "the tag exists.",
        )

    def refusal(self) -> ReleaseRefusedError | None:
        if self.keep_draft or self._published:
            return None  # a draft needs no tag; a public release has one already
        return None if self.tag_exists() else self._missing_tag()

    def _find_draft(self) -> dict[str, Any] | None:
        page = 1
        while True:
            response = self._api(
                "GET", f"/repos/{self.repo}/releases", params={"per_page": 100, "page": page}
            )
            _check(response, self.label)
            batch = response.json()
            for release in batch:
                if release.get("draft") and release.get("tag_name") == self.tag:
                    found: dict[str, Any] = release
                    return found
            if len(batch) < 100:
                return None
            page += 1

    def _create_draft(self) -> dict[str, Any]:
        response = self._api(
            "POST",
            f"/repos/{self.repo}/releases",
            json={
                "tag_name": self.tag,
                "name": self.release_name or self.tag,
                "draft": True,  # never public on creation: GitHub would create the tag
                "prerelease": False,
            },
        )
        _check(response, f"{self.label}: creating the draft release")
        created: dict[str, Any] = response.json()
        return created

    def user_download(self, name: str) -> Iterator[bytes]:
        # A draft's assets are downloadable only through the API (the release becomes
        # public, with its assets as verified, in `finalize`).
        return self.download(name)

    def user_access(self, name: str) -> str | None:
        return None

    @property
    def grants_access(self) -> bool:
        return False

    def grant_access(self, name: str) -> None:
        raise AssertionError("a GitHub release has no per-object access to grant")

    def access_remedy(self) -> str:
        return ""

    def finalize(self) -> str | None:
        if self._release is None:
            return None
        if self._published:
            if self.keep_draft:
                return (
                    f"{self.label}: the GitHub release was already published; --github-draft "
                    "does not make it a draft again"
                )
            return None
        if self.keep_draft:
            return (
                f"{self.label}: the GitHub release is a draft: once the tag {self.tag} exists, "
                "run the same command without --github-draft to publish it"
            )
        # Checked before anything was uploaded; asked again right before publishing, so
        # that a tag deleted meanwhile never lets GitHub create one.
        if not self.tag_exists():
            raise self._missing_tag()
        response = self._api(
            "PATCH", f"/repos/{self.repo}/releases/{self._release['id']}", json={"draft": False}
        )
        _check(response, f"{self.label}: publishing the draft")
        self._release = response.json()
        return None

    def _load_assets(self) -> None:
        self._assets = {}
        if self._release is None:
            return
        page = 1
        while True:
            response = self._api(
                "GET",
                f"/repos/{self.repo}/releases/{self._release['id']}/assets",
                params={"per_page": 100, "page": page},
            )
            _check(response, self.label)
            batch = response.json()
            for asset in batch:
                self._assets[asset["name"]] = asset
            if len(batch) < 100:
                return
            page += 1

    def remote_size(self, name: str) -> int | None:
        asset = self._assets.get(name)
        if asset is None or asset.get("state") != "uploaded":
            # An upload cut off mid-way leaves a "starter" asset with no complete bytes:
            # never published, so it counts as missing (`upload` removes it first).
            return None
        return int(asset["size"])

    def upload(self, name: str, path: Path, advance: Callable[[int], None]) -> None:
        if self._release is None:
            self._release = self._create_draft()
        starter = self._assets.pop(name, None)
        if starter is not None and starter.get("state") != "uploaded":
            # It blocks the name (a second asset of a name is a 422): delete, then redo.
            response = self._api("DELETE", f"/repos/{self.repo}/releases/assets/{starter['id']}")
            if response.status_code != 404:
                _check(response, f"{self.label}/{name}: deleting the cut-off upload")
        upload_url = str(self._release["upload_url"]).split("{", 1)[0]
        with path.open("rb") as handle:
            try:
                response = self._session.post(
                    upload_url,
                    params={"name": name},
                    data=_Reading(handle, advance),
                    headers={
                        "Content-Type": "application/octet-stream",
                        "Content-Length": str(path.stat().st_size),
                    },
                    timeout=600,
                )
            except requests.RequestException as exc:
                raise TargetError(f"{self.label}/{name}: upload: {exc}") from None
        if response.status_code == 422 and "already_exists" in response.text:
            raise PublishConflict(f"{self.label}/{name} appeared during upload")
        _check(response, f"{self.label}/{name}")
        self._assets[name] = response.json()

    def download(self, name: str) -> Iterator[bytes]:
        asset = self._assets[name]
        try:
            with self._session.get(
                f"{self.api_url.rstrip('/')}/repos/{self.repo}/releases/assets/{asset['id']}",
                headers={"Accept": "application/octet-stream"},
                stream=True,
                timeout=600,
            ) as response:
                _check(response, f"{self.label}/{name}")
                yield from response.iter_content(CHUNK)
        except requests.RequestException as exc:
            raise TargetError(f"{self.label}/{name}: download: {exc}") from None


def _bucket_region(bucket: str, endpoint_url: str | None) -> str:
    """The region a bucket lives in, as S3 reports it (us-east-1 answers None)."""
    try:
        import boto3
        from botocore.exceptions import BotoCoreError, ClientError
    except ImportError:
        raise ConfigurationError(
            "publishing to S3 needs boto3", remedy="pip install 'sandbox-tools[release]'"
        ) from None
    try:
        client = boto3.client("s3", region_name="us-east-1", endpoint_url=endpoint_url)
        location = client.get_bucket_location(Bucket=bucket).get("LocationConstraint")
    except (ClientError, BotoCoreError) as exc:
        raise ReleaseRefusedError(
            f"cannot find the region of S3 bucket {bucket!r}: {exc}",
            remedy="Give --s3-region, or set AWS_REGION.",
        ) from None
    return str(location or "us-east-1")


def _check(response: requests.Response, what: str) -> None:
    if response.status_code >= 400:
        raise TargetError(
            f"{what}: HTTP {response.status_code} from {response.url}: {response.text[:300]}"
        )


# -- from options to targets --------------------------------------------------------------


def expand(template: str, option: str, version: str) -> str:
    """`{version}` in an option's value; any other placeholder is a clear error."""
    try:
        return template.format(version=version)
    except (KeyError, IndexError, ValueError) as exc:
        raise ConfigurationError(
            f"{option} {template!r}: only {{version}} may be used ({exc!s} is not known)",
            remedy=f"Write {option} with {{version}} or no placeholder at all.",
        ) from None


def release_targets(
    where: Settings,
    version: str,
    environ: Mapping[str, str] | None = None,
    github_draft: bool = False,
) -> list[Target]:
    """The targets the resolved settings name (flags already applied by the caller);
    GITHUB_TOKEN comes from `environ` (default: this process's). `github_draft`: leave
    the GitHub release a draft."""
    environ = os.environ if environ is None else environ
    targets: list[Target] = []
    if where.s3_bucket:
        targets.append(
            S3Target(
                bucket=where.s3_bucket,
                prefix=expand(where.s3_prefix, "--s3-prefix", version),
                region=where.s3_region,
                endpoint_url=where.s3_endpoint_url,
                public_read=where.s3_public_read,
                public_url=where.s3_public_url,
            )
        )
    if where.github_repo:
        token = environ.get("GITHUB_TOKEN", "")
        if not token:
            raise ConfigurationError(
                "--github-repo needs a token", remedy="Export GITHUB_TOKEN (contents:write)."
            )
        targets.append(
            GitHubTarget(
                repo=where.github_repo,
                tag=expand(where.github_tag, "--github-tag", version),
                token=token,
                api_url=where.github_api_url,
                web_url=where.github_web_url,
                release_name=f"sandbox-tools {version}",
                keep_draft=github_draft,
            )
        )
    return targets
