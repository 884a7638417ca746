"""The `nibble` console command of the wheel: execs the packaged binary with NIBBLE_PYTHON set to the
Python of the environment nibble was installed into, which has its requirements (the wheel's
dependencies), so calibration and `nibble eval` run there whatever `python3` on PATH is."""
from __future__ import annotations

import os
import sys


def binary() -> str:
    """$NIBBLE_BIN (a build of your own), else the binary inside this package."""
    return os.environ.get("NIBBLE_BIN") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "nibble")


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("NIBBLE_PYTHON", sys.executable)  # an explicit NIBBLE_PYTHON wins
    return env


def main() -> None:
    exe = binary()
    if not os.access(exe, os.X_OK):
        print(f"nibble: error: the nibble binary is missing at {exe} (reinstall the package)", file=sys.stderr)
        sys.exit(2)
    os.execve(exe, [exe, *sys.argv[1:]], child_env())


if __name__ == "__main__":
    main()
