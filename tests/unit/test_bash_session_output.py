"""bash_session's output buffer, cleaning and truncation (runtime/tools/bash_session/
output.py), driven directly: no shells, no terminals, no event loop."""

from __future__ import annotations

import itertools
import re

from hypothesis import given, settings
from hypothesis import strategies as st

from sandbox_tools.runtime.tools.bash_session.output import (
    BUFFER_CHARS,
    OutputBuffer,
    WaitEnd,
    clean_output,
    render,
    truncate_tail,
)

PS1, PS2 = "__ST_PS1_0123456789ab__", "__ST_PS2_0123456789ab__"
NOTICE = re.compile(r"\[sandbox-tools: (\d+) bytes of earlier output truncated\]\n")
# What cleaned output may never hold: ESC (so no escape sequence), C0 controls but \t and
# \n, and DEL.
FORBIDDEN = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def rendered(
    text: str,
    *,
    dropped: int = 0,
    ended: WaitEnd = "prompt",
    exit_code: int | None = None,
    input_given: bool = True,
    max_output_bytes: int = 1000,
) -> str:
    return render(
        text,
        prompts=(PS1, PS2),
        dropped=dropped,
        ended=ended,
        exit_code=exit_code,
        input_given=input_given,
        max_output_bytes=max_output_bytes,
    )


# -- cleaning ---------------------------------------------------------------------------------


def test_clean_output_strips_escape_sequences_and_controls() -> None:
    raw = (
        "\x1b[1;31mred\x1b[0m \x1b]0;title\x07plain\x1b]2;t\x1b\\ \x1bDx\x1bM\r\n"
        "tab\there\x00\x08\x7f é\n"
    )
    assert clean_output(raw) == "red plain x\ntab\there é\n"


def test_clean_output_keeps_plain_text() -> None:
    assert clean_output("a\tb\nc \u20ac") == "a\tb\nc \u20ac"


# -- truncation -------------------------------------------------------------------------------


def test_truncate_tail_keeps_short_text() -> None:
    assert truncate_tail("hello", 5) == "hello"


def test_truncate_tail_keeps_the_newest_bytes_with_a_notice() -> None:
    assert truncate_tail("0123456789", 4) == (
        "[sandbox-tools: 6 bytes of earlier output truncated]\n6789"
    )


def test_truncate_tail_never_splits_a_character() -> None:
    # 5 bytes from the end of 10 two-byte characters: half a character is dropped too.
    assert truncate_tail("\u00e9" * 10, 5) == (
        "[sandbox-tools: 16 bytes of earlier output truncated]\n\u00e9\u00e9"
    )


# -- the buffer -------------------------------------------------------------------------------


def test_buffer_tracks_offsets_and_returns_each_output_once() -> None:
    buffer = OutputBuffer()
    assert buffer.limit == BUFFER_CHARS
    buffer.append("banner\n")
    buffer.skip()
    assert not buffer.unreturned and buffer.end == 7
    buffer.append("one\n")
    buffer.append("two\n")
    assert buffer.unreturned and buffer.text_since(11) == "two\n"
    assert buffer.take() == ("one\ntwo\n", 0)
    assert buffer.take() == ("", 0)


def test_a_full_buffer_drops_the_oldest_and_counts_unreturned_losses() -> None:
    buffer = OutputBuffer(limit=10)
    buffer.append("abcdef")
    assert buffer.take() == ("abcdef", 0)
    buffer.append("0123456789XY")  # 18 chars held: the 6 returned go, then "01" unreturned
    assert (buffer.raw, buffer.base, buffer.dropped) == ("23456789XY", 8, 2)
    assert buffer.take() == ("23456789XY", 2)
    assert buffer.dropped == 0


def test_offsets_before_the_buffer_read_from_its_start() -> None:
    buffer = OutputBuffer(limit=4)
    buffer.append("abcdefgh")
    assert buffer.text_since(0) == "efgh"


def test_feed_decodes_characters_split_across_reads() -> None:
    buffer = OutputBuffer()
    data = "é€".encode()
    for i in range(len(data)):
        buffer.feed(data[i : i + 1])
    assert buffer.take() == ("é€", 0)


def test_feed_replaces_bad_bytes_and_flushes_a_cut_character_at_the_end() -> None:
    buffer = OutputBuffer()
    buffer.feed(b"a\xffb\xe2\x82")
    assert buffer.raw == "a\ufffdb"
    buffer.feed(b"", final=True)
    assert buffer.take() == ("a\ufffdb\ufffd", 0)


# -- rendering --------------------------------------------------------------------------------


def test_render_removes_prompts_and_cleans() -> None:
    assert rendered(f"\x1b[32mok\x1b[0m\r\n{PS2}more\n{PS1}") == "ok\nmore\n"


def test_render_notes_why_the_call_ended() -> None:
    assert rendered("x", ended="continuation") == (
        "x\n[sandbox-tools: the shell is waiting for more input (an unfinished quote, "
        "bracket or here-document?): send the rest of the command, or restart the session]\n"
    )
    assert rendered("", ended="exited", exit_code=3) == (
        "[sandbox-tools: the shell exited with code 3; restart the session "
        "(restart: true) to get a new one]\n"
    )
    note = (
        "[sandbox-tools: no prompt yet: the command is still running or waiting for input; "
        "call again to read more output, send input, or restart the session]\n"
    )
    assert rendered("out\n", ended="idle") == "out\n" + note
    assert rendered("out\n", ended="timeout") == "out\n" + note
    assert rendered("out\n", ended="timeout", input_given=False) == "out\n"
    assert rendered("out\n", ended="prompt") == "out\n"


def test_render_reports_drops_before_other_notes() -> None:
    assert rendered("tail", dropped=12, ended="exited", exit_code=0) == (
        "tail\n[sandbox-tools: 12 characters of output were dropped (buffer full)]\n"
        "[sandbox-tools: the shell exited with code 0; restart the session "
        "(restart: true) to get a new one]\n"
    )


def test_render_truncates_the_output_before_adding_notes() -> None:
    text = rendered("x" * 100 + "END", max_output_bytes=64, ended="continuation")
    body, notes = text.split("\n[sandbox-tools: the shell is waiting", 1)
    assert body == "[sandbox-tools: 39 bytes of earlier output truncated]\n" + "x" * 61 + "END"
    assert notes.endswith("restart the session]\n")


# -- properties -------------------------------------------------------------------------------

# Text rich in the bytes escape sequences are made of, and in their neighbours.
noisy = st.text(
    alphabet=st.sampled_from("\x1b[]();?0123456789mHJKa \\\x07\r\n\t\x00\x08\x7f\u00e9\u009b"),
    max_size=60,
)
# Any character but ESC, some of each kind: ASCII, controls, 2-, 3- and 4-byte UTF-8.
ANY = "ab Z[]\\;019\x00\x07\x08\t\n\r\x7f\u0085\u009b\u00e9\u20ac\U0001f600"
plain = st.text(alphabet=st.sampled_from(ANY), max_size=30)
sequences = st.one_of(
    st.builds(  # CSI: parameters, intermediates, a final byte
        lambda p, i, f: f"\x1b[{p}{i}{f}",
        st.text(alphabet=st.sampled_from([chr(c) for c in range(0x30, 0x40)]), max_size=6),
        st.text(alphabet=st.sampled_from([chr(c) for c in range(0x20, 0x30)]), max_size=2),
        st.sampled_from([chr(c) for c in range(0x40, 0x7F)]),
    ),
    st.builds(  # OSC, ended by BEL or ST
        lambda body, end: f"\x1b]{body}{end}",
        st.text(alphabet=st.sampled_from(ANY.replace("\x07", "")), max_size=10),
        st.sampled_from(["\x07", "\x1b\\"]),
    ),
    st.builds(  # two-byte escapes (ESC ] opens an OSC instead)
        lambda c: f"\x1b{c}",
        st.sampled_from([chr(c) for c in range(0x40, 0x60) if chr(c) not in "[]"]),
    ),
)


@settings(max_examples=100, deadline=None)
@given(noisy)
def test_cleaning_never_leaves_an_escape_or_control(text: str) -> None:
    cleaned = clean_output(text)
    assert FORBIDDEN.search(cleaned) is None
    assert clean_output(cleaned) == cleaned


@settings(max_examples=100, deadline=None)
@given(plain, sequences, plain)
def test_cleaning_removes_whole_sequences(before: str, sequence: str, after: str) -> None:
    assert clean_output(before + sequence + after) == clean_output(before) + clean_output(after)


@settings(max_examples=100, deadline=None)
@given(st.text(alphabet=st.sampled_from(ANY + "\x1b"), max_size=60), st.integers(1, 80))
def test_truncation_keeps_within_the_limit_and_says_so(text: str, max_bytes: int) -> None:
    result = truncate_tail(text, max_bytes)
    size = len(text.encode())
    if size <= max_bytes:
        assert result == text
        return
    notice = NOTICE.match(result)
    assert notice is not None
    kept = result[notice.end() :]
    assert text.endswith(kept)
    assert max_bytes - 4 < len(kept.encode()) <= max_bytes  # at most a split character less
    assert int(notice.group(1)) == size - len(kept.encode())


@settings(max_examples=100, deadline=None)
@given(noisy, st.integers(64, 120))
def test_rendered_output_is_clean_and_truncation_is_announced(text: str, max_bytes: int) -> None:
    result = rendered(f"{PS1}{text}{PS2}", max_output_bytes=max_bytes)  # no notes
    assert FORBIDDEN.search(result) is None and PS1 not in result and PS2 not in result
    cleaned = clean_output(text)
    notice = NOTICE.match(result)
    if len(cleaned.encode()) <= max_bytes:
        assert notice is None and result == cleaned
    else:
        assert notice is not None
        kept = result[notice.end() :]
        assert cleaned.endswith(kept) and len(kept.encode()) <= max_bytes


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.one_of(st.text(alphabet="abc\u00e9\n", min_size=1, max_size=15), st.none()),
        max_size=30,
    ),
    st.integers(1, 25),
)
def test_buffer_stays_bounded_and_accounts_for_every_character(
    steps: list[str | None], limit: int
) -> None:
    """None is a call taking the output; what it gets plus what it is told was dropped
    is exactly what arrived since the previous call, the oldest dropped first."""
    buffer = OutputBuffer(limit=limit)
    everything = pending = ""
    for step in [*steps, None]:
        if step is None:
            text, dropped = buffer.take()
            assert len(text) + dropped == len(pending)
            assert text == pending[dropped:]
            pending = ""
            continue
        buffer.append(step)
        everything += step
        pending += step
        assert len(buffer.raw) <= limit
        assert buffer.base <= buffer.returned <= buffer.end
        assert buffer.raw == everything[-limit:] and buffer.end == len(everything)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(  # valid UTF-8 of every length, and stray bytes
        st.one_of(st.text(alphabet=st.sampled_from(ANY), max_size=4).map(str.encode), st.binary()),
        max_size=8,
    ).map(b"".join),
    st.lists(st.integers(0, 40), max_size=6),
)
def test_feeding_in_any_pieces_decodes_like_the_whole(data: bytes, cuts: list[int]) -> None:
    buffer = OutputBuffer()
    bounds = [0, *sorted(cuts), len(data)]
    for start, stop in itertools.pairwise(bounds):
        buffer.feed(data[start:stop])
    buffer.feed(b"", final=True)
    assert buffer.take() == (data.decode("utf-8", "replace"), 0)
