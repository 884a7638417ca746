"""What the calibration scripts say: CalibError for a bad input (one line 'calibration: <message>',
exit 2, printed by capture.py's main) and the 'calib: ...' lines of warnings and progress on stderr."""
from __future__ import annotations

import sys


class CalibError(Exception):
    """A bad input: reported as ONE line 'calibration: <message>', exit 2."""


def warn(msg: str) -> None:
    print(f"calib: warning: {msg}", file=sys.stderr, flush=True)


def note(msg: str) -> None:
    print(f"calib: {msg}", file=sys.stderr, flush=True)


def log(msg: str) -> None:
    print(f"calib: {msg}", file=sys.stderr, flush=True)


def first_line(e: BaseException) -> str:
    s = str(e).strip()
    return (s.splitlines()[0] if s else type(e).__name__)[:400]
