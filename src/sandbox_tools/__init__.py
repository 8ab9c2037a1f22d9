"""sandbox-tools: tools for agent-evaluation sandboxes, injected at runtime.

This module must stay import-free (beyond the version) because the in-container
runtime is a subpackage and is frozen on its own.
"""

from sandbox_tools._version import __version__

__all__ = ["__version__"]
