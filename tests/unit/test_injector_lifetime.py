"""Injection state has a lifetime: nothing per sample outlives the sample.

The old injector cached handles in module globals keyed by `sandbox.name`: a container
recreated under the same name got the dead handle, and every inspect sample's
environment stayed referenced for the life of the process. Here 1,000 samples go
through both entry points (an `Injector` per run, and `tool_support_sandbox`, which keeps
its state on the sandbox object) and the test counts what is left.

The provider is a scripted one: it answers the injector's fixed commands the way a
Debian container does, so that a thousand injections take seconds. What is measured is
the host's own bookkeeping, which no real container would change.
"""

from __future__ import annotations

import gc
import hashlib
import tracemalloc
import weakref
from pathlib import Path

import pytest

from sandbox_tools.artifacts import Artifact, ArtifactFormat, Provenance
from sandbox_tools.injector.inject import (
    Injector,
    ToolSupport,
    forget_sandbox,
    tool_support_sandbox,
)
from sandbox_tools.injector.options import InjectionOptions
from sandbox_tools.platforms import Arch
from sandbox_tools.sandboxes.base import Sandbox
from tests.support import BUILD_ID, ScriptedDebian


@pytest.fixture
def artifact(tmp_path: Path) -> Artifact:
    path = tmp_path / "sandbox-tools"
    path.write_bytes(b"\x7fELF" + b"x" * 4096)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    record = Artifact(
        name=path.name,
        arch=Arch.AMD64,
        format=ArtifactFormat.PORTABLE,
        size=path.stat().st_size,
        sha256=digest,
        build_id=BUILD_ID,
    )
    found = record.found_at(path, Provenance.DIST)
    assert found is not None
    return found


def live(kind: type) -> int:
    gc.collect()
    return sum(isinstance(obj, kind) for obj in gc.get_objects())


async def test_a_thousand_samples_leave_nothing_behind(artifact: Artifact) -> None:
    # What earlier tests of this process left (an in-process inspect eval keeps its
    # environments) is not this test's: it counts what its own samples leave.
    before = (live(ToolSupport), live(Injector), live(ScriptedDebian))
    tracemalloc.start()
    try:
        baseline = 0
        options = InjectionOptions(artifact=artifact, persistent=False)
        gone: list[weakref.ref[Sandbox]] = []
        for sample in range(1000):
            if sample == 100:  # warmed up: caches of the interpreter itself are filled
                gc.collect()
                baseline = tracemalloc.get_traced_memory()[0]
            sandbox = ScriptedDebian("sample")  # every sample: the same name
            async with Injector(options) as injector:
                support = await injector.tool_support(sandbox)
                assert support.info is not None and support.info.build_id == BUILD_ID
                assert await injector.tool_support(sandbox) is support
            assert len(injector) == 0
            # The convenience entry point: state lives on the sandbox object only.
            other = ScriptedDebian("sample")
            handle = await tool_support_sandbox(other, options=options)
            assert handle is not support  # same name, another sandbox: a fresh handle
            if sample % 2:
                await forget_sandbox(other)
            gone.append(weakref.ref(other))
            del sandbox, other, support, handle, injector
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - baseline
    finally:
        tracemalloc.stop()
    assert all(ref() is None for ref in gone)  # every sample's sandbox was collected
    assert (live(ToolSupport), live(Injector), live(ScriptedDebian)) == before
    assert grown < 256 * 1024, f"900 samples grew the host by {grown} bytes"
