"""Sandbox providers behind one small async interface (see `base.Sandbox`)."""

from sandbox_tools.sandboxes.base import ExecOutput, Sandbox, Stream

__all__ = ["ExecOutput", "Sandbox", "Stream"]
