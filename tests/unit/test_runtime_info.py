"""The host reads `runtime_info` in one place, into a typed record (RuntimeInfo.parse).

A sandbox's answer is untrusted (THREAT_MODEL.md): a missing or mistyped field is a
typed transport error naming the field, never a KeyError or a dict passed on.
"""

from __future__ import annotations

from typing import Any

import pytest

from sandbox_tools.errors import RuntimeTransportError
from sandbox_tools.injector.jsonrpc_client import RuntimeInfo

ANSWER: dict[str, Any] = {
    "version": "0.1.0",
    "build_id": "sha256:" + "1" * 64,
    "format": "portable",
    "platform": "linux/amd64",
    "pid": 42,
    "server_dir": "/opt/sandbox-tools/run",
}


def test_an_answer_becomes_a_typed_record() -> None:
    info = RuntimeInfo.parse(ANSWER)
    assert info == RuntimeInfo(**ANSWER)
    assert (info.build_id, info.pid) == (ANSWER["build_id"], 42)


@pytest.mark.parametrize(
    ("answer", "named"),
    [
        ({k: v for k, v in ANSWER.items() if k != "build_id"}, "'build_id'"),
        ({**ANSWER, "pid": True}, "'pid'"),  # JSON true is not a number
        ({**ANSWER, "server_dir": None}, "'server_dir'"),
        (["not", "an", "object"], "expected an object"),
    ],
)
def test_a_malformed_answer_is_a_transport_error_naming_what_is_wrong(
    answer: Any, named: str
) -> None:
    with pytest.raises(RuntimeTransportError, match=named):
        RuntimeInfo.parse(answer)


def test_the_limits_keep_only_named_numbers() -> None:
    """The limits are shown to the operator (a reused server's values), so what the
    sandbox sends there is kept only as named numbers, at most 64 of them."""
    limits = {"max_jobs": 3, "browser_call_timeout_s": 2.5, "flag": True, "x" * 65: 1}
    info = RuntimeInfo.parse({**ANSWER, "limits": {**limits, "text": "9"}})
    assert info.limits == {"max_jobs": 3, "browser_call_timeout_s": 2.5}
    assert RuntimeInfo.parse({**ANSWER, "limits": ["max_jobs", 3]}).limits == {}
    many = {f"limit_{i}": i for i in range(10_000)}
    assert len(RuntimeInfo.parse({**ANSWER, "limits": many}).limits) == 64
    assert RuntimeInfo.parse(ANSWER).limits == {}  # not reported: none known
