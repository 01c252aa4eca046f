"""Numbers in pasted or logged text: a count or a decimal as a tool prints it, or an error naming the line.

A paste is outside text. `Replay Errors: <5000 digits>` or `Rate: 1.2.3` must come back as an error that names the
line and what is accepted, never as Python's own message (int() refuses more than 4,300 digits, float('1.2.3') raises
"could not convert string to float"). Patterns capture the candidate loosely (`\\d+`, `[\\d.]+`) and this module
decides, so a crafted number is reported instead of silently skipped.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

from .logscan import capped_lines

MAX_DIGITS = 20                      # a 64-bit counter prints at most 20 digits
_COUNT = re.compile(r"\d{1,20}")
_DECIMAL = re.compile(r"\d{1,20}(?:\.\d{1,20})?")


class BadNumber(ValueError):
    """A number in outside text that is not one a tool prints (too long, two decimal points, empty)."""


def shown(value: str, keep: int = 24) -> str:
    """The value for an error message: quoted, and cut with its length when long."""
    return repr(value) if len(value) <= keep else f"{value[:keep]!r}... ({len(value):,} characters)"


def count(value: str, what: str) -> int:
    """A whole number such as a counter; BadNumber unless it is 1-20 digits."""
    if not _COUNT.fullmatch(value):
        raise BadNumber(f"{what} {shown(value)} is not a count (expected a whole number of 1-{MAX_DIGITS} digits)")
    return int(value)


def decimal(value: str, what: str) -> float:
    """A decimal such as a rate; BadNumber unless it is digits with at most one decimal point."""
    if not _DECIMAL.fullmatch(value):
        raise BadNumber(f"{what} {shown(value)} is not a number (expected digits with at most one decimal point, "
                        "such as 26.562)")
    return float(value)


@contextmanager
def lines_of(text: str) -> Iterator[Iterator[str]]:
    """The text's lines through the bounded matcher (logscan.capped_lines); a BadNumber raised while one of them
    is read comes out naming that line:  `with lines_of(text) as lines: for line in lines: ...`."""
    where = [0, ""]

    def numbered() -> Iterator[str]:
        for where[0], where[1] in enumerate(capped_lines(text), 1):
            yield where[1]

    try:
        yield numbered()
    except BadNumber as e:
        raise BadNumber(f"line {where[0]} ({shown(where[1].strip(), 60)}): {e}") from None
