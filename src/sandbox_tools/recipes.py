"""What goes into a root filesystem (suite, architecture, packages), defined once and
free of the Docker SDK: the injector derives build ids from the builder's recipe without
loading any engine client; making the root and its image is `sandboxes/images.py`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass

from sandbox_tools.platforms import Arch

# Bump when the way roots are made changes, so old cache entries are not reused.
RECIPE_FORMAT = 1
IMAGE_REPOSITORY = "sandbox-tools/base"


@dataclass(frozen=True, kw_only=True)
class RootfsRecipe:
    suite: str
    arch: Arch
    include: tuple[str, ...] = ()
    variant: str = "minbase"

    @property
    def digest(self) -> str:
        identity = {"format": RECIPE_FORMAT, **asdict(self), "include": sorted(self.include)}
        canonical = json.dumps(identity, sort_keys=True, default=str)
        return hashlib.sha256(canonical.encode()).hexdigest()

    @property
    def image_tag(self) -> str:
        extra = "-" + "-".join(sorted(self.include)) if self.include else ""
        name = f"{self.suite}-{self.arch.value}{extra}"[:80]
        return f"{IMAGE_REPOSITORY}:{name}-{self.digest[:12]}"
