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

# The cache keeps ONNX Runtime's statistics: the runs without one that these compare with use it too.
ARGS = ["--algo", "awq_lite", "--block_size", "16", "--calib_size", "4", "--calib_seq_len", "8",
        "--calibration_engine", "ort"]


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


# --- An entry is written whole or not at all (kill points), checked before use, and shared by runs ----------

def cache_listing(cache: str) -> list[str]:
    return sorted(os.listdir(cache))


def one_entry(cache: str) -> list[str]:
    """The listing of a cache with exactly one entry and its lock, nothing else."""
    names = cache_listing(cache)
    keys = [n for n in names if len(n) == 16 and os.path.isdir(os.path.join(cache, n))]
    assert len(keys) == 1 and names == [keys[0], keys[0] + ".lock"], names
    return keys


def cmd(nibble, tiny, out, data, cache) -> list[str]:
    return [nibble.binary, "quantize", "--onnx_path", tiny, "--output_path", out, *ARGS, "--dataset", data,
            "--calib_cache", cache]


@pytest.fixture(scope="module")
def uncached(nibble, tiny, tmp_path_factory):
    """The calibration data and the output of a run without a cache."""
    d = tmp_path_factory.mktemp("uncached")
    data = str(d / "calib.jsonl")
    write_jsonl(data, 7)
    out = str(d / "out" / "model.onnx")
    nibble.quantize(tiny, out, *ARGS, "--dataset", data)
    return data, read_all(out)


# Where a run is killed -> what the next run says about the cache.
CACHE_KILL_POINTS = {
    "calib_capture_written": "empty",     # capture.py killed with nibble: statistics written, no index
    "calib_cache_complete": "empty",      # the entry complete and synced under its temporary name
    "calib_cache_renamed": "reusing",     # the entry renamed into place, the run not finished
}


@pytest.mark.parametrize("point", list(CACHE_KILL_POINTS))
def test_kill_during_a_cache_write_leaves_no_entry_or_a_whole_one(nibble, tiny, uncached, tmp_path, point):
    import signal
    import subprocess
    data, fresh = uncached
    cache = str(tmp_path / "cache")
    env = dict(os.environ, NIBBLE_TEST_KILL_AT=point)
    p = subprocess.run(cmd(nibble, tiny, str(tmp_path / "a" / "model.onnx"), data, cache), env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == -signal.SIGKILL, f"not killed at '{point}': rc {p.returncode}\n{p.stderr}"
    out = str(tmp_path / "b" / "model.onnx")
    r = nibble.quantize(tiny, out, *ARGS, "--dataset", data, "--calib_cache", cache)
    lines = cache_lines(r.stderr)
    assert len(lines) == 1 and CACHE_KILL_POINTS[point] in lines[0], r.describe()
    assert read_all(out) == fresh
    one_entry(cache)                      # the killed run's temporary folder is gone


def test_torn_or_foreign_entry_is_said_and_recomputed(nibble, tiny, uncached, tmp_path):
    data, fresh = uncached
    cache = str(tmp_path / "cache")
    nibble.quantize(tiny, str(tmp_path / "a" / "model.onnx"), *ARGS, "--dataset", data, "--calib_cache", cache)
    key = one_entry(cache)[0]
    entry = os.path.join(cache, key)
    gram = sorted(n for n in os.listdir(entry) if "gram" in n)[0]
    with open(os.path.join(entry, gram), "r+b") as f:       # torn: a statistics file cut short
        f.truncate(os.path.getsize(os.path.join(entry, gram)) // 2)
    out = str(tmp_path / "b" / "model.onnx")
    r = nibble.quantize(tiny, out, *ARGS, "--dataset", data, "--calib_cache", cache)
    lines = cache_lines(r.stderr)
    assert len(lines) == 1 and "not used" in lines[0] and gram in lines[0] and "bytes" in lines[0], r.describe()
    assert read_all(out) == fresh
    # Foreign: an entry whose settings are not the ones its name stands for (copied in by hand).
    with open(os.path.join(entry, "settings.json")) as f:
        settings = json.load(f)
    settings["calib_size"] = 99
    with open(os.path.join(entry, "settings.json"), "w") as f:
        json.dump(settings, f)
    out = str(tmp_path / "c" / "model.onnx")
    r = nibble.quantize(tiny, out, *ARGS, "--dataset", data, "--calib_cache", cache)
    lines = cache_lines(r.stderr)
    assert len(lines) == 1 and "not this run's" in lines[0] and "calib_size" in lines[0], r.describe()
    assert read_all(out) == fresh
    assert one_entry(cache) == [key]


def waits_for_a_lock(pid: int) -> bool:
    """/proc/locks lists a process blocked on a lock as '<n>: -> FLOCK ... <pid> ...'."""
    with open("/proc/locks") as f:
        return any("->" in ln and ln.split("->", 1)[1].split()[3] == str(pid) for ln in f)


def test_two_runs_writing_one_entry_take_turns(nibble, tiny, uncached, tmp_path):
    """Run A stops (SIGSTOP) with its entry complete but not renamed, holding the entry's lock; run B,
    same settings, waits for it, then reuses A's entry. Both outputs equal a run without a cache."""
    import signal
    import subprocess
    import time
    data, fresh = uncached
    cache = str(tmp_path / "cache")
    env = dict(os.environ, NIBBLE_TEST_STOP_AT="calib_cache_complete")
    out_a, out_b = str(tmp_path / "a" / "model.onnx"), str(tmp_path / "b" / "model.onnx")
    a = subprocess.Popen(cmd(nibble, tiny, out_a, data, cache), env=env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
    b = None
    try:
        t0 = time.monotonic()
        while True:
            assert a.poll() is None, f"A exited with {a.returncode} instead of stopping: {a.stderr.read()}"
            with open(f"/proc/{a.pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "T":
                    break
            assert time.monotonic() - t0 < 120, "A did not reach its stop point"
            time.sleep(0.01)
        b = subprocess.Popen(cmd(nibble, tiny, out_b, data, cache), stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
        while not waits_for_a_lock(b.pid):   # B blocked in flock on the entry's lock
            assert b.poll() is None, f"B did not wait for A's entry: {b.stderr.read()}"
            assert time.monotonic() - t0 < 240, "B did not wait for the entry's lock"
            time.sleep(0.01)
    finally:
        a.send_signal(signal.SIGCONT)
        assert a.wait(timeout=120) == 0, a.stderr.read()
    err_b = b.communicate(timeout=120)[1]
    assert b.returncode == 0, err_b
    lines = cache_lines(err_b)
    assert len(lines) == 2 and "waiting" in lines[0] and "reusing" in lines[1], err_b
    assert read_all(out_a) == fresh and read_all(out_b) == fresh
    one_entry(cache)


def test_a_new_entry_replaces_older_ones_no_run_holds(nibble, tiny, uncached, tmp_path):
    data, _ = uncached
    cache = str(tmp_path / "cache")
    nibble.quantize(tiny, str(tmp_path / "a" / "model.onnx"), *ARGS, "--dataset", data, "--calib_cache", cache)
    first = one_entry(cache)
    nibble.quantize(tiny, str(tmp_path / "b" / "model.onnx"), *ARGS, "--dataset", data, "--calib_cache", cache,
                    "--use_fp32")
    assert one_entry(cache) != first
