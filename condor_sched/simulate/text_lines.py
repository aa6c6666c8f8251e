"""A trace file read line by line within bounds (openb CSV and SWF share it): each line's
text as it is consumed, never the whole file at once; a refusal names the line."""
from __future__ import annotations

from pathlib import Path
from typing import Iterator


class LineRefused(ValueError):
    """A line the bounds refuse (too long, past the file's bound, not UTF-8); the reader that
    called :func:`bounded_lines` names its file in its own error type."""

    def __init__(self, line: int, problem: str) -> None:
        super().__init__(f"line {line}: {problem}")
        self.line, self.problem = line, problem


def bounded_lines(path: Path, max_line_bytes: int, max_bytes: int) -> Iterator[tuple[int, str]]:
    """(line number from 1, text) of each line of ``path``; :class:`LineRefused` for a line
    longer than ``max_line_bytes``, one that takes the file past ``max_bytes``, or one that
    is not UTF-8. ``OSError`` passes to the caller."""
    read = 0
    with path.open("rb") as f:
        for number, raw in enumerate(iter(lambda: f.readline(max_line_bytes + 1), b""), 1):
            read += len(raw)
            if len(raw) > max_line_bytes:
                raise LineRefused(number, f"longer than {max_line_bytes} bytes")
            if read > max_bytes:
                raise LineRefused(number, f"file larger than {max_bytes} bytes")
            try:
                yield number, raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise LineRefused(number, f"not UTF-8 text (byte {e.start} of the line)") from None
