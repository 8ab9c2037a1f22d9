"""The gateway's MCP tools: each one's name, description, arguments and handler.

The arguments of a tool that calls a runtime method are that method's params dataclass
(`runtime/tools/*/tool_types.py`) with the `sandbox` added (a subclass, as the browser's
`TypeArguments`), less the fields the gateway fills itself (`filled`, given to the parse
with the gateway's values); the sandbox tools' own arguments are dataclasses of the same
kind, declared here. The input schema `tools/list` publishes is made from the dataclass
(schemas.py), and the call's arguments are parsed by it, so the two cannot disagree.

Every failure is an answer with `isError` set and a sentence the model can act on
(an unknown sandbox, a bad argument, the runtime's own tool error, an engine that is
gone); a bug of ours is one line to the model and the traceback to the server's log
(stderr), never to the client. Every text that leaves is bounded (`RESULT_CHARS`).
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from sandbox_tools.errors import RefusedToolCall, SandboxToolsError, ToolError
from sandbox_tools.injector.exec_remote import ExecRemoteOptions
from sandbox_tools.injector.jsonrpc_client import bounded_text
from sandbox_tools.injector.tool_clients import text_editor
from sandbox_tools.mcp_gateway.browser import DOCS as BROWSER_DOCS
from sandbox_tools.mcp_gateway.browser import FIRST_CALL_NOTE, SESSION_FIELD, arguments_of
from sandbox_tools.mcp_gateway.browser import RUNTIME_TOOLS as RUNTIME_BROWSER_TOOLS
from sandbox_tools.mcp_gateway.jobs import JobReport
from sandbox_tools.mcp_gateway.registry import GatewaySandbox, Sandboxes
from sandbox_tools.mcp_gateway.schemas import (
    SANDBOX_FIELD,
    argument_problem,
    input_schema,
    parse_problem,
)
from sandbox_tools.mcp_gateway.spec import (
    DEFAULT_CPUS,
    DEFAULT_DISK,
    DEFAULT_MEMORY,
    DEFAULT_PIDS,
    ContainerSpec,
)
from sandbox_tools.runtime.jsonrpc import (
    InvalidParams,
    WireParams,
    env_map,
    string_map,
    wire,
    wire_fields,
)
from sandbox_tools.runtime.tools.bash_session.tool_types import (
    DEFAULT_MAX_OUTPUT_BYTES,
    InteractParams,
)
from sandbox_tools.runtime.tools.exec_remote.tool_types import (
    MAX_WAIT_MS,
    AckParams,
    PollParams,
    StartParams,
)
from sandbox_tools.runtime.tools.text_editor.tool_types import TextEditorParams

log = logging.getLogger(__name__)

# The most characters one answer carries: what bash_session keeps of a command's output
# by default, so a model reads the same amount whichever tool ran the command.
RESULT_CHARS = DEFAULT_MAX_OUTPUT_BYTES
# The host's own cut of every answer. The runtime's (RESULT_CHARS bytes and its notes)
# stays below it, so only what a broken or forged answer adds is cut: at a line, which
# for one long line of output would otherwise leave nothing of it.
ANSWER_CHARS = RESULT_CHARS + 4096
# exec_start's jobs: how long one poll of the runtime waits for news while nobody asks
# (the request runs on between exec_poll calls), and how long exec_kill waits for the end.
JOB_POLL_SECONDS = 5.0
KILL_WAIT_SECONDS = 10.0
# The least time between two progress messages of one exec_poll.
PROGRESS_INTERVAL = 0.1
# The largest process and CPU counts a client may ask for.
MAX_PIDS = 1 << 22
MAX_CPUS = 1024.0
SANDBOX_DOC = "The sandbox to act in: an id sandbox_create or sandbox_attach gave."


# Where a tool may report what happens before it answers (MCP progress notifications,
# when the client asked for them): each call with a message for the user's eyes.
Progress = Callable[[str], Awaitable[None]]


@dataclass(frozen=True)
class Answer:
    """A tool's result: text for the model, and optionally the same facts as JSON."""

    text: str
    structured: dict[str, Any] | None = None
    is_error: bool = False
    images: tuple[str, ...] = ()  # base64 PNGs (a browser screenshot), after the text


def refusal(text: str) -> Answer:
    return Answer(shown(text, "message"), is_error=True)


def shown(text: str, what: str) -> str:
    """Text from the sandbox as an answer carries it: made printable first (which makes
    it longer: each control character becomes four), then cut to ANSWER_CHARS. Only
    what could still be shown is made printable (a forged 64 MiB is not copied 4 times
    over), so the count of what was cut is then at least the one given."""
    return bounded_text(printable(text[: 4 * ANSWER_CHARS + 1]), ANSWER_CHARS, what)


# Terminal control sequences (colours, cursor moves, titles, hyperlinks), which a shell's
# output carries and a client may show in the user's terminal as they are: dropped.
_CONTROL_SEQUENCE = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"  # CSI: colours, cursor, erase
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"  # OSC: titles, hyperlinks, clipboard
    r"|\x1b[@-Z\\-_]"  # the other two-character escapes
)
# Every other control character but tab and newline: shown as \xNN, never sent raw.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """Text from the sandbox as the client may show it: no terminal control sequence (an
    agent could otherwise rewrite what the user's terminal shows, or set its clipboard)
    and no other control character but tab and newline (CRLF becomes a newline)."""
    text = _CONTROL_SEQUENCE.sub("", text.replace("\r\n", "\n"))
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


# -- arguments ------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class CreateArguments(WireParams):
    """sandbox_create: the inspect `docker_sdk` sandbox's container options a client may
    choose. Left out on purpose: `volumes` (host paths would give the sandbox the host's
    files) and network modes that share a namespace (`host`, `container:<name>`)."""

    image: str = wire(doc="An image on the local Docker engine (never pulled), e.g. debian:12.")
    user: str | None = wire(
        default=None,
        doc="Who the container runs as, as `docker run --user`: a name or uid[:gid]. "
        "Default: the image's user (often root).",
    )
    read_only: bool = wire(
        default=False,
        doc="Make the root file system read-only. Without tmpfs, /tmp becomes a writable "
        "tmpfs (the tools need one place to live).",
    )
    tmpfs: dict[str, str] | None = wire(
        default=None,
        read=string_map,
        doc='Writable in-memory mounts: path -> options, e.g. {"/tmp": "exec,size=256m"}.',
    )
    network_mode: Literal["none", "bridge"] = wire(
        default="none",
        doc="none: no network at all; bridge: the engine's default network (internet "
        "access if the host has it).",
    )
    working_dir: str | None = wire(default=None, doc="The container's working directory.")
    environment: dict[str, str] | None = wire(
        default=None, read=env_map, doc="Environment variables: name -> value."
    )
    mem_limit: str = wire(
        default=DEFAULT_MEMORY, doc='Memory limit, as docker takes it: "512m", "4g".'
    )
    pids_limit: int = wire(
        default=DEFAULT_PIDS,
        minimum=1,
        maximum=MAX_PIDS,
        doc="The most processes the container may run at once.",
    )
    disk_limit: str = wire(
        default=DEFAULT_DISK,
        doc='The most the container may write to its own file system, e.g. "10g" (where '
        "the engine can bound it; the answer says when it cannot).",
    )
    cpus: float | None = wire(
        default=None,
        minimum=0.01,
        maximum=MAX_CPUS,
        doc=f"CPUs the container may use (default: {DEFAULT_CPUS:g}, or fewer if the "
        "engine has fewer).",
    )
    keep: bool = wire(
        default=False,
        doc="Leave the container running after sandbox_close and after this client "
        "disconnects (default: it is removed then).",
    )


@dataclass(frozen=True, kw_only=True)
class AttachArguments(WireParams):
    container: str = wire(
        doc="A running container the user listed when starting this server, exactly as "
        "listed (sandbox_list shows them)."
    )
    user: str | None = wire(
        default=None,
        doc="Act as this user (a name or uid[:gid]); needs a container whose default user "
        "is root. Default: the container's own user.",
    )


@dataclass(frozen=True, kw_only=True)
class CloseArguments(WireParams):
    sandbox: str = wire(doc=SANDBOX_DOC)
    keep: bool | None = wire(
        default=None,
        doc="For a container sandbox_create made with keep: false removes it after all. "
        "Default: as sandbox_create's keep said. An attached container always keeps running.",
    )


@dataclass(frozen=True, kw_only=True)
class BashArguments(InteractParams):
    sandbox: str = wire(doc=SANDBOX_DOC)


@dataclass(frozen=True, kw_only=True)
class EditArguments(TextEditorParams):
    sandbox: str = wire(doc=SANDBOX_DOC)


@dataclass(frozen=True, kw_only=True)
class StartArguments(StartParams):
    sandbox: str = wire(doc=SANDBOX_DOC)


@dataclass(frozen=True, kw_only=True)
class PollArguments(PollParams):
    sandbox: str = wire(doc=SANDBOX_DOC)


@dataclass(frozen=True, kw_only=True)
class KillArguments(AckParams):
    sandbox: str = wire(doc=SANDBOX_DOC)


# What the model reads about the runtime's fields (they carry no doc of their own).
BASH_DOCS = {
    "input": 'Text typed into the shell as is: end a command with a newline ("ls -la\\n") '
    'to run it; "\\u0003" is Ctrl+C, "\\u0004" Ctrl+D. Leave it out to read output that '
    "came since the last call.",
    "restart": "Replace the shell with a fresh one (its variables, directory and jobs go).",
    "wait_for_output": "The longest this call waits, in seconds, for the command to finish "
    "(the prompt to come back); a longer command goes on, and a later call reads the rest.",
    "idle_timeout": "Stop waiting once the shell printed nothing for this many seconds "
    "(after some output).",
}
EDIT_DOCS = {
    "command": "view: a file with line numbers, or a directory two levels deep; create: a "
    "new file of file_text; str_replace: old_str (which must occur exactly once) becomes "
    "new_str; insert: new_str after line insert_line; undo_edit: the file as it was before "
    "the last edit made here.",
    "path": "The absolute path of the file or directory, e.g. /work/app.py.",
    "view_range": "For view of a file: [first, last] line numbers; -1 as last reads to the end.",
    "file_text": "For create: the whole content of the new file.",
    "old_str": "For str_replace: the exact text to replace, unique in the file (include "
    "surrounding lines to make it so).",
    "new_str": "For str_replace: the replacement (empty deletes old_str); for insert: the "
    "text to insert.",
    "insert_line": "For insert: the line after which new_str goes (0: at the top).",
}
START_DOCS = {
    "command": "A shell command line, run by bash (or sh where there is no bash).",
    "input": "Text given to the command's standard input, which then ends.",
    "env": "Environment variables for the command: name -> value.",
    "cwd": "The directory the command starts in (default: the container's working directory).",
}
PID_DOC = "The job's pid, as exec_start gave it."
POLL_DOCS = {
    "pid": PID_DOC,
    "wait_ms": "The longest this call waits for output or the end, in milliseconds (at "
    f"most {MAX_WAIT_MS}); output already waiting is answered at once.",
}


# -- the tools ----------------------------------------------------------------------------


async def _create(sandboxes: Sandboxes, params: Any, progress: Progress | None) -> Answer:
    assert isinstance(params, CreateArguments)
    spec = ContainerSpec(
        image=params.image,
        user=params.user,
        read_only=params.read_only,
        tmpfs=params.tmpfs,
        network_mode=params.network_mode,
        working_dir=params.working_dir,
        environment=params.environment,
        mem_limit=params.mem_limit,
        pids_limit=params.pids_limit,
        cpus=params.cpus,
        disk_limit=params.disk_limit,
    )
    made = await sandboxes.create(spec, keep=params.keep)
    ending = (
        f"It stays running after sandbox_close and after {sandboxes.ends_with} (keep)."
        if made.keep
        else f"sandbox_close removes it, as does {sandboxes.ends_with}."
    )
    root = " read-only root," if params.read_only else ""
    if not made.disk_bounded:
        ending += (
            " Its disk is not bounded: this engine's storage driver cannot (tmpfs mounts "
            "with a size, and a read-only root, bound what it writes)."
        )
    text = (
        f"Created sandbox {made.id}: container {made.container_name} of {made.image} "
        f"({_identity(made)},{root} network {params.network_mode}). Pass "
        f'sandbox="{made.id}" to bash, text_editor and exec_start. {ending}'
    )
    return Answer(text, _facts(made))


async def _attach(sandboxes: Sandboxes, params: Any, progress: Progress | None) -> Answer:
    assert isinstance(params, AttachArguments)
    held, before = await sandboxes.attach(params.container, params.user)
    if before:
        text = f"Container {held.container_name} is attached already as sandbox {held.id}."
    else:
        text = (
            f"Attached to container {held.container_name} as sandbox {held.id} "
            f'({_identity(held)}). Pass sandbox="{held.id}" to bash, text_editor and '
            "exec_start. sandbox_close detaches; the container keeps running."
        )
    return Answer(text, _facts(held))


async def _list(sandboxes: Sandboxes, params: Any, progress: Progress | None) -> Answer:
    held = sandboxes.held()
    attachable = sorted(sandboxes.attachable)
    listed = (
        "Containers the user listed for sandbox_attach (pass the name exactly as shown): "
        + ", ".join(attachable)
        if attachable
        else "The user listed no containers for sandbox_attach."
    )
    if not held:
        text = f"No sandboxes yet: sandbox_create makes one.\n{listed}"
        return Answer(text, {"sandboxes": [], "attachable": attachable})
    statuses = await asyncio.gather(*(asyncio.to_thread(_status, each) for each in held))
    lines, facts = [], []
    for each, status in zip(held, statuses, strict=True):
        kind = "made here" + (", kept" if each.keep else "") if each.made else "attached"
        lines.append(
            f"{each.id}: container {each.container_name} ({each.image}), {kind}, {status}, "
            f"{_identity(each)}, {len(each.jobs)} job(s)"
        )
        facts.append({**_facts(each), "status": status, "jobs": sorted(each.jobs)})
    lines.append(listed)
    return Answer("\n".join(lines), {"sandboxes": facts, "attachable": attachable})


async def _close(sandboxes: Sandboxes, params: Any, progress: Progress | None) -> Answer:
    assert isinstance(params, CloseArguments)
    closed, removed = await sandboxes.close(params.sandbox, params.keep)
    name = closed.container_name
    if removed:
        text = f"Closed sandbox {closed.id}: container {name} removed."
    elif closed.made:
        text = f"Closed sandbox {closed.id}: container {name} left running (kept)."
    else:
        text = (
            f"Detached from container {name} (sandbox {closed.id}): the jobs and the shell "
            "started through this server ended; the container keeps running."
        )
    return Answer(text, {"sandbox": closed.id, "container": name, "removed": removed})


async def _bash(sandboxes: Sandboxes, params: Any, progress: Progress | None) -> Answer:
    assert isinstance(params, BashArguments)
    output = await sandboxes.get(params.sandbox).type_into_shell(params)
    return Answer(_bounded(output) or "(no output)")


async def _text_editor(sandboxes: Sandboxes, params: Any, progress: Progress | None) -> Answer:
    assert isinstance(params, EditArguments)
    held = sandboxes.get(params.sandbox)
    answer = await text_editor(
        held.support.client,
        params.command,
        params.path,
        view_range=params.view_range,
        file_text=params.file_text,
        old_str=params.old_str,
        new_str=params.new_str,
        insert_line=params.insert_line,
    )
    return Answer(_bounded(answer))


async def _exec_start(sandboxes: Sandboxes, params: Any, progress: Progress | None) -> Answer:
    assert isinstance(params, StartArguments)
    held = sandboxes.get(params.sandbox)
    options = ExecRemoteOptions(
        input=params.input,
        env=params.env or {},
        cwd=params.cwd,
        poll_interval=JOB_POLL_SECONDS,
        output_limit=RESULT_CHARS,  # the host's tail per stream (this gateway reads chunks)
    )
    job = await sandboxes.start_job(held, params.command, options)
    text = (
        f"Started job {job.pid} in sandbox {held.id}. exec_poll with pid {job.pid} reads "
        "its output and says when it ended; exec_kill stops it."
    )
    return Answer(text, {"sandbox": held.id, "pid": job.pid})


async def _exec_poll(sandboxes: Sandboxes, params: Any, progress: Progress | None) -> Answer:
    assert isinstance(params, PollArguments)
    held = sandboxes.get(params.sandbox)
    job = held.job(params.pid)
    async with job.lock:
        try:
            if progress is None:
                report = await job.read(params.wait_ms / 1000, RESULT_CHARS)
            else:
                streamed = _ProgressOut(progress)
                report = await job.stream(params.wait_ms / 1000, RESULT_CHARS, streamed)
                await streamed.flush()
        finally:
            held.forget_if_done(job)
    return _job_answer(held, report)


class _ProgressOut:
    """A job's output as progress messages: bounded and printable, as answers are, and
    at most one message per PROGRESS_INTERVAL (what came meanwhile is joined), so a job
    printing a byte a millisecond sends tens of messages a second, not a thousand."""

    def __init__(self, progress: Progress) -> None:
        self._progress = progress
        self._pending = ""
        self._last = 0.0

    async def __call__(self, text: str) -> None:
        self._pending += text
        now = asyncio.get_running_loop().time()
        if now - self._last >= PROGRESS_INTERVAL:
            await self.flush()

    async def flush(self) -> None:
        if self._pending:
            pending, self._pending = self._pending, ""
            self._last = asyncio.get_running_loop().time()
            await self._progress(_bounded(pending))


async def _exec_kill(sandboxes: Sandboxes, params: Any, progress: Progress | None) -> Answer:
    assert isinstance(params, KillArguments)
    held = sandboxes.get(params.sandbox)
    job = held.job(params.pid)
    async with job.lock:
        try:
            report = await job.kill(KILL_WAIT_SECONDS, RESULT_CHARS)
        finally:
            held.forget_if_done(job)
    return _job_answer(held, report)


def _browser_tool(name: str) -> Run:
    """A runtime browser tool, relayed to the sandbox's browser server with the
    arguments its own dataclass parsed (less the sandbox and the session it holds)."""

    async def run(sandboxes: Sandboxes, params: Any, progress: Progress | None) -> Answer:
        assert isinstance(params, WireParams)
        held = sandboxes.get(params.sandbox)  # type: ignore[attr-defined]
        arguments = {
            key: value
            for key, value in params.to_params().items()
            if key not in (SANDBOX_FIELD, SESSION_FIELD)
        }
        answer = await held.browser.call(name, arguments, ANSWER_CHARS)
        return Answer(_bounded(answer.text), is_error=answer.is_error, images=answer.images)

    return run


Run = Callable[[Sandboxes, Any, "Progress | None"], Awaitable[Answer]]


def _browser_docs(params: type[WireParams] | None) -> dict[str, str]:
    """The gateway's docs for those of a browser tool's fields the runtime left without."""
    names = {f.name for f in wire_fields(params)} if params is not None else set()
    return {name: doc for name, doc in BROWSER_DOCS.items() if name in names}


@dataclass(frozen=True)
class GatewayTool:
    name: str
    description: str
    params: type[WireParams] | None  # what the arguments are parsed into; None: none
    run: Run
    # Fields of `params` the gateway fills: left out of the schema, given to the parse.
    filled: Mapping[str, Any] = field(default_factory=dict)
    docs: Mapping[str, str] = field(default_factory=dict)  # for fields without a doc

    def listing(self) -> dict[str, Any]:
        """This tool as `tools/list` shows it."""
        return {
            "name": self.name,
            "description": self.description,
            "inputSchema": SCHEMAS[self.name],
        }


_SANDBOX_USES = "bash, text_editor and exec_start/exec_poll/exec_kill act in it"
_BASH_SESSION = ""  # the sandbox's own shell: the gateway picks it at the call

TOOLS = [
    GatewayTool(
        "sandbox_create",
        "Start a new container from an image on the local Docker engine and install the "
        f"tools in it; answers with the sandbox id that {_SANDBOX_USES}. No network unless "
        "network_mode is bridge. The container is removed by sandbox_close, or when this "
        "client disconnects, unless keep is true. Takes 2 to 10 seconds.",
        CreateArguments,
        _create,
    ),
    GatewayTool(
        "sandbox_attach",
        "Use a running container the user named (by name or id) as a sandbox: installs "
        f"the tools in it and answers with the sandbox id that {_SANDBOX_USES}. The "
        "container is the user's: sandbox_close and disconnecting only detach, never "
        "stop or remove it.",
        AttachArguments,
        _attach,
    ),
    GatewayTool(
        "sandbox_list",
        "List this server's sandboxes: id, container, image, whether it was made here or "
        "attached, its status, and its running jobs; and the containers the user listed "
        "for sandbox_attach.",
        None,
        _list,
    ),
    GatewayTool(
        "sandbox_close",
        "Close a sandbox: end its jobs and its shell, then remove a container "
        "sandbox_create made (unless kept), or detach from an attached one, which keeps "
        "running. Its id is no longer valid afterwards.",
        CloseArguments,
        _close,
    ),
    GatewayTool(
        "bash",
        "Type into a persistent shell in the sandbox: its directory, variables and "
        "background jobs last between calls (bash; sh -i in images without bash, which "
        "the first answer says). Answers with what the shell printed since the last call "
        f"(the newest {RESULT_CHARS:,} bytes of it), once the command finished or the wait "
        "ran out; then call again without input to read more. For commands that run for "
        "minutes, prefer exec_start.",
        BashArguments,
        _bash,
        filled={"session_name": _BASH_SESSION, "max_output_bytes": RESULT_CHARS},
        docs=BASH_DOCS,
    ),
    GatewayTool(
        "text_editor",
        "View, create and edit text files in the sandbox: view shows a file with line "
        "numbers (or lists a directory), create writes a new file, str_replace replaces one "
        "exact and unique piece of text, insert adds lines after a line number, undo_edit "
        "reverts the last edit of a file. Paths are absolute.",
        EditArguments,
        _text_editor,
        filled={"user": None},
        docs=EDIT_DOCS,
    ),
    GatewayTool(
        "exec_start",
        "Start a long-running command in the sandbox as a job (a build, a test suite, a "
        "server) and answer at once with its pid. Its stdout and stderr are kept apart and "
        "kept until read: exec_poll reads them and reports the end with the exit code; "
        "exec_kill stops it.",
        StartArguments,
        _exec_start,
        filled={"user": None, "stdin_open": False},
        docs=START_DOCS,
    ),
    GatewayTool(
        "exec_poll",
        "Read what a job printed since the last exec_poll (waiting up to wait_ms for news) "
        "and whether it is running, completed (with its exit code) or killed. At most "
        f"{RESULT_CHARS:,} characters per answer: the answer says when more is waiting.",
        PollArguments,
        _exec_poll,
        filled={"ack_seq": 0},
        docs=POLL_DOCS,
    ),
    GatewayTool(
        "exec_kill",
        "Stop a job: SIGTERM to its process group, SIGKILL after a grace period (2 s by "
        "default). Answers with its end and the output not read yet.",
        KillArguments,
        _exec_kill,
        filled={"ack_seq": 0},
        docs={"pid": PID_DOC},
    ),
]
TOOLS += [
    GatewayTool(
        tool.name,
        tool.description + FIRST_CALL_NOTE,
        arguments_of(tool, SANDBOX_DOC),
        _browser_tool(tool.name),
        filled={SESSION_FIELD: ""},
        docs=_browser_docs(tool.params),
    )
    for tool in RUNTIME_BROWSER_TOOLS
]
TOOLS_BY_NAME = {tool.name: tool for tool in TOOLS}
SCHEMAS = {  # made once, at import: a field without a doc fails here, not at a call
    tool.name: input_schema(tool.params, leave_out=tool.filled, docs=tool.docs) for tool in TOOLS
}


async def call_tool(
    sandboxes: Sandboxes, name: str, arguments: Any, progress: Progress | None = None
) -> Answer:
    """One `tools/call`: every failure is an answer the model can act on. `progress`:
    where a tool may report before it answers (exec_poll streams the job's output)."""
    tool = TOOLS_BY_NAME.get(name)
    if tool is None:
        return refusal(f"there is no tool {name[:80]!r}; the tools are {', '.join(TOOLS_BY_NAME)}")
    arguments = {} if arguments is None else arguments
    problem = argument_problem(name, SCHEMAS[name], arguments)
    if problem is not None:
        return refusal(problem)
    try:
        params = tool.params.parse({**arguments, **tool.filled}) if tool.params else None
    except InvalidParams as exc:
        return refusal(parse_problem(name, exc))
    try:
        sandbox_id = getattr(params, SANDBOX_FIELD, None)
        if not isinstance(sandbox_id, str) or name == "sandbox_close":
            return await tool.run(sandboxes, params, progress)
        held = sandboxes.get(sandbox_id)
        async with held.calls, sandboxes.calls:
            return await tool.run(sandboxes, params, progress)
    except RefusedToolCall as exc:
        return refusal(exc.message)
    except ToolError as exc:  # the runtime's sentence for the model
        return refusal(exc.message)
    except SandboxToolsError as exc:
        return refusal(f"{name} failed: {exc.explained()}")
    except TimeoutError as exc:
        return refusal(f"{name} did not finish in time: {exc}")
    except Exception as exc:
        # A bug of ours: the model learns the call failed, the log gets the traceback,
        # and the server keeps serving.
        log.exception("%s failed", name)
        return refusal(
            f"{name} failed inside the gateway ({type(exc).__name__}); the server goes on, "
            "and its log (stderr) has the details"
        )


# -- answers ----------------------------------------------------------------------------------


def _bounded(text: str) -> str:
    return shown(text, "answer")


def _identity(held: GatewaySandbox) -> str:
    uid = held.support.recon.uid
    if held.user is not None:
        return f"acting as {held.user}"
    return "running as root" if uid == 0 else f"running as uid {uid}"


def _facts(held: GatewaySandbox) -> dict[str, Any]:
    return {
        "sandbox": held.id,
        "container": held.container_name,
        "image": held.image,
        "made_here": held.made,
        "keep": held.keep,
        "user": held.user,
    }


def _status(held: GatewaySandbox) -> str:
    """The container's state as the engine says it now ("gone" once removed elsewhere)."""
    try:
        held.docker.container.reload()
    except Exception:
        return "gone"
    return str(held.docker.container.status)


def _job_answer(held: GatewaySandbox, report: JobReport) -> Answer:
    completed = report.completed
    if completed is None:
        head = f"Job {report.pid} in sandbox {held.id} is running."
    elif completed.killed:
        head = (
            f"Job {report.pid} in sandbox {held.id} was killed (exit code {completed.exit_code})."
        )
    else:
        head = (
            f"Job {report.pid} in sandbox {held.id} completed with exit code {completed.exit_code}."
        )
    parts = [head]
    taken = report.taken
    if taken.stdout:  # RESULT_CHARS at most, both streams together (jobs.take)
        parts.append(f"--- stdout ---\n{_bounded(taken.stdout)}")
    if taken.stderr:
        parts.append(f"--- stderr ---\n{_bounded(taken.stderr)}")
    if not taken.stdout and not taken.stderr:
        parts.append("(no new output)")
    if taken.waiting:
        parts.append(
            f"[{taken.waiting:,} more characters of output are waiting: call exec_poll again]"
        )
    facts = {
        "sandbox": held.id,
        "pid": report.pid,
        "state": report.state,
        "exit_code": None if completed is None else completed.exit_code,
        "waiting": taken.waiting,
    }
    return Answer("\n".join(parts), facts)
