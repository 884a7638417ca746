"""The transfer ledger's acceptance bounds (summary.device, counted on the emulated device exactly as a GPU
would move the bytes): what each algorithm sends over the bus, against the model's own figures. The
bounds and what W, the statistics and the packed output are: tools/ledger_bounds.py (bench/gpu_check
applies the same to a GPU's reports).

Pooled: a model twice as deep makes no more allocations (layer by layer, and the whole-model AWQ runs, which
hold each weight from its search to its quantizer in one room reserved for all of them)."""
from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest

from .conftest import REPO, data_file, folder_digest

sys.path.insert(0, os.path.join(REPO, "tools"))
from ledger_bounds import HOST_OK, gram_block_bytes, gram_bytes  # noqa: E402
import ledger_bounds  # noqa: E402


def _run(nibble, src, root, npz, *flags):
    out = os.path.join(root, "model.onnx")
    report = os.path.join(root, "r.json")
    calib = ["--calib_data", npz, "--calib_size", "4", "--calibration_eps", "cpu"] if npz else []
    nibble.quantize(src, out, *flags, *calib, "--block_size", "32", "--device", "cuda_emulated", "--report", report,
                    "--force")
    with open(report) as f:
        r = json.load(f)
    return r, r["summary"]["device"], out


def activations(src: str, report: dict) -> dict[str, int]:
    return ledger_bounds.activations(src, report)


def check_down(report: dict, d: dict, out: str) -> None:
    packed = report["summary"]["bytes_quantized_out"]
    assert packed <= os.path.getsize(data_file(out))  # the packed tensors are in the output's data file
    assert d["d2h_bytes"] <= 1.1 * packed + 0.01 * packed


def check_on_host(d: dict) -> None:
    assert set(d["on_host"]) <= HOST_OK, d["on_host"]
    assert d["host_fallback"] == bool(d["on_host"])


@pytest.fixture(scope="module")
def ledger_model(model_cache, tmp_path_factory):
    spec, src = model_cache.llama(dtype="fp16", hidden=128, inter=256)
    npz = str(tmp_path_factory.mktemp("ledger") / "calib.npz")
    # 512 tokens > K: every Gram matrix factorisable
    np.savez(npz, hidden=np.random.default_rng(3).standard_normal((4, 128, spec.hidden)).astype(np.float16))
    return spec, src, npz


@pytest.fixture(scope="module")
def deep_model(model_cache, ledger_model):
    """The ledger model twice as deep (the same calibration input: it feeds the hidden states)."""
    spec, _, npz = ledger_model
    return model_cache.llama(dtype="fp16", hidden=spec.hidden, inter=spec.inter, layers=2 * spec.layers)[1]


def check_pooled(nibble, deep, npz, tmp_path, r, *flags, held=False, grams_of=None):
    """No allocation after the first weight of a kind: twice the weights, the same allocations. A
    whole-model run that keeps each weight on the device from its search to its quantizer (`held`) holds
    them all at once between the two, in one room reserved for them (one allocation, however many weights):
    no more allocations either, and every weight is held (each goes up once, by `upload`). `grams_of`: the
    run's source model, when its Gram matrices are uploaded too (once each)."""
    r2, d2, _ = _run(nibble, deep, str(tmp_path / "deep"), npz, *flags)
    more = len(r2["weights"]) - len(r["weights"])
    assert more > 0
    assert d2["allocations"] == r["summary"]["device"]["allocations"]
    if held:
        for rep, d, model in ((r, r["summary"]["device"], grams_of), (r2, d2, deep)):
            grams = gram_bytes(activations(model, rep)) if grams_of else 0
            assert d["ops"]["reserve"]["allocations"] == 1
            assert d["ops"]["upload"]["h2d_bytes"] == rep["summary"]["bytes_in"] + grams
            assert rep["summary"]["peak_device_memory_bytes"] <= rep["summary"]["device_memory_budget_bytes"]


def test_rtn_dq_moves_each_weight_once_and_the_packed_output_back(nibble, ledger_model, deep_model, tmp_path):
    _, src, _ = ledger_model
    r, d, out = _run(nibble, src, str(tmp_path), None, "--algo", "rtn_dq")
    w = r["summary"]["bytes_in"]
    assert w <= d["h2d_bytes"] <= 1.1 * w
    check_down(r, d, out)
    assert d["on_host"] == [] and not d["host_fallback"]
    check_pooled(nibble, deep_model, None, tmp_path, r, "--algo", "rtn_dq")


@pytest.mark.parametrize("algo,op", [("rtn_dq", "rtn"), ("rtn_lsq", "rtn_lsq")])
def test_rtn_prefetches_the_next_weight(nibble, ledger_model, tmp_path, algo, op):
    """rtn_dq and rtn_lsq keep weight i + 1 on the device (Backend::upload: a copy enqueued on the prefetch stream)
    before it quantizes weight i: every weight but the first goes up as a prefetch that the previous
    weight's launches overlap and is read in place; each still crosses the bus once, all of it through
    the pinned staging ring."""
    _, src, _ = ledger_model
    r, d, _ = _run(nibble, src, str(tmp_path), None, "--algo", algo)
    sizes = [w["bytes_in"] for w in r["weights"]]
    ops = d["ops"]
    assert len(sizes) > 2
    assert d["prefetches"] == ops["upload"]["prefetches"] == len(sizes) - 1
    assert d["prefetches_overlapped"] == d["prefetches"]
    assert d["prefetch_bytes"] == d["prefetch_bytes_overlapped"] == sum(sizes[1:])
    assert ops[op]["h2d_bytes"] == sizes[0]  # the others are read where their prefetch put them
    assert d["h2d_bytes"] == sum(sizes)
    assert d["staged_bytes"] == d["h2d_bytes"] + d["d2h_bytes"]
    assert d["staging_chunks"] >= 2 * ops[op]["calls"]


def test_awq_lite_moves_each_weight_and_each_gram_once(nibble, ledger_model, deep_model, tmp_path):
    """The search keeps each weight on the device (statistic, loss) and the quantizer reads that copy for
    W ⊙ s; each activation's Gram matrix goes up once, as float32, for its Cholesky factor, which never
    comes back."""
    _, src, npz = ledger_model
    r, d, out = _run(nibble, src, str(tmp_path), npz, "--algo", "awq_lite", "--layer_by_layer", "off")
    ops, w = d["ops"], r["summary"]["bytes_in"]
    acts = activations(src, r)
    assert ops["upload"]["h2d_bytes"] == w
    assert ops["scale_weight_f32"]["h2d_bytes"] <= ops["scale_weight_f32"]["calls"] * max(acts.values()) * 4
    assert ops["gram_cholesky_upper"]["calls"] == len(acts)
    assert ops["gram_cholesky_upper"]["h2d_bytes"] == gram_bytes(acts)
    assert ops["gram_cholesky_upper"]["d2h_bytes"] == 0
    assert w + gram_bytes(acts) <= d["h2d_bytes"] <= 1.1 * (w + gram_bytes(acts))
    check_down(r, d, out)
    check_on_host(d)
    assert d["on_host"] == ["awq_scale"]
    check_pooled(nibble, deep_model, npz, tmp_path, r, "--algo", "awq_lite", "--layer_by_layer", "off", held=True)


def test_awq_lite_modelopt_mode_moves_each_weight_and_each_gram_once(nibble, ledger_model, tmp_path):
    """ModelOpt's arithmetic on the device: its two passes (weight statistic, then losses) read the kept
    weight, W ⊙ s (rounded to the weight dtype) stays on the device for the quantizer, and each
    activation's Gram matrix goes up once for the GEMM form: nothing comes back but the codes and the
    choices."""
    _, src, npz = ledger_model
    r, d, out = _run(nibble, src, str(tmp_path), npz, "--algo", "awq_lite", "--awq_mode", "modelopt")
    ops, w = d["ops"], r["summary"]["bytes_in"]
    acts = activations(src, r)
    assert ops["upload"]["h2d_bytes"] == w + gram_bytes(acts)  # each weight once, each Gram matrix once
    assert ops["scale_weight"]["d2h_bytes"] == 0
    assert ops["rtn"]["h2d_bytes"] == 0
    assert w + gram_bytes(acts) <= d["h2d_bytes"] <= 1.1 * (w + gram_bytes(acts))
    check_down(r, d, out)
    check_on_host(d)


def test_awq_lite_layer_by_layer_is_pooled(nibble, ledger_model, deep_model, tmp_path):
    """One layer at a time: a layer's kept weights are freed when it is written, and the next layer's come
    from the pool."""
    _, src, npz = ledger_model
    flags = ("--algo", "awq_lite", "--layer_by_layer")
    r, d, out = _run(nibble, src, str(tmp_path), npz, *flags)
    w = r["summary"]["bytes_in"]
    assert d["ops"]["upload"]["h2d_bytes"] == w
    assert w <= d["h2d_bytes"] <= 1.1 * (w + gram_bytes(activations(src, r)))
    check_down(r, d, out)
    check_pooled(nibble, deep_model, npz, tmp_path, r, *flags)


@pytest.fixture(scope="module")
def engine_calib(ledger_model, tmp_path_factory):
    """64 tokens, fewer than the channels: an activation's rows weigh less on the bus than its Gram matrix."""
    spec, _, _ = ledger_model
    npz = str(tmp_path_factory.mktemp("engine_ledger") / "calib.npz")
    np.savez(npz, hidden=np.random.default_rng(4).standard_normal((4, 16, spec.hidden)).astype(np.float16))
    return npz, 4 * 16


def _native_pair(nibble, src, npz, tmp_path, flags):
    """The layer engine's run on the CPU and on the emulated device: the same bytes; the emulated report."""
    digests = {}
    for device in ("cpu", "cuda_emulated"):
        out = str(tmp_path / device / "model.onnx")
        nibble.quantize(src, out, *flags, "--calibration_engine", "native", "--calib_data", npz, "--calib_size", "4",
                        "--block_size", "32", "--device", device, "--report", str(tmp_path / f"{device}.json"),
                        "--force")
        digests[device] = folder_digest(os.path.dirname(out))
    assert digests["cpu"] == digests["cuda_emulated"]
    with open(tmp_path / "cuda_emulated.json") as f:
        return json.load(f)


NATIVE_RUNS = {"awq_lite": ("--algo", "awq_lite", "--layer_by_layer", "off"),
               "awq_lite_layers": ("--algo", "awq_lite", "--layer_by_layer", "on"),
               "awq_clip": ("--algo", "awq_clip"), "awq_full": ("--algo", "awq_full"),
               "mixed": ("--algo", "awq_lite", "--mixed_strategy", "sensitivity", "--layer_by_layer", "off"),
               "gptq": ("--algo", "gptq"), "awq_gptq": ("--algo", "awq_gptq"), "awq_learned": ("--algo", "awq_learned")}


@pytest.mark.parametrize("run", list(NATIVE_RUNS))
def test_native_statistics_stay_where_the_search_reads_them(nibble, ledger_model, deep_model, engine_calib, tmp_path,
                                                            run):
    """The layer engine's forward runs on the device, its statistics accumulate there and the searches read them
    there (AWQ's factor and loss, the clip search, the sensitivity losses, GPTQ's factor, learned rounding): only the calibration
    input (here the hidden states fed to the first layer) and the weights go up, each once (the search reads the
    forward's copies), no activation and no Gram matrix crosses the bus either way, only Σ|x| comes back, and the
    output is the CPU's byte for byte. Before, each Gram matrix went up for the search (awq_lite: W + Σ K² · 4
    bytes at least), and then, with the forward on the host, each activation's rows."""
    _, src, _ = ledger_model
    npz, tokens = engine_calib
    r = _native_pair(nibble, src, npz, tmp_path, NATIVE_RUNS[run])
    d = r["summary"]["device"]
    ops, w, acts = d["ops"], r["summary"]["bytes_in"], activations(src, r)
    engine = r["summary"]["calibration_engine"]
    batches = tokens * sum(acts.values()) * 4  # each activation's rows, float32: they no longer go up
    feeds = tokens * 128 * 2  # the hidden states fed to the first layer, fp16
    print(f"ledger {run}: W {w}, input {feeds}, activation rows {batches}, Gram matrices {gram_bytes(acts)}, "
          f"h2d {d['h2d_bytes']}, d2h {d['d2h_bytes']}")
    assert engine["forward_on_device"] and engine["activation_upload_bytes"] == feeds
    # Nothing of the forward but integer arithmetic on token positions runs on the host: no activation comes down.
    assert engine["host_operators"] == {}
    for op in ("forward_matmul", "forward_norm", "forward_binary", "forward_unary", "forward_strided"):
        assert ops[op]["calls"] > 0 and ops[op]["h2d_bytes"] == ops[op]["d2h_bytes"] == 0 and not ops[op]["host_fallback"]
    # Up by `upload`: the input and the weights (the forward's copies, which the search and the quantizer read;
    # the norms' gains), no activation row and no Gram matrix.
    assert feeds <= ops["upload"]["h2d_bytes"] <= 1.01 * (w + feeds)
    # The report still counts the rows the statistics read, and tools/ledger_bounds.py holds the run to its input.
    assert engine["statistics_row_bytes"] == batches
    if run == "awq_learned":  # its codes cross twice (GPTQ's come back to be learned, the learned go up to be
        # packed: one byte each, W / 2 for fp16 weights); its rounding reads W ⊙ s and XᵀX where they are
        learned = ops["learned_rounding"]
        assert learned["h2d_bytes"] <= 1.1 * w and learned["d2h_bytes"] <= 0.7 * w  # measured: 1.08 W, 0.63 W
    else:
        assert ledger_bounds.check(src, r, NATIVE_RUNS[run][1], 32) == []
    if run.startswith("awq_lite"):  # each weight once, the input once, and the searches' O(K) vectors
        assert w + feeds <= ops["upload"]["h2d_bytes"]
        assert d["h2d_bytes"] - ops["upload"]["h2d_bytes"] <= 64 * 4 * sum(acts.values())
        assert ops["gram_cholesky_upper"]["calls"] == len(acts)
        assert ops["gram_cholesky_upper"]["h2d_bytes"] == 0  # G is read where it accumulated
    stats = ops["accumulate_statistics"]
    assert stats["calls"] >= len(acts) and stats["h2d_bytes"] == stats["d2h_bytes"] == 0
    assert not stats["host_fallback"]
    # Down: Σ|x| of each activation (K float64: the AWQ scales are host arithmetic), no Gram matrix, then
    # check_down's bound on the rest (the packed output and the choices).
    assert ops["download"]["d2h_bytes"] == 8 * sum(acts.values())
    learned_down = ops["learned_rounding"]["d2h_bytes"] + ops["gptq_quantize"]["d2h_bytes"] if run == "awq_learned" else 0
    assert d["d2h_bytes"] - ops["download"]["d2h_bytes"] - learned_down <= 1.11 * r["summary"]["bytes_quantized_out"]
    check_on_host(d)
    if run == "awq_lite_layers":  # a group's statistics come from the pool: twice as deep, no more allocations
        deep = _native_pair(nibble, deep_model, npz, tmp_path / "deep", NATIVE_RUNS[run])
        assert len(deep["weights"]) > len(r["weights"])
        assert deep["summary"]["device"]["allocations"] == d["allocations"]


def test_awq_clip_moves_each_weight_and_each_activations_gram_blocks_once(nibble, ledger_model, deep_model,
                                                                          tmp_path):
    _, src, npz = ledger_model
    r, d, out = _run(nibble, src, str(tmp_path), npz, "--algo", "awq_clip")
    w, stats = r["summary"]["bytes_in"], gram_block_bytes(activations(src, r), 32)
    assert w <= d["h2d_bytes"] <= 1.1 * (w + stats)
    check_down(r, d, out)
    assert d["on_host"] == [] and not d["host_fallback"]
    check_pooled(nibble, deep_model, npz, tmp_path, r, "--algo", "awq_clip")


@pytest.mark.parametrize("algo", ["gptq", "awq_gptq"])
def test_gptq_moves_each_weight_and_each_gram_once(nibble, ledger_model, deep_model, tmp_path, algo):
    """GPTQ's factor reads each activation's float64 Gram once (it goes up as float64: K² · 8 bytes);
    awq_gptq's AWQ search reads it once more for its Cholesky factor, as float32 (exact there)."""
    _, src, npz = ledger_model
    r, d, out = _run(nibble, src, str(tmp_path), npz, "--algo", algo, "--layer_by_layer", "off")
    acts = activations(src, r)
    w, g32 = r["summary"]["bytes_in"], gram_bytes(acts)
    stats = 2 * g32 + (g32 if algo == "awq_gptq" else 0)
    # The float64 Gram once per activation, and its O(K) channel lists (order, energies, dead flags, 1/s).
    assert 2 * g32 <= d["ops"]["gptq_factor"]["h2d_bytes"] <= 2 * g32 + 25 * sum(acts.values())
    assert w <= d["h2d_bytes"] <= 1.1 * (w + stats)
    check_down(r, d, out)
    check_on_host(d)
    check_pooled(nibble, deep_model, npz, tmp_path, r, "--algo", algo, "--layer_by_layer", "off", held=algo == "awq_gptq")


@pytest.mark.parametrize("algo,fmt", [("hqq", "dq"), ("hqq", "matmulnbits"), ("rtn_dq", "matmulnbits"),
                                      ("rtn_lsq", "matmulnbits")])
def test_hqq_moves_each_weight_once(nibble, ledger_model, deep_model, tmp_path, algo, fmt):
    """Each weight once, and its packed output back. MatMulNBits: the quantizer leaves the codes, scales and
    integer zero points on the device, where the packings read them: nothing goes up for them, and only
    B, the scales (in their fp16 type) and the zero points come back."""
    _, src, _ = ledger_model
    flags = ("--algo", algo, "--format", fmt)
    r, d, out = _run(nibble, src, str(tmp_path), None, *flags)
    w = r["summary"]["bytes_in"]
    assert w <= d["h2d_bytes"] <= 1.1 * w
    if fmt == "matmulnbits":
        ops = d["ops"]
        for op in ("pack_matmulnbits_weight", "matmulnbits_scales"):
            assert ops[op]["calls"] == len(r["weights"]) and ops[op]["h2d_bytes"] == 0, (op, ops[op])
        # B [N, G, blob] comes back and nothing else: 4-bit codes, half a byte each.
        assert ops["pack_matmulnbits_weight"]["d2h_bytes"] == sum(x["shape"][0] * x["shape"][1] // 2
                                                                  for x in r["weights"])
        # The quantizer brings back its error sum (8 bytes) and HQQ its fractional zero points (fp16, as the
        # output stores them): codes, scales and integer zero points stay on the device.
        fzp = sum(-(-x["shape"][x["k_axis"]] // 32) * x["shape"][1 - x["k_axis"]] * 2 for x in r["weights"])
        quant = ops[{"hqq": "hqq", "rtn_dq": "rtn"}.get(algo, algo)]
        assert quant["d2h_bytes"] == 8 * quant["calls"] + (fzp if algo == "hqq" else 0)
    check_down(r, d, out)
    check_on_host(d)
    check_pooled(nibble, deep_model, None, tmp_path, r, *flags)


def _run_as_the_cpu(nibble, src, npz, tmp_path, flags):
    """The emulated device's run, whose output must be the CPU's byte for byte."""
    r, d, out = _run(nibble, src, str(tmp_path / "emu"), npz, *flags)
    cpu = str(tmp_path / "cpu" / "model.onnx")
    nibble.quantize(src, cpu, *flags, "--calib_data", npz, "--calib_size", "4", "--calibration_eps", "cpu",
                    "--block_size", "32", "--device", "cpu", "--force")
    emulated = {f: h for f, h in folder_digest(os.path.dirname(out)).items() if f != "r.json"}
    assert folder_digest(os.path.dirname(cpu)) == emulated
    return r, d, out


@pytest.mark.parametrize("flags", [("--algo", "awq_lite", "--layer_by_layer", "off"), ("--algo", "awq_clip"),
                                   ("--algo", "awq_lite", "--use_zero_point")],
                         ids=["awq_lite_whole_model", "awq_clip", "awq_lite_zp"])
def test_awq_matmulnbits_packs_where_the_quantizer_left_the_codes(nibble, ledger_model, tmp_path, flags):
    """AWQ into MatMulNBits: the quantizer of W ⊙ s leaves its codes on the device for the packing, the
    output is the CPU's byte for byte, and only the packed output comes back."""
    _, src, npz = ledger_model
    flags = (*flags, "--format", "matmulnbits")
    r, d, out = _run_as_the_cpu(nibble, src, npz, tmp_path, flags)
    ops = d["ops"]
    for op in ("pack_matmulnbits_weight", "matmulnbits_scales"):
        assert ops[op]["calls"] == len(r["weights"]) and ops[op]["h2d_bytes"] == 0, (op, ops[op])
    check_down(r, d, out)
    check_on_host(d)


@pytest.mark.parametrize("flags", [("--algo", "gptq"), ("--algo", "gptq", "--use_zero_point"),
                                   ("--algo", "awq_gptq", "--layer_by_layer", "off")],
                         ids=["gptq", "gptq_zp", "awq_gptq_whole_model"])
def test_gptq_matmulnbits_packs_where_the_sweep_left_the_codes(nibble, ledger_model, tmp_path, flags):
    """GPTQ into MatMulNBits: the sweep leaves its codes, scales and zero points on the device, the packings
    read them there (nothing goes up for them), the sweep brings back its error sum alone, and the output
    is the CPU's byte for byte."""
    _, src, npz = ledger_model
    flags = (*flags, "--format", "matmulnbits")
    r, d, out = _run_as_the_cpu(nibble, src, npz, tmp_path, flags)
    ops = d["ops"]
    for op in ("pack_matmulnbits_weight", "matmulnbits_scales"):
        assert ops[op]["calls"] == len(r["weights"]) and ops[op]["h2d_bytes"] == 0, (op, ops[op])
    if "--use_zero_point" in flags:
        assert ops["pack_matmulnbits_zero_points"]["h2d_bytes"] == 0
    assert ops["gptq_quantize"]["calls"] == len(r["weights"])
    assert ops["gptq_quantize"]["d2h_bytes"] == 8 * len(r["weights"])
    assert ops["pack_matmulnbits_weight"]["d2h_bytes"] == sum(x["shape"][0] * x["shape"][1] // 2 for x in r["weights"])
    assert ledger_bounds.check(src, r, flags[1], 32) == []
    check_down(r, d, out)
    check_on_host(d)


def test_mixed_by_sensitivity_moves_each_weight_once(nibble, ledger_model, deep_model, tmp_path):
    """awq_lite with the INT8 set chosen by sensitivity: the search, the 4- and 8-bit losses of every weight,
    the search again of the INT8 weights' inputs and the quantizer all read one kept copy of each weight.
    The Gram matrices go up for the search's factor, for the losses (kept for the sibling weights) and again
    for the INT8 inputs' second search: at most three times each."""
    _, src, npz = ledger_model
    flags = ("--algo", "awq_lite", "--mixed_strategy", "sensitivity", "--layer_by_layer", "off")  # the whole-model pass
    r, d, out = _run(nibble, src, str(tmp_path), npz, *flags)
    ops, w = d["ops"], r["summary"]["bytes_in"]
    acts = activations(src, r)
    assert ops["upload"]["h2d_bytes"] == w + gram_bytes(acts)  # each weight once, each Gram matrix once
    assert ops["awq_losses"]["h2d_bytes"] <= ops["awq_losses"]["calls"] * 12 * max(acts.values()) * 4
    assert w + 2 * gram_bytes(acts) <= d["h2d_bytes"] <= 1.1 * (w + 3 * gram_bytes(acts))
    check_down(r, d, out)
    check_on_host(d)
    check_pooled(nibble, deep_model, npz, tmp_path, r, *flags, held=True, grams_of=src)


# ---- The 7B-shaped model (tools/make_llama_shaped.py --layers 2, fp16) within a 1 GiB device: minutes of
# CPU per algorithm on the emulated device, so opt-in.

BIG = pytest.mark.skipif(os.environ.get("NIBBLE_BIG_TESTS") != "1", reason="set NIBBLE_BIG_TESTS=1 (minutes each)")


@pytest.fixture(scope="module")
def shaped_7b(tmp_path_factory):
    import subprocess
    import sys
    d = tmp_path_factory.mktemp("shaped7b")
    src = str(d / "model.onnx")
    tool = os.path.join(os.path.dirname(__file__), "..", "..", "tools", "make_llama_shaped.py")
    subprocess.run([sys.executable, tool, "--layers", "2", "--dtype", "fp16", "--out", src, "--quiet"], check=True)
    return src


@pytest.mark.slow
@BIG
@pytest.mark.parametrize("algo", ["rtn_dq", "hqq", "awq_lite", "awq_clip", "gptq"])
@pytest.mark.parametrize("budget_gib", [1, 8])
def test_7b_shaped_within_the_budget(nibble, shaped_7b, tmp_path, algo, budget_gib):
    """1 GiB: the peak stays within it, and only O(K) vector operations run on the host (GPTQ's K = 11008
    factor too is made on the device, in its float64 Hessian's memory); what does not fit goes up again
    (awq_lite's MLP weights for its quantizer). 8 GiB, room for every statistic: the ledger's bounds as on
    the small model."""
    out, report = str(tmp_path / "model.onnx"), str(tmp_path / "r.json")
    calib = [] if algo in ("rtn_dq", "hqq") else ["--use_random_calib", "--calib_size", "2", "--calib_seq_len", "16",
                                         "--calibration_eps", "cpu", "--awqlite_alpha_step", "0.5"]
    res = nibble.run("quantize", "--onnx_path", shaped_7b, "--output_path", out, "--algo", algo, *calib, "--device",
                     "cuda_emulated", "--device_memory", f"{budget_gib}GiB", "--report", report, "--force",
                     timeout=7200)
    assert res.returncode == 0, res.describe()
    with open(report) as f:
        r = json.load(f)
    s, d = r["summary"], r["summary"]["device"]
    assert s["device_memory_budget_bytes"] == budget_gib << 30
    assert s["peak_device_memory_bytes"] <= budget_gib << 30
    if budget_gib > 1:
        assert ledger_bounds.check(shaped_7b, r, algo, 128) == []
    check_down(r, d, out)
    check_on_host(d)
