"""The runtime from source as real processes: CLI, server, Unix socket, children."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support import RuntimeDir, eventually, oversized_request_then_one

RUNTIME_INFO = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "runtime_info", "params": {}})


def wait_for_state(rt: RuntimeDir, pid: int, ack: int = 0, timeout: float = 20) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = rt.result("exec_remote_poll", {"pid": pid, "ack_seq": ack, "wait_ms": 1000})
        if result["state"] != "running":
            return result
    raise AssertionError(f"process {pid} still running after {timeout} s")


def pid_alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_twenty_concurrent_clis_start_exactly_one_server(runtime_dir: RuntimeDir) -> None:
    request = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "remote_version"})
    clis = [
        subprocess.Popen(
            [sys.executable, "-m", "sandbox_tools.runtime", "exec", request],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=runtime_dir.env,
        )
        for _ in range(20)
    ]
    answers = {json.loads(cli.communicate(timeout=60)[0])["result"] for cli in clis}
    assert len(answers) == 1, answers
    assert runtime_dir.server_starts() == 1
    assert str(runtime_dir.server_pid()) in answers.pop()


def test_killed_server_is_restarted_and_lost_jobs_are_reported(runtime_dir: RuntimeDir) -> None:
    job = runtime_dir.result("exec_remote_start", {"command": "sleep 30"})["pid"]
    old_server = runtime_dir.server_pid()
    assert old_server is not None
    os.kill(old_server, signal.SIGKILL)
    eventually(lambda: not pid_alive(old_server), "the killed server is gone")

    info = runtime_dir.result("runtime_info")
    assert info["pid"] != old_server
    response = runtime_dir.call("exec_remote_poll", {"pid": job, "ack_seq": 0})
    assert response["error"]["code"] == -32099
    assert "restarted" in response["error"]["message"]
    assert "lost" in response["error"]["message"]
    os.killpg(job, signal.SIGKILL)


def test_stale_socket_file_is_recovered(runtime_dir: RuntimeDir) -> None:
    import socket

    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(Path(runtime_dir.path, "server.sock")))
    stale.close()  # a socket file nobody listens on
    assert runtime_dir.result("version") == "0.1.0"


def test_ack_retransmits_after_a_dropped_response(runtime_dir: RuntimeDir) -> None:
    pid = runtime_dir.result("exec_remote_start", {"command": "echo first; echo second >&2"})["pid"]
    first = wait_for_state(runtime_dir, pid)
    # Pretend that response was lost: poll again without acknowledging it.
    again = runtime_dir.result("exec_remote_poll", {"pid": pid, "ack_seq": 0})
    assert again == first
    assert (first["stdout"], first["stderr"], first["exit_code"]) == ("first\n", "second\n", 0)


def test_terminal_result_survives_a_retried_poll(runtime_dir: RuntimeDir) -> None:
    pid = runtime_dir.result("exec_remote_start", {"command": "exit 7"})["pid"]
    final = wait_for_state(runtime_dir, pid)
    assert (final["state"], final["exit_code"]) == ("completed", 7)
    acked = runtime_dir.result("exec_remote_poll", {"pid": pid, "ack_seq": final["seq"]})
    retried = runtime_dir.result("exec_remote_poll", {"pid": pid, "ack_seq": final["seq"]})
    for result in (acked, retried):
        assert (result["state"], result["exit_code"], result["seq"]) == (
            "completed",
            7,
            final["seq"],
        )
        assert result["stdout"] == result["stderr"] == ""


def test_sigterm_trapping_process_is_killed(runtime_dir: RuntimeDir) -> None:
    pid = runtime_dir.result(
        "exec_remote_start",
        {"command": "trap '' TERM; echo ready; while true; do sleep 0.1; done"},
    )["pid"]
    ready = runtime_dir.result("exec_remote_poll", {"pid": pid, "ack_seq": 0, "wait_ms": 5000})
    assert ready["stdout"] == "ready\n"
    runtime_dir.result("exec_remote_kill", {"pid": pid, "ack_seq": ready["seq"]})
    final = wait_for_state(runtime_dir, pid, ack=ready["seq"])
    assert final["state"] == "killed"
    assert final["exit_code"] == 128 + signal.SIGKILL
    assert not pid_alive(pid)


def test_children_in_the_process_group_are_killed(runtime_dir: RuntimeDir) -> None:
    pid = runtime_dir.result(
        "exec_remote_start",
        {"command": "sleep 300 & echo $!; sh -c 'sleep 300 & echo $!; wait' & wait"},
    )["pid"]
    deadline = time.monotonic() + 10
    children: list[int] = []
    while len(children) < 2 and time.monotonic() < deadline:
        out = runtime_dir.result("exec_remote_poll", {"pid": pid, "ack_seq": 0, "wait_ms": 500})
        children = [int(line) for line in out["stdout"].split()]
    assert len(children) == 2 and all(pid_alive(child) for child in children)
    runtime_dir.result("exec_remote_kill", {"pid": pid, "ack_seq": 0})
    final = wait_for_state(runtime_dir, pid)
    assert final["state"] == "killed"
    eventually(lambda: not any(pid_alive(c) for c in children), "every child is gone")


def test_stdin_input_env_cwd(runtime_dir: RuntimeDir, tmp_path: Path) -> None:
    pid = runtime_dir.result(
        "exec_remote_start",
        {
            "command": 'cat; echo "$GREETING"; pwd',
            "input": "from input\n",
            "env": {"GREETING": "hello env"},
            "cwd": str(tmp_path),
        },
    )["pid"]
    final = wait_for_state(runtime_dir, pid)
    assert final["stdout"] == f"from input\nhello env\n{tmp_path}\n"

    pid = runtime_dir.result("exec_remote_start", {"command": "cat", "stdin_open": True})["pid"]
    runtime_dir.result("exec_remote_write_stdin", {"pid": pid, "ack_seq": 0, "data": "one "})
    runtime_dir.result("exec_remote_write_stdin", {"pid": pid, "ack_seq": 0, "data": "two"})
    runtime_dir.result("exec_remote_close_stdin", {"pid": pid, "ack_seq": 0})
    final = wait_for_state(runtime_dir, pid)
    assert (final["stdout"], final["exit_code"]) == ("one two", 0)

    response = runtime_dir.call("exec_remote_write_stdin", {"pid": pid, "ack_seq": 0, "data": "x"})
    assert response["error"]["code"] == -32099


def test_bad_cwd_and_unknown_pid_are_tool_errors(runtime_dir: RuntimeDir) -> None:
    bad_cwd = runtime_dir.call("exec_remote_start", {"command": "true", "cwd": "/no/such/dir"})
    assert bad_cwd["error"]["code"] == -32099 and "/no/such/dir" in bad_cwd["error"]["message"]
    unknown = runtime_dir.call("exec_remote_poll", {"pid": 999999, "ack_seq": 0})
    # inspect_ai's client recognises this phrase (docs/INSPECT_COMPAT.md)
    assert unknown["error"]["code"] == -32099
    assert "No job found with pid 999999" in unknown["error"]["message"]


@pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")
def test_user_switch_when_root(runtime_dir: RuntimeDir) -> None:
    pid = runtime_dir.result(
        "exec_remote_start", {"command": "id -u; echo $HOME", "user": "nobody"}
    )["pid"]
    final = wait_for_state(runtime_dir, pid)
    uid, home = final["stdout"].split()
    assert uid == "65534" and home == "/nonexistent"
    missing = runtime_dir.call("exec_remote_start", {"command": "true", "user": "no-such-user"})
    assert missing["error"]["code"] == -32099 and "no-such-user" in missing["error"]["message"]


@pytest.mark.security
@pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")
def test_cwd_is_entered_after_the_user_switch(runtime_dir: RuntimeDir, tmp_path: Path) -> None:
    """THREAT_MODEL.md, "drop privileges first, then touch the filesystem": a job of
    nobody started in a root-only directory once read files there (chdir ran as root)."""
    locked = tmp_path / "locked"  # like /root: nobody may pass through it
    locked.mkdir(mode=0o700)
    secret = locked / "open"  # readable itself, but only reachable through `locked`
    secret.mkdir(mode=0o755)
    (secret / "note.txt").write_text("root only\n")
    (secret / "note.txt").chmod(0o644)
    tmp_path.chmod(0o755)
    pid = runtime_dir.result(
        "exec_remote_start",
        {"command": "cat note.txt", "user": "nobody", "cwd": str(secret)},
    )["pid"]
    final = wait_for_state(runtime_dir, pid)
    assert "root only" not in final["stdout"]
    assert (final["exit_code"] != 0 and "can't cd" in final["stderr"].lower()) or (
        "permission denied" in final["stderr"].lower()
    )
    # A directory nobody may enter works as before. Without cwd: where the call came from
    # (the sandbox's working directory, as for the runtime's own user), entered with the
    # user's rights; where it may not enter, its home, else /.
    pid = runtime_dir.result(
        "exec_remote_start", {"command": "pwd", "user": "nobody", "cwd": "/tmp"}
    )["pid"]
    assert wait_for_state(runtime_dir, pid)["stdout"] == "/tmp\n"
    start = {"command": "pwd; echo $#", "user": "nobody"}
    open_dir = tempfile.mkdtemp(dir="/tmp")
    os.chmod(open_dir, 0o755)
    pid = runtime_dir.result("exec_remote_start", start, cwd=open_dir)["pid"]
    assert wait_for_state(runtime_dir, pid)["stdout"] == f"{open_dir}\n0\n"
    closed_dir = tempfile.mkdtemp(dir="/tmp")  # 0700, root's: nobody may not enter it
    pid = runtime_dir.result("exec_remote_start", start, cwd=closed_dir)["pid"]
    assert wait_for_state(runtime_dir, pid)["stdout"] == "/\n0\n"  # nobody's home is missing


def test_close_stdin_returns_when_buffered_input_is_never_read(
    runtime_dir: RuntimeDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A timed-out write left data buffered; close_stdin then waited for it to drain,
    holding the stdin lock, until the process exited (forever for `sleep infinity`)."""
    monkeypatch.setenv("SANDBOX_TOOLS_STDIN_TIMEOUT", "1")  # read by the server it starts
    pid = runtime_dir.result("exec_remote_start", {"command": "sleep 120", "stdin_open": True})[
        "pid"
    ]
    request = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "exec_remote_write_stdin",
        "params": {"pid": pid, "ack_seq": 0, "data": "x" * 1_000_000},
    }
    written = json.loads(runtime_dir.cli("exec", input=json.dumps(request)).stdout)
    assert "did not read its stdin" in written["error"]["message"]
    started = time.monotonic()
    closed = runtime_dir.call("exec_remote_close_stdin", {"pid": pid, "ack_seq": 0})
    assert "result" in closed, closed
    assert time.monotonic() - started < 10
    runtime_dir.result("exec_remote_kill", {"pid": pid, "ack_seq": 0})


@pytest.mark.parametrize(
    ("request_text", "code"),
    [
        ("{not json", -32700),
        ("[]", -32600),
        ('{"jsonrpc": "2.0", "id": 1, "method": "exec_remote_pol"}', -32601),
        (
            '{"jsonrpc": "2.0", "id": 1, "method": "exec_remote_poll", "params": {"pid": "1"}}',
            -32602,
        ),
        ('{"jsonrpc": "2.0", "id": 1, "method": "exec_remote_start", "params": {}}', -32602),
    ],
)
def test_malformed_input_never_kills_the_server(
    runtime_dir: RuntimeDir, request_text: str, code: int
) -> None:
    assert runtime_dir.result("version") == "0.1.0"
    server = runtime_dir.server_pid()
    done = runtime_dir.cli("exec", request_text)
    assert done.returncode == 0 and "Traceback" not in done.stdout + done.stderr
    assert json.loads(done.stdout)["error"]["code"] == code
    # Straight to the socket too, bypassing the CLI's own validation.
    import socket

    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(str(Path(runtime_dir.path, "server.sock")))
        sock.sendall(request_text.encode() + b"\n")
        assert json.loads(sock.makefile("rb").readline())["error"]["code"] == code
    assert runtime_dir.result("version") == "0.1.0"
    assert runtime_dir.server_pid() == server


def test_stdio_answers_out_of_order_and_survives_garbage(runtime_dir: RuntimeDir) -> None:
    pid = runtime_dir.result("exec_remote_start", {"command": "sleep 1"})["pid"]
    lines = [
        json.dumps(
            {
                "jsonrpc": "2.0",
                "id": "slow",
                "method": "exec_remote_poll",
                "params": {"pid": pid, "ack_seq": 0, "wait_ms": 10000},
            }
        ),
        "garbage",
        json.dumps({"jsonrpc": "2.0", "id": "fast", "method": "version"}),
    ]
    done = runtime_dir.cli("stdio", input="\n".join(lines) + "\n")
    responses = [json.loads(line) for line in done.stdout.splitlines()]
    assert [r.get("id") for r in responses] == [None, "fast", "slow"]
    assert responses[0]["error"]["code"] == -32700
    assert responses[2]["result"]["state"] == "completed"


def test_healthcheck_and_stop_server(runtime_dir: RuntimeDir) -> None:
    assert runtime_dir.cli("healthcheck").returncode == 1  # no server yet
    assert runtime_dir.cli("start-server").returncode == 0
    assert runtime_dir.cli("healthcheck").returncode == 0
    server = runtime_dir.server_pid()
    assert server is not None
    assert runtime_dir.cli("stop-server").returncode == 0
    assert not pid_alive(server)
    assert runtime_dir.cli("healthcheck").returncode == 1


def test_refuses_a_socket_it_does_not_own(runtime_dir: RuntimeDir) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to plant a socket owned by another user")
    import socket

    path = str(Path(runtime_dir.path, "server.sock"))
    planted = socket.socket(socket.AF_UNIX)
    planted.bind(path)
    os.chown(path, 1000, 1000)
    done = runtime_dir.cli("exec", '{"jsonrpc":"2.0","id":1,"method":"version"}')
    error = json.loads(done.stdout)["error"]
    assert error["code"] == -32098 and "refusing" in error["message"]
    planted.close()


@pytest.mark.security
@pytest.mark.parametrize(
    ("request_text", "code", "words"),
    [
        ("[" * 100_000 + "]" * 100_000, -32700, "nested too deeply"),
        ('{"jsonrpc":"2.0","id":3,"method":"version","params":{"x":NaN}}', -32700, "NaN"),
        ('{"jsonrpc":"2.0","id":3,"method":"version","params":{"x":1e999}}', -32700, "range"),
        (
            '{"jsonrpc":"2.0","id":3,"method":"exec_remote_start","params":{"command":"a\\u0000"}}',
            -32602,
            "NUL",
        ),
        (
            '{"jsonrpc":"2.0","id":3,"method":"text_editor",'
            '"params":{"command":"view","path":"/\\ud800"}}',
            -32602,
            "surrogate",
        ),
    ],
)
def test_hostile_json_gets_one_clear_error(
    runtime_dir: RuntimeDir, request_text: str, code: int, words: str
) -> None:
    """Rule 5: deep nesting, non-finite numbers, NUL and lone surrogates: each once gave a
    traceback, a -32098 with the server's traceback, or no answer at all. Now one error
    response, at once; the server keeps serving."""
    done = runtime_dir.cli("exec", input=request_text, timeout=30)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    response = json.loads(done.stdout)
    assert response["error"]["code"] == code, response
    assert words.lower() in response["error"]["message"].lower(), response
    assert "Traceback" not in json.dumps(response)
    assert runtime_dir.result("version")


def test_exec_takes_argv_that_is_not_utf8(runtime_dir: RuntimeDir) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "sandbox_tools.runtime", "exec", b'{"id":1,"x":"\xff"}'],
        capture_output=True,
        env=runtime_dir.env,
        timeout=30,
    )
    assert done.returncode == 0 and b"Traceback" not in done.stderr, done.stderr
    assert json.loads(done.stdout)["error"]["code"] == -32700


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a directory of another user")
def test_stdio_answers_with_the_reason_when_the_server_directory_is_refused(
    tmp_path: Path,
) -> None:
    """The host reads responses, not stderr: a refused server directory used to show up
    only as "stdio channel closed"."""
    foreign = tmp_path / "run"
    foreign.mkdir(mode=0o700)
    os.chown(foreign, 65534, 65534)
    env = {**RuntimeDir(str(foreign)).env}
    request = json.dumps({"jsonrpc": "2.0", "id": 5, "method": "version"}) + "\n"
    done = subprocess.run(
        [sys.executable, "-m", "sandbox_tools.runtime", "stdio"],
        input=request * 2,
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
    )
    responses = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(responses) == 2 and all(r["id"] == 5 for r in responses), done.stdout
    assert "owned by uid 65534" in responses[0]["error"]["message"]


def test_a_vanished_socket_is_recovered(runtime_dir: RuntimeDir) -> None:
    """Rule 5: a tmp cleaner (or anything at our uid) removed the socket while the server
    lived; every call then waited 30 s and failed, and stop-server could not stop it."""
    assert runtime_dir.result("version")
    pid = runtime_dir.server_pid()
    os.unlink(os.path.join(runtime_dir.path, "server.sock"))
    started = time.monotonic()
    assert runtime_dir.result("version")
    assert time.monotonic() - started < 10
    assert runtime_dir.server_pid() == pid  # the same server: its jobs are not lost
    os.unlink(os.path.join(runtime_dir.path, "server.sock"))
    stopped = runtime_dir.cli("stop-server", timeout=30)
    assert stopped.returncode == 0, stopped.stderr


def test_jobs_and_sessions_are_capped(
    runtime_dir: RuntimeDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rule 5: no global bound once let 20 flooding jobs add 183 MB to the server. Past
    the cap a clear tool error; after the jobs end, starting works again."""
    monkeypatch.setenv("SANDBOX_TOOLS_MAX_JOBS", "3")
    monkeypatch.setenv("SANDBOX_TOOLS_MAX_SESSIONS", "2")
    pids = [
        runtime_dir.result("exec_remote_start", {"command": "sleep 60"})["pid"] for _ in range(3)
    ]
    refused = runtime_dir.call("exec_remote_start", {"command": "true"})
    assert refused["error"]["code"] == -32099
    assert "too many processes" in refused["error"]["message"]
    for pid in pids:
        runtime_dir.result("exec_remote_kill", {"pid": pid, "ack_seq": 0})
        final = wait_for_state(runtime_dir, pid)
        runtime_dir.result("exec_remote_poll", {"pid": pid, "ack_seq": final["seq"]})
    assert runtime_dir.result("exec_remote_start", {"command": "true"})["pid"]
    first, _ = (runtime_dir.result("bash_session_new_session") for _ in range(2))
    # Past the cap the least recently used idle session makes room (long-lived servers).
    runtime_dir.result("bash_session_new_session")
    gone = runtime_dir.call("bash_session", {"session_name": first["session_name"], "input": ""})
    assert "closed to make room" in gone["error"]["message"]


def test_an_oversized_request_on_stdio_is_answered_once(runtime_dir: RuntimeDir) -> None:
    """A 100 MB request was sent twice and answered with four errors; now one error, and
    the channel goes on serving."""
    argv = [sys.executable, "-m", "sandbox_tools.runtime", "stdio"]
    answers = oversized_request_then_one(argv, runtime_dir.env, "version")
    assert answers[1] == {"jsonrpc": "2.0", "id": 2, "result": answers[1]["result"]}


def _exec_limited(rt: RuntimeDir, request: dict, limit: int) -> tuple[bytes, dict]:
    env = {**rt.env, "INSPECT_SANDBOX_JSON_RPC_RESPONSE_MAX_BYTES": str(limit)}
    done = subprocess.run(
        [sys.executable, "-m", "sandbox_tools.runtime", "exec"],
        input=json.dumps(request).encode(),
        capture_output=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout, json.loads(done.stdout)


def test_a_response_over_the_callers_limit_comes_in_pieces(
    runtime_dir: RuntimeDir, tmp_path: Path
) -> None:
    """PROTOCOL.md Large responses: with inspect's limit set on `exec`, a larger response is
    held by the server and fetched by handle and offset; every frame fits the limit, the
    pieces make exactly the whole response, and a released handle is a -32000 error."""
    import base64

    big = tmp_path / "big.txt"
    big.write_text("".join(f"line {n} " + "é" * 40 + "\n" for n in range(4000)))
    view = {"command": "view", "path": str(big)}
    whole = runtime_dir.call("text_editor", view)
    request = {"jsonrpc": "2.0", "id": 9, "method": "text_editor", "params": view}
    limit = 20_000
    frame, first = _exec_limited(runtime_dir, request, limit)
    piece = first["__inspect_json_rpc_response_chunk__"]
    handle, data, frames = piece["handle"], b"", [frame]
    assert first["id"] == 9 and piece["version"] == 1 and piece["offset"] == 0
    while True:
        data += base64.b64decode(piece["chunk"])
        assert piece["next_offset"] == len(data) and piece["done"] == (
            len(data) == piece["total_size"]
        )
        if piece["done"]:
            break
        fetch = {"handle": handle, "offset": len(data)}
        continuation = {"jsonrpc": "2.0", "id": 10, "method": "__inspect_json_rpc_response_chunk__"}
        frame, reply = _exec_limited(runtime_dir, {**continuation, "params": fetch}, limit)
        frames.append(frame)
        piece = reply["__inspect_json_rpc_response_chunk__"]
    assert json.loads(data) == {**whole, "id": 9}  # the same response, its own id
    assert len(frames) >= 3 and all(len(f) <= limit for f in frames)
    release = {"jsonrpc": "2.0", "id": 11, "method": "__inspect_json_rpc_response_chunk__"}
    _, released = _exec_limited(
        runtime_dir, {**release, "params": {"handle": handle, "release": True}}, limit
    )
    assert released["result"] is None
    _, gone = _exec_limited(
        runtime_dir, {**release, "params": {"handle": handle, "offset": 0}}, limit
    )
    assert gone["error"]["code"] == -32000
    _, small = _exec_limited(runtime_dir, request, 100)  # too small to carry anything
    assert small["error"]["code"] == -32098 and "too small" in small["error"]["message"]
    _, fits = _exec_limited(runtime_dir, {**request, "method": "version"}, limit)
    assert "result" in fits  # small responses are untouched


def test_a_poll_without_wait_ms_waits_briefly_for_the_end(runtime_dir: RuntimeDir) -> None:
    """inspect_ai's client polls without wait_ms and sleeps at least 5 s between polls: a
    command ending 0.3 s after start must be reported by the first poll, not 5 s later."""
    pid = runtime_dir.result("exec_remote_start", {"command": "sleep 0.3; echo end"})["pid"]
    first = runtime_dir.result("exec_remote_poll", {"pid": pid, "ack_seq": 0})
    if first["state"] == "running":  # the output came first: one more poll sees the end
        assert first["stdout"] == "end\n"
        first = runtime_dir.result("exec_remote_poll", {"pid": pid, "ack_seq": first["seq"]})
    assert first["state"] == "completed" and first["exit_code"] == 0
    immediate = runtime_dir.result("exec_remote_start", {"command": "sleep 5"})["pid"]
    assert (
        runtime_dir.result("exec_remote_poll", {"pid": immediate, "ack_seq": 0, "wait_ms": 0})[
            "state"
        ]
        == "running"
    )
    runtime_dir.result("exec_remote_kill", {"pid": immediate, "ack_seq": 0})


def test_a_notification_through_exec_is_delivered_and_prints_nothing(
    runtime_dir: RuntimeDir,
) -> None:
    """JSON-RPC: a notification gets no response. `exec` once hung waiting for one, then
    answered with an error; inspect_ai's exec_notification takes any output for a failure.
    Now it is delivered (the server has handled it when exec returns) and nothing printed."""
    pid = runtime_dir.result("exec_remote_start", {"command": "sleep 60"})["pid"]
    notification = {"jsonrpc": "2.0", "method": "exec_remote_kill", "params": {"pid": pid}}
    done = runtime_dir.cli("exec", input=json.dumps(notification), timeout=30)
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    final = runtime_dir.result("exec_remote_poll", {"pid": pid, "ack_seq": 0, "wait_ms": 5000})
    assert final["state"] == "killed"  # the notification was acted on


def test_a_gone_session_or_process_is_named_by_its_reason_on_the_wire(
    runtime_dir: RuntimeDir,
) -> None:
    """The host recovers from a gone session (a new one) by `data.reason`, never by the
    message's words: each method that looks a session or process up says which it is."""
    gone = {
        ("bash_session", '{"session_name": "nope", "input": "ls\\n"}'): "session_gone",
        ("web_go", '{"session_name": "nope", "url": "about:blank"}'): "session_gone",
        ("mcp_kill_server", '{"session_id": 999}'): "session_gone",
        ("exec_remote_poll", '{"pid": 999999, "ack_seq": 0}'): "process_gone",
    }
    for (method, params), reason in gone.items():
        error = runtime_dir.call(method, json.loads(params))["error"]
        assert error["code"] == -32099, (method, error)
        assert error["data"] == {"reason": reason}, (method, error)
    closed = runtime_dir.result("bash_session_new_session", {})["session_name"]
    runtime_dir.result("bash_session_close_session", {"session_name": closed})
    error = runtime_dir.call("bash_session", {"session_name": closed, "input": "ls\n"})["error"]
    assert "closed by its host" in error["message"]
    assert error["data"] == {"reason": "session_gone"}
    # Errors the host cannot act on carry no reason: the message alone is for the model.
    bad_cwd = runtime_dir.call("exec_remote_start", {"command": "true", "cwd": "/no/such/dir"})
    assert bad_cwd["error"]["code"] == -32099 and "data" not in bad_cwd["error"]


def test_runtime_info_reports_the_limits_the_server_started_with(runtime_dir: RuntimeDir) -> None:
    """A limit is read once, when the server starts: a later call with another value in
    its environment meets the same server, and runtime_info says which value holds."""

    def limits_with(max_jobs: str) -> dict[str, Any]:
        done = subprocess.run(
            [sys.executable, "-m", "sandbox_tools.runtime", "exec", RUNTIME_INFO],
            capture_output=True,
            text=True,
            env={**runtime_dir.env, "SANDBOX_TOOLS_MAX_JOBS": max_jobs},
            timeout=60,
        )
        limits: dict[str, Any] = json.loads(done.stdout)["result"]["limits"]
        return limits

    limits = limits_with("3")
    assert limits["max_jobs"] == 3 and limits["max_browser_sessions"] == 16
    assert "browser" not in limits and "launcher" not in limits  # paths are not limits
    assert limits_with("9")["max_jobs"] == 3
