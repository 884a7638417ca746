"""Independent numpy reference of nibble's RTN quantizer (= ModelOpt's, reference doc §2.2-2.5, §11.1).

Numerics follow numpy semantics in the WEIGHT dtype: the arrays stay float16 for fp16 models and
every constant is a Python scalar (NEP 50 "weak" scalars do not promote), exactly as ModelOpt's
numpy path computes them:

  symmetric : s = max(amax/7, 1e-5)                 q = clip(rint(W/s), -8, 7)        (INT4)
  zero point: s = max(mx-mn, 1e-5)/15               z = clip(-rint(mn/s), 0, 15)
              q = clip(rint(W/s) + z, 0, 15)                                             (UINT4)

Blocks are `bs` consecutive rows along K of one output column of W [K, N].  A partial last block
is zero-padded for the statistics only (so mn/mx include 0 there).  block_size -1 = one block of
length K (per channel), scales 1-D [N].

Layouts:
  * ONNX INT4/UINT4: row-major over the tensor's dims, element 2i in the low nibble of byte i.
  * MatMulNBits:     B[n, g, j] = u[g*bs+2j, n] | u[g*bs+2j+1, n] << 4 with u the unsigned code
                     (q+8 symmetric, q with zp); positions beyond K hold 8 (sym) / zp.
                     zero_points[n, g//2] packs g even in the low nibble.
"""
from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass
class Quantized:
    """RTN result for a weight viewed as W [K, N] (blocks along K)."""
    q: np.ndarray            # [K, N] int8 (symmetric, -8..7) or uint8 (zero point, 0..15)
    scale: np.ndarray        # [G, N] weight dtype, or [N] per channel
    zp: np.ndarray | None    # like scale, uint8 0..15, zero-point mode only
    block_size: int          # as requested (-1 = per channel)
    K: int
    N: int

    @property
    def per_channel(self) -> bool:
        return self.block_size == -1

    @property
    def bs(self) -> int:
        """Effective block length along K."""
        return self.K if self.per_channel else self.block_size

    @property
    def G(self) -> int:
        return -(-self.K // self.bs)

    def scale_2d(self) -> np.ndarray:
        """[G, N] scales (per channel: [1, N])."""
        return self.scale.reshape(self.G, self.N)

    def zp_2d(self) -> np.ndarray:
        return self.zp.reshape(self.G, self.N)

    def dequant(self) -> np.ndarray:
        """W_hat [K, N] in the weight dtype: q*s (or (q-z)*s) rounded once to the weight dtype,
        which is what DequantizeLinear/MatMulNBits compute (the product is exact in fp32)."""
        return dequant(self.q, self.scale_2d(), self.bs, None if self.zp is None else self.zp_2d())


def _rep(a: np.ndarray, bs: int, K: int) -> np.ndarray:
    return np.repeat(a, bs, axis=0)[:K]


def rtn_quantize(w: np.ndarray, block_size: int, zero_point: bool = False) -> Quantized:
    """Quantize w [K, N] (float32 or float16) along K.  See module doc."""
    assert w.ndim == 2 and w.dtype in (np.float32, np.float16), (w.shape, w.dtype)
    K, N = w.shape
    bs = K if block_size == -1 else block_size
    G = -(-K // bs)
    pad = G * bs - K
    wp = np.concatenate([w, np.zeros((pad, N), w.dtype)], axis=0) if pad else w
    blocks = wp.reshape(G, bs, N)
    if not zero_point:
        amax = np.abs(blocks).max(axis=1)                     # [G, N]
        s = np.maximum(amax / 7, 1e-5)                         # weak python scalars: stays in w.dtype
        assert s.dtype == w.dtype
        q = np.clip(np.rint(w / _rep(s, bs, K)), -8, 7).astype(np.int8)
        z = None
    else:
        mx = blocks.max(axis=1)
        mn = blocks.min(axis=1)
        s = np.maximum(mx - mn, 1e-5) / 15
        assert s.dtype == w.dtype
        zf = np.clip(-np.rint(mn / s), 0, 15)
        assert zf.dtype == w.dtype
        q = np.clip(np.rint(w / _rep(s, bs, K)) + _rep(zf, bs, K), 0, 15).astype(np.uint8)
        z = zf.astype(np.uint8)
    if block_size == -1:
        s = s.reshape(N)
        z = None if z is None else z.reshape(N)
    return Quantized(q=q, scale=s, zp=z, block_size=block_size, K=K, N=N)


def dequant(q: np.ndarray, s2d: np.ndarray, bs: int, z2d: np.ndarray | None = None) -> np.ndarray:
    """(q - z) * s, computed exactly in float64 and rounded once to the scale dtype."""
    K = q.shape[0]
    qq = q.astype(np.float64)
    if z2d is not None:
        qq = qq - _rep(z2d.astype(np.float64), bs, K)
    return (qq * _rep(s2d.astype(np.float64), bs, K)).astype(s2d.dtype)


def mse(w: np.ndarray, qz: Quantized) -> float:
    """Mean squared error (float64) of the dequantized weight vs the float weight."""
    d = qz.dequant().astype(np.float64) - w.astype(np.float64)
    return float(np.mean(d * d))


# --------------------------------------------------------------------------------------------
# What ORT's QuantizeLinear computes (format qdq: codes are produced at run time by ORT)
# --------------------------------------------------------------------------------------------

def ort_quantize_linear(w: np.ndarray, s2d: np.ndarray, bs: int, z2d: np.ndarray | None, signed: bool,
                        truncate: bool = False) -> np.ndarray:
    """QuantizeLinear along K as ONNX Runtime's CPU kernel evaluates it: x/scale in float32 (fp16
    inputs are widened first), round half to even, + zero point, saturate.  truncate=True models
    ORT's fp16 per-axis/per-tensor kernel, which truncates toward zero instead of rounding
    (onnxruntime issue #18576 / #22741, fixed by PR #32452; blocked fp16 rounds correctly)."""
    K = w.shape[0]
    v = w.astype(np.float32) / _rep(s2d.astype(np.float32), bs, K)
    v = np.trunc(v) if truncate else np.rint(v)
    if z2d is not None:
        v = v + _rep(z2d.astype(np.float32), bs, K)
    lo, hi = (-8, 7) if signed else (0, 15)
    return np.clip(v, lo, hi).astype(np.int8 if signed else np.uint8)


# --------------------------------------------------------------------------------------------
# Packing
# --------------------------------------------------------------------------------------------

def pack_int4(codes: np.ndarray) -> bytes:
    """ONNX INT4/UINT4 raw_data: row-major flatten, element 2i -> low nibble of byte i."""
    flat = (codes.astype(np.int16).ravel() & 0xF).astype(np.uint8)
    if flat.size % 2:
        flat = np.concatenate([flat, np.zeros(1, np.uint8)])
    return (flat[0::2] | (flat[1::2] << 4)).astype(np.uint8).tobytes()


def unpack_int4(raw: bytes, shape: tuple[int, ...], signed: bool) -> np.ndarray:
    """Inverse of pack_int4: int8 (sign-extended) or uint8 array of `shape`."""
    n = int(np.prod(shape)) if shape else 1
    b = np.frombuffer(raw, np.uint8)
    assert b.size == (n + 1) // 2, f"INT4 raw_data holds {b.size} bytes, {(n + 1) // 2} expected for shape {shape}"
    flat = np.empty(b.size * 2, np.uint8)
    flat[0::2] = b & 0xF
    flat[1::2] = b >> 4
    flat = flat[:n]
    if signed:
        return np.where(flat >= 8, flat.astype(np.int16) - 16, flat).astype(np.int8).reshape(shape)
    return flat.reshape(shape)


def matmulnbits_block_size(qz: Quantized) -> int:
    """MatMulNBits block_size: the block size, or for per channel the smallest power of two >= max(16, K)."""
    if not qz.per_channel:
        return qz.block_size
    b = 16
    while b < qz.K:
        b *= 2
    return b


def pack_matmulnbits(qz: Quantized) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, int]:
    """(B uint8 [N, G, bs/2], scales [N, G] weight dtype, zero_points uint8 [N, ceil(G/2)] | None, bs)."""
    K, N = qz.K, qz.N
    bs = matmulnbits_block_size(qz)
    G = -(-K // bs)
    assert G == qz.G or qz.per_channel
    if qz.zp is None:
        u = (qz.q.astype(np.int16) + 8).astype(np.uint8)
        pad_code = np.full((G * bs - K, N), 8, np.uint8)
    else:
        u = qz.q.astype(np.uint8)
        pad_code = _rep(qz.zp_2d(), bs, G * bs)[K:]
    up = np.concatenate([u, pad_code], axis=0)                   # [G*bs, N]
    blk = up.reshape(G, bs // 2, 2, N)
    B = (blk[:, :, 0, :] | (blk[:, :, 1, :] << 4)).astype(np.uint8)  # [G, bs/2, N]
    B = np.ascontiguousarray(B.transpose(2, 0, 1))               # [N, G, bs/2]
    scales = np.ascontiguousarray(qz.scale_2d().T)               # [N, G]
    zps = None
    if qz.zp is not None:
        z = qz.zp_2d().T.astype(np.uint8)                        # [N, G]
        if G % 2:
            z = np.concatenate([z, np.zeros((N, 1), np.uint8)], axis=1)
        zps = np.ascontiguousarray(z[:, 0::2] | (z[:, 1::2] << 4))  # [N, ceil(G/2)]
    return B, scales, zps, bs


def unpack_matmulnbits(B: np.ndarray, K: int) -> np.ndarray:
    """u [K, N] (unsigned codes) from B [N, G, bs/2]; drops the padding rows."""
    N, G, half = B.shape
    u = np.empty((N, G, half, 2), np.uint8)
    u[..., 0] = B & 0xF
    u[..., 1] = B >> 4
    return u.reshape(N, G * half * 2)[:, :K].T.copy()


def dequant_matmulnbits(B: np.ndarray, scales: np.ndarray, zps: np.ndarray | None, K: int, bs: int) -> np.ndarray:
    """W_hat [K, N] as MatMulNBits computes it (zero point default 8)."""
    N, G, _ = B.shape
    u = unpack_matmulnbits(B, K).astype(np.float64)
    if zps is None:
        z = np.full((N, G), 8.0)
    else:
        zz = np.empty((N, zps.shape[1] * 2), np.uint8)
        zz[:, 0::2] = zps & 0xF
        zz[:, 1::2] = zps >> 4
        z = zz[:, :G].astype(np.float64)
    s = scales.reshape(N, G).astype(np.float64)
    return ((u - _rep(z.T, bs, K)) * _rep(s.T, bs, K)).astype(scales.dtype)


def bits_equal(a: np.ndarray, b: np.ndarray) -> bool:
    """Bitwise equality of two float arrays of the same dtype and shape."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    u = {2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize]
    return bool(np.array_equal(np.ascontiguousarray(a).view(u), np.ascontiguousarray(b).view(u)))
