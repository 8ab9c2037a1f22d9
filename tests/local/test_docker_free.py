"""Build ids and recipes live in modules free of the Docker SDK: the injector decides
whether a local artifact is current without loading any engine client (a fresh
interpreter, so nothing another test imported can hide an import)."""

from __future__ import annotations

import subprocess
import sys

CHECK = """
import sys
from sandbox_tools.artifacts import ArtifactFormat
from sandbox_tools.injector.acquire import current_build_id
from sandbox_tools.platforms import Arch
from sandbox_tools.recipes import RootfsRecipe

current_build_id(Arch.AMD64, ArtifactFormat.PORTABLE)
RootfsRecipe(suite="bookworm", arch=Arch.ARM64).image_tag
print(sorted(m for m in sys.modules if m == "docker" or m.startswith("docker.")))
"""


def test_build_ids_and_recipes_load_no_docker_sdk() -> None:
    done = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
