"""Key names as a model writes them ("Enter", "ArrowDown", "a", "Shift+Tab") turned into
the fields of DevTools' `Input.dispatchKeyEvent`: pure.

Chromium acts on `windowsVirtualKeyCode` (focus moves on Tab, lists on the arrows) and
inserts `text`; `key` and `code` are what a page's key handlers read. The codes are those
of a US layout, as Puppeteer's and Playwright's keyboards use: a page sees the key a
person on such a keyboard would have pressed.
"""

from __future__ import annotations

from dataclasses import dataclass

# DevTools' modifier bits.
ALT, CONTROL, META, SHIFT = 1, 2, 4, 8
MODIFIERS = {
    "alt": ALT,
    "option": ALT,
    "control": CONTROL,
    "ctrl": CONTROL,
    "meta": META,
    "cmd": META,
    "command": META,
    "shift": SHIFT,
}


@dataclass(frozen=True)
class KeyEvent:
    """One key press: what `Input.dispatchKeyEvent` is sent, down and then up."""

    key: str
    code: str
    key_code: int
    text: str | None = None  # what the press inserts; None for keys that insert nothing
    modifiers: int = 0


# name: (key, code, windowsVirtualKeyCode, text)
_NAMED: dict[str, tuple[str, str, int, str | None]] = {
    "enter": ("Enter", "Enter", 13, "\r"),
    "tab": ("Tab", "Tab", 9, None),
    "escape": ("Escape", "Escape", 27, None),
    "backspace": ("Backspace", "Backspace", 8, None),
    "delete": ("Delete", "Delete", 46, None),
    "insert": ("Insert", "Insert", 45, None),
    "home": ("Home", "Home", 36, None),
    "end": ("End", "End", 35, None),
    "pageup": ("PageUp", "PageUp", 33, None),
    "pagedown": ("PageDown", "PageDown", 34, None),
    "arrowleft": ("ArrowLeft", "ArrowLeft", 37, None),
    "arrowup": ("ArrowUp", "ArrowUp", 38, None),
    "arrowright": ("ArrowRight", "ArrowRight", 39, None),
    "arrowdown": ("ArrowDown", "ArrowDown", 40, None),
    "space": (" ", "Space", 32, " "),
    "shift": ("Shift", "ShiftLeft", 16, None),
    "control": ("Control", "ControlLeft", 17, None),
    "alt": ("Alt", "AltLeft", 18, None),
    "meta": ("Meta", "MetaLeft", 91, None),
    **{f"f{n}": (f"F{n}", f"F{n}", 111 + n, None) for n in range(1, 13)},
}
# Other spellings models use for the same keys.
_ALIASES = {
    "return": "enter",
    "esc": "escape",
    "del": "delete",
    "up": "arrowup",
    "down": "arrowdown",
    "left": "arrowleft",
    "right": "arrowright",
    "spacebar": "space",
    "ctrl": "control",
    "cmd": "meta",
    "command": "meta",
    "option": "alt",
}
# Punctuation on a US keyboard without Shift: (code, windowsVirtualKeyCode).
_PUNCTUATION = {
    "-": ("Minus", 189),
    "=": ("Equal", 187),
    "[": ("BracketLeft", 219),
    "]": ("BracketRight", 221),
    "\\": ("Backslash", 220),
    ";": ("Semicolon", 186),
    "'": ("Quote", 222),
    ",": ("Comma", 188),
    ".": ("Period", 190),
    "/": ("Slash", 191),
    "`": ("Backquote", 192),
}
KNOWN_KEYS = ["Space" if key == " " else key for key, _, _, _ in _NAMED.values()]


class UnknownKey(ValueError):
    """A key name no keyboard has; the message lists the names there are."""


def _character(char: str, modifiers: int) -> KeyEvent:
    shortcut = modifiers & (ALT | CONTROL | META)
    if char.isascii() and char.isalpha():
        upper = char.upper()
        key = upper if modifiers & SHIFT else char
        # Control+a is a shortcut (select all), not an "a" typed into the field.
        return KeyEvent(key, f"Key{upper}", ord(upper), None if shortcut else key, modifiers)
    if char.isascii() and char.isdigit():
        return KeyEvent(char, f"Digit{char}", ord(char), None if shortcut else char, modifiers)
    code, key_code = _PUNCTUATION.get(char, ("", 0))
    # A character no US key makes without Shift (an "é", a "?"): its text is what counts.
    return KeyEvent(char, code, key_code, None if shortcut else char, modifiers)


def key_event(name: str) -> KeyEvent:
    """The press `name` means: a named key (case does not matter), one character (case
    does), either after modifiers joined with "+" ("Shift+Tab", "Control+a")."""
    if not name:
        raise UnknownKey("the key is empty: name one, such as Enter or a")
    if name == "+" or len(name) == 1:
        parts = [name]
    elif name.endswith("++"):
        parts = [*name[:-2].split("+"), "+"]
    else:
        parts = name.split("+")
    *held, main = parts
    modifiers = 0
    for modifier in held:
        bit = MODIFIERS.get(modifier.strip().lower())
        if bit is None:
            raise UnknownKey(
                f"{modifier!r} in {name!r} is not a modifier (use Alt, Control, Meta or Shift)"
            )
        modifiers |= bit
    if len(main) == 1:
        return _character(main, modifiers)
    lowered = main.strip().lower()
    named = _NAMED.get(_ALIASES.get(lowered, lowered))
    if named is None:
        raise UnknownKey(
            f"unknown key {main!r}: use a single character or one of {', '.join(KNOWN_KEYS)}"
        )
    key, code, key_code, text = named
    if modifiers & (ALT | CONTROL | META):
        text = None  # Control+Space and the like are shortcuts; Shift+Space is still a space
    return KeyEvent(key, code, key_code, text, modifiers)
