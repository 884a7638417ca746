"""Bad input -> exit code != 0, ONE line on stderr starting 'nibble: error:' that names the
file / tensor / flag at fault, no crash (no signal), and nothing left in the output folder.
The input folder is byte-identical afterwards (checked by Nibble.quantize for every run)."""
from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto

from . import models as M
from .conftest import Graph, data_file, folder_digest, listing

WEIGHT_F64 = "model.up_proj.weight_f64"


def assert_error(r, out_dir: str | None, before: list[str] | None, names: tuple[str, ...], contains: str = ""):
    assert r.returncode != 0, f"expected failure, got exit 0\n{r.describe()}"
    assert 0 < r.returncode < 128, f"exit code {r.returncode}: crashed or killed by a signal\n{r.describe()}"
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, f"stderr must be exactly one line, got {len(lines)}\n{r.describe()}"
    msg = lines[0]
    assert msg.startswith("nibble: error:"), f"stderr does not start with 'nibble: error:': {msg!r}"
    if names:
        assert any(n in msg for n in names), f"error message names none of {names}: {msg!r}"
    if contains:
        assert contains in msg, f"error message lacks {contains!r}: {msg!r}"
    if out_dir is not None:
        assert listing(out_dir) == before, (f"output folder changed by the failed run: before {before}, "
                                            f"after {listing(out_dir)}")
    return msg


@pytest.fixture
def dirs(tmp_path):
    """(input folder, empty output folder)."""
    i, o = tmp_path / "in", tmp_path / "out"
    i.mkdir()
    o.mkdir()
    return str(i), str(o)


def external_model(folder: str, name: str = "model.onnx") -> str:
    """Small fp32 llama (1 layer) with one external data file next to it."""
    return M.save(M.make_llama(M.LlamaSpec(layers=1)), os.path.join(folder, name))


def ext_tensors(model_path: str) -> tuple[str, ...]:
    """Names of the initializers stored in external data (any of them may be the one reported)."""
    return tuple(t.name for t in Graph(model_path).inits.values() if t.data_location == TensorProto.EXTERNAL)


def rewrite_external(model_path: str, tensor: str, **fields) -> None:
    """Change external_data key/values of one initializer in the graph file (data file untouched)."""
    m = onnx.load(model_path, load_external_data=False)
    t = next(t for t in m.graph.initializer if t.name == tensor)
    assert t.data_location == TensorProto.EXTERNAL
    kv = {e.key: e.value for e in t.external_data}
    kv.update({k: str(v) for k, v in fields.items()})
    del t.external_data[:]
    for k, v in kv.items():
        e = t.external_data.add()
        e.key, e.value = k, v
    with open(model_path, "wb") as f:
        f.write(m.SerializeToString())


def fail_run(nibble, src, out_dir, *args, names=(), contains="", out_name="model.onnx"):
    before = listing(out_dir)
    r = nibble.quantize(src, os.path.join(out_dir, out_name), *args, check=False)
    return assert_error(r, out_dir, before, names, contains)


# --------------------------------------------------------------------------------------------
# Unreadable / malformed input
# --------------------------------------------------------------------------------------------

def test_not_onnx(nibble, dirs):
    i, o = dirs
    src = os.path.join(i, "random.onnx")
    data = np.random.default_rng(1).integers(0, 256, 4096, dtype=np.uint8).tobytes()
    with open(src, "wb") as f:
        f.write(data)
    with pytest.raises(Exception):
        onnx.load_model_from_string(data)  # precondition: really not a valid protobuf
    fail_run(nibble, src, o, "--algo", "rtn_dq", names=("random.onnx",))


def test_missing_input(nibble, dirs):
    i, o = dirs
    fail_run(nibble, os.path.join(i, "nope.onnx"), o, "--algo", "rtn_dq", names=("nope.onnx",))


def test_truncated_protobuf(nibble, dirs):
    i, o = dirs
    blob = M.make_single_matmul(weight="model.up.weight").SerializeToString()
    cut = blob[: len(blob) // 2]  # the middle of the 8 KiB raw_data field
    with pytest.raises(Exception):
        onnx.load_model_from_string(cut)
    src = os.path.join(i, "truncated.onnx")
    with open(src, "wb") as f:
        f.write(cut)
    fail_run(nibble, src, o, "--algo", "rtn_dq", names=("truncated.onnx",))


def test_missing_external_data_file(nibble, dirs):
    i, o = dirs
    src = external_model(i)
    os.remove(src + ".data")
    fail_run(nibble, src, o, "--algo", "rtn_dq", names=("model.onnx.data",) + ext_tensors(src))


@pytest.mark.parametrize("case", ["offset", "length", "huge_offset"])
def test_external_data_out_of_range(nibble, dirs, case):
    i, o = dirs
    src = external_model(i)
    size = os.path.getsize(src + ".data")
    tensor = "model.layers.0.mlp.down_proj.MatMul.weight"
    info = {e.key: e.value for e in Graph(src).inits[tensor].external_data}
    off = int(info["offset"])
    if case == "offset":
        rewrite_external(src, tensor, offset=size + 64)
    elif case == "length":
        rewrite_external(src, tensor, length=size - off + 4)
    else:
        rewrite_external(src, tensor, offset=2 ** 63 - 8)
    fail_run(nibble, src, o, "--algo", "rtn_dq", names=(tensor, "model.onnx.data"))


@pytest.mark.parametrize("location", ["../model.onnx.data", "sub/../../model.onnx.data"])
def test_external_location_escapes_folder(nibble, tmp_path, location):
    """The referenced file exists and is valid, it is just outside the model's folder."""
    src = external_model(str(tmp_path / "in"))
    os.makedirs(tmp_path / "in" / "sub")
    os.rename(src + ".data", tmp_path / "model.onnx.data")
    for t in Graph(src).inits.values():
        if t.data_location == TensorProto.EXTERNAL:
            rewrite_external(src, t.name, location=location)
    o = str(tmp_path / "out")
    os.makedirs(o)
    fail_run(nibble, src, o, "--algo", "rtn_dq", names=(location,) + ext_tensors(src))


def test_external_location_absolute(nibble, tmp_path):
    src = external_model(str(tmp_path / "in"))
    elsewhere = str(tmp_path / "elsewhere" / "weights.bin")
    os.makedirs(os.path.dirname(elsewhere))
    os.rename(src + ".data", elsewhere)
    for t in Graph(src).inits.values():
        if t.data_location == TensorProto.EXTERNAL:
            rewrite_external(src, t.name, location=elsewhere)
    o = str(tmp_path / "out")
    os.makedirs(o)
    fail_run(nibble, src, o, "--algo", "rtn_dq", names=(elsewhere, "weights.bin") + ext_tensors(src))


def test_float64_weight(nibble, dirs):
    i, o = dirs
    src = M.save(M.make_single_matmul(np.float64, weight=WEIGHT_F64), os.path.join(i, "model.onnx"), "inline")
    fail_run(nibble, src, o, "--algo", "rtn_dq", names=(WEIGHT_F64,))


def test_nothing_to_quantize(nibble, dirs):
    i, o = dirs
    src = M.save(M.make_no_matmul(), os.path.join(i, "plain.onnx"), "inline")
    fail_run(nibble, src, o, "--algo", "rtn_dq", names=("plain.onnx",))


# --------------------------------------------------------------------------------------------
# Output path problems
# --------------------------------------------------------------------------------------------

def test_output_exists_needs_force(nibble, dirs):
    i, o = dirs
    src = external_model(i)
    out = os.path.join(o, "model.onnx")
    with open(out, "wb") as f:
        f.write(b"precious")
    fail_run(nibble, src, o, "--algo", "rtn_dq", names=(out, "model.onnx"))
    with open(out, "rb") as f:
        assert f.read() == b"precious"
    nibble.quantize(src, out, "--algo", "rtn_dq", "--force")
    onnx.checker.check_model(out)
    assert sorted(listing(o)) == sorted(["model.onnx", os.path.basename(data_file(out))])


def test_output_under_regular_file(nibble, tmp_path):
    """Output folder cannot be created (a path component is a regular file)."""
    src = external_model(str(tmp_path / "in"))
    blocker = tmp_path / "file.txt"
    blocker.write_bytes(b"x")
    before = listing(str(tmp_path / "in"))
    r = nibble.quantize(src, str(blocker / "sub" / "out.onnx"), "--algo", "rtn_dq", check=False)
    assert_error(r, None, None, names=("file.txt",))
    assert blocker.read_bytes() == b"x"
    assert listing(str(tmp_path / "in")) == before
    assert sorted(os.listdir(tmp_path)) == ["file.txt", "in"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions (covered by test_output_under_regular_file)")
def test_output_folder_not_writable(nibble, dirs):
    i, o = dirs
    src = external_model(i)
    os.chmod(o, 0o555)
    try:
        fail_run(nibble, src, o, "--algo", "rtn_dq", names=(o, "out"))
    finally:
        os.chmod(o, 0o755)


@pytest.mark.parametrize("alias", ["same", "dotdot"])
def test_output_same_as_input(nibble, dirs, alias):
    i, _ = dirs
    src = external_model(i)
    os.makedirs(os.path.join(i, "sub"))
    out = src if alias == "same" else os.path.join(i, "sub", "..", "model.onnx")
    before = listing(i)
    r = nibble.quantize(src, out, "--algo", "rtn_dq", "--force", check=False)  # hashes the input folder
    assert_error(r, i, before, names=("model.onnx",))


def test_output_data_file_never_clobbers_input_data(nibble, dirs):
    """Derived from 'the input files are byte-identical after any run': OUT=b.onnx in the input
    folder, whose b.onnx.data (the name older versions gave OUT's data, which an overwrite removes) is
    the input's external data file -> with --force the run writes its own data file and leaves every
    input file as it was."""
    i, _ = dirs
    src = external_model(i, "a.onnx")
    os.rename(os.path.join(i, "a.onnx.data"), os.path.join(i, "b.onnx.data"))
    for t in Graph(src).inits.values():
        if t.data_location == TensorProto.EXTERNAL:
            rewrite_external(src, t.name, location="b.onnx.data")
    before = folder_digest(i)
    out = os.path.join(i, "b.onnx")
    r = nibble.run("quantize", "--onnx_path", src, "--output_path", out, "--algo", "rtn_dq", "--force")
    assert r.returncode == 0, r.describe()
    after = folder_digest(i)
    assert {k: after[k] for k in before} == before
    assert sorted(set(after) - set(before)) == sorted(["b.onnx", os.path.basename(data_file(out))])


# --------------------------------------------------------------------------------------------
# Bad flags
# --------------------------------------------------------------------------------------------

def test_unknown_algo(nibble, dirs):
    i, o = dirs
    src = external_model(i)
    fail_run(nibble, src, o, "--algo", "gptq_magic", names=("gptq_magic", "--algo", "algo"))


@pytest.mark.parametrize("bs", ["100", "8", "0", "-2", "abc"])
def test_bad_block_size(nibble, dirs, bs):
    i, o = dirs
    src = external_model(i)
    fail_run(nibble, src, o, "--algo", "rtn_dq", "--block_size", bs, names=("block_size", bs))


def test_unknown_format(nibble, dirs):
    i, o = dirs
    src = external_model(i)
    fail_run(nibble, src, o, "--algo", "rtn_dq", "--format", "gguf", names=("gguf", "format"))


@pytest.mark.parametrize("flag,value", [("--awqclip_alpha_step", "0"), ("--awqclip_alpha_min", "1.5"),
                                        ("--awqclip_bsz_col", "0")])
def test_awq_clip_bad_grid_flags(nibble, dirs, flag, value):
    """awq_clip / awq_full: a bad clip-grid flag is one clear error line, before any work."""
    i, o = dirs
    src = external_model(i)
    fail_run(nibble, src, o, "--algo", "awq_clip", flag, value, names=(flag.lstrip("-"),))


@pytest.mark.parametrize("algo", [None, "awq_lite", "awq_clip", "awq_full"])
def test_awq_lite_needs_a_decoder_or_npz(nibble, dirs, algo):
    """--algo defaults to awq_lite (ModelOpt's default); a model without input_ids cannot be calibrated
    from text: one error line naming the model and the way out (--calib_data)."""
    i, o = dirs
    src = external_model(i)
    args = [] if algo is None else ["--algo", algo]
    fail_run(nibble, src, o, *args, names=("input_ids",), contains="--calib_data")
