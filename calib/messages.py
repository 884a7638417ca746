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


def log_batch(gi: int, passes: int, bi: int, n_batches: int, t1: float, t2: float, t3: float) -> None:
    log(f"pass {gi + 1}/{passes} batch {bi + 1}/{n_batches}: run {t2 - t1:.2f} s, stats {t3 - t2:.2f} s")


def first_line(e: BaseException) -> str:
    s = str(e).strip()
    return (s.splitlines()[0] if s else type(e).__name__)[:400]
