"""calib/capture.py (spec: calib/README.md): statistics against a direct numpy computation on ONNX
Runtime's own activations, padding masks, passes under a small budget, ModelOpt's AWQ scale grid, the
text/npz input paths, and one clear error line for every bad input.

Models: a tiny ORT-GenAI-like decoder built here (input_ids -> Gather -> MatMuls, attention_mask and
position_ids mixed into the hidden state, past KV passed through), weights in an external data file;
plus build/smollm2-fp32 (tools/smollm2_to_onnx.py) when it exists.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CAPTURE = os.path.join(REPO, "calib", "capture.py")
SMOLLM2 = os.path.join(REPO, "build", "smollm2-fp32", "model.onnx")
CORPUS_FILE = os.environ.get("NIBBLE_CORPUS", "/usr/share/doc/jargon-text/jargon.txt.gz")

H, I, V = 24, 40, 64          # hidden, intermediate, vocabulary of the tiny model
KVH, HD = 2, 4                 # past KV heads and head size
WORDS = [f"w{i}" for i in range(V - 3)]
VOCAB = {"<unk>": 0, "</s>": 1, "<s>": 2, **{w: i + 3 for i, w in enumerate(WORDS)}}
ACTS = [("h0", H), ("act1", I), ("h1", H), ("gu", I), ("h2", H)]
MODELOPT_ALPHAS = [k.item() for k in np.arange(0, 1.0 + 0.1, 0.1)]   # AWQLiteHelper's loss keys


# --------------------------------------------------------------------------------------------
# The tiny model
# --------------------------------------------------------------------------------------------

def make_tiny(folder: str, dtype: str = "fp32", position_ids: bool = False, symbolic_kv: bool = False,
              past_dtype: str | None = None) -> str:
    """ORT-GenAI-like decoder in folder/model.onnx (+ model.onnx.data, tokenizer.json, tokenizer_config.json,
    genai_config.json).  Activations: h0 [.., H], act1 [.., I], h1 [.., H] (shared by two MatMuls),
    gu [.., I], h2 [.., H] (lm_head input)."""
    os.makedirs(folder, exist_ok=True)
    npdt = {"fp32": np.float32, "fp16": np.float16}[dtype]
    odt = {"fp32": TensorProto.FLOAT, "fp16": TensorProto.FLOAT16}[dtype]
    pdt = {"fp32": TensorProto.FLOAT, "fp16": TensorProto.FLOAT16}[past_dtype or dtype]
    rng = np.random.default_rng(7)

    def w(name, k, n, scale=None):
        return numpy_helper.from_array((rng.standard_normal((k, n)) * (scale or k ** -0.5)).astype(npdt), name)

    inits = [w("embed", V, H, 1.0), w("W1", H, I), w("W2", I, H), w("Wg", H, I), w("Wu", H, I), w("Wd", I, H),
             w("Wlm", H, V), numpy_helper.from_array(np.array([-1], np.int64), "axes_last"),
             numpy_helper.from_array(np.array(0.5, npdt), "c_mask"),
             numpy_helper.from_array(np.array(0.01, npdt), "c_pos")]
    nodes = [
        helper.make_node("Gather", ["embed", "input_ids"], ["emb"], name="/model/embed_tokens/Gather"),
        helper.make_node("Cast", ["attention_mask"], ["maskf"], to=odt),
        helper.make_node("Unsqueeze", ["maskf", "axes_last"], ["maskf3"]),
        helper.make_node("Mul", ["maskf3", "c_mask"], ["mask_add"]),
        helper.make_node("Add", ["emb", "mask_add"], ["h0m" if position_ids else "h0"]),
    ]
    kv_dims = ["batch_size", "kv_heads", "past_sequence_length", "head_size"] if symbolic_kv else \
        ["batch_size", KVH, "past_sequence_length", HD]
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch_size", "sequence_length"]),
              helper.make_tensor_value_info("attention_mask", TensorProto.INT64,
                                            ["batch_size", "total_sequence_length"])]
    if position_ids:
        inputs.append(helper.make_tensor_value_info("position_ids", TensorProto.INT64,
                                                    ["batch_size", "sequence_length"]))
        nodes += [helper.make_node("Cast", ["position_ids"], ["posf"], to=odt),
                  helper.make_node("Unsqueeze", ["posf", "axes_last"], ["posf3"]),
                  helper.make_node("Mul", ["posf3", "c_pos"], ["pos_add"]),
                  helper.make_node("Add", ["h0m", "pos_add"], ["h0"])]
    nodes += [
        helper.make_node("MatMul", ["h0", "W1"], ["a1"], name="/model/layers.0/attn/qkv_proj/MatMul"),
        helper.make_node("Sigmoid", ["a1"], ["s1"]),
        helper.make_node("Mul", ["a1", "s1"], ["act1"]),
        helper.make_node("MatMul", ["act1", "W2"], ["m2"], name="/model/layers.0/attn/o_proj/MatMul"),
        helper.make_node("Add", ["h0", "m2"], ["h1"]),
        helper.make_node("MatMul", ["h1", "Wg"], ["g"], name="/model/layers.0/mlp/gate_proj/MatMul"),
        helper.make_node("MatMul", ["h1", "Wu"], ["u"], name="/model/layers.0/mlp/up_proj/MatMul"),
        helper.make_node("Mul", ["g", "u"], ["gu"]),
        helper.make_node("MatMul", ["gu", "Wd"], ["d"], name="/model/layers.0/mlp/down_proj/MatMul"),
        helper.make_node("Add", ["h1", "d"], ["h2"]),
        helper.make_node("MatMul", ["h2", "Wlm"], ["logits"], name="/lm_head/MatMul"),
        helper.make_node("Identity", ["past_key_values.0.key"], ["present.0.key"]),
        helper.make_node("Identity", ["past_key_values.0.value"], ["present.0.value"]),
    ]
    inputs += [helper.make_tensor_value_info(f"past_key_values.0.{kv}", pdt, kv_dims) for kv in ("key", "value")]
    outputs = [helper.make_tensor_value_info("logits", odt, ["batch_size", "sequence_length", V])] + \
        [helper.make_tensor_value_info(f"present.0.{kv}", pdt, kv_dims) for kv in ("key", "value")]
    g = helper.make_graph(nodes, "tiny", inputs, outputs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    onnx.checker.check_model(m)
    path = os.path.join(folder, "model.onnx")
    onnx.save(m, path, save_as_external_data=True, all_tensors_to_one_file=True, location="model.onnx.data",
              size_threshold=64)   # tiny constants inline: ORT cannot shape-infer external ones

    from tokenizers import Tokenizer, models, pre_tokenizers
    tok = Tokenizer(models.WordLevel(VOCAB, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(os.path.join(folder, "tokenizer.json"))
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"eos_token": "</s>", "bos_token": "<s>", "unk_token": "<unk>"}, f)
    with open(os.path.join(folder, "genai_config.json"), "w") as f:
        json.dump({"model": {"eos_token_id": 1, "pad_token_id": 1, "context_length": 32, "type": "llama",
                             "decoder": {"num_key_value_heads": KVH, "head_size": HD, "hidden_size": H,
                                         "num_attention_heads": 6, "num_hidden_layers": 1}}}, f)
    return path


def acts_json(folder: str, acts=ACTS) -> str:
    p = os.path.join(folder, "acts.json")
    with open(p, "w") as f:
        json.dump([{"name": n, "K": k} for n, k in acts], f)
    return p


def random_texts(n: int, rng: np.random.Generator, lo: int = 3, hi: int = 30) -> list[str]:
    return [" ".join(rng.choice(WORDS, int(rng.integers(lo, hi)))) for _ in range(n)]


# --------------------------------------------------------------------------------------------
# Running capture.py and the independent reference
# --------------------------------------------------------------------------------------------

def folder_digest(folder: str) -> dict:
    import hashlib
    out = {}
    for root, _, files in os.walk(folder):
        for f in files:
            with open(os.path.join(root, f), "rb") as fh:
                out[os.path.relpath(os.path.join(root, f), folder)] = hashlib.sha256(fh.read()).hexdigest()
    return out


def run_capture(*args, cwd=None, env=None):
    p = subprocess.run([sys.executable, CAPTURE, *map(str, args)], capture_output=True, text=True,
                       timeout=600, cwd=cwd, env=env)
    return p


def capture_ok(model: str, out: str, acts: str, *args, env=None, gram_reader=True) -> dict:
    """Runs capture, asserts exit 0 and an untouched model folder; returns the index with arrays loaded."""
    before = folder_digest(os.path.dirname(model))
    p = run_capture("capture", "--model", model, "--out", out, "--activations", acts, "--eps", "cpu", *args,
                    env=env)
    assert p.returncode == 0, f"exit {p.returncode}\n{p.stderr[-4000:]}"
    assert folder_digest(os.path.dirname(model)) == before, "the model's folder changed"
    assert "peak RSS" in p.stderr.strip().splitlines()[-1]
    with open(os.path.join(out, "index.json")) as f:
        idx = json.load(f)
    for e in idx["activations"]:
        K = e["K"]
        e["_mean"] = np.fromfile(os.path.join(out, e["mean_abs_np"]), "<f4")
        e["_sum"] = np.fromfile(os.path.join(out, e["sum_abs"]), "<f8")
        if gram_reader:
            e["_gram"] = np.fromfile(os.path.join(out, e["gram"]), "<f8").reshape(K, K)
        assert e["_mean"].shape == (K,) and e["_sum"].shape == (K,)
    idx["_stderr"] = p.stderr
    return idx


def reference_activations(model: str, batches: list[dict], names: list[str]) -> dict[str, list[np.ndarray]]:
    """Each batch's activations from an ONNX Runtime session of our own: the whole model (weights loaded
    by onnx), the names added as outputs, ORT_DISABLE_ALL, CPU."""
    import onnxruntime as ort
    m = onnx.load(model)
    for n in names:
        m.graph.output.append(onnx.ValueInfoProto(name=n))
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    out = {n: [] for n in names}
    for feeds in batches:
        for n, v in zip(names, sess.run(names, feeds)):
            out[n].append(v)
    return out


def check_stats(idx: dict, ref: dict[str, list[np.ndarray]], masks: list[np.ndarray] | None, mask_padding: bool):
    """mean_abs_np bit-exact (ModelOpt's x_mean), sum_abs to 1e-12 relative, gram to float32 accuracy
    (each batch's X^T X is one float32 syrk, summed in float64), rows."""
    by = {e["name"]: e for e in idx["activations"]}
    assert set(by) == set(ref)
    for name, parts in ref.items():
        e = by[name]
        K = e["K"]
        X = np.concatenate(parts, axis=0).reshape(-1, K)           # ModelOpt: concat axis 0, reshape
        if X.dtype == np.float16:
            want = np.abs(X).mean(0, dtype=np.float32)
            assert np.array_equal(e["_mean"].astype(np.float16).view(np.uint16),
                                  np.abs(X).mean(0).view(np.uint16)), name   # ModelOpt's fp16 x_mean
        else:
            want = np.abs(X).mean(0)
        assert want.dtype == np.float32
        assert np.array_equal(e["_mean"].view(np.uint32), want.view(np.uint32)), \
            f"{name}: mean_abs_np differs from numpy in {(e['_mean'] != want).sum()} of {K} channels"
        assert e["rows_all"] == X.shape[0]
        Xd = X.astype(np.float64)
        if mask_padding and masks is not None:
            keep = np.concatenate([m.reshape(-1) for m in masks]) != 0
            Xd = Xd[keep]
        assert e["rows"] == Xd.shape[0], name
        s = np.abs(Xd).sum(0)
        np.testing.assert_allclose(e["_sum"], s, rtol=1e-12, atol=0, err_msg=name)
        G = Xd.T @ Xd
        # float32 dot products of length rows: |error| <= ~rows * 2^-24 * sum |x_i x_j|
        bound = 4 * Xd.shape[0] * 2.0 ** -24 * (np.abs(Xd).T @ np.abs(Xd)) + 1e-300
        assert (np.abs(e["_gram"] - G) <= bound).all(), f"{name}: gram differs beyond float32 accuracy"
        assert np.array_equal(e["_gram"], e["_gram"].T), f"{name}: gram not symmetric"


def npz_batches(path: str, batch: int) -> list[dict]:
    z = np.load(path)
    n = min(z[k].shape[0] for k in z.files)
    return [{k: z[k][i:i + batch] for k in z.files} for i in range(0, n - n % batch, batch)]


def test_statistics_do_not_depend_on_threads(tiny, tmp_path):
    # 12 x 200 rows: the Gram row buffer (1024 rows) is flushed twice mid-run and once at the end
    rng = np.random.default_rng(11)
    npz = make_npz(str(tmp_path), 12, 200, rng, pad=False)
    acts = acts_json(str(tmp_path))
    runs = [capture_ok(tiny, tmp_path / f"t{t}", acts, "--calib_data", npz, "--calib_size", 12, "--threads", t,
                       env={**os.environ, "OPENBLAS_NUM_THREADS": str(t)})
            for t in (1, 3)]
    assert runs[0]["activations"][0]["rows"] == 2400
    for a, b in zip(*(r["activations"] for r in runs)):
        for k in ("_mean", "_sum", "_gram"):
            assert a[k].tobytes() == b[k].tobytes(), (a["name"], k)


def make_npz(folder: str, n: int, seq: int, rng, dtype="fp32", pad=True, position_ids=False) -> str:
    ids = rng.integers(3, V, (n, seq)).astype(np.int64)
    mask = np.ones((n, seq), np.int64)
    if pad:
        for i in range(n):
            L = int(rng.integers(1, seq + 1))
            mask[i, L:] = 0
            ids[i, L:] = 1
    arrays = {"input_ids": ids, "attention_mask": mask}
    pd = {"fp32": np.float32, "fp16": np.float16}[dtype]
    for kv in ("key", "value"):
        arrays[f"past_key_values.0.{kv}"] = np.zeros((n, KVH, 0, HD), pd)    # bench/compare_lib's layout
    if position_ids:
        pos = np.cumsum(mask, -1) - 1
        pos[mask == 0] = 1
        arrays["position_ids"] = pos
    p = os.path.join(folder, "calib.npz")
    np.savez(p, **arrays)
    return p


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    return make_tiny(str(tmp_path_factory.mktemp("tiny")))


@pytest.fixture(scope="module")
def tiny_fp16(tmp_path_factory) -> str:
    return make_tiny(str(tmp_path_factory.mktemp("tiny16")), dtype="fp16")


@pytest.fixture(scope="module")
def tiny_pos(tmp_path_factory) -> str:
    return make_tiny(str(tmp_path_factory.mktemp("tinypos")), position_ids=True, symbolic_kv=True)


# --------------------------------------------------------------------------------------------
# Statistics
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("mask_padding,gram", [(0, "blas"), (1, "blas"), (1, "numpy")])
def test_npz_stats_equal_numpy(tiny, tmp_path, mask_padding, gram):
    """gram: capture's in-place BLAS dsyrk, or its numpy fallback (NIBBLE_CALIB_NUMPY_GRAM=1)."""
    rng = np.random.default_rng(1)
    npz = make_npz(str(tmp_path), 6, 37, rng)
    env = dict(os.environ, NIBBLE_CALIB_NUMPY_GRAM="1") if gram == "numpy" else None
    idx = capture_ok(tiny, tmp_path / "out", acts_json(str(tmp_path)), "--calib_data", npz, "--calib_size", 6,
                     "--batch_size", 2, "--mask_padding", mask_padding, env=env)
    batches = npz_batches(npz, 2)
    ref = reference_activations(tiny, batches, [n for n, _ in ACTS])
    masks = [b["attention_mask"] for b in batches]
    check_stats(idx, ref, masks, bool(mask_padding))
    assert idx["samples"] == 6 and idx["batch_size"] == 2 and idx["seq_len"] == 37 and idx["passes"] == 1
    assert idx["mask_padding"] is bool(mask_padding)
    assert idx["tokens_total"] == 6 * 37
    assert idx["tokens_unpadded"] == int(sum(m.sum() for m in masks)) < 6 * 37
    rows = {e["name"]: e["rows"] for e in idx["activations"]}
    assert rows["h0"] == (idx["tokens_unpadded"] if mask_padding else 6 * 37)


@pytest.mark.parametrize("dtype,mask_padding", [("fp32", 0), ("fp32", 1), ("fp16", 0), ("fp16", 1)])
def test_stats_in_session_equal_numpy(tiny, tiny_fp16, tmp_path, dtype, mask_padding):
    """--stats_in_session on (the path a GPU provider takes: XᵀX and the |x| sums computed by the
    session's own MatMul and ReduceSum) against the numpy path on the CPU provider: rows equal, sums and
    Gram within float32 accuracy (another summation order), the token sample and Gram blocks too."""
    model = tiny if dtype == "fp32" else tiny_fp16
    rng = np.random.default_rng(5)
    npz = make_npz(str(tmp_path), 6, 37, rng, dtype=dtype)
    acts = acts_json(str(tmp_path))
    common = ("--calib_data", npz, "--calib_size", 6, "--batch_size", 2, "--mask_padding", mask_padding,
              "--sample_tokens", 16)
    a = capture_ok(model, tmp_path / "numpy", acts, *common, "--stats_in_session", "off")
    b = capture_ok(model, tmp_path / "session", acts, *common, "--stats_in_session", "on")
    assert a["stats"] == "numpy" and b["stats"] == "session"
    for x, y in zip(a["activations"], b["activations"]):
        assert x["name"] == y["name"] and x["rows"] == y["rows"] and x["rows_all"] == y["rows_all"]
        scale = np.abs(x["_gram"]).max()
        assert np.abs(x["_gram"] - y["_gram"]).max() <= 1e-5 * scale, x["name"]
        np.testing.assert_allclose(y["_sum"], x["_sum"], rtol=1e-5, err_msg=x["name"])
        np.testing.assert_allclose(y["_mean"], x["_mean"], rtol=1e-5, err_msg=x["name"])
        ts = [np.fromfile(os.path.join(tmp_path, d, e["token_sample"]), "<f4") for d, e in (("numpy", x), ("session", y))]
        assert ts[0].size > 0 and np.array_equal(ts[0], ts[1]), x["name"]
    c = capture_ok(model, tmp_path / "blocks", acts, *common, "--stats_in_session", "on", "--gram_block", 8,
                   gram_reader=False)
    for x, y in zip(b["activations"], c["activations"]):
        K = x["K"]
        blocks = np.fromfile(os.path.join(tmp_path, "blocks", y["gram"]), "<f8").reshape(-1, 8, 8)
        for g in range(blocks.shape[0]):
            kb = min(8, K - 8 * g)
            np.testing.assert_allclose(blocks[g, :kb, :kb], x["_gram"][8 * g:8 * g + kb, 8 * g:8 * g + kb],
                                       rtol=1e-6, atol=1e-6 * np.abs(x["_gram"]).max(), err_msg=x["name"])


def test_fp16_model_stats(tiny_fp16, tmp_path):
    """fp16 activations: mean_abs_np = np.abs(X).mean(0, dtype=float32), whose float16 cast is ModelOpt's
    fp16 x_mean; sum_abs / gram of the fp16 values in float64."""
    rng = np.random.default_rng(2)
    npz = make_npz(str(tmp_path), 4, 21, rng, dtype="fp16")
    idx = capture_ok(tiny_fp16, tmp_path / "out", acts_json(str(tmp_path)), "--calib_data", npz,
                     "--calib_size", 4, "--mask_padding", 1)
    batches = npz_batches(npz, 1)
    ref = reference_activations(tiny_fp16, batches, [n for n, _ in ACTS])
    assert ref["h1"][0].dtype == np.float16
    check_stats(idx, ref, [b["attention_mask"] for b in batches], True)


def test_passes_under_tiny_budget_give_identical_stats(tiny, tmp_path):
    rng = np.random.default_rng(3)
    npz = make_npz(str(tmp_path), 4, 19, rng)
    acts = acts_json(str(tmp_path))
    one = capture_ok(tiny, tmp_path / "one", acts, "--calib_data", npz, "--calib_size", 4, "--mask_padding", 1)
    # H*H*8 = 4.5 KiB, I*I*8 = 12.5 KiB: 20 KiB per group -> h0+act1 | h1 | gu | h2 ... several passes
    many = capture_ok(tiny, tmp_path / "many", acts, "--calib_data", npz, "--calib_size", 4, "--mask_padding", 1,
                      "--budget_mb", 20 / 1024)
    assert one["passes"] == 1 and many["passes"] >= 3
    tiny_budget = capture_ok(tiny, tmp_path / "each", acts, "--calib_data", npz, "--calib_size", 4,
                             "--mask_padding", 1, "--budget_mb", 1e-6)
    assert tiny_budget["passes"] == len(ACTS)
    for other in (many, tiny_budget):
        for a, b in zip(one["activations"], other["activations"]):
            assert a["name"] == b["name"] and a["rows"] == b["rows"]
            for k in ("_mean", "_sum", "_gram"):
                assert a[k].tobytes() == b[k].tobytes(), (a["name"], k)


def test_text_file_is_cut_into_windows(tiny_pos, tmp_path):
    """A .txt of short paragraphs (each far shorter than seq_len) is one token stream cut into
    calib_size windows of seq_len tokens, packed across lines and paragraphs, no padding."""
    rng = np.random.default_rng(8)
    n, seq = 4, 24
    paras = random_texts(30, rng, 3, 9)
    (tmp_path / "d.txt").write_text("\n\n".join(p.replace(" w2 ", "\nw2 ") for p in paras) + "\n")
    words = " ".join(paras).split()
    assert len(words) > n * seq and max(len(p.split()) for p in paras) < seq
    ids = np.array([VOCAB[w] for w in words[:n * seq]], np.int64).reshape(n, seq)
    mask = np.ones((n, seq), np.int64)
    batches = []
    for b in range(0, n, 2):
        f = {"input_ids": ids[b:b + 2], "attention_mask": mask[b:b + 2],
             "position_ids": np.tile(np.arange(seq, dtype=np.int64), (2, 1))}
        for kv in ("key", "value"):
            f[f"past_key_values.0.{kv}"] = np.zeros((2, KVH, 0, HD), np.float32)
        batches.append(f)
    ref = reference_activations(tiny_pos, batches, [nm for nm, _ in ACTS])
    idx = capture_ok(tiny_pos, tmp_path / "out", acts_json(str(tmp_path)), "--dataset", tmp_path / "d.txt",
                     "--calib_size", n, "--seq_len", seq, "--batch_size", 2, "--mask_padding", 1)
    assert idx["samples"] == n and idx["tokens_total"] == n * seq == idx["tokens_unpadded"]
    check_stats(idx, ref, None, False)


def test_text_dataset_jsonl(tiny_pos, tmp_path):
    """Text path: first calib_size texts, truncation to seq_len, padding to the longest with eos (right),
    position_ids = ModelOpt's formula (model has the input), past KV heads from genai_config.json
    (symbolic dims in the model)."""
    rng = np.random.default_rng(4)
    seq = 24
    texts = random_texts(7, rng, 3, 20) + [" ".join(rng.choice(WORDS, 40))] + random_texts(3, rng)
    jsonl = tmp_path / "d.jsonl"
    jsonl.write_text("".join(json.dumps({"text": t}) + "\n" + ("\n" if i == 2 else "") for i, t in enumerate(texts)))
    n = 8
    ids = np.full((n, seq), 1, np.int64)
    mask = np.zeros((n, seq), np.int64)
    for i, t in enumerate(texts[:n]):
        toks = [VOCAB[w] for w in t.split()][:seq]
        ids[i, :len(toks)] = toks
        mask[i, :len(toks)] = 1
    pos = np.cumsum(mask, -1) - 1
    pos[mask == 0] = 1
    batches = []
    for b in range(0, n, 4):
        f = {"input_ids": ids[b:b + 4], "attention_mask": mask[b:b + 4], "position_ids": pos[b:b + 4]}
        for kv in ("key", "value"):
            f[f"past_key_values.0.{kv}"] = np.zeros((4, KVH, 0, HD), np.float32)
        batches.append(f)
    ref = reference_activations(tiny_pos, batches, [nm for nm, _ in ACTS])
    for ds in (jsonl,):
        idx = capture_ok(tiny_pos, tmp_path / f"out_{ds.suffix[1:]}", acts_json(str(tmp_path)), "--dataset", ds,
                         "--calib_size", n, "--seq_len", seq, "--batch_size", 4, "--mask_padding", 1)
        assert idx["samples"] == n and idx["seq_len"] == seq and idx["tokens_total"] == n * seq
        assert idx["tokens_unpadded"] == int(mask.sum())
        check_stats(idx, ref, [b["attention_mask"] for b in batches], True)


def test_npz_missing_inputs_are_synthesised(tiny_pos, tmp_path):
    """An npz with input_ids only: attention_mask = ones, position_ids from it, past KV empty."""
    rng = np.random.default_rng(5)
    ids = rng.integers(3, V, (3, 11)).astype(np.int64)
    np.savez(tmp_path / "ids.npz", input_ids=ids)
    idx = capture_ok(tiny_pos, tmp_path / "out", acts_json(str(tmp_path)), "--calib_data", tmp_path / "ids.npz")
    assert idx["samples"] == 3 and idx["tokens_unpadded"] == 33
    batches = [{"input_ids": ids[i:i + 1], "attention_mask": np.ones((1, 11), np.int64),
                "position_ids": np.arange(11, dtype=np.int64)[None],
                "past_key_values.0.key": np.zeros((1, KVH, 0, HD), np.float32),
                "past_key_values.0.value": np.zeros((1, KVH, 0, HD), np.float32)} for i in range(3)]
    check_stats(idx, reference_activations(tiny_pos, batches, [n for n, _ in ACTS]), None, False)


def test_buffer_share_and_cnn_fallback(tiny, tmp_path):
    """--dataset cnn without `datasets` (or offline) warns and falls back to tools/corpus.py; with
    --use_buffer_share the past KV has the context length of genai_config.json (the graph passes it through)."""
    if not os.path.exists(CORPUS_FILE):
        pytest.skip(f"corpus {CORPUS_FILE} not installed")
    idx = capture_ok(tiny, tmp_path / "out", acts_json(str(tmp_path), ACTS[:2]), "--dataset", "cnn",
                     "--calib_size", 2, "--seq_len", 16, "--use_buffer_share")
    assert "falling back to the project's corpus" in idx["_stderr"]
    assert idx["source"].startswith("tools/corpus.py") and idx["samples"] == 2 and idx["tokens_total"] == 32


# --------------------------------------------------------------------------------------------
# grid
# --------------------------------------------------------------------------------------------

def modelopt_get_scale(x_max, w_max, alpha):
    """ModelOpt 0.47 int4.py get_scale, as written there."""
    scales = (x_max.__pow__(alpha) / (w_max.__pow__(1 - alpha) + np.finfo(w_max.dtype).tiny)).clip(
        min=1e-4, max=1e4)
    return scales / np.sqrt(scales.max() * scales.min())


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_grid_equals_modelopt_get_scale(tmp_path, dtype):
    rng = np.random.default_rng(6)
    npdt = np.dtype(dtype)
    ext = {"float32": "f32", "float16": "f16"}[dtype]
    items = []
    for j, K in enumerate((576, 37, 1)):
        x = np.abs(rng.standard_normal(K) * rng.exponential(2, K)).astype(npdt)
        wm = rng.uniform(0, 1, K).astype(npdt)
        if K > 5:
            x[:3] = 0
            wm[3] = 0
        x.astype(npdt.newbyteorder("<")).tofile(tmp_path / f"x{j}.bin")
        wm.astype(npdt.newbyteorder("<")).tofile(tmp_path / f"w{j}.bin")
        items.append({"id": f"w{j}", "x_mean": f"x{j}.bin", "w_mean": f"w{j}.bin", "K": K, "_x": x, "_w": wm})
    req = {"alphas": MODELOPT_ALPHAS, "items": [{k: v for k, v in it.items() if not k.startswith("_")}
                                                for it in items]}
    if dtype != "float32":
        req["dtype"] = dtype
    (tmp_path / "req.json").write_text(json.dumps(req))
    assert "0.30000000000000004" in (tmp_path / "req.json").read_text()
    p = run_capture("grid", "--request", tmp_path / "req.json", "--out", tmp_path / "g")
    assert p.returncode == 0, p.stderr
    with np.errstate(all="ignore"):
        for it in items:
            got = np.fromfile(tmp_path / "g" / f"{it['id']}.grid.{ext}", npdt.newbyteorder("<"))
            want = np.stack([modelopt_get_scale(it["_x"], it["_w"], a) for a in MODELOPT_ALPHAS])
            assert want.dtype == npdt
            assert got.tobytes() == want.astype(npdt.newbyteorder("<")).tobytes(), it["id"]


# --------------------------------------------------------------------------------------------
# SmolLM2 (real model, external data, GroupQueryAttention)
# --------------------------------------------------------------------------------------------

@pytest.mark.skipif(not os.path.exists(SMOLLM2), reason="build/smollm2-fp32 not built (tools/smollm2_to_onnx.py)")
def test_smollm2_text_calibration(tmp_path):
    if not os.path.exists(CORPUS_FILE):
        pytest.skip(f"corpus {CORPUS_FILE} not installed")
    sys.path.insert(0, os.path.join(REPO, "tools"))
    import corpus
    from tokenizers import Tokenizer
    texts = corpus.calibration_texts(2)
    (tmp_path / "d.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    m = onnx.load(SMOLLM2, load_external_data=False)
    inits = {t.name: t for t in m.graph.initializer}
    acts = []
    for n in m.graph.node:
        if n.op_type == "MatMul" and n.input[1] in inits and any(f"layers.{L}/" in n.name for L in (0, 29)):
            if n.input[0] not in [a for a, _ in acts]:
                acts.append((n.input[0], int(inits[n.input[1]].dims[0])))
    assert len(acts) == 8
    seq = 64
    idx = capture_ok(SMOLLM2, tmp_path / "out", acts_json(str(tmp_path), acts), "--dataset", tmp_path / "d.jsonl",
                     "--calib_size", 2, "--seq_len", seq)
    tok = Tokenizer.from_file(os.path.join(os.path.dirname(SMOLLM2), "tokenizer.json"))
    batches = []
    for t in texts:
        ids = tok.encode(t).ids[:seq]
        assert len(ids) == seq
        f = {"input_ids": np.array([ids], np.int64), "attention_mask": np.ones((1, seq), np.int64)}
        for i in m.graph.input:
            if i.name.startswith("past_key_values"):
                f[i.name] = np.zeros((1, 3, 0, 64), np.float32)
        batches.append(f)
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    so.add_session_config_entry("session.model_external_initializers_file_folder_path",
                                os.path.dirname(SMOLLM2))
    for a, _ in acts:
        m.graph.output.append(onnx.ValueInfoProto(name=a))
    sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    names = [a for a, _ in acts]
    ref = {n: [] for n in names}
    for f in batches:
        for n, v in zip(names, sess.run(names, f)):
            ref[n].append(v)
    check_stats(idx, ref, None, False)
    assert idx["tokens_total"] == 2 * seq == idx["tokens_unpadded"]


# --------------------------------------------------------------------------------------------
# Bad input: exit 2, one line 'calibration: ...', no traceback
# --------------------------------------------------------------------------------------------

def assert_one_error(p, *fragments):
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    errs = [ln for ln in lines if ln.startswith("calibration: ")]
    assert p.returncode == 2, f"exit {p.returncode}\n{p.stderr}"
    assert len(errs) == 1 and lines[-1] == errs[0], p.stderr
    assert "Traceback" not in p.stderr, p.stderr
    for f in fragments:
        assert f in errs[0], f"{f!r} not in {errs[0]!r}"
    return errs[0]


def _err_case(tiny, tmp, case):
    d = str(tmp)
    acts = acts_json(d)
    base = ["capture", "--model", tiny, "--out", os.path.join(d, "out"), "--activations", acts, "--eps", "cpu"]
    rng = np.random.default_rng(9)
    if case == "dataset_missing":
        return base + ["--dataset", os.path.join(d, "nope.jsonl")], ["nope.jsonl", "not found"]
    if case == "dataset_unknown_type":
        open(os.path.join(d, "x.csv"), "w").write("a,b\n")
        return base + ["--dataset", os.path.join(d, "x.csv")], ["x.csv", "unknown type"]
    if case == "too_few_texts":
        open(os.path.join(d, "few.jsonl"), "w").write('{"text": "w1 w2 w3"}\n\n{"text": "w4 w5"}\n')
        return base + ["--dataset", os.path.join(d, "few.jsonl"), "--calib_size", "3", "--seq_len", "2"], \
            ["few.jsonl", "2 non-empty texts", "--calib_size 3"]
    if case == "too_few_tokens":
        open(os.path.join(d, "short.jsonl"), "w").write('{"text": "w1 w2 w3"}\n{"text": "w4 w5"}\n')
        return base + ["--dataset", os.path.join(d, "short.jsonl"), "--calib_size", "2", "--seq_len", "8"], \
            ["short.jsonl", "too few tokens", "3 tokens", "--seq_len is 8"]
    if case == "txt_too_few_tokens":
        open(os.path.join(d, "short.txt"), "w").write("w1 w2 w3\n\nw4 w5\n")
        return base + ["--dataset", os.path.join(d, "short.txt"), "--calib_size", "2", "--seq_len", "8"], \
            ["short.txt", "too few tokens", "5,", "need 16"]
    if case == "bad_jsonl":
        open(os.path.join(d, "b.jsonl"), "w").write('{"text": "w1 w2"}\n{"txt": "w3"}\n')
        return base + ["--dataset", os.path.join(d, "b.jsonl"), "--calib_size", "2"], ["b.jsonl:2", "\"text\""]
    if case == "parquet_without_pyarrow":
        try:
            import pyarrow  # noqa: F401
            pytest.skip("pyarrow installed")
        except ImportError:
            pass
        open(os.path.join(d, "x.parquet"), "wb").write(b"PAR1")
        return base + ["--dataset", os.path.join(d, "x.parquet")], ["x.parquet", "pyarrow"]
    if case == "npz_wrong_name":
        np.savez(os.path.join(d, "c.npz"), input_ids=np.ones((2, 5), np.int64), token_ids=np.ones((2, 5), np.int64))
        return base + ["--calib_data", os.path.join(d, "c.npz")], ["c.npz", "'token_ids'", "not an input"]
    if case == "npz_wrong_rank":
        np.savez(os.path.join(d, "c.npz"), input_ids=np.ones((2, 5, 1), np.int64))
        return base + ["--calib_data", os.path.join(d, "c.npz")], ["c.npz", "'input_ids'", "rank 3"]
    if case == "npz_wrong_dim":
        np.savez(os.path.join(d, "c.npz"), input_ids=np.ones((2, 5), np.int64),
                 **{"past_key_values.0.key": np.zeros((2, KVH + 1, 0, HD), np.float32)})
        return base + ["--calib_data", os.path.join(d, "c.npz")], ["'past_key_values.0.key'", "axis 1"]
    if case == "npz_wrong_dtype":
        np.savez(os.path.join(d, "c.npz"), input_ids=np.ones((2, 5), np.int32))
        return base + ["--calib_data", os.path.join(d, "c.npz")], ["'input_ids'", "int32", "int64"]
    if case == "npz_sample_counts":
        np.savez(os.path.join(d, "c.npz"), input_ids=np.ones((2, 5), np.int64),
                 attention_mask=np.ones((3, 5), np.int64))
        return base + ["--calib_data", os.path.join(d, "c.npz")], ["'attention_mask'", "3 samples"]
    if case == "npz_not_npz":
        open(os.path.join(d, "c.npz"), "w").write("hello")
        return base + ["--calib_data", os.path.join(d, "c.npz")], ["c.npz", "not a readable .npz"]
    if case == "npz_missing":
        return base + ["--calib_data", os.path.join(d, "none.npz")], ["none.npz", "not found"]
    if case == "model_without_input_ids":
        x = helper.make_tensor_value_info("hidden", TensorProto.FLOAT, ["b", "s", H])
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", "s", H])
        wgt = numpy_helper.from_array(rng.standard_normal((H, H)).astype(np.float32), "W")
        g = helper.make_graph([helper.make_node("MatMul", ["hidden", "W"], ["y"])], "g", [x], [y], [wgt])
        mp = os.path.join(d, "m", "model.onnx")
        os.makedirs(os.path.dirname(mp))
        onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10), mp)
        return ["capture", "--model", mp, "--out", os.path.join(d, "out"), "--activations",
                acts_json(d, [("hidden", H)]), "--eps", "cpu", "--calib_size", "2"], ["no input_ids input", "hidden"]
    if case == "npz_lacks_input":
        x = helper.make_tensor_value_info("hidden", TensorProto.FLOAT, ["b", "s", H])
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", "s", H])
        wgt = numpy_helper.from_array(rng.standard_normal((H, H)).astype(np.float32), "W")
        g = helper.make_graph([helper.make_node("MatMul", ["hidden", "W"], ["y"])], "g", [x], [y], [wgt])
        mp = os.path.join(d, "m", "model.onnx")
        os.makedirs(os.path.dirname(mp))
        onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10), mp)
        np.savez(os.path.join(d, "c.npz"), input_ids=np.ones((2, 5), np.int64))
        return ["capture", "--model", mp, "--out", os.path.join(d, "out"), "--activations",
                acts_json(d, [("hidden", H)]), "--eps", "cpu", "--calib_data", os.path.join(d, "c.npz")], \
            ["'input_ids' is not an input"]
    if case == "nonfinite_activation":
        x = helper.make_tensor_value_info("hidden", TensorProto.FLOAT, ["b", "s", H])
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", "s", H])
        wgt = numpy_helper.from_array(rng.standard_normal((H, H)).astype(np.float32), "W")
        g = helper.make_graph([helper.make_node("MatMul", ["hidden", "W"], ["y"])], "g", [x], [y], [wgt])
        mp = os.path.join(d, "m", "model.onnx")
        os.makedirs(os.path.dirname(mp))
        onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10), mp)
        hid = rng.standard_normal((2, 5, H)).astype(np.float32)
        hid[1, 3, 7] = np.inf
        np.savez(os.path.join(d, "c.npz"), hidden=hid)
        return ["capture", "--model", mp, "--out", os.path.join(d, "out"), "--activations",
                acts_json(d, [("hidden", H)]), "--eps", "cpu", "--calib_data", os.path.join(d, "c.npz")], \
            ["'hidden'", "non-finite"]
    if case == "no_tokenizer":
        import shutil
        m2 = os.path.join(d, "m2")
        os.makedirs(m2)
        for f in ("model.onnx", "model.onnx.data", "genai_config.json"):
            shutil.copy(os.path.join(os.path.dirname(tiny), f), m2)
        return ["capture", "--model", os.path.join(m2, "model.onnx"), "--out", os.path.join(d, "out"),
                "--activations", acts, "--eps", "cpu"], ["no tokenizer.json", "--tokenizer"]
    if case == "unknown_ep":
        return base[:-2] + ["--eps", "tpu", "--calib_data", make_npz(d, 2, 5, rng)], ["--eps", "'tpu'", "unknown"]
    if case == "unavailable_ep_only":
        return base[:-2] + ["--eps", "dml", "--calib_data", make_npz(d, 2, 5, rng)], ["--eps dml", "available"]
    if case == "activation_not_in_graph":
        return base[:5] + ["--activations", acts_json(d, [("nope", 3)]), "--eps", "cpu"], ["'nope'", "no tensor"]
    if case == "activation_wrong_K":
        return base[:5] + ["--activations", acts_json(d, [("h1", H + 1)]), "--eps", "cpu",
                           "--calib_data", make_npz(d, 2, 5, rng)], ["'h1'", "K = 25"]
    if case == "activations_bad_json":
        open(os.path.join(d, "a.json"), "w").write('[{"name": "h1"}]')
        return base[:5] + ["--activations", os.path.join(d, "a.json")], ["a.json", "entry 0"]
    if case == "model_missing":
        return ["capture", "--model", os.path.join(d, "no.onnx"), "--out", os.path.join(d, "out"),
                "--activations", acts], ["no.onnx", "not found"]
    if case == "model_not_onnx":
        open(os.path.join(d, "bad.onnx"), "wb").write(b"\x00garbage" * 10)
        return ["capture", "--model", os.path.join(d, "bad.onnx"), "--out", os.path.join(d, "out"),
                "--activations", acts], ["bad.onnx", "not an ONNX model"]
    if case == "out_is_model_folder":
        return ["capture", "--model", tiny, "--out", os.path.dirname(tiny), "--activations", acts], \
            ["model's folder"]
    if case == "bad_flag":
        return base + ["--calib_size", "many"], ["command line", "--calib_size"]
    if case == "no_past_kv_but_model_has_them":
        return base + ["--no_past_kv_inputs", "--calib_data", make_npz(d, 2, 5, rng)], ["--no_past_kv_inputs"]
    if case == "grid_missing_file":
        open(os.path.join(d, "req.json"), "w").write(json.dumps(
            {"alphas": [0.0, 0.5], "items": [{"id": "a", "x_mean": "x.f32", "w_mean": "w.f32", "K": 4}]}))
        return ["grid", "--request", os.path.join(d, "req.json"), "--out", os.path.join(d, "g")], ["x.f32"]
    if case == "grid_wrong_size":
        np.ones(3, np.float32).tofile(os.path.join(d, "x.f32"))
        np.ones(4, np.float32).tofile(os.path.join(d, "w.f32"))
        open(os.path.join(d, "req.json"), "w").write(json.dumps(
            {"alphas": [0.0, 0.5], "items": [{"id": "a", "x_mean": "x.f32", "w_mean": "w.f32", "K": 4}]}))
        return ["grid", "--request", os.path.join(d, "req.json"), "--out", os.path.join(d, "g")], \
            ["x.f32", "12 bytes", "4 float32"]
    raise AssertionError(case)


ERROR_CASES = ["dataset_missing", "dataset_unknown_type", "too_few_texts", "too_few_tokens", "txt_too_few_tokens",
               "bad_jsonl",
               "parquet_without_pyarrow", "npz_wrong_name", "npz_wrong_rank", "npz_wrong_dim", "npz_wrong_dtype",
               "npz_sample_counts", "npz_not_npz", "npz_missing", "model_without_input_ids", "npz_lacks_input",
               "nonfinite_activation", "no_tokenizer", "unknown_ep", "unavailable_ep_only", "activation_not_in_graph",
               "activation_wrong_K", "activations_bad_json", "model_missing", "model_not_onnx",
               "out_is_model_folder", "bad_flag", "no_past_kv_but_model_has_them", "grid_missing_file",
               "grid_wrong_size"]


@pytest.mark.parametrize("case", ERROR_CASES)
def test_bad_input_one_error_line(tiny, tmp_path, case):
    import onnxruntime as ort
    if case == "unavailable_ep_only" and "DmlExecutionProvider" in ort.get_available_providers():
        pytest.skip("DirectML is available here")
    before = folder_digest(os.path.dirname(tiny))
    args, fragments = _err_case(tiny, tmp_path, case)
    p = run_capture(*args)
    assert_one_error(p, *fragments)
    assert folder_digest(os.path.dirname(tiny)) == before
    assert not os.path.exists(os.path.join(tmp_path, "out", "index.json"))


# --------------------------------------------------------------------------------------------
# An encoder (BERT-style): no eos token, pad is [PAD], token_type_ids to feed
# --------------------------------------------------------------------------------------------

def make_encoder(folder: str) -> str:
    """input_ids, token_type_ids, attention_mask [b, s] -> word + type embeddings -> MatMul -> Relu
    -> MatMul; a WordPiece-style vocabulary with [PAD] [UNK] [CLS] [SEP], no eos token."""
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(21)
    vocab = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, **{w: i + 4 for i, w in enumerate(WORDS)}}
    nv = len(vocab)
    inits = [numpy_helper.from_array(rng.standard_normal((nv, H)).astype(np.float32), "word_emb"),
             numpy_helper.from_array(rng.standard_normal((2, H)).astype(np.float32), "type_emb"),
             numpy_helper.from_array((rng.standard_normal((H, I)) * H ** -0.5).astype(np.float32), "W1"),
             numpy_helper.from_array((rng.standard_normal((I, H)) * I ** -0.5).astype(np.float32), "W2")]
    nodes = [helper.make_node("Gather", ["word_emb", "input_ids"], ["we"]),
             helper.make_node("Gather", ["type_emb", "token_type_ids"], ["te"]),
             helper.make_node("Add", ["we", "te"], ["e"]),
             helper.make_node("MatMul", ["e", "W1"], ["f1"], name="/encoder/layer.0/intermediate/MatMul"),
             helper.make_node("Relu", ["f1"], ["r"]),
             helper.make_node("MatMul", ["r", "W2"], ["y"], name="/encoder/layer.0/output/MatMul")]
    ins = [helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "seq"])
           for n in ("input_ids", "token_type_ids", "attention_mask")]
    g = helper.make_graph(nodes, "enc", ins, [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", H])],
                          inits)
    path = os.path.join(folder, "model.onnx")
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10), path)
    from tokenizers import Tokenizer, models, pre_tokenizers
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(os.path.join(folder, "tokenizer.json"))
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"pad_token": "[PAD]", "unk_token": "[UNK]", "cls_token": "[CLS]", "sep_token": "[SEP]"}, f)
    return path


@pytest.mark.parametrize("short", [False, True], ids=["full_windows", "padded"])
def test_encoder_model_calibrates(tmp_path, short):
    """Full-length texts need no pad token; shorter ones are padded with [PAD]; token_type_ids is fed
    as zeros; the statistics equal numpy's on ONNX Runtime's own activations."""
    model = make_encoder(str(tmp_path / "enc"))
    rng = np.random.default_rng(31)
    n, seq = 4, 12
    texts = random_texts(n, rng, 3, 10) if short else random_texts(n, rng, seq + 2, seq + 10)
    if short:
        texts[0] = " ".join(rng.choice(WORDS, seq + 3))   # one full text: the set is padded to seq
    (tmp_path / "d.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    ids = np.zeros((n, seq), np.int64)
    mask = np.zeros((n, seq), np.int64)
    for i, t in enumerate(texts):
        toks = [VOCAB[w] + 1 for w in t.split()][:seq]     # the encoder's ids are the decoder's + 1
        ids[i, :len(toks)] = toks
        mask[i, :len(toks)] = 1
    batches = [{"input_ids": ids[b:b + 2], "token_type_ids": np.zeros((2, seq), np.int64),
                "attention_mask": mask[b:b + 2]} for b in range(0, n, 2)]
    acts = [("e", H), ("r", I)]
    ref = reference_activations(model, batches, [a for a, _ in acts])
    idx = capture_ok(model, tmp_path / "out", acts_json(str(tmp_path), acts), "--dataset", tmp_path / "d.jsonl",
                     "--calib_size", n, "--seq_len", seq, "--batch_size", 2, "--mask_padding", 1)
    assert idx["tokens_unpadded"] == int(mask.sum()) and (int(mask.sum()) < n * seq) == short
    check_stats(idx, ref, [b["attention_mask"] for b in batches], True)


def test_encoder_model_quantizes_end_to_end(tmp_path):
    """nibble quantize --algo awq_lite on the encoder: calibration feeds it, ONNX Runtime runs the output,
    within 10% relative RMS of the float model (measured 8.2%: INT4, block 16, random weights)."""
    nib = os.environ.get("NIBBLE_BIN", os.path.join(REPO, "build", "nibble"))
    model = make_encoder(str(tmp_path / "enc"))
    rng = np.random.default_rng(41)
    (tmp_path / "d.txt").write_text("\n".join(random_texts(40, rng, 5, 15)) + "\n")
    out = str(tmp_path / "q" / "model.onnx")
    p = subprocess.run([nib, "quantize", "--onnx_path", model, "--output_path", out, "--algo", "awq_lite",
                        "--block_size", "16", "--dataset", str(tmp_path / "d.txt"), "--calib_size", "4",
                        "--calib_seq_len", "16"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    import onnxruntime as ort
    feeds = {"input_ids": rng.integers(4, V, (2, 16)).astype(np.int64),
             "token_type_ids": np.zeros((2, 16), np.int64), "attention_mask": np.ones((2, 16), np.int64)}
    so = ort.SessionOptions()
    so.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", "1")
    ref = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    got = ort.InferenceSession(out, so, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    rel = float(np.sqrt(np.mean((got - ref) ** 2) / np.mean(ref ** 2)))
    assert rel < 0.1, rel


@pytest.mark.parametrize("blas", [True, False], ids=["ssyrk-upper", "numpy-full"])
def test_gram_row_blocks_equal_the_whole_matrix(blas, monkeypatch):
    """The Gram file is written in row blocks mirrored from ssyrk's upper triangle (no whole float64 copy):
    the same values, bit for bit, as the whole mirrored matrix, at every block edge."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "calib"))
    try:
        import accumulator
    finally:
        sys.path.pop(0)
    if not blas:
        monkeypatch.setattr(accumulator.SYRK, "fn", None)
    elif accumulator.SYRK.fn is None:
        pytest.skip("numpy's OpenBLAS ssyrk not found")
    rng = np.random.default_rng(1)
    for K in (5, 255, 256, 700):
        whole, blocked = accumulator.Accumulator("x", K), accumulator.Accumulator("x", K)
        for n in (300, 17, 256):
            X = rng.standard_normal((n, K)).astype(np.float32)
            whole.update(X, None)
            blocked.update(X, None)
        want = whole.gram_f64()
        got = np.concatenate([b for _, b in blocked.gram_f64_rows(rows=128)])
        assert got.dtype == np.float64 and got.shape == (K, K)
        assert got.tobytes() == want.tobytes(), K
        assert np.array_equal(got, got.T)
