"""Our runtime in the place inspect_ai keeps a locally built runtime of its own.

inspect_ai looks for `inspect_ai/binaries/inspect-sandbox-tools-<arch>-v<N>-dev` (a
gzipped tar of the runtime's tree) when INSPECT_SANDBOX_TOOLS_INSTALL_STATE=edited.
Putting our artifact there, as a tar holding one `inspect-sandbox-tools` file, makes
inspect's own injection and tools run our runtime unchanged: that is how the
conformance suite and the side-by-side benchmark drive it. inspect's shipped binaries
are never touched.
"""

from __future__ import annotations

import gzip
import io
import tarfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sandbox_tools.artifacts import atomic_write
from sandbox_tools.platforms import Arch

INSTALL_STATE_ENV = "INSPECT_SANDBOX_TOOLS_INSTALL_STATE"
INSTALL_STATE_USING_DEV = "edited"


def dev_runtime_path(arch: Arch) -> Path:
    """Where inspect_ai looks for its dev runtime for `arch` (INSTALL_STATE=edited)."""
    import inspect_ai
    from inspect_ai.tool._sandbox_tools_utils.sandbox import _get_sandbox_tools_version

    name = "amd64" if arch is Arch.AMD64 else "arm64"
    version = _get_sandbox_tools_version()
    return (
        Path(inspect_ai.__file__).parent
        / "binaries"
        / f"inspect-sandbox-tools-{name}-v{version}-dev"
    )


@contextmanager
def as_inspect_dev_runtime(artifact: Path, arch: Arch) -> Iterator[Path]:
    """Install `artifact` as inspect's dev runtime for `arch` while the block runs."""
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w") as tar:
        info = tar.gettarinfo(str(artifact), arcname="inspect-sandbox-tools")
        info.mode, info.uid, info.gid, info.uname, info.gname = 0o755, 0, 0, "root", "root"
        with artifact.open("rb") as data:
            tar.addfile(info, data)
    target = dev_runtime_path(arch)
    atomic_write(target, gzip.compress(archive.getvalue()))
    try:
        yield target
    finally:
        target.unlink(missing_ok=True)
        target.with_name(target.name + ".tar").unlink(missing_ok=True)  # inspect's cache
