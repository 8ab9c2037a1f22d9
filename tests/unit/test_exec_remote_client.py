from sandbox_tools.injector.exec_remote import _Tail


def test_tail_keeps_newest_characters() -> None:
    tail = _Tail(10)
    for part in ("abcdef", "ghijkl", "mnop"):
        tail.add(part)
    assert tail.value() == "ghijklmnop"


def test_tail_under_limit_keeps_everything() -> None:
    tail = _Tail(100)
    tail.add("x" * 40)
    tail.add("y" * 40)
    assert tail.value() == "x" * 40 + "y" * 40


def test_the_host_builds_requests_the_runtime_parses() -> None:
    """One spelling of each key: what the host sends parses back to itself."""
    from sandbox_tools.runtime.tools.exec_remote.tool_types import (
        AckParams,
        PollParams,
        WriteStdinParams,
    )

    for params in (
        PollParams(pid=7, ack_seq=3, wait_ms=250),
        AckParams(pid=7, ack_seq=0),
        WriteStdinParams(pid=7, ack_seq=1, data="héllo\n"),
    ):
        assert type(params).parse(params.to_params()) == params


def test_every_tools_request_is_built_by_the_class_that_parses_it() -> None:
    """bash_session, text_editor and exec_remote_start: the host's params parse back to
    the object that built them, the identity passed through as the caller gave it."""
    from sandbox_tools.runtime.identity import parse_user
    from sandbox_tools.runtime.tools.bash_session.tool_types import (
        InteractParams,
        NewSessionParams,
    )
    from sandbox_tools.runtime.tools.exec_remote.tool_types import StartParams
    from sandbox_tools.runtime.tools.text_editor.tool_types import TextEditorParams

    user = "1000:1000"
    spec = parse_user({"user": user})
    built = [
        NewSessionParams(user=spec),
        InteractParams(
            session_name="BashSession",
            input="ls\n",
            restart=False,
            wait_for_output=5.0,
            idle_timeout=0.5,
            max_output_bytes=4096,
        ),
        TextEditorParams(
            command="view",
            path="/etc/hosts",
            view_range=(1, 3),
            file_text=None,
            old_str=None,
            new_str=None,
            insert_line=None,
            user=spec,
        ),
        StartParams(
            command="echo hi",
            input=None,
            stdin_open=True,
            env={"A": "b"},
            cwd="/tmp",
            user=spec,
        ),
    ]
    for params in built:
        wire = params.to_params(user=user if getattr(params, "user", None) else None)
        assert type(params).parse(wire) == params


def test_mcp_messages_are_sent_as_the_runtime_reads_them() -> None:
    from sandbox_tools.runtime.tools.mcp.tool_types import SendParams, SessionParams

    request = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    answer = {"jsonrpc": "2.0", "id": 7, "result": {}}
    assert SendParams.request(SendParams(3, request).to_params("request")) == SendParams(3, request)
    assert SendParams.notification(SendParams(3, note).to_params("notification")).message == note
    assert SendParams.response(SendParams(3, answer).to_params("response")).message == answer
    assert SessionParams.parse(SessionParams(session_id=3).to_params()).session_id == 3


def test_tiny_pieces_cost_their_characters_not_an_object_each() -> None:
    """A process printing two bytes a poll once kept one string per poll in the tail."""
    tail = _Tail(1_000_000)
    for _ in range(200_000):
        tail.add("ab")
    assert tail.value() == "ab" * 200_000
    assert len(tail._parts) <= 400_000 // _Tail.JOIN_BELOW + 1
