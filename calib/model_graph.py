"""The model's graph as calibration reads it: loaded without its weights, the requested activations
(ACTS.json) checked against it, and cut down to the nodes they depend on with them as its outputs."""
from __future__ import annotations

import json
import os

from messages import CalibError, first_line


def read_activations(path: str) -> list[tuple[str, int]]:
    if not os.path.isfile(path):
        raise CalibError(f"--activations {path}: file not found")
    try:
        with open(path, encoding="utf-8") as f:
            v = json.load(f)
    except (OSError, ValueError) as e:
        raise CalibError(f"--activations {path}: not JSON ({first_line(e)})") from None
    if not isinstance(v, list) or not v:
        raise CalibError(f"--activations {path}: a non-empty list of {{\"name\": ..., \"K\": ...}} expected")
    out, seen = [], {}
    for i, e in enumerate(v):
        if not isinstance(e, dict) or not isinstance(e.get("name"), str) or not e["name"] \
                or not isinstance(e.get("K"), int) or isinstance(e.get("K"), bool) or e["K"] <= 0:
            raise CalibError(f"--activations {path}: entry {i} is not {{\"name\": string, \"K\": positive int}}")
        name, K = e["name"], e["K"]
        if name in seen:
            if seen[name] != K:
                raise CalibError(f"--activations {path}: '{name}' is listed with K {seen[name]} and K {K}")
            continue
        seen[name] = K
        out.append((name, K))
    return out


def load_graph(path: str):
    import onnx
    if not os.path.exists(path):
        raise CalibError(f"--model {path}: file not found")
    if not os.path.isfile(path):
        raise CalibError(f"--model {path}: not a file")
    try:
        return onnx.load(path, load_external_data=False)
    except Exception as e:  # noqa: BLE001 - DecodeError, ...
        raise CalibError(f"--model {path}: not an ONNX model ({first_line(e)})") from None


def check_activations(model, acts, model_path):
    g = model.graph
    produced = {o for n in g.node for o in n.output if o}
    inputs = {vi.name for vi in g.input}
    inits = {t.name for t in g.initializer}
    for name, _ in acts:
        if name in produced:
            continue
        if name in inputs and name not in inits:
            continue
        if name in inits:
            raise CalibError(f"{model_path}: '{name}' (--activations) is an initializer, not an activation")
        raise CalibError(f"{model_path}: no tensor named '{name}' (--activations) in the graph")


def _subgraph_refs(node, acc: set) -> None:
    """Every tensor name a node's subgraphs read (over-inclusive: outer-scope names are among them)."""
    from onnx import AttributeProto
    for a in node.attribute:
        graphs = [a.g] if a.type == AttributeProto.GRAPH else list(a.graphs) if a.type == AttributeProto.GRAPHS else []
        for g in graphs:
            for n in g.node:
                acc.update(x for x in n.input if x)
                _subgraph_refs(n, acc)


def augmented_model_bytes(model, outputs: list[str]) -> bytes:
    """The model with `outputs` as its only graph outputs and only the nodes they depend on."""
    import onnx
    g = model.graph
    producer = {}
    for i, n in enumerate(g.node):
        for o in n.output:
            if o:
                producer[o] = i
    need_nodes = set()
    stack = [producer[o] for o in outputs if o in producer]
    while stack:
        i = stack.pop()
        if i in need_nodes:
            continue
        need_nodes.add(i)
        refs = set(x for x in g.node[i].input if x)
        _subgraph_refs(g.node[i], refs)
        stack.extend(producer[r] for r in refs if r in producer and producer[r] not in need_nodes)
    kept = [g.node[i] for i in sorted(need_nodes)]
    used = set()
    for n in kept:
        used.update(x for x in n.input if x)
        _subgraph_refs(n, used)
    input_names = {vi.name for vi in g.input}

    ng = onnx.GraphProto()
    ng.name = g.name
    ng.doc_string = g.doc_string
    ng.node.extend(kept)
    ng.initializer.extend(t for t in g.initializer if t.name in used or t.name in input_names)
    ng.sparse_initializer.extend(g.sparse_initializer)
    ng.input.extend(g.input)
    ng.value_info.extend(g.value_info)
    for o in outputs:
        ng.output.append(onnx.ValueInfoProto(name=o))
    nm = onnx.ModelProto()
    for fd, val in model.ListFields():          # everything but the graph (opsets, functions, metadata)
        if fd.name == "graph":
            continue
        if hasattr(val, "extend"):              # repeated field
            getattr(nm, fd.name).extend(val)
        elif hasattr(val, "CopyFrom"):          # message
            getattr(nm, fd.name).CopyFrom(val)
        else:
            setattr(nm, fd.name, val)
    nm.graph.CopyFrom(ng)
    try:
        return nm.SerializeToString()
    except Exception as e:  # noqa: BLE001 - protobuf's 2 GiB limit
        raise CalibError(f"the model's graph cannot be serialized ({first_line(e)}): weights stored inline "
                         f"beyond protobuf's 2 GiB limit? Store them as external data") from None


def session_model_bytes(cut: bytes, items: list, gram_block: int, keep_rows: bool) -> bytes:
    """The cut graph with session_stats.py's statistics of `items` as its outputs."""
    import onnx
    from session_stats import add_stat_outputs
    return add_stat_outputs(onnx.load_from_string(cut), items, gram_block, keep_rows).SerializeToString()
