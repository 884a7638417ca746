"""Layer by layer (--layer_state): capture's view of one layer group, whose graph is the group's segment
(layers.py) and whose batches are the boundary tensors kept in the state folder."""
from __future__ import annotations

from messages import CalibError, first_line, log
from ort_session import make_session


class _Layered:
    """capture's view of one layer group (calib/layers.py): its batches come from the state folder,
    its session is the group's segment, and what crosses into the next segment is saved per batch."""

    def __init__(self, a, model, acts):
        from layers import LayerCut, read_groups
        groups = read_groups(a.layer_groups)
        if not 0 <= a.layer < len(groups):
            raise CalibError(f"--layer {a.layer}: --layer_groups has {len(groups)} groups")
        if sorted(groups[a.layer]) != sorted(n for n, _ in acts):
            raise CalibError(f"--layer {a.layer}: --activations and group {a.layer} of --layer_groups differ")
        self.a, self.model = a, model
        self.cut = LayerCut(model, groups)
        from layers import effective_weights
        self.eff = effective_weights(a.layer_weights)
        # quantized layers fed forward: the statistics run leaves the boundary to the advance run
        self.writes_next = a.layer_advance or not a.layer_weights

    def open(self, source_batches):
        from layers import LayerBatches
        self.lb = LayerBatches(self.a.layer_state, self.cut, self.a.layer, source_batches)
        for k in ("n_batches", "samples", "batch_size", "seq_len", "source"):
            setattr(self, k, getattr(self.lb, k))

    def __iter__(self):
        return iter(self.lb)

    @property
    def tokens(self):
        return self.lb.tokens

    def fetch(self, names, carry):
        s = self.a.layer
        own = [n for n in names if self.cut.produced_in.get(n, -1) == s]
        if carry and self.writes_next:
            self.lb.begin_next()
            own += [t for t in self.lb.carry if t not in own]
        return own

    def inputs(self, feeds):
        """The feeds the segment reads (the boundary holds what later segments need too)."""
        return {t: feeds[t] for t in self.seg_inputs}

    def model_bytes(self, fetch):
        b = self.cut.model_bytes(self.model, self.a.layer, self.lb.in_types, fetch, self.eff)
        if self.cut.substituted:
            log(f"layer group {self.a.layer}: {self.cut.substituted} weight(s) run dequantized")
        self.seg_inputs = self.cut.last_inputs
        return b

    def save_next(self, bi, feeds, mask, got):
        if not self.writes_next:
            return
        self.lb.save_next(bi, feeds, mask, got)
        for t in self.lb.carry:     # not an activation of this group: not counted below
            if t not in self.names:
                got.pop(t, None)

    def finish_next(self):
        if self.writes_next:
            self.lb.finish_next()

    def advance(self, model_dir, providers, model_path):
        """--layer_advance: the group's segment run once more, only for the boundary of the next group."""
        fetch = [] if self.lb.last else list(self.lb.carry)
        if not fetch:
            return False
        self.lb.begin_next()
        sess = None
        for bi, (feeds, mask) in enumerate(self):
            if sess is None:
                sess = make_session(self.model_bytes(fetch), model_dir, providers, model_path)
            try:
                vals = sess.run(fetch, self.inputs(feeds))
            except Exception as e:  # noqa: BLE001
                raise CalibError(f"{model_path}: ONNX Runtime failed on calibration batch {bi + 1} "
                                 f"({first_line(e)})") from None
            self.lb.save_next(bi, feeds, mask, dict(zip(fetch, vals)))
        self.lb.finish_next()
        return True


def layer_mode(a, model, acts):
    if a.layer_state is None:
        return None
    if a.layer_groups is None or a.layer < 0:
        raise CalibError("--layer_state needs --layer_groups and --layer")
    lay = _Layered(a, model, acts)
    lay.names = {n for n, _ in acts}
    return lay
