#!/usr/bin/env python3
"""Runs a command as a child process and reports, as JSON: wall seconds, CPU seconds, peak RSS of the
whole process tree, and the size of what it wrote.

    python3 bench/measure.py [--out PATH]... [--log FILE] [--label NAME] [--json FILE] -- CMD [ARGS...]

Library use (bench/rtn_side_by_side.py, a later compare script):

    from measure import measure
    r = measure(["build/nibble", "quantize", ...], outputs=["/tmp/x/out"], log_path="/tmp/x/log.txt")
    r["wall_s"], r["peak_rss_mb"], r["output_mb"], r["rc"]

Peak RSS is the larger of two readings:
  * ``maxrss_mb``: ``ru_maxrss`` from ``os.wait4`` on the child: the peak RSS of the child or of its
    largest reaped descendant (the kernel keeps the max, not the sum; exact, no sampling);
  * ``tree_rss_peak_mb``: the peak over time of the summed RSS of the child and all its live descendants,
    sampled every ``poll_s`` (20 ms) through /proc (psutil is not needed).  Only this one sees several
    processes alive at once; it can miss a spike shorter than the interval.
Both use 1 MB = 2**20 bytes.  Output size: every regular file under each ``outputs`` path (file or
directory, recursively), summed; give each run an output directory of its own.  Nothing is measured
about the machine's other load: run one measurement at a time.
"""
import argparse
import json
import os
import subprocess
import sys
import threading
import time

MB = 1024 * 1024
_PAGE = os.sysconf("SC_PAGE_SIZE")


def _children_map():
    """ppid -> [pid] for all processes, read from /proc/*/stat."""
    kids = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat", "rb") as f:
                s = f.read()
        except OSError:
            continue
        # pid (comm) state ppid ...; comm may contain spaces/parens: split after the last ')'
        rest = s[s.rfind(b")") + 2:].split()
        kids.setdefault(int(rest[1]), []).append(int(d))
    return kids


def _rss_bytes(pid):
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return 0


def tree_rss_bytes(root_pid):
    """Summed RSS of root_pid and all its descendants now."""
    kids = _children_map()
    total, stack, seen = 0, [root_pid], set()
    while stack:
        p = stack.pop()
        if p in seen:
            continue
        seen.add(p)
        total += _rss_bytes(p)
        stack.extend(kids.get(p, ()))
    return total


def dir_size(paths):
    """(total bytes, [(path, bytes)]) of the regular files under each path."""
    files = []
    for p in paths:
        if os.path.isfile(p):
            files.append((p, os.path.getsize(p)))
        elif os.path.isdir(p):
            for root, _, names in os.walk(p):
                for n in sorted(names):
                    fp = os.path.join(root, n)
                    if os.path.isfile(fp) and not os.path.islink(fp):
                        files.append((fp, os.path.getsize(fp)))
    return sum(b for _, b in files), files


def measure(cmd, outputs=(), log_path=None, env=None, cwd=None, poll_s=0.02, timeout_s=None):
    """Runs cmd (list of str) to completion and returns a dict (see module doc).  stdout+stderr of the
    child go to log_path when given, else are inherited.  timeout_s kills the child's process group."""
    log = open(log_path, "wb") if log_path else None
    t0 = time.perf_counter()
    try:
        proc = subprocess.Popen(cmd, stdout=log or None, stderr=subprocess.STDOUT if log else None,
                                env=env, cwd=cwd, start_new_session=True)
    except OSError as e:
        if log:
            log.close()
        return {"cmd": cmd, "rc": None, "error": f"{type(e).__name__}: {e}", "wall_s": 0.0}
    peak = [0]
    done = threading.Event()

    def poll():
        while not done.is_set():
            peak[0] = max(peak[0], tree_rss_bytes(proc.pid))
            done.wait(poll_s)

    th = threading.Thread(target=poll, daemon=True)
    th.start()
    timed_out = False
    if timeout_s is not None:
        def killer():
            nonlocal timed_out
            if not done.wait(timeout_s):
                timed_out = True
                try:
                    os.killpg(proc.pid, 9)
                except OSError:
                    pass
        threading.Thread(target=killer, daemon=True).start()
    _, status, ru = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    done.set()
    th.join()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if log:
        log.close()
    total, files = dir_size(outputs)
    maxrss = ru.ru_maxrss * 1024  # KiB on Linux
    return {
        "cmd": cmd,
        "rc": proc.returncode,
        "timed_out": timed_out,
        "wall_s": round(wall, 3),
        "user_s": round(ru.ru_utime, 3),
        "sys_s": round(ru.ru_stime, 3),
        "peak_rss_mb": round(max(maxrss, peak[0]) / MB, 1),
        "maxrss_mb": round(maxrss / MB, 1),
        "tree_rss_peak_mb": round(peak[0] / MB, 1),
        "output_mb": round(total / MB, 3),
        "output_bytes": total,
        "output_files": [{"path": p, "bytes": b} for p, b in files],
        "log": log_path,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", action="append", default=[], help="output file or directory (repeatable)")
    ap.add_argument("--log", help="send the child's stdout+stderr here")
    ap.add_argument("--label")
    ap.add_argument("--json", help="also write the JSON here")
    ap.add_argument("--timeout", type=float)
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
    if not cmd:
        ap.error("no command given (put it after --)")
    r = measure(cmd, outputs=a.out, log_path=a.log, timeout_s=a.timeout)
    if a.label:
        r = {"label": a.label, **r}
    s = json.dumps(r, indent=2)
    print(s)
    if a.json:
        with open(a.json, "w") as f:
            f.write(s + "\n")
    sys.exit(0 if r.get("rc") == 0 else 1)


if __name__ == "__main__":
    main()
