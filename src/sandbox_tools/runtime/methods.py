"""The server's method table: core methods plus one module per tool."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

from sandbox_tools.runtime.build_info import build_info
from sandbox_tools.runtime.jsonrpc import Method, Params
from sandbox_tools.runtime.tools.exec_remote import json_rpc_methods as exec_remote_methods
from sandbox_tools.runtime.tools.exec_remote.controller import ExecRemoteController


def core_methods(server_dir: str, request_shutdown: Callable[[], None]) -> dict[str, Method]:
    async def version(params: Params) -> Any:
        return build_info()["version"]

    async def remote_version(params: Params) -> Any:
        return f"Server: {sys.argv[0]} ({os.getpid()})"

    async def runtime_info(params: Params) -> Any:
        return {**build_info(), "pid": os.getpid(), "server_dir": server_dir}

    async def sandbox_tools_shutdown(params: Params) -> Any:
        request_shutdown()
        return None

    return {
        "version": version,
        "remote_version": remote_version,
        "runtime_info": runtime_info,
        "sandbox_tools_shutdown": sandbox_tools_shutdown,
    }


def all_methods(
    server_dir: str, request_shutdown: Callable[[], None], exec_remote: ExecRemoteController
) -> dict[str, Method]:
    return {
        **core_methods(server_dir, request_shutdown),
        **exec_remote_methods.methods(exec_remote),
    }
