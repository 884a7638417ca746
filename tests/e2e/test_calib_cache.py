"""--calib_cache: statistics are reused only when everything they depend on is the same, contents of
the input files included, and the log says whether the cache was used and why not.

Model: test_calib's tiny ORT-GenAI-like decoder (H=24, I=40), awq_lite, block 16, text calibration
from a .jsonl file of random words.
"""
from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

from .conftest import data_file
from .test_calib import make_tiny, random_texts

ARGS = ["--algo", "awq_lite", "--block_size", "16", "--calib_size", "4", "--calib_seq_len", "8"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    return make_tiny(str(tmp_path_factory.mktemp("cache_tiny")))


def write_jsonl(path: str, seed: int) -> None:
    with open(path, "w") as f:
        for t in random_texts(4, np.random.default_rng(seed), lo=12, hi=20):
            f.write(json.dumps({"text": t}) + "\n")


def read_all(out: str) -> bytes:
    with open(out, "rb") as f, open(data_file(out), "rb") as g:
        return f.read() + g.read()


def cache_lines(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if "--calib_cache" in ln]


def test_dataset_rewritten_in_place_is_not_reused(nibble, tiny, tmp_path):
    data = str(tmp_path / "calib.jsonl")
    cache = str(tmp_path / "cache")
    write_jsonl(data, 1)
    first = str(tmp_path / "a" / "model.onnx")
    r = nibble.quantize(tiny, first, *ARGS, "--dataset", data, "--calib_cache", cache)
    assert any("empty" in ln for ln in cache_lines(r.stderr)), r.describe()
    write_jsonl(data, 2)                      # other texts, same name
    second = str(tmp_path / "b" / "model.onnx")
    r = nibble.quantize(tiny, second, *ARGS, "--dataset", data, "--calib_cache", cache)
    lines = cache_lines(r.stderr)
    assert len(lines) == 1 and "not reused" in lines[0] and "calib.jsonl" in lines[0], r.describe()
    fresh = str(tmp_path / "c" / "model.onnx")
    nibble.quantize(tiny, fresh, *ARGS, "--dataset", data)
    assert read_all(second) == read_all(fresh)          # calibrated on the new texts
    assert read_all(second) != read_all(first)
    third = str(tmp_path / "d" / "model.onnx")
    r = nibble.quantize(tiny, third, *ARGS, "--dataset", data, "--calib_cache", cache)
    assert any("reusing" in ln for ln in cache_lines(r.stderr)), r.describe()
    assert read_all(third) == read_all(fresh)


def test_model_data_rewritten_in_place_is_not_reused(nibble, tiny, tmp_path):
    folder = tmp_path / "m"
    shutil.copytree(os.path.dirname(tiny), folder)
    model = str(folder / "model.onnx")
    data = str(tmp_path / "calib.jsonl")
    write_jsonl(data, 3)
    cache = str(tmp_path / "cache")
    nibble.quantize(model, str(tmp_path / "a" / "model.onnx"), *ARGS, "--dataset", data, "--calib_cache", cache)
    with open(folder / "model.onnx.data", "r+b") as f:    # one weight byte changed, same size and name
        f.seek(100)
        b = f.read(1)
        f.seek(100)
        f.write(bytes([b[0] ^ 0x40]))
    r = nibble.quantize(model, str(tmp_path / "b" / "model.onnx"), *ARGS, "--dataset", data, "--calib_cache", cache)
    lines = cache_lines(r.stderr)
    assert len(lines) == 1 and "not reused" in lines[0] and "model.onnx.data" in lines[0], r.describe()


@pytest.mark.parametrize("flag", ["--use_fp32", "--use_buffer_share", "--model_name"])
def test_settings_that_change_the_feeds_are_in_the_key(nibble, tiny, tmp_path, flag):
    data = str(tmp_path / "calib.jsonl")
    write_jsonl(data, 4)
    cache = str(tmp_path / "cache")
    nibble.quantize(tiny, str(tmp_path / "a" / "model.onnx"), *ARGS, "--dataset", data, "--calib_cache", cache)
    extra = [flag]
    if flag == "--model_name":
        tok = tmp_path / "tok"
        tok.mkdir()
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(os.path.join(os.path.dirname(tiny), f), tok)
        extra.append(str(tok))
    r = nibble.quantize(tiny, str(tmp_path / "b" / "model.onnx"), *ARGS, "--dataset", data, "--calib_cache", cache,
                        *extra)
    lines = cache_lines(r.stderr)
    assert len(lines) == 1 and "not reused" in lines[0] and flag.lstrip("-") in lines[0], r.describe()
