#!/usr/bin/env python3
"""Compares two quantized models initializer by initializer (parity checks in bench/RESULTS.md):

    .venv/bin/python bench/int4_diff.py A/model.onnx B/model.onnx

Prints how many INT4 codes (`*_i4`), scales (`*_scale`) and other initializers differ, and whether the
node counts and op types agree.  Exit 0 when everything is identical, 1 otherwise."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))

import numpy as np  # noqa: E402

from tests.e2e.conftest import Graph  # noqa: E402


def main() -> int:
    a, b = Graph(sys.argv[1]), Graph(sys.argv[2])
    wa = sorted(n for n in a.inits if n.endswith("_i4"))
    wb = sorted(n for n in b.inits if n.endswith("_i4"))
    if wa != wb:
        print(f"different quantized weights: {len(wa)} vs {len(wb)}")
        return 1
    codes = diff = sdiff = 0
    for n in wa:
        qa, _ = a.int4(n)
        qb, _ = b.int4(n)
        codes += qa.size
        diff += int((qa != qb).sum())
        sdiff += int((a.array(n[:-3] + "_scale") != b.array(n[:-3] + "_scale")).sum())
    others = [n for n in a.inits if not n.endswith(("_i4", "_scale"))]
    oth = sum(1 for n in others if n not in b.inits or not np.array_equal(a.array(n), b.array(n)))
    ops = sorted(n.op_type for n in a.node_list) == sorted(n.op_type for n in b.node_list)
    print(f"{len(wa)} weights: {diff} of {codes} INT4 codes differ, {sdiff} scales differ, {oth} of "
          f"{len(others)} other initializers differ; nodes {len(a.node_list)} vs {len(b.node_list)}, "
          f"same op types: {ops}")
    return 0 if diff == sdiff == oth == 0 and ops and len(a.node_list) == len(b.node_list) else 1


if __name__ == "__main__":
    sys.exit(main())
