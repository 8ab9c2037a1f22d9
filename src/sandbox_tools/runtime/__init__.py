"""The in-container runtime: a stateless CLI in front of a stateful server.

Nothing here may import the host-side packages (injector, sandboxes, cli, ...):
this subpackage is what PyInstaller freezes into the injected executable.
"""
