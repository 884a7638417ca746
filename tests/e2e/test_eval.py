"""`nibble eval` (tools/eval_model.py): perplexity equal to tools/eval_ppl.py's on the same windows,
KL(P_ref || P_model) against an independent numpy computation, 0 for a model against itself and > 0
for a quantized one, --text (.txt / .jsonl), --json, and one error line for every bad input.

Model: test_calib's tiny ORT-GenAI-like decoder (input_ids, attention_mask, past KV; a WordLevel
tokenizer of the words w0..w60), so every run takes well under a second of ONNX Runtime.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from .conftest import REPO
from .test_calib import HD, KVH, WORDS, make_tiny

EVAL_PPL = os.path.join(REPO, "tools", "eval_ppl.py")


@pytest.fixture(scope="module")
def models(nibble, tmp_path_factory):
    """(float model, its rtn_dq INT4 version) of the tiny decoder."""
    root = tmp_path_factory.mktemp("tiny_eval")
    ref = make_tiny(str(root / "float"))
    q = str(root / "q" / "model.onnx")
    nibble.quantize(ref, q, "--algo", "rtn_dq", "--block_size", "16", "--nodes_to_exclude", "", "--quiet")
    return ref, q


@pytest.fixture(scope="module")
def words_txt(tmp_path_factory) -> str:
    rng = np.random.default_rng(5)
    p = tmp_path_factory.mktemp("text") / "words.txt"
    p.write_text(" ".join(WORDS[i] for i in rng.integers(0, len(WORDS), 300)) + "\n")
    return str(p)


def run_eval(nibble, *args):
    return nibble.run("eval", *map(str, args))


def eval_json(nibble, tmp_path, *args) -> tuple[dict, str]:
    out = tmp_path / f"eval{len(list(tmp_path.iterdir()))}.json"
    r = run_eval(nibble, *args, "--json", out, "--quiet")
    assert r.returncode == 0, r.describe()
    with open(out) as f:
        return json.load(f), r.stdout


def one_error(r, *needles):
    assert r.returncode != 0, r.describe()
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("nibble: error:"), r.describe()
    for n in needles:
        assert n in lines[0], f"{n!r} not in the error line\n{r.describe()}"


# ------------------------------------------------------------------------------ the measurements

def test_ppl_equals_eval_ppl(nibble, models, tmp_path):
    """Default text (the corpus eval split), same windows: the same perplexity as tools/eval_ppl.py."""
    ref, q = models
    for m in (ref, q):
        res, _ = eval_json(nibble, tmp_path, "--model", m, "--windows", 3, "--seq_len", 64)
        p = subprocess.run([sys.executable, EVAL_PPL, m, "--windows", "3", "--seq_len", "64"],
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        want = json.loads(p.stdout.strip().splitlines()[-1])
        assert res["tokens"] == want["tokens"] == 3 * 63
        assert res["ppl"] == pytest.approx(want["ppl"], rel=1e-12), (res["ppl"], want["ppl"])
        assert "kl" not in res and res["reference"] is None


def test_kl_of_a_model_against_itself_is_zero(nibble, models, words_txt, tmp_path):
    ref, _ = models
    res, out = eval_json(nibble, tmp_path, "--model", ref, "--reference", ref, "--text", words_txt,
                         "--windows", 4, "--seq_len", 32)
    assert abs(res["kl"]) < 1e-6 and res["kl_max_window"] < 1e-6, res
    assert res["top1_agreement"] == 1.0 and res["ppl"] == res["ref_ppl"], res


def _logits(path: str, ids: np.ndarray) -> np.ndarray:
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", "1")
    so.log_severity_level = 3
    s = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    feeds = {"input_ids": ids[None], "attention_mask": np.ones((1, len(ids)), np.int64),
             "past_key_values.0.key": np.zeros((1, KVH, 0, HD), np.float32),
             "past_key_values.0.value": np.zeros((1, KVH, 0, HD), np.float32)}
    return s.run(["logits"], feeds)[0][0].astype(np.float64)


def test_kl_of_the_quantized_model(nibble, models, words_txt, tmp_path):
    """KL > 0, checked against a direct numpy computation over the same windows."""
    ref, q = models
    W, L = 4, 32
    res, out = eval_json(nibble, tmp_path, "--model", q, "--reference", ref, "--text", words_txt,
                         "--windows", W, "--seq_len", L)
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(os.path.dirname(ref), "tokenizer.json"))
    ids = np.asarray(tok.encode(open(words_txt).read()).ids, np.int64)[: W * L].reshape(W, L)
    kl, nll, ref_nll, agree = 0.0, 0.0, 0.0, 0
    for w in ids:
        lp = _logits(ref, w)[:-1]
        lq = _logits(q, w)[:-1]
        lp = lp - np.log(np.exp(lp - lp.max(-1, keepdims=True)).sum(-1, keepdims=True)) - lp.max(-1, keepdims=True)
        lq = lq - np.log(np.exp(lq - lq.max(-1, keepdims=True)).sum(-1, keepdims=True)) - lq.max(-1, keepdims=True)
        kl += float((np.exp(lp) * (lp - lq)).sum())
        nll -= float(lq[np.arange(L - 1), w[1:]].sum())
        ref_nll -= float(lp[np.arange(L - 1), w[1:]].sum())
        agree += int((lp.argmax(-1) == lq.argmax(-1)).sum())
    n = W * (L - 1)
    assert res["tokens"] == n
    assert res["kl"] > 1e-4, res
    assert res["kl"] == pytest.approx(kl / n, rel=1e-6, abs=1e-9)
    assert res["ppl"] == pytest.approx(math.exp(nll / n), rel=1e-6)
    assert res["ref_ppl"] == pytest.approx(math.exp(ref_nll / n), rel=1e-6)
    assert res["top1_agreement"] == pytest.approx(agree / n)
    assert len(res["kl_windows"]) == W and res["kl_max_window"] == max(res["kl_windows"])
    # the human summary
    for s in ("perplexity", "KL(reference || model)", "top-1 agreement", q, ref):
        assert s in out, out


def test_text_txt_and_jsonl_agree(nibble, models, words_txt, tmp_path):
    """A .jsonl of documents is the documents joined by a blank line: the same windows as that .txt."""
    ref, _ = models
    words = open(words_txt).read().split()
    docs = [" ".join(words[i: i + 50]) for i in range(0, len(words), 50)]
    jl = tmp_path / "docs.jsonl"
    jl.write_text("".join(json.dumps({"text": d, "id": i}) + "\n" for i, d in enumerate(docs)))
    tx = tmp_path / "docs.txt"
    tx.write_text("\n\n".join(docs))
    a, _ = eval_json(nibble, tmp_path, "--model", ref, "--text", jl, "--windows", 2, "--seq_len", 64)
    b, _ = eval_json(nibble, tmp_path, "--model", ref, "--text", tx, "--windows", 2, "--seq_len", 64)
    assert a["ppl"] == b["ppl"] and a["tokens"] == 2 * 63, (a, b)
    assert a["text"] == str(jl)


def test_tokenizer_flag(nibble, models, words_txt, tmp_path):
    """A model folder without tokenizer.json: error, then --tokenizer pointing at one."""
    ref, _ = models
    d = tmp_path / "bare"
    d.mkdir()
    for f in ("model.onnx", "model.onnx.data", "genai_config.json"):
        shutil.copy(os.path.join(os.path.dirname(ref), f), d / f)
    r = run_eval(nibble, "--model", d / "model.onnx", "--text", words_txt, "--windows", 1, "--seq_len", 16)
    one_error(r, "tokenizer.json", "--tokenizer")
    res, _ = eval_json(nibble, tmp_path, "--model", d / "model.onnx", "--text", words_txt, "--windows", 1,
                       "--seq_len", 16, "--tokenizer", os.path.dirname(ref))
    assert res["ppl"] > 1


# ------------------------------------------------------------------------------------- errors

def test_errors(nibble, models, words_txt, tmp_path):
    ref, q = models
    one_error(run_eval(nibble, "--model", tmp_path / "nope.onnx"), "--model", "nope.onnx", "no such file")
    one_error(run_eval(nibble, "--model", ref, "--reference", tmp_path / "nope.onnx", "--text", words_txt),
              "--reference", "no such file")
    one_error(run_eval(nibble, "--model", ref, "--text", tmp_path / "nope.txt"), "--text", "no such file")
    short = tmp_path / "short.txt"
    short.write_text("w1 w2 w3 w4 w5\n")
    one_error(run_eval(nibble, "--model", ref, "--text", short), "short.txt", "5 tokens", "--seq_len")
    one_error(run_eval(nibble, "--model", ref, "--text", words_txt, "--seq_len", 100, "--windows", 10),
              "300 tokens", "3 window(s)", "--windows 3")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "w1 w2"}\n{"txt": "w3"}\n')
    one_error(run_eval(nibble, "--model", ref, "--text", bad), "bad.jsonl", "line 2", '"text"')
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"\x00\x01not a model" * 10)
    one_error(run_eval(nibble, "--model", junk, "--text", words_txt), "junk.onnx", "cannot load")
    one_error(run_eval(nibble, "--model", ref, "--windows", 0), "--windows")
    r = run_eval(nibble, "--reference", ref)
    assert r.returncode != 0 and r.stderr.strip().startswith("nibble: error:") and "--model" in r.stderr, r.describe()
    # --json under a path whose parent is a file
    ro = tmp_path / "ro"
    ro.mkdir()
    (ro / "x").write_text("")
    one_error(run_eval(nibble, "--model", ref, "--text", words_txt, "--windows", 1, "--seq_len", 16,
                       "--json", ro / "x" / "e.json"), "--json")


def test_paired_ppl_statistics(tmp_path):
    """bench/paired_ppl.py on two evaluations of the same 4 windows: the mean per-window NLL difference,
    its standard error and the perplexity ratio, against values worked out by hand."""
    a = {"ppl": math.exp(2.0), "seq_len": 256, "window_nll": [2.0, 2.1, 1.9, 2.0]}
    b = {"ppl": math.exp(2.05), "seq_len": 256, "window_nll": [2.1, 2.1, 2.0, 2.0]}
    pa, pb = tmp_path / "a.json", tmp_path / "b.json"
    pa.write_text("log line\n" + json.dumps(a) + "\n")
    pb.write_text(json.dumps(b) + "\n")
    out = subprocess.run([sys.executable, os.path.join(REPO, "bench", "paired_ppl.py"), str(pa), str(pb)],
                         capture_output=True, text=True, check=True).stdout
    r = json.loads(out.strip().splitlines()[-1])
    # differences 0.1, 0, 0.1, 0: mean 0.05, sample sd sqrt(4 * 0.0025 / 3), se = sd / 2
    assert r["windows"] == 4 and r["b_better_windows"] == 0
    assert r["mean_dnll"] == pytest.approx(0.05, abs=1e-12)
    assert r["se"] == pytest.approx(math.sqrt(0.01 / 3) / 2, rel=1e-9)
    assert r["t"] == pytest.approx(0.05 / (math.sqrt(0.01 / 3) / 2), rel=1e-9)
    assert r["ratio"] == pytest.approx(math.exp(0.05), rel=1e-12) and not r["identical"]
    # The same NLL on every window (two byte-identical models): no t, said so, and valid JSON.
    same = subprocess.run([sys.executable, os.path.join(REPO, "bench", "paired_ppl.py"), str(pa), str(pa)],
                          capture_output=True, text=True, check=True).stdout
    r = json.loads(same.strip().splitlines()[-1])
    assert r["identical"] and r["t"] is None and r["mean_dnll"] == 0 and "the same NLL" in same
    pb.write_text(json.dumps({**b, "window_nll": b["window_nll"][:3]}) + "\n")
    bad = subprocess.run([sys.executable, os.path.join(REPO, "bench", "paired_ppl.py"), str(pa), str(pb)],
                         capture_output=True, text=True)
    assert bad.returncode != 0 and "different windows" in bad.stderr


def test_paired_ppl_pools_splits(tmp_path):
    """Sides joined by '+' pool their windows in order (eval then calib split); a side whose splits differ
    from the other's is refused rather than paired window for wrong window."""
    def write(name, split, nll):
        p = tmp_path / name
        p.write_text(json.dumps({"ppl": math.exp(sum(nll) / len(nll)), "seq_len": 256, "split": split,
                                 "window_nll": nll}) + "\n")
        return str(p)
    a = write("a_eval.json", "eval", [2.0, 2.2]) + "+" + write("a_calib.json", "calib", [1.8])
    b = write("b_eval.json", "eval", [2.0, 2.1]) + "+" + write("b_calib.json", "calib", [1.9])
    script = os.path.join(REPO, "bench", "paired_ppl.py")
    r = json.loads(subprocess.run([sys.executable, script, a, b], capture_output=True, text=True,
                                  check=True).stdout.strip().splitlines()[-1])
    # differences 0, -0.1, +0.1 over three windows: mean 0; pooled ppl = exp(mean of the windows)
    assert r["windows"] == 3 and r["b_better_windows"] == 1
    assert r["mean_dnll"] == pytest.approx(0.0, abs=1e-12)
    assert r["ppl_a"] == pytest.approx(math.exp(6.0 / 3), rel=1e-12)
    assert r["ppl_b"] == pytest.approx(math.exp(6.0 / 3), rel=1e-12)
    swapped = b.split("+")[1] + "+" + b.split("+")[0]
    bad = subprocess.run([sys.executable, script, a, swapped], capture_output=True, text=True)
    assert bad.returncode != 0 and "different windows" in bad.stderr
