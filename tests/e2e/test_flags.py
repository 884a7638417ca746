"""Flags of ModelOpt's command line: each acts, or says at run time in one line why it has no effect.

Model: test_calib's tiny ORT-GenAI-like decoder (H=24, I=40, vocabulary 64), block 16.
"""
from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

from .conftest import data_file
from .test_calib import make_npz, make_tiny

BLOCK = ["--block_size", "16"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    return make_tiny(str(tmp_path_factory.mktemp("flags_tiny")))


@pytest.fixture(scope="module")
def tiny_pos(tmp_path_factory) -> str:
    return make_tiny(str(tmp_path_factory.mktemp("flags_tinypos")), position_ids=True, symbolic_kv=True)


def no_effect_lines(stderr: str, flag: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if flag in ln and "no effect" in ln]


def read_all(out: str) -> bytes:
    with open(out, "rb") as f, open(data_file(out), "rb") as g:
        return f.read() + g.read()


def test_use_random_calib_is_seeded_and_needs_no_tokenizer(nibble, tiny, tmp_path):
    """--use_random_calib calibrates on random token ids: no tokenizer needed, two runs give the same
    bytes, and the model differs from one calibrated on other data (the flag acts)."""
    folder = tmp_path / "m"
    folder.mkdir()
    for f in ("model.onnx", "model.onnx.data", "genai_config.json"):   # no tokenizer files
        shutil.copy(os.path.join(os.path.dirname(tiny), f), folder)
    model = str(folder / "model.onnx")
    args = ["--algo", "awq_lite", *BLOCK, "--calib_size", "4", "--calib_seq_len", "16"]
    outs = []
    for i in range(2):
        out = str(tmp_path / f"r{i}" / "model.onnx")
        r = nibble.quantize(model, out, *args, "--use_random_calib")
        assert "random token ids" in r.stderr, r.describe()
        outs.append(read_all(out))
    assert outs[0] == outs[1]
    npz = make_npz(str(tmp_path), 4, 16, np.random.default_rng(3), pad=False)
    other = str(tmp_path / "npz" / "model.onnx")
    nibble.quantize(model, other, *args, "--calib_data", npz)
    assert read_all(other) != outs[0]


def test_use_random_calib_and_calib_data_contradict(nibble, tiny, tmp_path):
    npz = make_npz(str(tmp_path), 2, 8, np.random.default_rng(3))
    r = nibble.quantize(tiny, str(tmp_path / "o" / "model.onnx"), "--algo", "awq_lite", *BLOCK,
                        "--use_random_calib", "--calib_data", npz, check=False)
    assert r.returncode != 0 and r.stderr.strip().splitlines()[-1].startswith("nibble: error: "), r.describe()
    assert "--use_random_calib" in r.stderr.strip().splitlines()[-1]


CASES = {
    "gather_block_size": (["--algo", "rtn_dq", "--gather_block_size", "64"], "--gather_block_size 64"),
    "alpha_step_modelopt": (["--algo", "awq_lite", "--awq_mode", "modelopt", "--awqlite_alpha_step", "0.5"],
                            "--awqlite_alpha_step 0.5"),
    "bsz_col_nibble": (["--algo", "awq_clip", "--awqclip_bsz_col", "64"], "--awqclip_bsz_col 64"),
    "no_position_ids_without_input": (["--algo", "awq_lite", "--no_position_ids"], "--no_position_ids"),
    "add_position_ids_with_input": (["--algo", "awq_lite", "--add_position_ids"], "--add_position_ids"),
    "random_calib_rtn": (["--algo", "rtn_dq", "--use_random_calib"], "--use_random_calib"),
    "gptq_act_order_rtn": (["--algo", "rtn_dq", "--gptq_act_order"], "--gptq_act_order"),
    "gptq_percdamp_awq": (["--algo", "awq_lite", "--gptq_percdamp", "0.1"], "--gptq_percdamp 0.1"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_inert_flag_says_so_in_one_line(nibble, tiny, tiny_pos, tmp_path, case):
    args, flag = CASES[case]
    model = tiny_pos if case == "add_position_ids_with_input" else tiny
    npz = make_npz(str(tmp_path), 2, 8, np.random.default_rng(5), position_ids=model == tiny_pos)
    calib = ["--calib_data", npz, "--calib_size", "2"] if args[1] != "rtn_dq" else []
    r = nibble.quantize(model, str(tmp_path / "o" / "model.onnx"), *args, *BLOCK, *calib)
    assert len(no_effect_lines(r.stderr, flag)) == 1, r.describe()
    # the same run without the flag says nothing of the kind
    plain = [a for a in args if a not in flag.split()]
    r = nibble.quantize(model, str(tmp_path / "p" / "model.onnx"), *plain, *BLOCK, *calib)
    assert not [ln for ln in r.stderr.splitlines() if "no effect" in ln], r.describe()


def test_model_name_hub_name_resolves_through_the_local_cache(nibble, tiny, tmp_path, monkeypatch):
    """ModelOpt's --model_name takes a hub name: nibble finds its snapshot in the Hugging Face cache
    (refs/main), and without one says in one line where it looked and how to point at a folder."""
    folder = tmp_path / "m"
    folder.mkdir()
    for f in ("model.onnx", "model.onnx.data", "genai_config.json"):     # no tokenizer beside the model
        shutil.copy(os.path.join(os.path.dirname(tiny), f), folder)
    model = str(folder / "model.onnx")
    cache = tmp_path / "hub"
    snap = cache / "models--acme--Tiny-1B" / "snapshots" / "0123abcd"
    snap.mkdir(parents=True)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(os.path.dirname(tiny), f), snap)
    (cache / "models--acme--Tiny-1B" / "refs").mkdir()
    (cache / "models--acme--Tiny-1B" / "refs" / "main").write_text("0123abcd")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    data = tmp_path / "d.txt"
    data.write_text(" ".join(f"w{i % 50}" for i in range(400)) + "\n")
    args = ["--algo", "awq_lite", *BLOCK, "--calib_size", "4", "--calib_seq_len", "16", "--dataset", str(data)]
    hub = str(tmp_path / "hub_out" / "model.onnx")
    r = nibble.quantize(model, hub, *args, "--model_name", "acme/Tiny-1B")
    assert "Hugging Face cache" in r.stderr, r.describe()
    direct = str(tmp_path / "dir_out" / "model.onnx")
    nibble.quantize(model, direct, *args, "--model_name", str(snap))
    assert read_all(hub) == read_all(direct)

    r = nibble.quantize(model, str(tmp_path / "x" / "model.onnx"), *args, "--model_name", "meta-llama/Meta-Llama-3-8B",
                        check=False)
    last = r.stderr.strip().splitlines()[-1]
    assert r.returncode != 0 and last.startswith("nibble: error: "), r.describe()
    assert "--model_name meta-llama/Meta-Llama-3-8B" in last and "models--meta-llama--Meta-Llama-3-8B" in last
    assert "--model_name FOLDER" in last and "--tokenizer" not in last, last
