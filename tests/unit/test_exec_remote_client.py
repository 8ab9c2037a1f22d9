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
