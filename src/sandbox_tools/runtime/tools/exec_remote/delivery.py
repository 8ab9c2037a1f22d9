"""exec_remote's acknowledged, bounded output delivery: pure state, no I/O.

One `Delivery` per job (PROTOCOL.md, "exec_remote delivery"):
- each piece of output is a chunk with its own sequence number; it stays buffered
  until the client acknowledges it (`ack_seq`), so a lost response loses nothing and a
  poll repeating an acknowledgement gets the same output again;
- one response carries at most `response_bytes` of chunks (always at least one chunk,
  so a chunk larger than that still moves);
- `has_room` tells the job's pipe readers whether to read more: they stop while
  `buffer_bytes` or more are unacknowledged, which is the backpressure on the process;
- the end of the job takes the next sequence number and is reported only once all
  output before it fits in the response; a straggler's output after it is dropped;
- once the client acknowledges the end, the job is released and its `FinalResult`
  answers retried calls: same state, exit code and sequence number, no output.

The controller owns processes, pipes, clocks and waiting; it calls this and notifies.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Literal, get_args

from sandbox_tools.runtime.tools.exec_remote.tool_types import (
    COMPLETED,
    KILLED,
    RUNNING,
    JobState,
    OutputResult,
    PollResult,
)

Stream = Literal["stdout", "stderr"]
STDOUT: Stream
STDERR: Stream
STDOUT, STDERR = get_args(Stream)


@dataclass(frozen=True)
class Chunk:
    seq: int
    stream: Stream
    text: str
    size: int  # bytes read from the pipe: what the buffer and response budgets count


@dataclass(frozen=True)
class FinalResult:
    """How a job ended, and the sequence number of that end."""

    state: JobState
    exit_code: int
    seq: int

    def poll_result(self) -> PollResult:
        """The answer to a poll once all output is delivered (or was, long ago)."""
        return {
            "state": self.state,
            "exit_code": self.exit_code,
            "seq": self.seq,
            "stdout": "",
            "stderr": "",
        }

    def output(self) -> OutputResult:
        """The answer to kill or close_stdin for a job already released."""
        return {"seq": self.seq, "stdout": "", "stderr": ""}


class Delivery:
    """The output buffer of one job, its sequence numbers and its end."""

    def __init__(self, buffer_bytes: int, response_bytes: int) -> None:
        self.buffer_bytes = buffer_bytes
        self.response_bytes = response_bytes
        self.chunks: deque[Chunk] = deque()
        self.buffered = 0  # bytes of the unacknowledged chunks
        self.next_seq = 1
        self.acked = 0
        self.final: FinalResult | None = None

    @property
    def finished(self) -> bool:
        return self.final is not None

    @property
    def state(self) -> JobState:
        return RUNNING if self.final is None else self.final.state

    @property
    def has_room(self) -> bool:
        """Whether a reader may read more (after the end, readers just drain)."""
        return self.buffered < self.buffer_bytes or self.final is not None

    @property
    def has_news(self) -> bool:
        """Whether a poll has anything to report right now (output, or the end)."""
        return bool(self.chunks) or self.final is not None

    def append(self, stream: Stream, text: str, size: int) -> bool:
        """Buffer output; False (and nothing kept) once the end has been recorded."""
        if self.final is not None:
            return False
        self.chunks.append(Chunk(self.next_seq, stream, text, size))
        self.next_seq += 1
        self.buffered += size
        return True

    def finish(self, exit_code: int, *, killed: bool) -> FinalResult:
        """Record the end; it takes the next sequence number, after all output."""
        assert self.final is None, "a job ends once"
        self.final = FinalResult(KILLED if killed else COMPLETED, exit_code, self.next_seq)
        self.next_seq += 1
        return self.final

    def acknowledge(self, ack_seq: int) -> bool:
        """Forget the chunks up to `ack_seq`; True when that freed buffer space."""
        if ack_seq <= self.acked:
            return False
        self.acked = ack_seq
        freed = False
        while self.chunks and self.chunks[0].seq <= ack_seq:
            self.buffered -= self.chunks.popleft().size
            freed = True
        return freed

    def end_acknowledged(self, ack_seq: int) -> bool:
        """Whether `ack_seq` acknowledges the end: the job can be released."""
        return self.final is not None and ack_seq >= self.final.seq

    def output(self) -> tuple[OutputResult, bool]:
        """Unacknowledged output up to the response cap, and whether all of it fit."""
        parts: dict[Stream, list[str]] = {STDOUT: [], STDERR: []}
        seq = self.acked
        budget = self.response_bytes
        complete = True
        for chunk in self.chunks:
            if budget < chunk.size and seq > self.acked:
                complete = False
                break
            parts[chunk.stream].append(chunk.text)
            budget -= chunk.size
            seq = chunk.seq
        result: OutputResult = {
            "seq": seq,
            "stdout": "".join(parts[STDOUT]),
            "stderr": "".join(parts[STDERR]),
        }
        return result, complete

    def poll_result(self) -> PollResult:
        """What a poll returns (after acknowledging): output, and the end once it fits."""
        output, complete = self.output()
        if self.final is not None and complete:
            return {
                "state": self.final.state,
                "exit_code": self.final.exit_code,
                **output,
                "seq": self.final.seq,
            }
        return {"state": RUNNING, "exit_code": None, **output}
