"""exec_remote's acknowledged output delivery (runtime/tools/exec_remote/delivery.py),
driven directly: no processes, no sockets, no event loop.

`poll` below is what the controller does around its wait: acknowledge, release the job
once its end is acknowledged (a released job answers from its remembered result), else
report what the buffer holds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, get_args

from hypothesis import given, settings
from hypothesis import strategies as st

from sandbox_tools.runtime.tools.exec_remote.delivery import (
    STDERR,
    STDOUT,
    Chunk,
    Delivery,
    FinalResult,
    Stream,
)
from sandbox_tools.runtime.tools.exec_remote.tool_types import (
    COMPLETED,
    KILLED,
    RUNNING,
    JobState,
    PollResult,
)


def poll(delivery: Delivery, ack_seq: int) -> tuple[PollResult, bool]:
    """The controller's poll without the wait: (result, whether the job is released)."""
    delivery.acknowledge(ack_seq)
    if delivery.end_acknowledged(ack_seq):
        assert delivery.final is not None
        return delivery.final.poll_result(), True
    return delivery.poll_result(), False


def fed(*pieces: tuple[Stream, str], buffer_bytes: int = 1000, response: int = 1000) -> Delivery:
    delivery = Delivery(buffer_bytes, response)
    for stream, text in pieces:
        assert delivery.append(stream, text, len(text.encode()))
    return delivery


# -- examples --------------------------------------------------------------------------------


def test_states_are_the_wire_states() -> None:
    assert (RUNNING, COMPLETED, KILLED) == ("running", "completed", "killed")
    assert set(get_args(JobState)) == {RUNNING, COMPLETED, KILLED}
    assert (STDOUT, STDERR) == ("stdout", "stderr")


def test_an_empty_buffer_reports_the_acknowledged_seq() -> None:
    delivery = Delivery(100, 100)
    assert delivery.poll_result() == {
        "state": "running",
        "exit_code": None,
        "seq": 0,
        "stdout": "",
        "stderr": "",
    }
    assert not delivery.has_news and delivery.has_room


def test_chunks_are_numbered_and_split_by_stream() -> None:
    delivery = fed((STDOUT, "a"), (STDERR, "E"), (STDOUT, "b"))
    assert [chunk.seq for chunk in delivery.chunks] == [1, 2, 3]
    assert delivery.chunks[1] == Chunk(2, STDERR, "E", 1)
    assert delivery.poll_result() == {
        "state": "running",
        "exit_code": None,
        "seq": 3,
        "stdout": "ab",
        "stderr": "E",
    }


def test_unacknowledged_output_is_replayed_and_acknowledged_output_is_not() -> None:
    delivery = fed((STDOUT, "one "), (STDOUT, "two "))
    first, _ = poll(delivery, 0)
    assert poll(delivery, 0)[0] == first  # the response was lost: the same again
    assert delivery.append(STDOUT, "three", 5)
    second, _ = poll(delivery, first["seq"])
    assert (second["stdout"], second["seq"]) == ("three", 3)
    assert delivery.buffered == 5 and [c.seq for c in delivery.chunks] == [3]


def test_acknowledge_says_whether_it_freed_space() -> None:
    delivery = fed((STDOUT, "abc"), (STDOUT, "def"))
    assert delivery.acknowledge(1) and delivery.buffered == 3
    assert not delivery.acknowledge(1)  # the same ack again
    assert not delivery.acknowledge(0)  # an older one
    assert delivery.acked == 1 and delivery.buffered == 3


def test_a_response_stops_at_the_byte_budget() -> None:
    delivery = fed(*[(STDOUT, f"{i}xyz") for i in range(5)], response=10)
    result, complete = delivery.output()
    assert (result["seq"], result["stdout"], complete) == (2, "0xyz1xyz", False)
    delivery.acknowledge(2)
    assert delivery.output()[0]["stdout"] == "2xyz3xyz"


def test_a_chunk_larger_than_the_budget_still_moves_alone() -> None:
    delivery = fed((STDOUT, "x" * 50), (STDOUT, "y"), response=10)
    result, complete = delivery.output()
    assert (result["seq"], len(result["stdout"]), complete) == (1, 50, False)


def test_the_end_waits_until_all_output_fits() -> None:
    delivery = fed((STDOUT, "aaaa"), (STDERR, "bbbb"), response=5)
    final = delivery.finish(3, killed=False)
    assert final == FinalResult(COMPLETED, 3, 3) and delivery.next_seq == 4
    first, released = poll(delivery, 0)
    assert first["state"] == "running" and first["exit_code"] is None
    assert (first["seq"], first["stdout"], released) == (1, "aaaa", False)
    second, released = poll(delivery, 1)
    assert second == {
        "state": "completed",
        "exit_code": 3,
        "seq": 3,
        "stdout": "",
        "stderr": "bbbb",
    }
    assert not released
    assert poll(delivery, 3) == (final.poll_result(), True)


def test_a_killed_job_reports_killed() -> None:
    delivery = Delivery(10, 10)
    delivery.finish(137, killed=True)
    assert delivery.state == "killed"
    assert delivery.poll_result()["state"] == "killed"
    assert delivery.poll_result()["exit_code"] == 137


def test_remembered_result_answers_polls_and_other_calls() -> None:
    final = FinalResult(COMPLETED, 0, 7)
    assert final.poll_result() == {
        "state": "completed",
        "exit_code": 0,
        "seq": 7,
        "stdout": "",
        "stderr": "",
    }
    assert list(final.poll_result()) == ["state", "exit_code", "seq", "stdout", "stderr"]
    assert final.output() == {"seq": 7, "stdout": "", "stderr": ""}


def test_result_keys_keep_their_wire_order() -> None:
    running = fed((STDOUT, "x")).poll_result()
    assert list(running) == ["state", "exit_code", "seq", "stdout", "stderr"]
    ended = fed((STDOUT, "x"))
    ended.finish(0, killed=False)
    assert list(ended.poll_result()) == ["state", "exit_code", "seq", "stdout", "stderr"]


def test_output_after_the_end_is_dropped() -> None:
    delivery = fed((STDOUT, "before"))
    delivery.finish(0, killed=False)
    assert not delivery.append(STDOUT, "straggler", 9)
    assert delivery.buffered == 6 and len(delivery.chunks) == 1 and delivery.next_seq == 3


def test_readers_pause_at_the_buffer_limit_until_acknowledged_or_ended() -> None:
    delivery = fed((STDOUT, "12345"), buffer_bytes=5)
    assert not delivery.has_room
    delivery.acknowledge(1)
    assert delivery.has_room
    delivery.append(STDOUT, "123456", 6)
    assert not delivery.has_room
    delivery.finish(0, killed=False)
    assert delivery.has_room  # readers drain (and drop) whatever still comes


def test_news_is_buffered_output_or_the_end() -> None:
    delivery = Delivery(10, 10)
    assert not delivery.has_news
    delivery.append(STDERR, "e", 1)
    assert delivery.has_news
    delivery.acknowledge(1)
    assert not delivery.has_news
    delivery.finish(0, killed=False)
    assert delivery.has_news


# -- properties -------------------------------------------------------------------------------

texts = st.text(alphabet=st.sampled_from("ab\n\u00e9\u20ac"), min_size=1, max_size=12)
steps = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.sampled_from([STDOUT, STDERR]), texts),
        st.tuples(st.just("poll"), st.booleans()),  # True: the response is lost
        st.tuples(st.just("stale"), st.integers(1, 5)),  # a late duplicate, older ack
    ),
    max_size=40,
)


@dataclass
class Client:
    """A client acknowledging what it received; some responses never reach it."""

    delivery: Delivery
    ack: int = 0  # the newest seq received
    sent_ack: int = 0  # the ack of the newest poll sent
    released: bool = False
    got: dict[Stream, str] = field(default_factory=lambda: {STDOUT: "", STDERR: ""})
    sent: list[Chunk] = field(default_factory=list)  # every chunk the job buffered
    lost: PollResult | None = None  # the last lost response at the current ack
    end: PollResult | None = None

    def append(self, stream: Stream, text: str) -> None:
        if not self.delivery.has_room:
            return  # the pipe reader waits; the process blocks on its write
        size = len(text.encode())
        accepted = self.delivery.append(stream, text, size)
        assert accepted == (self.delivery.final is None)
        if accepted:
            self.sent.append(self.delivery.chunks[-1])
            assert self.delivery.buffered - size < self.delivery.buffer_bytes
        assert self.delivery.buffered == sum(c.size for c in self.delivery.chunks)

    def poll(self, lose: bool) -> None:
        if self.released:
            final = self.delivery.final
            assert final is not None and self.end is not None
            assert final.poll_result() == {**self.end, "stdout": "", "stderr": ""}
            return
        before = self.sent_ack = self.ack
        result, self.released = poll(self.delivery, self.ack)
        covered = [c for c in self.sent if before < c.seq <= result["seq"]]
        for stream in (STDOUT, STDERR):  # exactly the chunks after the ack, in order
            assert result[stream] == "".join(c.text for c in covered if c.stream == stream)
        sizes = sum(c.size for c in covered)
        assert sizes <= self.delivery.response_bytes or len(covered) == 1
        if self.lost is not None:  # a replay never loses what the lost response held
            assert result["stdout"].startswith(self.lost["stdout"])
            assert result["stderr"].startswith(self.lost["stderr"])
        if result["state"] != RUNNING:
            final = self.delivery.final
            assert final is not None and result["seq"] == final.seq
            assert all(c.seq <= result["seq"] for c in self.sent)  # nothing after the end
        elif self.delivery.final is not None:  # the end is withheld only behind output
            assert any(c.seq > result["seq"] for c in self.delivery.chunks)
        if lose:
            self.lost = result
            return
        self.lost = None
        for stream in (STDOUT, STDERR):
            self.got[stream] += result[stream]
        self.ack = result["seq"]
        if result["state"] != RUNNING:
            self.end = result

    def stale(self, back: int) -> None:
        """A delayed duplicate of an older poll changes nothing the client relies on."""
        snapshot = (self.delivery.acked, self.delivery.buffered, list(self.delivery.chunks))
        if not self.released:
            poll(self.delivery, max(0, self.sent_ack - back))
            after = (self.delivery.acked, self.delivery.buffered, list(self.delivery.chunks))
            assert after == snapshot


@settings(max_examples=120, deadline=None)
@given(
    steps,
    st.integers(1, 40),
    st.integers(1, 60),
    st.booleans(),
    st.integers(0, 255),
)
def test_every_byte_is_delivered_exactly_once_in_order(
    script: list[tuple[Any, ...]],
    response_bytes: int,
    buffer_bytes: int,
    killed: bool,
    exit_code: int,
) -> None:
    client = Client(Delivery(buffer_bytes, response_bytes))
    finish_at = len(script) // 2
    for index, step in enumerate(script):
        if index == finish_at:
            client.delivery.finish(exit_code, killed=killed)
        if step[0] == "append":
            client.append(step[1], step[2])
        elif step[0] == "poll":
            client.poll(lose=step[1])
        else:
            client.stale(step[1])
    if client.delivery.final is None:
        client.delivery.finish(exit_code, killed=killed)
    for _ in range(len(client.sent) + 3):  # each poll moves at least one chunk or the end
        client.poll(lose=False)
    assert client.released and client.end is not None
    assert client.end["state"] == (KILLED if killed else COMPLETED)
    assert client.end["exit_code"] == exit_code
    for stream in (STDOUT, STDERR):
        assert client.got[stream] == "".join(c.text for c in client.sent if c.stream == stream)
    assert [c.seq for c in client.sent] == list(range(1, len(client.sent) + 1))
    assert client.end["seq"] == len(client.sent) + 1


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 30), min_size=1, max_size=30), st.integers(1, 50))
def test_repolling_with_the_same_ack_returns_the_same_response(
    sizes: list[int], response_bytes: int
) -> None:
    delivery = Delivery(10_000, response_bytes)
    for i, size in enumerate(sizes):
        delivery.append(STDOUT if i % 2 else STDERR, str(i % 10) * size, size)
    ack = 0
    while delivery.chunks:
        first, _ = poll(delivery, ack)
        assert poll(delivery, ack)[0] == first
        assert sum(len(first[s]) for s in (STDOUT, STDERR)) <= response_bytes or (
            first["seq"] == ack + 1
        )
        ack = first["seq"]
        delivery.acknowledge(ack)
    assert delivery.buffered == 0 and ack == len(sizes)
