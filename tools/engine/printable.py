"""Control characters out of every string that came from outside, before it reaches a finding, a
command line or a terminal: one function, `printable`, applied where results are finalised
(runner.execute, for what is answered and stored alike), where job errors and progress are recorded
(jobs.py), and where a command line is built from names we did not choose (`shell_word`).

A log line, a node name or a DCGM message can carry ESC sequences that erase lines on screen (`ESC[2K`,
`\\r`), hide text (`ESC[8m`) or write the user's clipboard (OSC 52), and a newline that starts a forged
line in a drain command. Each such character becomes its visible escape (`\\x1b`, `\\u202e`), so the
text still says what was there. Kept: tab, and newline in prose (findings may span lines); a shell word
keeps neither.
"""

import re
import shlex

# C0 controls, DEL, C1 controls, and the Unicode bidi overrides / line separators that reorder or split
# what a terminal shows.
_CONTROLS = [*range(0x00, 0x20), 0x7F, *range(0x80, 0xA0), *range(0x202A, 0x202F), *range(0x2066, 0x206A),
             0x2028, 0x2029]
_ESCAPES = {c: (f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}") for c in _CONTROLS}
_PROSE = str.maketrans({c: e for c, e in _ESCAPES.items() if c not in (0x09, 0x0A)})
_WORD = str.maketrans(_ESCAPES)
_ANY = re.compile("[" + "".join(re.escape(chr(c)) for c in _CONTROLS if c not in (0x09, 0x0A)) + "]")


def printable(text: str, *, newlines: bool = True) -> str:
    """`text` with every control character escaped (newlines kept unless newlines=False)."""
    if not newlines:
        return text.translate(_WORD)
    return text.translate(_PROSE) if _ANY.search(text) else text


def printable_data(value):
    """printable() on every string inside a JSON-like value (dict keys too)."""
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, dict):
        return {printable(k) if isinstance(k, str) else k: printable_data(v) for k, v in value.items()}
    if isinstance(value, list):
        return [printable_data(v) for v in value]
    return value


def shell_word(text: str) -> str:
    """One shell word for a command line we print: controls (newline included) escaped, then quoted."""
    return shlex.quote(printable(text, newlines=False))
