"""Layer-by-layer calibration for calib/capture.py (spec: calib/README.md, "Layer by layer").

The graph is cut into segments, one per group of activations (a decoder layer's MatMul inputs):
segment s = every node needed for group s's activations that no earlier segment already holds.  A
node's inputs then come from initializers, graph inputs or earlier segments, so any DAG can be cut
this way.  What crosses a cut (the residual stream, plus shared tensors such as the attention mask,
position ids or rotary caches) is kept on disk per batch between layers, in a state folder:

    STATE/g<s>/meta.json         batches, samples, seq_len, source, the tensors' names
    STATE/g<s>/b<i>.npz          batch i: every tensor entering segment s (+ "__mask__", "__tokens__")
    STATE/g<s>/done              written last: g<s> is complete

Running segment s reads g<s> and writes g<s+1>; nibble deletes g<s> once layer s is finished, so at
most two boundaries are on disk, and a run stopped anywhere can start again from the layer it was on.
"""
from __future__ import annotations

import json
import os
import shutil

import numpy as np

from messages import CalibError


def _refs(node, acc: set) -> None:
    """Every tensor a node reads, its subgraphs' outer-scope names included (over-inclusive)."""
    from onnx import AttributeProto
    acc.update(x for x in node.input if x)
    for a in node.attribute:
        graphs = [a.g] if a.type == AttributeProto.GRAPH else list(a.graphs) if a.type == AttributeProto.GRAPHS else []
        for g in graphs:
            for n in g.node:
                _refs(n, acc)


class LayerCut:
    """The segments of a graph for `groups` (activation names per group, in processing order)."""

    def __init__(self, model, groups: list[list[str]]):
        g = model.graph
        self.inits = {t.name for t in g.initializer}
        producer, refs = {}, []
        for i, n in enumerate(g.node):
            for o in n.output:
                if o:
                    producer[o] = i
            r = set()
            _refs(n, r)
            refs.append(r)
        self.segments: list[list[int]] = []
        seen: set[int] = set()
        for acts in groups:
            seg, stack = [], [producer[a] for a in acts if a in producer]
            while stack:
                i = stack.pop()
                if i in seen:
                    continue
                seen.add(i)
                seg.append(i)
                stack.extend(producer[r] for r in refs[i] if r in producer and producer[r] not in seen)
            self.segments.append(sorted(seg))
        self.produced_in = {}
        for s, seg in enumerate(self.segments):
            for i in seg:
                for o in g.node[i].output:
                    if o:
                        self.produced_in[o] = s
        # last segment that reads each tensor (a group's activations count as read by its segment)
        self.last_use: dict[str, int] = {}
        self.needs: list[list[str]] = []
        for s, seg in enumerate(self.segments):
            need = set(groups[s])
            for i in seg:
                need |= refs[i]
            need = {t for t in need if t not in self.inits}
            for t in need:
                self.last_use[t] = max(self.last_use.get(t, -1), s)
            self.needs.append(sorted(t for t in need if self.produced_in.get(t, -1) != s))
        self.groups = groups

    def entering(self, s: int) -> list[str]:
        """Tensors kept on disk entering segment s: made before s, read at s or later."""
        return sorted(t for t, last in self.last_use.items() if last >= s and self.produced_in.get(t, -1) < s)

    def carried_out(self, s: int) -> list[str]:
        """What segment s must output for the segments after it."""
        return sorted(t for t, last in self.last_use.items() if last > s and self.produced_in.get(t, -1) == s)

    def model_bytes(self, model, s: int, in_types: dict, outputs: list[str], eff: dict | None = None) -> bytes:
        """Segment s as a model: inputs = what it reads from the boundary (typed from the stored
        arrays, symbolic dims), outputs = `outputs`; its initializers still point at the original
        external data (nothing copied)."""
        import onnx
        from onnx import helper
        g = model.graph
        nodes = [g.node[i] for i in self.segments[s]]
        used = set()
        for n in nodes:
            _refs(n, used)
        ng = onnx.GraphProto()
        ng.name = f"{g.name}_segment{s}"
        ng.node.extend(nodes)
        ng.initializer.extend(t for t in g.initializer if t.name in used)
        self.substituted = substitute(ng, used, eff) if eff else 0
        self.last_inputs = [t for t in self.needs[s] if t in used]
        for t in self.last_inputs:
            dt, rank = in_types[t]
            ng.input.append(helper.make_tensor_value_info(t, dt, [f"{t}_d{k}" for k in range(rank)]))
        ng.value_info.extend(v for v in g.value_info if v.name in used)
        for o in outputs:
            ng.output.append(onnx.ValueInfoProto(name=o))
        nm = onnx.ModelProto()
        for fd, val in model.ListFields():
            if fd.name == "graph":
                continue
            if hasattr(val, "extend"):
                getattr(nm, fd.name).extend(val)
            elif hasattr(val, "CopyFrom"):
                getattr(nm, fd.name).CopyFrom(val)
            else:
                setattr(nm, fd.name, val)
        nm.graph.CopyFrom(ng)
        return nm.SerializeToString()


def read_groups(path: str) -> list[list[str]]:
    try:
        with open(path, encoding="utf-8") as f:
            v = json.load(f)
    except (OSError, ValueError) as e:
        raise CalibError(f"--layer_groups {path}: cannot read ({e})") from None
    if not isinstance(v, list) or not v or not all(isinstance(x, list) and x and all(isinstance(n, str) for n in x)
                                                    for x in v):
        raise CalibError(f"--layer_groups {path}: a non-empty list of non-empty lists of names expected")
    return v


class LayerBatches:
    """The calibration batches as they enter segment s (read from the state folder), and the writer of
    what leaves it for segment s + 1."""

    def __init__(self, state: str, cut: LayerCut, s: int, source_batches_fn):
        self.state, self.cut, self.s = state, cut, s
        self.dir = os.path.join(state, f"g{s}")
        if not os.path.exists(os.path.join(self.dir, "done")):
            if s != 0:
                raise CalibError(f"--layer_state {state}: the boundary entering layer group {s} is missing "
                                 f"(g{s}/done); start again without --resume")
            self._write_first(source_batches_fn())
        with open(os.path.join(self.dir, "meta.json"), encoding="utf-8") as f:
            self.meta = json.load(f)
        self.names = self.meta["names"]
        self.n_batches, self.samples = self.meta["n_batches"], self.meta["samples"]
        self.batch_size, self.seq_len, self.source = self.meta["batch_size"], self.meta["seq_len"], self.meta["source"]
        self.last = s + 1 >= len(cut.segments)
        self.next_dir = os.path.join(state, f"g{s + 1}")
        self.carry = [] if self.last else cut.carried_out(s)
        self.keep = [] if self.last else [t for t in cut.entering(s + 1) if t not in self.carry]
        self.in_types: dict = {}

    def _write_first(self, batches) -> None:
        """g0: the model's inputs per batch, as the whole-model pass would feed them."""
        tmp = self.dir + ".tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        want = self.cut.entering(0)
        names = None
        for bi, (feeds, tok_mask) in enumerate(batches):
            missing = [t for t in want if t not in feeds]
            if missing:
                raise CalibError(f"layer by layer: graph input '{missing[0]}' is not fed by the calibration data")
            names = want
            arrs = {f"t{k}": np.asarray(feeds[t]) for k, t in enumerate(want)}
            if tok_mask is not None:
                arrs["__mask__"] = np.asarray(tok_mask)
            ntok = tok_mask.size if tok_mask is not None else feeds["input_ids"].size if "input_ids" in feeds else 0
            arrs["__tokens__"] = np.asarray(ntok, np.int64)
            np.savez(os.path.join(tmp, f"b{bi}.npz"), **arrs)
        meta = {"names": names or want, "n_batches": batches.n_batches, "samples": batches.samples,
                "batch_size": batches.batch_size, "seq_len": batches.seq_len, "source": batches.source}
        with open(os.path.join(tmp, "meta.json"), "w", encoding="utf-8") as f:
            json.dump(meta, f)
        open(os.path.join(tmp, "done"), "w").close()
        shutil.rmtree(self.dir, ignore_errors=True)
        os.replace(tmp, self.dir)

    def __iter__(self):
        for bi in range(self.n_batches):
            with np.load(os.path.join(self.dir, f"b{bi}.npz")) as d:
                feeds = {t: d[f"t{k}"] for k, t in enumerate(self.names)}
                mask = d["__mask__"] if "__mask__" in d else None
                self.tokens = int(d["__tokens__"])
            if not self.in_types:
                from onnx import helper
                self.in_types = {t: (helper.np_dtype_to_tensor_dtype(a.dtype), a.ndim) for t, a in feeds.items()}
            yield feeds, mask

    def begin_next(self) -> None:
        if self.last:
            return
        self.tmp = self.next_dir + ".tmp"
        shutil.rmtree(self.tmp, ignore_errors=True)
        os.makedirs(self.tmp)

    def save_next(self, bi: int, feeds: dict, mask, got: dict) -> None:
        """Batch bi leaving segment s: the tensors still needed later, kept or just computed."""
        if self.last:
            return
        names = self.keep + self.carry
        arrs = {f"t{k}": (feeds[t] if t in feeds else got[t]) for k, t in enumerate(names)}
        if mask is not None:
            arrs["__mask__"] = mask
        arrs["__tokens__"] = np.asarray(self.tokens, np.int64)
        np.savez(os.path.join(self.tmp, f"b{bi}.npz"), **arrs)

    def finish_next(self) -> None:
        if self.last:
            return
        meta = dict(self.meta, names=self.keep + self.carry)
        with open(os.path.join(self.tmp, "meta.json"), "w", encoding="utf-8") as f:
            json.dump(meta, f)
        open(os.path.join(self.tmp, "done"), "w").close()
        shutil.rmtree(self.next_dir, ignore_errors=True)
        os.replace(self.tmp, self.next_dir)


# --------------------------------------------------------------------------------------------
# Feeding the quantized layers forward
# --------------------------------------------------------------------------------------------

def effective_weights(folder: str | None) -> dict:
    """What nibble quantized so far, as index entries by weight name (folder/eff_<g>.json, written by
    nibble after each layer): codes, scales, zero points, the AWQ scale s and the column divisor."""
    out = {}
    if not folder or not os.path.isdir(folder):
        return out
    for f in sorted(os.listdir(folder)):
        if f.startswith("eff_") and f.endswith(".json"):
            with open(os.path.join(folder, f), encoding="utf-8") as fh:
                for e in json.load(fh):
                    e["dir"] = folder
                    out[e["name"]] = e
    return out


def dequantized(e: dict, np_dtype) -> np.ndarray:
    """The float weight the quantized model computes with, in the original graph's terms: the codes
    dequantized, divided by s along K (the 1/s the output puts on the activation side) and multiplied
    by the column divisor along N (the consumer's 1/s folded into this weight's columns)."""
    rows, cols, ka, B = e["rows"], e["cols"], e["k_axis"], e["block"]
    rd = lambda key, dt: np.fromfile(os.path.join(e["dir"], e[key]), dtype=dt)  # noqa: E731
    codes = rd("codes", np.uint8 if e["zero_point"] else np.int8).reshape(rows, cols).astype(np.float32)
    K, N = (rows, cols) if ka == 0 else (cols, rows)
    G = -(-K // B)
    c = codes if ka == 0 else codes.T                                  # [K, N]
    sc = rd("scales", np.float32).reshape((G, N) if ka == 0 else (N, G))
    sc = sc if ka == 0 else sc.T                                       # [G, N]
    zp = np.zeros_like(sc)
    if e.get("zp"):
        z = rd("zp", np.uint8).reshape((G, N) if ka == 0 else (N, G)).astype(np.float32)
        zp = z if ka == 0 else z.T
    gi = np.arange(K) // B
    w = (c - zp[gi]) * sc[gi]
    if e.get("s"):
        w /= rd("s", np.float32)[:, None]
    if e.get("divisor"):
        w *= rd("divisor", np.float32)[None, :]
    return np.ascontiguousarray((w if ka == 0 else w.T).astype(np_dtype))


def substitute(graph, names: set, eff: dict) -> int:
    """Replaces the initializers among `names` that nibble already quantized by their dequantized form
    (inline), so the segment computes what the quantized model computes. Returns how many."""
    from onnx import helper, numpy_helper
    n = 0
    for i, t in enumerate(graph.initializer):
        if t.name in names and t.name in eff:
            dt = helper.tensor_dtype_to_np_dtype(t.data_type)
            graph.initializer[i].CopyFrom(numpy_helper.from_array(dequantized(eff[t.name], dt), t.name))
            n += 1
    return n
