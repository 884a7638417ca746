"""The bad-model corpus, as generators: every malformed model the loader must refuse is built here
from a few lines of onnx.helper (no big files checked in).  For each one, `nibble quantize` must exit
non-zero (not by a signal), print exactly ONE stderr line starting "nibble: error:" that names the
file, tensor or node at fault, leave nothing in the output folder and not touch the input folder.

Cases: truncated protobuf, not-a-model protobufs, wrong external offsets/lengths (past the end,
overflowing, not integers, not matching the shape), `location` escaping the folder (.., absolute,
symlink, NUL byte) or naming a folder / FIFO, data_type mismatches (raw_data size, typed-field counts,
UNDEFINED type), zero / negative / overflowing dims, initializers defined twice (also as a node
output), cycles, missing inputs and outputs.  A few valid-but-unusual models that must be ACCEPTED
(a weight referenced by two MatMuls, two initializers aliasing the same bytes, an unsorted but acyclic
graph) are at the end.
"""
from __future__ import annotations

import os
import signal
import struct

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from .conftest import folder_digest, listing
from .test_errors import assert_error

W = "model.layers.0.mlp.up_proj.MatMul.weight"
NODE = "/model/layers.0/mlp/up_proj/MatMul"
K, N = 64, 32


# --------------------------------------------------------------------------------------------
# Generators
# --------------------------------------------------------------------------------------------

def weight_array(dtype=np.float32, k=K, n=N, seed=0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal((k, n)) * 0.1).astype(dtype)


def ext_tensor(name: str, data_type: int, dims, location: str | None = "model.onnx.data",
               offset=0, length=None, extra: dict | None = None) -> TensorProto:
    t = TensorProto()
    t.name = name
    t.data_type = data_type
    t.dims.extend(dims)
    t.data_location = TensorProto.EXTERNAL
    kv = {}
    if location is not None:
        kv["location"] = location
    if offset is not None:
        kv["offset"] = str(offset)
    if length is not None:
        kv["length"] = str(length)
    kv.update(extra or {})
    for k, v in kv.items():
        e = t.external_data.add()
        e.key, e.value = k, v
    return t


def raw_tensor(name: str, data_type: int, dims, raw: bytes) -> TensorProto:
    t = TensorProto()
    t.name = name
    t.data_type = data_type
    t.dims.extend(dims)
    t.raw_data = raw
    return t


def model_of(inits, nodes=None, inputs=None, outputs=None, elem=TensorProto.FLOAT) -> onnx.ModelProto:
    """One MatMul x @ W -> y around the given initializers (nodes/inputs/outputs overridable).
    Built without onnx.checker: most of these models are invalid on purpose."""
    nodes = nodes if nodes is not None else [helper.make_node("MatMul", ["x", W], ["y"], name=NODE)]
    inputs = inputs if inputs is not None else [helper.make_tensor_value_info("x", elem, ["M", K])]
    outputs = outputs if outputs is not None else [helper.make_tensor_value_info("y", elem, ["M", N])]
    g = helper.make_graph(nodes, "bad", inputs, outputs, initializer=inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def write(folder: str, model: onnx.ModelProto | bytes, data: bytes | None = None, name: str = "model.onnx") -> str:
    os.makedirs(folder, exist_ok=True)
    p = os.path.join(folder, name)
    with open(p, "wb") as f:
        f.write(model if isinstance(model, bytes) else model.SerializeToString())
    if data is not None:
        with open(os.path.join(folder, "model.onnx.data"), "wb") as f:
            f.write(data)
    return p


def good_external(folder: str, **ext) -> str:
    """A valid single-MatMul model with its weight in model.onnx.data; ext overrides the external fields."""
    w = weight_array()
    fields = dict(location="model.onnx.data", offset=0, length=w.nbytes)
    fields.update(ext)
    return write(folder, model_of([ext_tensor(W, TensorProto.FLOAT, [K, N], **fields)]), w.tobytes())


# --------------------------------------------------------------------------------------------
# Running
# --------------------------------------------------------------------------------------------

@pytest.fixture
def io(tmp_path):
    i, o = tmp_path / "in", tmp_path / "out"
    i.mkdir()
    o.mkdir()
    return str(i), str(o)


def refuse(nibble, src: str, out_dir: str, names: tuple[str, ...], digest_input: bool = True, timeout: int = 30):
    """Runs nibble on src and asserts the error contract; returns the message."""
    in_dir = os.path.dirname(src)
    before_in = folder_digest(in_dir) if digest_input else listing(in_dir)
    before_out = listing(out_dir)
    r = nibble.run("quantize", "--onnx_path", src, "--output_path", os.path.join(out_dir, "model.onnx"),
                   "--algo", "rtn_dq", timeout=timeout)
    msg = assert_error(r, out_dir, before_out, names)
    after_in = folder_digest(in_dir) if digest_input else listing(in_dir)
    assert after_in == before_in, f"input folder changed:\n{r.describe()}"
    return msg


# --------------------------------------------------------------------------------------------
# Not a model
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("cut", ["1byte", "10pct", "half", "last_byte_missing", "mid_varint"])
def test_truncated_protobuf(nibble, io, cut):
    i, o = io
    blob = model_of([onnx.numpy_helper.from_array(weight_array(), W)]).SerializeToString()
    n = {"1byte": 1, "10pct": len(blob) // 10, "half": len(blob) // 2, "last_byte_missing": len(blob) - 1}.get(cut)
    if cut == "mid_varint":  # stop right after a varint's continuation byte
        n = next(k + 1 for k in range(len(blob) // 3, len(blob)) if blob[k] & 0x80)
    with pytest.raises(Exception):
        onnx.load_model_from_string(blob[:n])
    refuse(nibble, write(i, blob[:n]), o, ("model.onnx",))


@pytest.mark.parametrize("case", ["empty", "tensor_proto", "no_graph", "no_nodes", "no_ir_version", "nested_garbage"])
def test_not_a_model(nibble, io, case):
    i, o = io
    if case == "empty":
        blob = b""
    elif case == "tensor_proto":  # a valid protobuf of another message type
        blob = onnx.numpy_helper.from_array(weight_array(), W).SerializeToString()
    elif case == "no_graph":
        blob = helper.make_model(helper.make_graph([], "g", [], []), ir_version=10)
        blob.ClearField("graph")
        blob = blob.SerializeToString()
    elif case == "no_nodes":
        blob = model_of([onnx.numpy_helper.from_array(weight_array(), W)], nodes=[]).SerializeToString()
    elif case == "no_ir_version":
        m = model_of([onnx.numpy_helper.from_array(weight_array(), W)])
        m.ir_version = 0
        blob = m.SerializeToString()
    else:  # field 7 (graph) of length 5000 holding 1000-deep nested groups
        blob = b"\x08\x0a\x3a" + bytes([0x88, 0x27]) + b"\x0b" * 5000
    refuse(nibble, write(i, blob), o, ("model.onnx",))


def test_model_path_is_fifo(nibble, io):
    """Opening a FIFO for reading blocks until a writer comes: nibble must refuse it, not hang."""
    i, o = io
    p = os.path.join(i, "model.onnx")
    os.mkfifo(p)
    refuse(nibble, p, o, ("model.onnx",), digest_input=False)


# --------------------------------------------------------------------------------------------
# External data: ranges
# --------------------------------------------------------------------------------------------

NBYTES = K * N * 4


@pytest.mark.parametrize("fields", [
    dict(offset=NBYTES + 4096),                      # starts past the end
    dict(offset=64),                                 # ends past the end
    dict(offset=2 ** 64 - 8),                        # offset + length overflows 64 bits
    dict(offset=2 ** 63),                            # beyond int64
    dict(offset="99999999999999999999999"),          # beyond uint64
    dict(offset="12abc"),                            # not an integer
    dict(offset="-4"),                               # negative
    dict(offset=" 4"),                               # leading space
    dict(offset=""),                                 # empty
    dict(length=NBYTES - 4),                         # shorter than the shape needs
    dict(length=NBYTES + 4),                         # longer than the shape needs
    dict(length=2 ** 64 - 1),
    dict(length="0x2000"),
], ids=lambda f: "-".join(f"{k}={v}" for k, v in f.items())[:40])
def test_external_range(nibble, io, fields):
    i, o = io
    refuse(nibble, good_external(i, **fields), o, (W,))


def test_external_length_missing_and_file_short(nibble, io):
    """No length key: the shape decides how many bytes, and the file is 4 bytes too short."""
    i, o = io
    w = weight_array()
    src = write(i, model_of([ext_tensor(W, TensorProto.FLOAT, [K, N], length=None)]), w.tobytes()[:-4])
    refuse(nibble, src, o, (W,))


# --------------------------------------------------------------------------------------------
# External data: locations
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("case", ["dotdot", "sub_dotdot", "absolute", "symlink_out", "symlink_dir_out", "missing",
                                  "empty", "no_location_key", "folder", "nul_byte", "newline", "fifo", "dev_zero_link"])
def test_external_location(nibble, tmp_path, case):
    i, o = str(tmp_path / "in"), str(tmp_path / "out")
    os.makedirs(o)
    w = weight_array()
    outside = tmp_path / "outside.bin"
    outside.write_bytes(w.tobytes())
    os.makedirs(os.path.join(i, "sub"))
    loc = {"dotdot": "../outside.bin", "sub_dotdot": "sub/../../outside.bin", "absolute": str(outside),
           "symlink_out": "link.bin", "symlink_dir_out": "linkdir/outside.bin", "missing": "nope.bin",
           "empty": "", "no_location_key": None, "folder": "sub", "nul_byte": "model.onnx.data\0/../../outside.bin",
           "newline": "no\nsuch.bin", "fifo": "pipe.bin", "dev_zero_link": "zero.bin"}[case]
    if case == "symlink_out":
        os.symlink(outside, os.path.join(i, "link.bin"))
    if case == "symlink_dir_out":
        os.symlink(tmp_path, os.path.join(i, "linkdir"))
    if case == "fifo":
        os.mkfifo(os.path.join(i, "pipe.bin"))
    if case == "dev_zero_link":
        os.symlink("/dev/zero", os.path.join(i, "zero.bin"))
    src = write(i, model_of([ext_tensor(W, TensorProto.FLOAT, [K, N], location=loc, length=NBYTES)]), w.tobytes())
    msg = refuse(nibble, src, o, (W,), digest_input=case not in ("fifo", "dev_zero_link"))
    assert "\0" not in msg


# --------------------------------------------------------------------------------------------
# data_type and typed fields
# --------------------------------------------------------------------------------------------

def test_raw_data_size_not_matching_dtype(nibble, io):
    """Declared fp32 [64, 32], raw_data holds the fp16 bytes (half the size)."""
    i, o = io
    t = raw_tensor(W, TensorProto.FLOAT, [K, N], weight_array(np.float16).tobytes())
    refuse(nibble, write(i, model_of([t])), o, (W,))


def test_fp16_declared_fp32_bytes(nibble, io):
    i, o = io
    t = raw_tensor(W, TensorProto.FLOAT16, [K, N], weight_array(np.float32).tobytes())
    refuse(nibble, write(i, model_of([t], elem=TensorProto.FLOAT16)), o, (W,))


def test_external_fp16_declared_fp32_length(nibble, io):
    i, o = io
    w = weight_array()
    t = ext_tensor(W, TensorProto.FLOAT16, [K, N], length=w.nbytes)
    refuse(nibble, write(i, model_of([t], elem=TensorProto.FLOAT16), w.tobytes()), o, (W,))


@pytest.mark.parametrize("case", ["float_data_short", "float_data_long", "fp16_int32_short", "bf16_int32_long",
                                  "fp16_in_float_data", "no_data_at_all"])
def test_typed_field_counts(nibble, io, case):
    i, o = io
    t = TensorProto()
    t.name = W
    t.dims.extend([K, N])
    w = weight_array()
    if case == "float_data_short":
        t.data_type = TensorProto.FLOAT
        t.float_data.extend(w.ravel()[:-1].tolist())
    elif case == "float_data_long":
        t.data_type = TensorProto.FLOAT
        t.float_data.extend(w.ravel().tolist() + [1.0])
    elif case == "fp16_int32_short":
        t.data_type = TensorProto.FLOAT16
        t.int32_data.extend(w.astype(np.float16).view(np.uint16).ravel()[:-7].tolist())
    elif case == "bf16_int32_long":
        t.data_type = TensorProto.BFLOAT16
        t.int32_data.extend([0x3F80] * (K * N + 1))
    elif case == "fp16_in_float_data":
        t.data_type = TensorProto.FLOAT16
        t.float_data.extend(w.ravel().tolist())
    else:
        t.data_type = TensorProto.FLOAT
    elem = TensorProto.FLOAT if t.data_type == TensorProto.FLOAT else t.data_type
    refuse(nibble, write(i, model_of([t], elem=elem)), o, (W,))


@pytest.mark.parametrize("dt", [0, 999, -3])
def test_undefined_or_unknown_data_type(nibble, io, dt):
    """data_type UNDEFINED (0), or a number no ONNX version defines: the size of the tensor cannot be
    known, so no range can be checked; the model is not valid ONNX."""
    i, o = io
    w = weight_array()
    t = ext_tensor(W, dt, [K, N], length=w.nbytes)
    refuse(nibble, write(i, model_of([t]), w.tobytes()), o, (W,))


def test_string_weight_nothing_to_quantize(nibble, io):
    i, o = io
    t = TensorProto()
    t.name, t.data_type = W, TensorProto.STRING
    t.dims.extend([2, 2])
    t.string_data.extend([b"a", b"b", b"c", b"d"])
    refuse(nibble, write(i, model_of([t])), o, ("model.onnx",))


# --------------------------------------------------------------------------------------------
# dims
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("case", ["zero_dim_no_data", "zero_dim_with_data", "negative", "two_negatives",
                                  "numel_overflow", "bytes_overflow", "huge_no_length", "huge_inline", "int64_min"])
def test_dims(nibble, io, case):
    i, o = io
    w = weight_array()
    names = (W,)
    if case == "zero_dim_no_data":  # a valid empty tensor: nothing to quantize
        t, names = raw_tensor(W, TensorProto.FLOAT, [0, N], b""), ("model.onnx",)
    elif case == "zero_dim_with_data":
        t = raw_tensor(W, TensorProto.FLOAT, [0, N], w.tobytes())
    elif case == "negative":
        t = ext_tensor(W, TensorProto.FLOAT, [-1, N], length=w.nbytes)
    elif case == "two_negatives":  # product 2048 is positive and matches the data
        t = ext_tensor(W, TensorProto.FLOAT, [-K, -N], length=w.nbytes)
    elif case == "numel_overflow":
        t = ext_tensor(W, TensorProto.FLOAT, [2 ** 62, 8], length=w.nbytes)
    elif case == "bytes_overflow":  # 2^62 elements fit int64, 2^64 bytes do not
        t = ext_tensor(W, TensorProto.FLOAT, [2 ** 31, 2 ** 31], length=w.nbytes)
    elif case == "huge_no_length":  # 2^61 bytes, no length key: the range check must catch it
        t = ext_tensor(W, TensorProto.FLOAT16, [2 ** 30, 2 ** 30], length=None)
    elif case == "huge_inline":
        t = raw_tensor(W, TensorProto.FLOAT, [2 ** 40, 2 ** 20], w.tobytes())
    else:
        t = ext_tensor(W, TensorProto.FLOAT, [-(2 ** 63), -1], length=w.nbytes)
    refuse(nibble, write(i, model_of([t]), w.tobytes()), o, names)


# --------------------------------------------------------------------------------------------
# Graph structure
# --------------------------------------------------------------------------------------------

def _w():
    return onnx.numpy_helper.from_array(weight_array(), W)


def test_initializer_defined_twice(nibble, io):
    i, o = io
    refuse(nibble, write(i, model_of([_w(), _w()])), o, (W,))


def test_initializer_also_node_output(nibble, io):
    """W is an initializer AND the output of a node: two definitions of one tensor."""
    i, o = io
    nodes = [helper.make_node("Identity", ["x"], [W], name="/model/shadow/Identity"),
             helper.make_node("MatMul", ["x", W], ["y"], name=NODE)]
    refuse(nibble, write(i, model_of([_w()], nodes=nodes)), o, (W,))


def test_tensor_produced_by_two_nodes(nibble, io):
    i, o = io
    nodes = [helper.make_node("Relu", ["x"], ["h"], name="/model/a/Relu"),
             helper.make_node("Sigmoid", ["x"], ["h"], name="/model/b/Sigmoid"),
             helper.make_node("MatMul", ["h", W], ["y"], name=NODE)]
    refuse(nibble, write(i, model_of([_w()], nodes=nodes)), o, ("'h'", "/model/b/Sigmoid"))


def test_node_consumes_its_own_output(nibble, io):
    """A cycle of length one.  The quantizer itself needs no topological order, but the graph it would
    write is not a DAG: ONNX requires one and ONNX Runtime refuses it, so nibble refuses the input."""
    i, o = io
    nodes = [helper.make_node("Add", ["x", "h"], ["h"], name="/model/loop/Add"),
             helper.make_node("MatMul", ["h", W], ["y"], name=NODE)]
    refuse(nibble, write(i, model_of([_w()], nodes=nodes)), o, ("/model/loop/Add",))


def test_two_node_cycle(nibble, io):
    i, o = io
    nodes = [helper.make_node("Relu", ["b"], ["a"], name="/model/cyc/Relu"),
             helper.make_node("MatMul", ["a", W], ["b"], name=NODE),
             helper.make_node("Identity", ["b"], ["y"], name="/model/out/Identity")]
    refuse(nibble, write(i, model_of([_w()], nodes=nodes)), o, ("/model/cyc/Relu", NODE))


def test_missing_node_input(nibble, io):
    i, o = io
    nodes = [helper.make_node("MatMul", ["x_nowhere", W], ["y"], name=NODE)]
    refuse(nibble, write(i, model_of([_w()], nodes=nodes)), o, ("x_nowhere",))


def test_missing_weight_is_not_a_silent_skip(nibble, io):
    """The MatMul's weight names no initializer and no other definition."""
    i, o = io
    nodes = [helper.make_node("MatMul", ["x", "w_nowhere"], ["y"], name=NODE)]
    refuse(nibble, write(i, model_of([], nodes=nodes)), o, ("w_nowhere",))


def test_graph_output_not_produced(nibble, io):
    i, o = io
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["M", N]),
            helper.make_tensor_value_info("ghost", TensorProto.FLOAT, ["M", N])]
    refuse(nibble, write(i, model_of([_w()], outputs=outs)), o, ("ghost",))


def test_graph_input_duplicated(nibble, io):
    i, o = io
    ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["M", K])] * 2
    refuse(nibble, write(i, model_of([_w()], inputs=ins)), o, ("'x'",))


# --------------------------------------------------------------------------------------------
# Unusual but valid: must be accepted
# --------------------------------------------------------------------------------------------

def _accept(nibble, src, out_dir, check=True):
    import onnxruntime as ort
    out = os.path.join(out_dir, "model.onnx")
    nibble.quantize(src, out, "--algo", "rtn_dq")
    if check:
        onnx.checker.check_model(out)
    x = np.random.default_rng(5).standard_normal((3, K)).astype(np.float32)
    sess = ort.InferenceSession(out, providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x}), x


def test_initializer_referenced_twice(nibble, io):
    """One weight read by two MatMuls: quantized once, both read the same dequantized tensor."""
    i, o = io
    nodes = [helper.make_node("MatMul", ["x", W], ["y"], name=NODE),
             helper.make_node("MatMul", ["x", W], ["y2"], name="/model/layers.0/mlp/up2_proj/MatMul")]
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["M", N]) for n in ("y", "y2")]
    (y, y2), _ = _accept(nibble, write(i, model_of([_w()], nodes=nodes, outputs=outs)), o)
    np.testing.assert_array_equal(y, y2)


def test_two_initializers_alias_the_same_bytes(nibble, io):
    i, o = io
    w = weight_array()
    inits = [ext_tensor(W, TensorProto.FLOAT, [K, N], length=w.nbytes),
             ext_tensor("alias", TensorProto.FLOAT, [K, N], length=w.nbytes)]
    nodes = [helper.make_node("MatMul", ["x", W], ["y"], name=NODE),
             helper.make_node("MatMul", ["x", "alias"], ["y2"], name="/model/layers.1/mlp/up_proj/MatMul")]
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["M", N]) for n in ("y", "y2")]
    (y, y2), _ = _accept(nibble, write(i, model_of(inits, nodes=nodes, outputs=outs), w.tobytes()), o)
    np.testing.assert_array_equal(y, y2)


def test_unsorted_acyclic_graph(nibble, io):
    """Nodes listed consumer first: not topologically sorted, but a DAG.  nibble does not need the
    order and keeps the node list as it is (ONNX Runtime sorts it at load)."""
    i, o = io
    nodes = [helper.make_node("MatMul", ["h", W], ["y"], name=NODE),
             helper.make_node("Relu", ["x"], ["h"], name="/model/pre/Relu")]
    src = write(i, model_of([_w()], nodes=nodes))
    (y,), x = _accept(nibble, src, o, check=False)  # onnx.checker insists on the order, ORT does not
    w = onnx.numpy_helper.to_array(_w())
    ref = np.maximum(x, 0) @ w
    rel = np.sqrt(np.mean((y - ref) ** 2) / np.mean(ref ** 2))
    assert rel < 0.2, f"relative rms error {rel:.3f} of the INT4 model: the Relu did not run first?"


@pytest.mark.parametrize("case", ["digits_overflow", "megabyte_name"])
def test_extreme_node_names(nibble, io, case):
    """Node names that broke the layer-index parser (std::stoi threw on a digit run past INT_MAX; a
    std::regex overflowed the stack on a name of hundreds of KB): the weight is quantized, the
    --report gives layer -1 / the parsed number, and the model runs."""
    import json
    i, o = io
    name = {"digits_overflow": "/model/layers.99999999999999999999/mlp/up_proj/MatMul",
            "megabyte_name": "/model/layers.3/" + "x" * (1 << 20) + "/up_proj/MatMul"}[case]
    nodes = [helper.make_node("MatMul", ["x", W], ["y"], name=name)]
    src = write(i, model_of([_w()], nodes=nodes))
    report = os.path.join(str(i), "..", f"report_{case}.json")
    out = os.path.join(o, "model.onnx")
    nibble.quantize(src, out, "--algo", "rtn_dq", "--report", report)
    weights = json.load(open(report))["weights"]
    assert [w["layer"] for w in weights] == [-1 if case == "digits_overflow" else 3]
    import onnxruntime as ort
    x = np.random.default_rng(5).standard_normal((3, K)).astype(np.float32)
    (y,) = ort.InferenceSession(out, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    ref = x @ onnx.numpy_helper.to_array(_w())
    assert np.sqrt(np.mean((y - ref) ** 2) / np.mean(ref ** 2)) < 0.2


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["fp32", "fp16"])
def test_misaligned_external_offset(nibble, tmp_path, dtype):
    """ONNX does not require external data to be aligned: a weight at offset 1, 2 or 3 quantizes to the
    same bytes as at offset 0 (the kernels get an aligned copy; under UBSan a misaligned typed read
    would abort)."""
    w = weight_array(dtype)
    et = TensorProto.FLOAT if dtype == np.float32 else TensorProto.FLOAT16
    digests = []
    for off in range(4):
        i = str(tmp_path / f"in{off}")
        t = ext_tensor(W, et, [K, N], offset=off, length=w.nbytes)
        src = write(i, model_of([t], elem=et), b"\x7f" * off + w.tobytes())
        out = tmp_path / f"out{off}" / "model.onnx"
        nibble.quantize(src, str(out), "--algo", "rtn_dq")
        digests.append(folder_digest(str(out.parent)))
    assert all(d == digests[0] for d in digests), digests
