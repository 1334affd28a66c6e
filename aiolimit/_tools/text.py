"""How the command line writes things: limiter names, counted nouns, seconds and sizes.

>>> shown("red\\x1b[31m\\nname")
'red\\\\x1b[31m\\\\nname'
>>> plural(1, "key"), plural(3, "key")
('1 key', '3 keys')
"""

from __future__ import annotations

__all__ = ["bar", "plural", "seconds", "shown", "size"]

_ESCAPES = {"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\x00": "\\0"}
_BAR_WIDTH = 20


def shown(name: str) -> str:
    """A limiter name as printed: what the terminal would act on (escape sequences, control
    characters, line breaks, bidirectional overrides) written as Python writes it in a
    string literal (``\\x1b``, ``\\n``, ``\\u202e``), a backslash doubled, so that a name
    can neither reach the terminal nor split a row; a shard's NUL as ``\\0``."""
    if name.isprintable() and "\\" not in name:
        return name
    return "".join(_escaped(char) for char in name)


def _escaped(char: str) -> str:
    if char in _ESCAPES:
        return _ESCAPES[char]
    if char.isprintable():
        return char
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def plural(count: int, word: str, words: str | None = None) -> str:
    """``1 key``, ``2 keys``, ``0 keys`` (``words``: a plural not made with an s)."""
    return f"{count:,} {word if count == 1 else (words or word + 's')}"


def seconds(value: float) -> str:
    """``0.250 s``, ``7,200 s``: milliseconds while they matter."""
    return f"{value:.3f} s" if value < 10 else f"{value:,.0f} s"


def size(count: float) -> str:
    """``512 B``, ``1.5 KiB``, ``3.2 MiB``."""
    if count < 1024:
        return f"{count:.0f} B"
    count /= 1024
    return f"{count:.1f} KiB" if count < 1024 else f"{count / 1024:.1f} MiB"


def bar(part: int, whole: int) -> str:
    """``[#####---------------]``: ``part`` of ``whole`` in 20 characters."""
    filled = min(_BAR_WIDTH, max(0, round(_BAR_WIDTH * part / whole))) if whole else 0
    return "[" + "#" * filled + "-" * (_BAR_WIDTH - filled) + "]"
