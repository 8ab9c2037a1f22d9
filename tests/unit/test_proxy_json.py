"""A model-proxy request body is bad input, whatever it is (THREAT_MODEL.md, rule 3)."""

from __future__ import annotations

import pytest

from sandbox_tools.injector.model_proxy import ProxyRequest, ProxyRequestRefused


@pytest.mark.security
def test_a_body_nested_past_the_interpreters_depth_is_a_value_error() -> None:
    """10 KB nested 5,000 deep raised RecursionError: a 502 and a traceback per request.
    Now it is a ValueError like any body that is not JSON (the handlers answer 400)."""
    body = b"[" * 5000 + b"]" * 5000
    with pytest.raises(ValueError, match="nested too deeply") as caught:
        ProxyRequest("POST", "/v1/chat/completions", [], body).json()
    assert not isinstance(caught.value, ProxyRequestRefused)


def test_a_plain_body_parses() -> None:
    assert ProxyRequest("POST", "/", [], b'{"a": [1]}').json() == {"a": [1]}
