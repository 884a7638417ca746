"""--config presets (configs/*.toml) and the --report record of every option.

CLI11 2.1.2 (Debian 12) never reads a subcommand's config file, so nibble applies it itself
(cli/main.cc apply_config): these tests check that a preset's values arrive, that command-line flags
win over it, that an empty TOML array means an empty list, and that a bad file is one error line.
"""
from __future__ import annotations

import glob
import json
import os
import re
import tomllib

import pytest

from .conftest import REPO
from .test_calib import make_tiny

CONFIGS = sorted(glob.glob(os.path.join(REPO, "configs", "*.toml")))
OPTIONS_H = os.path.join(REPO, "host", "options.h")
CALIB_H = os.path.join(REPO, "calib", "calibration.h")


def error_lines(r) -> list[str]:
    return [ln for ln in r.stderr.splitlines() if ln.strip()]


def report_of(nibble, src, out_dir, *args, **kw) -> dict:
    rep = os.path.join(out_dir, "report.json")
    nibble.quantize(src, os.path.join(out_dir, "model.onnx"), "--report", rep, "--quiet", *args, **kw)
    with open(rep) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    """Decoder with input_ids and a tokenizer (calibration works on it), 5 quantizable MatMuls."""
    return make_tiny(str(tmp_path_factory.mktemp("tiny_cfg")))


# --------------------------------------------------------------------------------------- presets

def test_presets_exist():
    names = {os.path.basename(p) for p in CONFIGS}
    assert {"modelopt-default.toml", "best-accuracy.toml", "fastest.toml", "smallest.toml"} <= names, names
    readme = open(os.path.join(REPO, "configs", "README.md")).read()
    missing = [n for n in names if n not in readme]
    assert not missing, f"configs/README.md does not list {missing}"


@pytest.mark.parametrize("preset", CONFIGS, ids=os.path.basename)
def test_preset_loads_and_command_line_wins(nibble, tiny, tmp_path, preset):
    """Every key of the preset reaches the run (report options), except the ones the command line
    gives: a small calibration here, to keep the test fast."""
    with open(preset, "rb") as f:
        values = tomllib.load(f)
    assert values, f"{preset} is empty"
    text = open(preset).read()
    assert text.lstrip().startswith("#"), f"{preset} should start with a comment saying why"
    override = {"calib_size": 2, "calib_seq_len": 16, "block_size": 16}
    args = [a for k, v in override.items() for a in (f"--{k}", str(v))]
    rep = report_of(nibble, tiny, str(tmp_path), "--config", preset, *args)
    opts = rep["options"]
    assert opts["config"] == preset
    for k, v in values.items():
        want = override.get(k, v)
        assert k in opts, f"{preset}: key {k} is not a nibble option"
        got = opts[k]
        if isinstance(want, float):
            assert got == pytest.approx(want), (k, got, want)
        else:
            assert got == want, f"{preset}: {k} = {got!r} in the report, {want!r} expected"
    for k, v in override.items():
        assert opts[k] == v, (k, opts[k])
    # Embedding tables keep their own --gather_block_size.
    assert all(w["block_size"] == 16 or w["bits"] == 8 or w["op_type"] == "Gather" for w in rep["weights"]), \
        rep["weights"]


def test_config_values_and_overrides(nibble, model_cache, tmp_path):
    spec, src = model_cache.llama()
    cfg = tmp_path / "p.toml"
    cfg.write_text('# a preset\nalgo = "rtn_dq"\nblock_size = 16   # trailing comment\n'
                   'use_zero_point = true\nnodes_to_exclude = []\nformat = "matmulnbits"\n')
    rep = report_of(nibble, src, str(tmp_path / "a"), "--config", str(cfg))
    o = rep["options"]
    assert (o["algo"], o["block_size"], o["use_zero_point"], o["nodes_to_exclude"], o["format"]) == \
        ("rtn_dq", 16, True, [], "matmulnbits"), o
    assert any(w["node"].startswith("/lm_head") for w in rep["weights"]), "nodes_to_exclude = [] must quantize lm_head"
    assert all(w["block_size"] == 16 and w["zero_point"] for w in rep["weights"])

    # the command line wins: a value, a flag switched off, a list
    rep = report_of(nibble, src, str(tmp_path / "b"), "--block_size", "32", "--config", str(cfg),
                    "--use_zero_point=false", "--nodes_to_exclude", "/lm_head", "--format", "dq")
    o = rep["options"]
    assert (o["algo"], o["block_size"], o["use_zero_point"], o["nodes_to_exclude"], o["format"]) == \
        ("rtn_dq", 32, False, ["/lm_head"], "dq"), o
    assert not any(w["node"].startswith("/lm_head") for w in rep["weights"])
    assert all(w["block_size"] == 32 and not w["zero_point"] for w in rep["weights"])


def test_config_gives_the_paths(nibble, model_cache, tmp_path):
    """A [quantize] section is accepted, and required flags may come from the file."""
    spec, src = model_cache.llama()
    out = tmp_path / "o" / "model.onnx"
    cfg = tmp_path / "paths.toml"
    cfg.write_text(f'[quantize]\nonnx_path = "{src}"\noutput_path = "{out}"\nalgo = "rtn"\n')
    r = nibble.run("quantize", "--config", str(cfg), "--quiet")
    assert r.returncode == 0, r.describe()
    assert out.exists()


def test_config_ini_syntax(nibble, model_cache, tmp_path):
    spec, src = model_cache.llama()
    cfg = tmp_path / "p.ini"
    cfg.write_text("; INI comment\n[quantize]\nalgo=rtn_dq\nblock_size=64\n")
    rep = report_of(nibble, src, str(tmp_path / "a"), "--config", str(cfg))
    assert rep["options"]["block_size"] == 64 and rep["options"]["algo"] == "rtn_dq"


@pytest.mark.parametrize("content,what", [
    (None, "no such file"),
    ("DIR", "not a regular file"),
    ('algoo = "rtn_dq"\n', "unknown key 'algoo'"),
    ('block_size = "abc"\n', "block_size"),
    ("use_zero_point = maybe\n", "use_zero_point"),
    ('[other]\nalgo = "rtn_dq"\n', "other.algo"),
    ('config = "x.toml"\n', "unknown key 'config'"),
    ('algo = "nope"\n', "--algo nope is unknown"),   # a value the pipeline refuses
])
def test_bad_config_is_one_error_line(nibble, model_cache, tmp_path, content, what):
    spec, src = model_cache.llama()
    cfg = tmp_path / "bad.toml"
    if content == "DIR":
        cfg.mkdir()
    elif content is not None:
        cfg.write_text(content)
    out = tmp_path / "o" / "model.onnx"
    r = nibble.quantize(src, str(out), "--config", str(cfg), check=False)
    assert r.returncode != 0, r.describe()
    lines = error_lines(r)
    assert len(lines) == 1 and lines[0].startswith("nibble: error:") and what in lines[0], r.describe()
    if what != "--algo nope is unknown":
        assert str(cfg) in lines[0], r.describe()
    assert not out.exists()


# --------------------------------------------------------------------------------------- report

def help_flags(nibble) -> set[str]:
    r = nibble.run("quantize", "--help")
    assert r.returncode == 0, r.describe()
    return set(re.findall(r"^\s+--([a-z0-9_]+)", r.stdout, re.M)) - {"help"}


def struct_fields(path: str, struct: str) -> set[str]:
    body = open(path).read().split("struct " + struct + " {", 1)[1].split("\n};", 1)[0]
    return set(re.findall(r"^  (?:[\w:<>]+)\s+(\w+)(?:\s*=[^;]*|\{[^;]*\})?;", body, re.M))


def option_fields() -> set[str]:
    """Every field of QuantizeOptions under its flag's name: the calibration flags live in its
    CalibrationOptions member (--calibration_engine in its engine), --mixed_strategy in mixed_strategy_flag, --use_zero_point in zero_point_flag,
    --awq_mode in arithmetic."""
    fields = struct_fields(OPTIONS_H, "QuantizeOptions") - {"calib", "mixed_strategy_flag", "zero_point_flag",
                                                            "arithmetic"}
    fields |= {"mixed_strategy", "use_zero_point", "awq_mode"}
    # threads, quiet: set from --threads/--quiet; engine is --calibration_engine; layer_engine and
    # engine_fallback: the engine the run opens and why auto did not (no flag); calibration_eps_given: whether
    # --calibration_eps was given (the report echoes the flag)
    fields |= struct_fields(CALIB_H, "CalibrationOptions") - {"threads", "quiet", "engine", "layer_engine",
                                                               "engine_fallback", "calibration_eps_given"}
    fields |= {"calibration_engine"}
    return fields


def test_report_records_every_option(nibble, model_cache, tmp_path):
    spec, src = model_cache.llama()
    cfg = tmp_path / "p.toml"
    cfg.write_text('algo = "rtn_dq"\n')
    rep = report_of(nibble, src, str(tmp_path / "a"), "--config", str(cfg), "--block_size", "32",
                    "--threads", "2", "--awq_mode", "modelopt", "--calib_seq_len", "64")
    opts = rep["options"]
    flags, fields = help_flags(nibble), option_fields()
    assert len(flags) > 30 and len(fields) > 30, (flags, fields)
    assert not flags - opts.keys(), f"flags missing from the report: {sorted(flags - opts.keys())}"
    assert not fields - opts.keys(), f"QuantizeOptions fields missing from the report: {sorted(fields - opts.keys())}"
    assert not opts.keys() - flags, f"report options that are no flag: {sorted(opts.keys() - flags)}"
    assert opts["config"] == str(cfg) and opts["algo"] == "rtn_dq" and opts["block_size"] == 32
    assert opts["threads"] == 2 and opts["awq_mode"] == "modelopt" and opts["calib_seq_len"] == 64
    assert opts["quiet"] is True and opts["force"] is False and opts["report"].endswith("report.json")
    s = rep["summary"]
    for k in ("seconds", "peak_rss_bytes", "output_bytes", "bytes_in", "mse"):
        assert k in s, k
