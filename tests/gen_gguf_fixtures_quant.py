"""Helpers for tests/gen_gguf_fixtures.py: a byte-level GGUF v3 serializer (valid and
deliberately broken files), random but valid K-quant blocks, a numpy port of ggml's
quantize_row_q4_K_ref, and an optional cross-check against ggml-quants.c compiled from the
llama-cpp-python sdist.

Nothing here touches the network or the repository; the caller decides where files go.
"""

from __future__ import annotations

import ctypes
import os
import struct
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

# ---------------------------------------------------------------------------------------
# GGUF constants (ggml/include/gguf.h, ggml/include/ggml.h of the vendored llama.cpp)
# ---------------------------------------------------------------------------------------

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32

# gguf_type
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
VTYPE_NAMES = ["UINT8", "INT8", "UINT16", "INT16", "UINT32", "INT32", "FLOAT32", "BOOL",
               "STRING", "ARRAY", "UINT64", "INT64", "FLOAT64"]
_SCALAR_FMT = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f",
               BOOL: "<?", U64: "<Q", I64: "<q", F64: "<d"}


def gguf_str(s: str | bytes) -> bytes:
    b = s.encode("utf-8") if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def pack_value(vtype: int, value: Any, sub_type: int | None = None) -> bytes:
    """The value part of a KV pair (without the leading type code)."""
    if vtype in _SCALAR_FMT:
        return struct.pack(_SCALAR_FMT[vtype], value)
    if vtype == STR:
        return gguf_str(value)
    if vtype == ARR:
        assert sub_type is not None
        out = struct.pack("<IQ", sub_type, len(value))
        for item in value:
            if sub_type == ARR:      # nested array: item = (inner_sub_type, inner_values)
                out += pack_value(ARR, item[1], item[0])
            else:
                out += pack_value(sub_type, item)
        return out
    raise ValueError(vtype)


def pad_to(n: int, align: int) -> int:
    return (n + align - 1) // align * align


@dataclass
class RawTensor:
    name: str
    ne: list[int]              # GGUF order: ne[0] = fastest-varying (columns)
    ggml_type: int
    data: bytes
    offset: int | None = None  # relative to the data section; None = next aligned slot
    n_dims: int | None = None  # override the dimension count written (malformed files)
    store: bool = True         # False: describe the tensor but write none of its bytes


@dataclass
class RawGGUF:
    """Serialises GGUF exactly like gguf-py's GGUFWriter (checked byte for byte by the
    generator), with hooks to break any field."""
    kvs: list[tuple[str, int, Any, int | None]] = field(default_factory=list)
    tensors: list[RawTensor] = field(default_factory=list)
    alignment: int = DEFAULT_ALIGNMENT
    magic: bytes = GGUF_MAGIC
    version: int = 3
    n_tensors: int | None = None   # override the header counts
    n_kv: int | None = None
    trailing_padding: bool = True  # GGUFWriter pads after the last tensor too
    raw_kv_bytes: bytes | None = None  # replace the whole KV section

    def kv(self, key: str, vtype: int, value: Any, sub_type: int | None = None) -> "RawGGUF":
        self.kvs.append((key, vtype, value, sub_type))
        return self

    def layout(self) -> list[int]:
        """Offsets of every tensor relative to the data section (auto ones filled in)."""
        offs, cur = [], 0
        for t in self.tensors:
            o = cur if t.offset is None else t.offset
            offs.append(o)
            cur = pad_to(o + len(t.data), self.alignment)
        return offs

    def header(self) -> bytes:
        """Everything before the alignment padding that precedes the data section."""
        out = bytearray()
        out += self.magic
        out += struct.pack("<I", self.version)
        out += struct.pack("<Q", len(self.tensors) if self.n_tensors is None else self.n_tensors)
        out += struct.pack("<Q", len(self.kvs) if self.n_kv is None else self.n_kv)
        if self.raw_kv_bytes is not None:
            out += self.raw_kv_bytes
        else:
            for key, vtype, value, sub in self.kvs:
                out += gguf_str(key) + struct.pack("<I", vtype) + pack_value(vtype, value, sub)
        for t, o in zip(self.tensors, self.layout()):
            nd = len(t.ne) if t.n_dims is None else t.n_dims
            out += gguf_str(t.name) + struct.pack("<I", nd)
            for d in t.ne:
                out += struct.pack("<q", d)
            out += struct.pack("<I", t.ggml_type) + struct.pack("<Q", o)
        return bytes(out)

    def data_start(self) -> int:
        return pad_to(len(self.header()), self.alignment)

    def build(self) -> bytes:
        out = bytearray(self.header())
        out += b"\0" * (self.data_start() - len(out))
        blob = bytearray()
        for t, o in zip(self.tensors, self.layout()):
            if not t.store:
                continue
            if len(blob) < o + len(t.data):
                blob += b"\0" * (o + len(t.data) - len(blob))
            blob[o:o + len(t.data)] = t.data
        if self.tensors and self.trailing_padding:
            blob += b"\0" * (pad_to(len(blob), self.alignment) - len(blob))
        out += blob
        return bytes(out)


def dump_json(obj, width: int = 240) -> str:
    """Indented JSON whose small objects / arrays stay on one line (keeps the files small)."""
    import json

    def enc(o, ind):
        flat = json.dumps(o, ensure_ascii=False)
        if len(flat) + ind <= width or not isinstance(o, (dict, list)) or not o:
            return flat
        pad = " " * (ind + 1)
        if isinstance(o, dict):
            items = [f"{pad}{json.dumps(k, ensure_ascii=False)}: {enc(v, ind + 1)}" for k, v in o.items()]
            return "{\n" + ",\n".join(items) + "\n" + " " * ind + "}"
        items = [pad + enc(v, ind + 1) for v in o]
        return "[\n" + ",\n".join(items) + "\n" + " " * ind + "]"
    return enc(obj, 0) + "\n"


# ---------------------------------------------------------------------------------------
# random, valid K-quant blocks (every bit pattern of scales/qs is meaningful; only the
# f16 super-block scales are constrained to finite values)
# ---------------------------------------------------------------------------------------

QK_K = 256
BLOCK_BYTES = {"Q2_K": 84, "Q3_K": 110, "Q4_K": 144, "Q5_K": 176, "Q6_K": 210}

# f16 scale edge cases injected into the "rand_edge" tensors: 0, smallest subnormal,
# largest subnormal, a negative scale, the largest finite half, -0.0
F16_EDGE = [0x0000, 0x0001, 0x03FF, 0xB800, 0x7BFF, 0x8000]


def _f16_scale(rng: np.random.Generator, n: int, lo: float, hi: float) -> np.ndarray:
    v = np.exp(rng.uniform(np.log(lo), np.log(hi), n)).astype(np.float16)
    return v.view(np.uint16)


def random_k_blocks(qtype: str, n_blocks: int, rng: np.random.Generator,
                    edge: bool = False) -> np.ndarray:
    """uint8 [n_blocks, type_size]. Field order as in ggml-common.h."""
    nb = n_blocks
    rb = lambda n: rng.integers(0, 256, (nb, n), dtype=np.uint8)  # noqa: E731
    d = _f16_scale(rng, nb, 1e-4, 1e-2)
    dmin = _f16_scale(rng, nb, 1e-4, 1e-2)
    if edge:
        for i in range(nb):
            d[i] = F16_EDGE[i % len(F16_EDGE)]
            dmin[i] = F16_EDGE[(i + 3) % len(F16_EDGE)]
    h = lambda a: a.astype("<u2").view(np.uint8).reshape(nb, 2)  # noqa: E731
    if qtype == "Q2_K":      # scales[16] qs[64] d dmin
        parts = [rb(16), rb(64), h(d), h(dmin)]
    elif qtype == "Q3_K":    # hmask[32] qs[64] scales[12] d
        parts = [rb(32), rb(64), rb(12), h(d)]
    elif qtype == "Q4_K":    # d dmin scales[12] qs[128]
        parts = [h(d), h(dmin), rb(12), rb(128)]
    elif qtype == "Q5_K":    # d dmin scales[12] qh[32] qs[128]
        parts = [h(d), h(dmin), rb(12), rb(32), rb(128)]
    elif qtype == "Q6_K":    # ql[128] qh[64] scales[16] (int8) d
        parts = [rb(128), rb(64), rb(16), h(d)]
    else:
        raise ValueError(qtype)
    out = np.concatenate(parts, axis=1)
    assert out.shape == (nb, BLOCK_BYTES[qtype])
    return out


def random_mxfp4_blocks(n_blocks: int, rng: np.random.Generator, edge: bool = False) -> np.ndarray:
    e = rng.integers(112, 136, (n_blocks, 1), dtype=np.uint8)
    if edge:
        e[:, 0] = [(0, 1, 2, 127, 250)[i % 5] for i in range(n_blocks)]
    qs = rng.integers(0, 256, (n_blocks, 16), dtype=np.uint8)
    return np.concatenate([e, qs], axis=1)


# ---------------------------------------------------------------------------------------
# numpy port of quantize_row_q4_K_ref (ggml/src/ggml-quants.c), strict IEEE f32, one
# operation at a time in C's order (no fused multiply-add, sequential sums)
# ---------------------------------------------------------------------------------------

f32 = np.float32


def _nearest_int(v: np.ndarray) -> np.ndarray:
    # ggml's nearest_int adds 12582912.f and reads the mantissa: round half to even
    return np.rint(v.astype(f32)).astype(np.int64)


def _make_qkx2_quants(x: np.ndarray, w: np.ndarray, nmax: int, rmin: float, rdelta: float,
                      nstep: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x, w: [B, n] f32 (B independent sub-blocks). Returns (scale [B], the_min [B], L [B, n])."""
    B, n = x.shape
    mn = x[:, 0].copy()
    mx = x[:, 0].copy()
    sum_w = w[:, 0].copy()
    sum_x = (sum_w * x[:, 0]).astype(f32)
    for i in range(1, n):
        mn = np.where(x[:, i] < mn, x[:, i], mn)
        mx = np.where(x[:, i] > mx, x[:, i], mx)
        sum_w = (sum_w + w[:, i]).astype(f32)
        sum_x = (sum_x + (w[:, i] * x[:, i]).astype(f32)).astype(f32)
    mn = np.where(mn > 0, f32(0), mn).astype(f32)
    flat = mx == mn
    rng_ = np.where(flat, f32(1), (mx - mn).astype(f32)).astype(f32)
    iscale = (f32(nmax) / rng_).astype(f32)
    scale = (f32(1) / iscale).astype(f32)
    L = np.zeros((B, n), dtype=np.int64)
    best = np.zeros(B, dtype=f32)
    for i in range(n):
        l = _nearest_int((iscale * (x[:, i] - mn).astype(f32)).astype(f32))
        L[:, i] = np.clip(l, 0, nmax)
        diff = ((scale * L[:, i].astype(f32)).astype(f32) + mn).astype(f32)
        diff = (diff - x[:, i]).astype(f32)
        diff = (diff * diff).astype(f32)
        best = (best + (w[:, i] * diff).astype(f32)).astype(f32)
    for is_ in range(nstep + 1):
        isc = ((f32(rmin) + (f32(rdelta) * f32(is_)).astype(f32)).astype(f32) + f32(nmax)).astype(f32)
        # C reads the current `min` here: it changes when a step is taken below
        rng_ = np.where(flat, f32(1), (mx - mn).astype(f32)).astype(f32)
        isc = (isc / rng_).astype(f32)
        sum_l = np.zeros(B, f32)
        sum_l2 = np.zeros(B, f32)
        sum_xl = np.zeros(B, f32)
        Laux = np.zeros((B, n), dtype=np.int64)
        for i in range(n):
            l = np.clip(_nearest_int((isc * (x[:, i] - mn).astype(f32)).astype(f32)), 0, nmax)
            Laux[:, i] = l
            lf = l.astype(f32)
            wl = (w[:, i] * lf).astype(f32)
            sum_l = (sum_l + wl).astype(f32)
            sum_l2 = (sum_l2 + (wl * lf).astype(f32)).astype(f32)
            sum_xl = (sum_xl + (wl * x[:, i]).astype(f32)).astype(f32)
        D = ((sum_w * sum_l2).astype(f32) - (sum_l * sum_l).astype(f32)).astype(f32)
        ok = D > 0
        Ds = np.where(ok, D, f32(1)).astype(f32)
        this_scale = (((sum_w * sum_xl).astype(f32) - (sum_x * sum_l).astype(f32)).astype(f32) / Ds).astype(f32)
        this_min = (((sum_l2 * sum_x).astype(f32) - (sum_l * sum_xl).astype(f32)).astype(f32) / Ds).astype(f32)
        pos = this_min > 0
        sl2 = np.where(sum_l2 == 0, f32(1), sum_l2).astype(f32)
        this_scale = np.where(pos, (sum_xl / sl2).astype(f32), this_scale).astype(f32)
        this_min = np.where(pos, f32(0), this_min).astype(f32)
        cur = np.zeros(B, f32)
        for i in range(n):
            diff = ((this_scale * Laux[:, i].astype(f32)).astype(f32) + this_min).astype(f32)
            diff = (diff - x[:, i]).astype(f32)
            diff = (diff * diff).astype(f32)
            cur = (cur + (w[:, i] * diff).astype(f32)).astype(f32)
        take = ok & (cur < best) & ~flat
        L = np.where(take[:, None], Laux, L)
        best = np.where(take, cur, best)
        scale = np.where(take, this_scale, scale)
        mn = np.where(take, this_min, mn)
    scale = np.where(flat, f32(0), scale).astype(f32)
    L = np.where(flat[:, None], 0, L)
    return scale, (-mn).astype(f32), L


def quantize_q4_k_ref(x: np.ndarray) -> np.ndarray:
    """float32 [..., k*256] -> uint8 [..., k*144], as quantize_row_q4_K_ref."""
    x = np.ascontiguousarray(x, dtype=f32)
    shape = x.shape
    assert shape[-1] % QK_K == 0
    xb = x.reshape(-1, QK_K)
    nb = xb.shape[0]
    sub = xb.reshape(nb * 8, 32)
    sum_x2 = np.zeros(nb * 8, f32)
    for l in range(32):
        sum_x2 = (sum_x2 + (sub[:, l] * sub[:, l]).astype(f32)).astype(f32)
    av_x = np.sqrt((sum_x2 / f32(32)).astype(f32)).astype(f32)
    w = (av_x[:, None] + np.abs(sub)).astype(f32)
    scales, mins, L = _make_qkx2_quants(sub, w, 15, -1.0, 0.1, 20)
    scales = scales.reshape(nb, 8)
    mins = mins.reshape(nb, 8)
    L = L.reshape(nb, 8, 32)
    max_scale = np.zeros(nb, f32)
    max_min = np.zeros(nb, f32)
    for j in range(8):
        max_scale = np.where(scales[:, j] > max_scale, scales[:, j], max_scale)
        max_min = np.where(mins[:, j] > max_min, mins[:, j], max_min)
    safe = lambda a: np.where(a > 0, a, f32(1)).astype(f32)  # noqa: E731
    inv_scale = np.where(max_scale > 0, (f32(63) / safe(max_scale)).astype(f32), f32(0)).astype(f32)
    inv_min = np.where(max_min > 0, (f32(63) / safe(max_min)).astype(f32), f32(0)).astype(f32)
    ls = np.minimum(63, _nearest_int((inv_scale[:, None] * scales).astype(f32)) & 0xFF)
    lm = np.minimum(63, _nearest_int((inv_min[:, None] * mins).astype(f32)) & 0xFF)
    sc = np.zeros((nb, 12), dtype=np.int64)
    for j in range(8):
        if j < 4:
            sc[:, j] = ls[:, j]
            sc[:, j + 4] = lm[:, j]
        else:
            sc[:, j + 4] = (ls[:, j] & 0xF) | ((lm[:, j] & 0xF) << 4)
            sc[:, j - 4] |= (ls[:, j] >> 4) << 6
            sc[:, j] |= (lm[:, j] >> 4) << 6
    d16 = (max_scale / f32(63)).astype(f32).astype(np.float16)
    dmin16 = (max_min / f32(63)).astype(f32).astype(np.float16)
    d = d16.astype(f32)
    dmin = dmin16.astype(f32)
    for j in range(8):
        if j < 4:
            s, m = sc[:, j] & 63, sc[:, j + 4] & 63
        else:
            s = (sc[:, j + 4] & 0xF) | ((sc[:, j - 4] >> 6) << 4)
            m = (sc[:, j + 4] >> 4) | ((sc[:, j] >> 6) << 4)
        dd = (d * s.astype(f32)).astype(f32)
        dm = (dmin * m.astype(f32)).astype(f32)
        nz = dd != 0
        dd_s = np.where(nz, dd, f32(1)).astype(f32)
        q = _nearest_int((((xb[:, 32 * j:32 * j + 32] + dm[:, None]).astype(f32)) / dd_s[:, None]).astype(f32))
        q = np.clip(q, 0, 15)
        L[:, j] = np.where(nz[:, None], q, L[:, j])
    Lf = L.reshape(nb, QK_K)
    qs = np.zeros((nb, 128), dtype=np.int64)
    for c in range(4):
        qs[:, 32 * c:32 * c + 32] = Lf[:, 64 * c:64 * c + 32] | (Lf[:, 64 * c + 32:64 * c + 64] << 4)
    out = np.concatenate([d16.view(np.uint16).astype("<u2").view(np.uint8).reshape(nb, 2),
                          dmin16.view(np.uint16).astype("<u2").view(np.uint8).reshape(nb, 2),
                          sc.astype(np.uint8), qs.astype(np.uint8)], axis=1)
    return out.reshape(*shape[:-1], shape[-1] // QK_K * 144)


GROUP_MAX_EPS = f32(1e-15)


def _make_qx_quants_rmse1(x: np.ndarray, nmax: int) -> tuple[np.ndarray, np.ndarray]:
    """make_qx_quants(n, nmax, x, L, rmse_type=1, qw=NULL) on [B, n] rows. Returns (scale, L)."""
    B, n = x.shape
    mx = np.zeros(B, f32)
    amax = np.zeros(B, f32)
    for i in range(n):
        ax = np.abs(x[:, i])
        upd = ax > amax
        amax = np.where(upd, ax, amax)
        mx = np.where(upd, x[:, i], mx)
    zero = amax < GROUP_MAX_EPS
    mxs = np.where(zero, f32(1), mx).astype(f32)
    w = (x * x).astype(f32)

    def sums(iscale):
        sumlx = np.zeros(B, f32)
        suml2 = np.zeros(B, f32)
        Ls = np.zeros((B, n), np.int64)
        for i in range(n):
            l = np.clip(_nearest_int((iscale * x[:, i]).astype(f32)), -nmax, nmax - 1)
            Ls[:, i] = l + nmax
            lf = l.astype(f32)
            sumlx = (sumlx + ((w[:, i] * x[:, i]).astype(f32) * lf).astype(f32)).astype(f32)
            suml2 = (suml2 + ((w[:, i] * lf).astype(f32) * lf).astype(f32)).astype(f32)
        return sumlx, suml2, Ls

    iscale = (f32(-nmax) / mxs).astype(f32)
    sumlx, suml2, L = sums(iscale)
    s2 = np.where(suml2 != 0, suml2, f32(1)).astype(f32)
    scale = np.where(suml2 != 0, (sumlx / s2).astype(f32), f32(0)).astype(f32)
    best = (scale * sumlx).astype(f32)
    for is_ in range(-9, 10):
        if is_ == 0:
            continue
        isc = ((-(f32(nmax) + (f32(0.1) * f32(is_)).astype(f32)).astype(f32)) / mxs).astype(f32)
        sumlx, suml2, Ls = sums(isc)
        s2 = np.where(suml2 > 0, suml2, f32(1)).astype(f32)
        take = (suml2 > 0) & ((sumlx * sumlx).astype(f32) > (best * suml2).astype(f32)) & ~zero
        L = np.where(take[:, None], Ls, L)
        sc = (sumlx / s2).astype(f32)
        scale = np.where(take, sc, scale).astype(f32)
        best = np.where(take, (sc * sumlx).astype(f32), best).astype(f32)
    scale = np.where(zero, f32(0), scale).astype(f32)
    L = np.where(zero[:, None], 0, L)
    return scale, L


def quantize_q6_k_ref(x: np.ndarray) -> np.ndarray:
    """float32 [..., k*256] -> uint8 [..., k*210], as quantize_row_q6_K_ref."""
    x = np.ascontiguousarray(x, dtype=f32)
    shape = x.shape
    assert shape[-1] % QK_K == 0
    xb = x.reshape(-1, QK_K)
    nb = xb.shape[0]
    scales, L = _make_qx_quants_rmse1(xb.reshape(nb * 16, 16), 32)
    scales = scales.reshape(nb, 16)
    L = L.reshape(nb, QK_K)
    max_scale = np.zeros(nb, f32)
    max_abs = np.zeros(nb, f32)
    for ib in range(16):
        a = np.abs(scales[:, ib])
        upd = a > max_abs
        max_abs = np.where(upd, a, max_abs)
        max_scale = np.where(upd, scales[:, ib], max_scale)
    zero = max_abs < GROUP_MAX_EPS
    ms = np.where(zero, f32(1), max_scale).astype(f32)
    iscale = (f32(-128) / ms).astype(f32)
    d16 = (f32(1) / iscale).astype(f32).astype(np.float16)
    d16 = np.where(zero, np.float16(0), d16).astype(np.float16)
    sc = np.minimum(127, _nearest_int((iscale[:, None] * scales).astype(f32)))
    sc = np.where(zero[:, None], 0, sc)
    d = d16.astype(f32)
    for j in range(16):
        dd = (d * sc[:, j].astype(f32)).astype(f32)
        nz = dd != 0
        dds = np.where(nz, dd, f32(1)).astype(f32)
        l = np.clip(_nearest_int((xb[:, 16 * j:16 * j + 16] / dds[:, None]).astype(f32)), -32, 31) + 32
        L[:, 16 * j:16 * j + 16] = np.where(nz[:, None], l, L[:, 16 * j:16 * j + 16])
    L = np.where(zero[:, None], 0, L)
    ql = np.zeros((nb, 128), np.int64)
    qh = np.zeros((nb, 64), np.int64)
    for h in range(2):
        j = 128 * h
        for_l = lambda o: L[:, j + o:j + o + 32]  # noqa: E731
        q1, q2, q3, q4 = for_l(0), for_l(32), for_l(64), for_l(96)
        ql[:, 64 * h:64 * h + 32] = (q1 & 0xF) | ((q3 & 0xF) << 4)
        ql[:, 64 * h + 32:64 * h + 64] = (q2 & 0xF) | ((q4 & 0xF) << 4)
        qh[:, 32 * h:32 * h + 32] = (q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6)
    out = np.concatenate([ql.astype(np.uint8), qh.astype(np.uint8),
                          sc.astype(np.int8).view(np.uint8),
                          d16.view(np.uint16).astype("<u2").view(np.uint8).reshape(nb, 2)], axis=1)
    out[zero] = 0
    return out.reshape(*shape[:-1], shape[-1] // QK_K * 210)


# ---------------------------------------------------------------------------------------
# scalar dequantisers transcribed from tests/fixtures/gguf/GGUF_NOTES.md section 3 (not from
# gguf-py): the generator checks them against gguf.quants.dequantize on every fixture tensor,
# which checks the notes
# ---------------------------------------------------------------------------------------

F = np.float32


def f16(b, o): return F(np.frombuffer(b[o:o+2], '<f2')[0])
def deq_block(t: str, b: bytes) -> list:
    y = [F(0)] * (256 if t.endswith('_K') else 32)
    if t == 'Q8_0':
        d = f16(b, 0); return [F(F(np.int8(np.uint8(b[2+i]).view(np.int8))) * d) for i in range(32)]
    if t == 'Q4_0':
        d = f16(b, 0); qs = b[2:18]
        for j in range(16):
            y[j] = F((qs[j] & 15) - 8) * d; y[j+16] = F((qs[j] >> 4) - 8) * d
        return y
    if t == 'Q4_1':
        d, m = f16(b, 0), f16(b, 2); qs = b[4:20]
        for j in range(16):
            y[j] = F(F(qs[j] & 15) * d) + m; y[j+16] = F(F(qs[j] >> 4) * d) + m
        return y
    if t in ('Q5_0', 'Q5_1'):
        o = 2 if t == 'Q5_0' else 4
        d = f16(b, 0); m = f16(b, 2) if t == 'Q5_1' else None
        h = int.from_bytes(b[o:o+4], 'little'); qs = b[o+4:o+20]
        for j in range(16):
            a = (qs[j] & 15) | ((h >> j) & 1) << 4; c = (qs[j] >> 4) | ((h >> (j+16)) & 1) << 4
            if m is None: y[j] = F(a - 16) * d; y[j+16] = F(c - 16) * d
            else: y[j] = F(F(a) * d) + m; y[j+16] = F(F(c) * d) + m
        return y
    if t == 'MXFP4':
        e = b[0]; bits = (e - 1) << 23 if e >= 2 else (0x00200000 << e)
        d = np.array([bits], '<u4').view('<f4')[0]
        K = [0,1,2,3,4,6,8,12,0,-1,-2,-3,-4,-6,-8,-12]; qs = b[1:17]
        for j in range(16):
            y[j] = F(K[qs[j] & 15]) * d; y[j+16] = F(K[qs[j] >> 4]) * d
        return y
    if t == 'Q2_K':
        sc, qs = b[0:16], b[16:80]; d, dmin = f16(b, 80), f16(b, 82)
        for h in range(2):
            q = qs[32*h:32*h+32]
            for j in range(4):
                sh = 2*j
                for half in range(2):
                    s = 8*h + 2*j + half
                    dl = d * F(sc[s] & 15); ml = dmin * F(sc[s] >> 4)
                    for l in range(16):
                        y[128*h + 32*j + 16*half + l] = F(dl * F((q[l + 16*half] >> sh) & 3)) - ml
        return y
    if t == 'Q3_K':
        hm, qs, scb = b[0:32], b[32:96], b[96:108]; d = f16(b, 108)
        sc = []
        for s in range(16):
            low4 = scb[s] & 15 if s < 8 else scb[s-8] >> 4
            high2 = (scb[8 + s % 4] >> (2 * (s // 4))) & 3
            sc.append((low4 | high2 << 4) - 32)
        for h in range(2):
            q = qs[32*h:32*h+32]
            for j in range(4):
                sh = 2*j; bit = 4*h + j
                for half in range(2):
                    s = 8*h + 2*j + half
                    for l in range(16):
                        L = l + 16*half
                        v = ((q[L] >> sh) & 3) - (0 if hm[L] & (1 << bit) else 4)
                        y[128*h + 32*j + 16*half + l] = F(d * F(sc[s])) * F(v)
        return y
    if t in ('Q4_K', 'Q5_K'):
        d, dmin = f16(b, 0), f16(b, 2); scb = b[4:16]
        qh = b[16:48] if t == 'Q5_K' else None; qs = b[48:176] if t == 'Q5_K' else b[16:144]
        def gsm(j):
            if j < 4: return scb[j] & 63, scb[j+4] & 63
            return (scb[j+4] & 15) | ((scb[j-4] >> 6) << 4), (scb[j+4] >> 4) | ((scb[j] >> 6) << 4)
        for c in range(4):
            q = qs[32*c:32*c+32]
            for k in range(2):
                s, m = gsm(2*c + k)
                for l in range(32):
                    v = (q[l] & 15) if k == 0 else (q[l] >> 4)
                    if qh is not None and qh[l] & ((1 if k == 0 else 2) << (2*c)): v += 16
                    y[64*c + 32*k + l] = F(F(d * F(s)) * F(v)) - F(dmin * F(m))
        return y
    if t == 'Q6_K':
        ql, qh, sc = b[0:128], b[128:192], np.frombuffer(b[192:208], np.int8); d = f16(b, 208)
        for h in range(2):
            L, H, S = ql[64*h:64*h+64], qh[32*h:32*h+32], sc[8*h:8*h+8]
            for l in range(32):
                i = l // 16
                q1 = ((L[l] & 15) | ((H[l] >> 0) & 3) << 4) - 32
                q2 = ((L[l+32] & 15) | ((H[l] >> 2) & 3) << 4) - 32
                q3 = ((L[l] >> 4) | ((H[l] >> 4) & 3) << 4) - 32
                q4 = ((L[l+32] >> 4) | ((H[l] >> 6) & 3) << 4) - 32
                for off, q, si in ((0, q1, 0), (32, q2, 2), (64, q3, 4), (96, q4, 6)):
                    y[128*h + l + off] = F(d * F(S[i + si])) * F(q)
        return y
    raise ValueError(t)


def dequantize_from_notes(t: str, data: bytes, type_size: int) -> np.ndarray:
    out = []
    with np.errstate(all="ignore"):
        for i in range(len(data) // type_size):
            out += deq_block(t, data[i * type_size:(i + 1) * type_size])
    return np.array(out, dtype=np.float32)


# ---------------------------------------------------------------------------------------
# optional: ggml-quants.c from the sdist, compiled with gcc, called through ctypes
# ---------------------------------------------------------------------------------------

C_DEQUANT = {"Q4_0": 32, "Q4_1": 32, "Q5_0": 32, "Q5_1": 32, "Q8_0": 32, "MXFP4": 32,
             "Q2_K": 256, "Q3_K": 256, "Q4_K": 256, "Q5_K": 256, "Q6_K": 256}
C_QUANT_REF = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "MXFP4", "Q4_K", "Q6_K"]


class GgmlQuantsC:
    """ggml-quants.c built as a shared library (gcc -O2 -ffp-contract=off)."""

    def __init__(self, ggml_src: Path, workdir: Path):
        so = workdir / "libggml_quants_check.so"
        cmd = ["gcc", "-O2", "-ffp-contract=off", "-fno-fast-math", "-shared", "-fPIC",
               f"-I{ggml_src.parent / 'include'}", f"-I{ggml_src}", f"-I{ggml_src / 'ggml-cpu'}",
               str(ggml_src / "ggml-quants.c"), "-o", str(so)]
        subprocess.run(cmd, check=True, capture_output=True)
        self.cmd = " ".join(cmd[:6]) + " ggml/src/ggml-quants.c"
        self.lib = ctypes.CDLL(str(so), mode=os.RTLD_LAZY | os.RTLD_GLOBAL)

    def dequantize(self, qtype: str, blocks: bytes, n: int) -> np.ndarray:
        fn = getattr(self.lib, "dequantize_row_" + qtype.lower().replace("_k", "_K"))
        out = np.zeros(n, dtype=np.float32)
        buf = ctypes.create_string_buffer(blocks, len(blocks))
        fn(buf, out.ctypes.data_as(ctypes.c_void_p), ctypes.c_int64(n))
        return out

    def quantize_ref(self, qtype: str, x: np.ndarray, type_size: int, block: int) -> bytes:
        name = "quantize_row_" + qtype.lower().replace("_k", "_K") + "_ref"
        fn = getattr(self.lib, name)
        x = np.ascontiguousarray(x, dtype=np.float32).ravel()
        out = ctypes.create_string_buffer(x.size // block * type_size)
        fn(x.ctypes.data_as(ctypes.c_void_p), out, ctypes.c_int64(x.size))
        return out.raw
