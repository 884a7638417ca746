#!/usr/bin/env python3
"""Registers per CUDA kernel and architecture, from the ptxas reports the build keeps beside each object
of the CUDA library (cmake/ptxas_log.sh), as a markdown table (bench/GPU-MODEL.md "Registers").

    bench/ptxas_registers.py [build/CMakeFiles/nibble_kernels_cuda.dir]
"""
import glob
import os
import re
import sys


def main(argv: list[str]) -> int:
    root = argv[0] if argv else "build/CMakeFiles/nibble_kernels_cuda.dir"
    rows: dict[str, dict[str, str]] = {}
    for path in glob.glob(os.path.join(root, "**", "*.ptxas.log"), recursive=True):
        kernel = arch = None
        for line in open(path):
            m = re.search(r"Compiling entry function '(\S+)' for '(sm_\d+)'", line)
            if m:
                # One-thread-per-index bodies (…Body) and cooperative ones (launch_blocks.h: …Blocks).
                name = re.search(r"INS1_\d+([A-Za-z0-9]+?(?:Body|Blocks))E", m.group(1))
                kernel, arch = (name.group(1) if name else m.group(1)), m.group(2)
                continue
            m = re.search(r"(\d+) bytes spill stores", line)
            spill = m and int(m.group(1)) > 0
            m = re.search(r"Used (\d+) registers", line)
            if m and kernel:
                rows.setdefault(kernel, {})[arch] = m.group(1)
            if spill and kernel:
                rows.setdefault(kernel, {})[arch + "!"] = "spills"
    if not rows:
        print(f"no ptxas reports under {root}: build with the CUDA backend first", file=sys.stderr)
        return 1
    archs = sorted({a for r in rows.values() for a in r if not a.endswith("!")}, key=lambda a: int(a[3:]))
    print("| kernel | " + " | ".join(archs) + " |\n|---|" + "---|" * len(archs))
    for k in sorted(rows):
        print("| " + k + " | " + " | ".join(rows[k].get(a, "") + (" (spills)" if rows[k].get(a + "!") else "")
                                             for a in archs) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
