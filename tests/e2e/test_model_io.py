"""Model I/O at the edges: ORT-GenAI folders in and out, and external data beyond 4 GiB offsets
(a sparse file, so the test costs no disk), which is what a model over 2 GB looks like to the loader."""
from __future__ import annotations

import json
import os

import numpy as np
import onnx
import onnxruntime as ort

from . import models
from .conftest import Graph, data_file, folder_digest
from .reference import rtn_quantize


def _genai_folder(folder: str, model_name: str = "model.onnx") -> str:
    os.makedirs(folder, exist_ok=True)
    path = models.save(models.make_single_matmul(), os.path.join(folder, model_name))
    cfg = {"model": {"decoder": {"filename": model_name, "head_size": 8}, "context_length": 64},
           "search": {"max_length": 64}}
    with open(os.path.join(folder, "genai_config.json"), "w") as f:
        json.dump(cfg, f)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        with open(os.path.join(folder, name), "w") as f:
            f.write('{"name": "%s"}' % name)
    with open(os.path.join(folder, "README.txt"), "w") as f:
        f.write("not a GenAI file")
    return path


def test_genai_folder_gives_genai_folder(nibble, tmp_path):
    src = _genai_folder(str(tmp_path / "in"))
    out = tmp_path / "out" / "model-int4.onnx"
    nibble.quantize(src, str(out), "--algo", "rtn_dq")
    files = sorted(os.listdir(out.parent))
    assert files == sorted(["genai_config.json", "model-int4.onnx", os.path.basename(data_file(str(out))),
                            "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json"]), files
    cfg = json.load(open(out.parent / "genai_config.json"))
    assert cfg["model"]["decoder"]["filename"] == "model-int4.onnx"  # follows the renamed model
    assert cfg["model"]["decoder"]["head_size"] == 8                  # everything else kept
    assert open(out.parent / "tokenizer.json").read() == '{"name": "tokenizer.json"}'


def test_genai_companions_not_overwritten_without_force(nibble, tmp_path):
    src = _genai_folder(str(tmp_path / "in"))
    os.makedirs(tmp_path / "out")
    (tmp_path / "out" / "genai_config.json").write_text("{}")
    r = nibble.quantize(src, str(tmp_path / "out" / "model.onnx"), "--algo", "rtn_dq", check=False)
    assert r.returncode != 0 and "genai_config.json" in r.stderr and "--force" in r.stderr, r.describe()
    assert sorted(os.listdir(tmp_path / "out")) == ["genai_config.json"]
    nibble.quantize(src, str(tmp_path / "out" / "model.onnx"), "--algo", "rtn_dq", "--force")
    assert json.load(open(tmp_path / "out" / "genai_config.json"))["model"]["decoder"]["filename"] == "model.onnx"


def test_genai_config_not_json_is_one_error_line_naming_it(nibble, tmp_path):
    src = _genai_folder(str(tmp_path / "in"))
    cfg = tmp_path / "in" / "genai_config.json"
    cfg.write_text('{"model": {"decoder": ')
    out = tmp_path / "out" / "model.onnx"
    r = nibble.quantize(src, str(out), "--algo", "rtn_dq", check=False)
    assert r.returncode != 0, r.describe()
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith(f"nibble: error: {os.path.realpath(cfg)} is not valid JSON: parse error at line 1, "
                           "column 23"), r.describe()
    assert not [n for n in os.listdir(out.parent) if n.endswith(".nibble-part")]


def test_output_beside_input_leaves_genai_files_alone(nibble, tmp_path):
    src = _genai_folder(str(tmp_path / "in"))
    before = folder_digest(str(tmp_path / "in"))
    r = nibble.run("quantize", "--onnx_path", src, "--output_path", str(tmp_path / "in" / "model-int4.onnx"),
                   "--algo", "rtn_dq")
    assert r.returncode == 0, r.describe()
    after = folder_digest(str(tmp_path / "in"))
    assert {k: after[k] for k in before} == before  # every input file untouched
    new_data = os.path.basename(data_file(str(tmp_path / "in" / "model-int4.onnx")))
    assert sorted(set(after) - set(before)) == ["model-int4.onnx", new_data]
    assert json.load(open(tmp_path / "in" / "genai_config.json"))["model"]["decoder"]["filename"] == "model.onnx"


def test_weights_beyond_4gib_offsets(nibble, tmp_path):
    """Both weights sit past 4 GiB in a sparse external data file; the output must hold the same codes
    as a plain model and run in ONNX Runtime."""
    k, n = 64, 48
    rng = np.random.default_rng(5)
    w1 = (rng.standard_normal((k, n)) * 0.1).astype(np.float32)
    w2 = (rng.standard_normal((n, k)) * 0.1).astype(np.float32)
    folder = tmp_path / "big"
    folder.mkdir()
    data = folder / "model.onnx.data"
    offsets = [(1 << 32) + 4096, (5 << 30) + 8192]
    with open(data, "wb") as f:
        for off, w in zip(offsets, (w1, w2)):
            f.seek(off)
            f.write(w.tobytes())
    inits = []
    for name, off, w in (("w1", offsets[0], w1), ("w2", offsets[1], w2)):
        t = onnx.helper.make_tensor(name, onnx.TensorProto.FLOAT, w.shape, vals=[])
        t.ClearField("float_data")
        t.data_location = onnx.TensorProto.EXTERNAL
        for key, val in (("location", "model.onnx.data"), ("offset", str(off)), ("length", str(w.nbytes))):
            e = t.external_data.add()
            e.key, e.value = key, val
        inits.append(t)
    h = onnx.helper
    g = h.make_graph([h.make_node("MatMul", ["x", "w1"], ["h"], name="/model/layers.0/mlp/up_proj/MatMul"),
                      h.make_node("MatMul", ["h", "w2"], ["y"], name="/model/layers.0/mlp/down_proj/MatMul")],
                     "big", [h.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["M", k])],
                     [h.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["M", k])], initializer=inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 21)], ir_version=10)
    onnx.save(m, str(folder / "model.onnx"))
    assert os.path.getsize(data) > (5 << 30)

    out = tmp_path / "out" / "model.onnx"
    # (nibble.quantize would hash the 5 GiB sparse input: check the input by size and mtime instead)
    stat = os.stat(data)
    r = nibble.run("quantize", "--onnx_path", str(folder / "model.onnx"), "--output_path", str(out),
                   "--algo", "rtn_dq", "--awq_mode", "modelopt", "--block_size", "32")
    assert r.returncode == 0, r.describe()
    assert (os.stat(data).st_size, os.stat(data).st_mtime_ns) == (stat.st_size, stat.st_mtime_ns)
    got = Graph(str(out))
    for name, w in (("w1", w1), ("w2", w2)):
        ref = rtn_quantize(w, 32)
        codes, _ = got.int4(name + "_i4")
        np.testing.assert_array_equal(codes, ref.q)
        np.testing.assert_array_equal(got.array(name + "_scale"), ref.scale_2d())
    assert os.path.getsize(data_file(str(out))) < 1 << 20  # the output is small and dense
    x = rng.standard_normal((3, k)).astype(np.float32)
    so = ort.SessionOptions()  # fp32 activations in the fused MatMulNBits
    so.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", "1")
    y = ort.InferenceSession(str(out), so, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    want = x @ rtn_quantize(w1, 32).dequant() @ rtn_quantize(w2, 32).dequant()
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-5)
