#!/usr/bin/env python3
"""Generate tests/fixtures/gguf/: reference fixtures for WASTE's GGUF reader.

What it writes (and nothing else), all under tests/fixtures/gguf/:

  types/<type>.gguf        one small GGUF v3 file per tensor type (F32 F16 BF16 Q4_0 Q4_1
                           Q5_0 Q5_1 Q8_0 MXFP4 Q2_K Q3_K Q4_K Q5_K Q6_K), written by gguf-py's
                           GGUFWriter, 4-5 tensors each (1-D, several rows, 3-D, 4-D, edge values)
  types/<type>.dequant.f32 gguf.quants.dequantize of every tensor, concatenated (raw LE f32,
                           row-major; offsets in manifest.json)
  types/<type>.source.f32  the random f32 the tensors were quantised from (those that were)
  misc/*.gguf              every KV value type, alignment 64 and 1, no tensors, no trailing padding
  malformed/*.gguf         broken files for the error paths (malformed.json says what is wrong)
  models/*.gguf            tiny-qwen3_moe converted by llama.cpp's convert_hf_to_gguf.py (f32, q8_0),
                           tiny-mixtral (q8_0, rope-permuted q/k), tiny-glm4_moe, tiny-deepseek_v3,
                           tiny-gpt_oss-mxfp4 (q8_0; MXFP4 experts), tiny-minimax_m2, tiny-deepseek_v32,
                           tiny-glm_moe_dsa, tiny-qwen3_next, tiny-qwen3_5_moe and tiny-kimi_linear, and a wider qwen3moe written with GGUFWriter whose experts are
                           Q4_K; reference logits for each
  manifest.json            every tensor of types/ and misc/ (type, shapes, offsets, sha256, refs)
  malformed.json           [{file, what, field, llama_cpp, gguf_py}, ...]
  models.json              commands, versions, metadata keys, tensor tables, logits checks
  convert_survey.json      convert_hf_to_gguf.py run on every tiny-* fixture: keys, tensors, and
                           the HF -> GGUF tensor mapping found by matching values
  c_cross_check.json       (only with --check-c) ggml-quants.c compiled from the sdist agrees with
                           gguf-py's dequantize bit for bit and with the Q4_K quantiser port

Run by hand, never by CI:

    python3 tests/gen_gguf_fixtures.py [--sdist /tmp/sdist/llama_cpp_python-0.3.36.tar.gz] [--check-c]

Needs numpy, torch, transformers, safetensors, gguf (0.19.0, the installed package is used for
writing, reading and (de)quantising; convert_hf_to_gguf.py runs with the sdist's own vendored
gguf-py, as it does by default), sentencepiece (convert_hf_to_gguf.py imports it for llama/mixtral
even without a tokenizer.model). Offline, CPU, one thread. Deterministic: rerunning reproduces
every file byte for byte (the model conversions included; checked).

The GGUF layout, block formats and tensor naming are described in tests/fixtures/gguf/GGUF_NOTES.md
(written by hand, not by this script); tests/fixtures/README.md has a "## gguf" section.
"""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import argparse
import hashlib
import json
import shutil
import struct
import sys
import tempfile
from pathlib import Path

import numpy as np

import gguf
from gguf import GGMLQuantizationType as QT
from gguf import GGUFReader, GGUFWriter

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gen_gguf_fixtures_quant as gq  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "fixtures" / "gguf"
DEFAULT_SDIST = Path("/tmp/sdist/llama_cpp_python-0.3.36.tar.gz")
ARCH = "wastetest"

TYPES = ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "MXFP4",
         "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]
GGUFPY_QUANTIZES = {"BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "MXFP4"}  # gguf.quants.quantize
K_TYPES = {"Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"}


def sha256(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def rel(p: Path) -> str:
    return str(p.relative_to(OUT))


def block_info(t: str) -> tuple[int, int]:
    return gguf.GGML_QUANT_SIZES[QT[t]]


def dequant(data: bytes, t: str, ne: list[int]) -> np.ndarray:
    """gguf.quants.dequantize on the stored bytes; returns f32 in numpy (row-major) shape."""
    blk, ts = block_info(t)
    row_bytes = ne[0] // blk * ts
    a = np.frombuffer(data, dtype=np.uint8).reshape(-1, row_bytes)
    out = gguf.quants.dequantize(a, QT[t])
    return np.ascontiguousarray(out, dtype=np.float32).reshape(list(reversed(ne)))


# ---------------------------------------------------------------------------------------
# types/
# ---------------------------------------------------------------------------------------

def float_specials(t: str) -> np.ndarray:
    """Bit patterns for the 'special' tensor of F32 / F16 / BF16 (no signalling NaN)."""
    if t == "F32":
        bits = [0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0x00000001,
                0x007FFFFF, 0x7F7FFFFF, 0x3F800000, 0xBF800000, 0x00800000, 0x3DCCCCCD]
        return np.array(bits, dtype="<u4").view(np.float32)
    if t == "F16":
        bits = [0x0000, 0x8000, 0x7C00, 0xFC00, 0x7E00, 0x0001, 0x03FF, 0x7BFF, 0x3C00, 0xBC00,
                0x0400, 0x2E66]
        return np.array(bits, dtype="<u2")
    bits = [0x0000, 0x8000, 0x7F80, 0xFF80, 0x7FC0, 0x0001, 0x007F, 0x7F7F, 0x3F80, 0xBF80,
            0x0080, 0x3DCD]
    return np.array(bits, dtype="<u2")


def type_tensors(t: str, rng: np.random.Generator) -> list[dict]:
    """The tensors of types/<t>.gguf: name, ne, stored bytes, source (f32 or None), how."""
    blk, ts = block_info(t)
    out = []

    def src(ne, scale=0.5):
        return (rng.standard_normal(list(reversed(ne))) * scale).astype(np.float32)

    def add(name, ne, data, source, how):
        assert len(data) == int(np.prod(ne)) // blk * ts, (name, len(data))
        out.append(dict(name=name, ne=list(ne), data=bytes(data), source=source, how=how))

    if t in ("F32", "F16", "BF16"):
        shapes = [("vec7", [7]), ("mat_33x5", [33, 5]), ("t3_4x3x2", [4, 3, 2]),
                  ("t4_3x2x2x2", [3, 2, 2, 2])]
        for name, ne in shapes:
            x = src(ne)
            if t == "F32":
                add(name, ne, x.astype("<f4").tobytes(), None, "random normal * 0.5, stored as is")
            elif t == "F16":
                add(name, ne, x.astype("<f2").tobytes(), x,
                    "source.astype(float16) (numpy, round to nearest even)")
            else:
                add(name, ne, gguf.quants.quantize(x, QT.BF16).tobytes(), x,
                    "gguf.quants.quantize(source, BF16) (round to nearest even)")
        sp = float_specials(t)
        add("special", [len(sp)], sp.tobytes(), None,
            "special bit patterns: +0 -0 +inf -inf qNaN min-subnormal max-subnormal max 1 -1 "
            "min-normal ~0.1")
        return out

    if t in GGUFPY_QUANTIZES:     # block 32 types quantised by gguf-py
        shapes = [("vec96", [96]), ("mat_64x5", [64, 5]), ("exps_32x3x4", [32, 3, 4])]
        for name, ne in shapes:
            x = src(ne)
            add(name, ne, gguf.quants.quantize(x, QT[t]).tobytes(), x,
                f"gguf.quants.quantize(source, {t})")
        x = src([32, 5])
        x[0] = 0.0                                   # all-zero block: scale 0
        x[1] = 0.3                                   # constant block
        x[2, 7] = 40.0                               # one outlier
        x[3] *= 1e-6                                 # tiny values: subnormal f16 scale
        x[4] = -np.abs(x[4])                         # all negative
        add("edge_32x5", [32, 5], gguf.quants.quantize(x, QT[t]).tobytes(), x,
            f"gguf.quants.quantize(source, {t}); rows: zeros, constant 0.3, outlier 40, "
            "values*1e-6 (subnormal scale), all negative")
        if t == "MXFP4":
            b = gq.random_mxfp4_blocks(5, rng, edge=True)
            add("rand_edge_32x5", [32, 5], b.tobytes(), None,
                "random valid blocks, E8M0 exponents 0, 1, 2, 127, 250 (denormal and large scales)")
        return out

    assert t in K_TYPES
    shapes = [("rand_vec256", [256]), ("rand_mat_512x3", [512, 3]), ("rand_exps_256x2x3", [256, 2, 3])]
    for name, ne in shapes:
        nb = int(np.prod(ne)) // 256
        add(name, ne, gq.random_k_blocks(t, nb, rng).tobytes(), None,
            "random valid blocks: f16 d (and dmin) log-uniform in [1e-4, 1e-2], every other byte uniform")
    add("rand_edge_256x6", [256, 6], gq.random_k_blocks(t, 6, rng, edge=True).tobytes(), None,
        "random blocks whose f16 d / dmin are the edge values 0, 2^-24 (min subnormal), "
        "max subnormal, -0.5, 65504, -0")
    if t == "Q4_K":
        x = src([512, 3])
        x[1, :256] = 0.0
        add("quant_mat_512x3", [512, 3], gq.quantize_q4_k_ref(x).tobytes(), x,
            "numpy port of ggml's quantize_row_q4_K_ref (byte-identical to the C, see "
            "c_cross_check.json); block 2 is all zeros")
    return out


def write_types(rng_seed: int) -> list[dict]:
    files = []
    (OUT / "types").mkdir(parents=True)
    for t in TYPES:
        rng = np.random.default_rng([rng_seed, int(QT[t])])
        tensors = type_tensors(t, rng)
        path = OUT / "types" / f"{t.lower()}.gguf"
        w = GGUFWriter(str(path), ARCH)
        w.add_string("general.name", f"WASTE GGUF fixture: {t} tensors")
        w.add_uint32("wastetest.fixture_seed", rng_seed)
        for tt in tensors:
            blk, ts = block_info(t)
            arr = np.frombuffer(tt["data"], dtype=np.uint8).reshape(
                list(reversed(tt["ne"]))[:-1] + [tt["ne"][0] // blk * ts])
            w.add_tensor(tt["name"], arr, raw_dtype=QT[t])
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        files.append(describe_file(path, {tt["name"]: tt for tt in tensors}, prefix=f"{t.lower()}."))
    return files


def describe_file(path: Path, extra: dict | None = None, prefix: str | None = None) -> dict:
    """Read a GGUF back with GGUFReader, re-serialise it with RawGGUF (must be byte-identical:
    checks our reading of the format), write the dequantised references, describe it."""
    b = path.read_bytes()
    r = GGUFReader(str(path))
    align = int(r.fields["general.alignment"].contents()) if "general.alignment" in r.fields else 32
    raw = gq.RawGGUF(alignment=align)
    kvs = []
    for k, f in r.fields.items():
        if k.startswith("GGUF."):
            continue
        vt = int(f.types[0])
        sub = int(f.parts[3][0]) if vt == gq.ARR else None  # f.types lacks it for empty arrays
        val = f.contents()
        raw.kv(k, vt, val, sub)
        kvs.append(dict(key=k, type=gq.VTYPE_NAMES[vt],
                        **({"sub_type": gq.VTYPE_NAMES[sub]} if sub is not None else {}),
                        value=val))
    tensors = []
    deq_parts, src_parts = [], []
    data_start = r.data_offset
    for ti in r.tensors:
        t = ti.tensor_type.name
        ne = [int(x) for x in ti.shape]
        blob = b[ti.data_offset:ti.data_offset + ti.n_bytes]
        rel_off = ti.data_offset - data_start
        raw.tensors.append(gq.RawTensor(ti.name, ne, int(ti.tensor_type), blob, rel_off))
        entry = dict(name=ti.name, ggml_type=t, ggml_type_code=int(ti.tensor_type),
                     ne=ne, numpy_shape=list(reversed(ne)), n_elements=int(ti.n_elements),
                     n_bytes=int(ti.n_bytes), offset=rel_off, file_offset=int(ti.data_offset),
                     sha256=sha256(blob))
        if prefix is not None:
            deq = dequant(blob, t, ne)
            if t not in ("F32", "F16", "BF16"):
                notes = gq.dequantize_from_notes(t, blob, block_info(t)[1])
                assert np.array_equal(notes.view("<u4"), deq.ravel().view("<u4")), (path.name, ti.name)
            entry["dequantized"] = rel(path.parent / f"{prefix}dequant.f32")
            entry["dequantized_offset"] = 4 * sum(a.size for a in deq_parts)
            entry["dequantized_count"] = int(deq.size)
            entry["dequantized_sha256"] = sha256(deq.astype("<f4").tobytes())
            deq_parts.append(deq.ravel())
            x = (extra or {}).get(ti.name, {})
            if x.get("source") is not None:
                entry["source"] = rel(path.parent / f"{prefix}source.f32")
                entry["source_offset"] = 4 * sum(a.size for a in src_parts)
                src_parts.append(x["source"].ravel())
                fin = np.isfinite(x["source"])
                entry["max_abs_err_vs_source"] = float(np.abs(deq[fin] - x["source"][fin]).max())
            else:
                entry["source"] = None
            if x.get("how"):
                entry["content"] = x["how"]
            assert x.get("data", blob) == blob
        tensors.append(entry)
    if deq_parts:
        (path.parent / f"{prefix}dequant.f32").write_bytes(np.concatenate(deq_parts).astype("<f4").tobytes())
    if src_parts:
        (path.parent / f"{prefix}source.f32").write_bytes(np.concatenate(src_parts).astype("<f4").tobytes())
    if r.tensors:
        raw.trailing_padding = len(b) != max(int(t.data_offset + t.n_bytes) for t in r.tensors)
    rebuilt = raw.build()
    assert rebuilt == b, f"{path.name}: RawGGUF re-serialisation differs from the file"
    return dict(file=rel(path), size=len(b), sha256=sha256(b), version=3, alignment=align,
                data_offset=data_start, n_kv=len(kvs), n_tensors=len(tensors), kv=jsonable(kvs),
                tensors=tensors)


def jsonable(x):
    if isinstance(x, dict):
        return {k: jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (np.floating, float)):
        v = float(x)
        if np.isfinite(v):
            return v
        return "nan" if np.isnan(v) else ("inf" if v > 0 else "-inf")
    if isinstance(x, np.bool_):
        return bool(x)
    if isinstance(x, bytes):
        return x.decode("utf-8")
    return x


# ---------------------------------------------------------------------------------------
# misc/: every KV type, alignments, no tensors, no trailing padding
# ---------------------------------------------------------------------------------------

def kv_all_types() -> gq.RawGGUF:
    g = gq.RawGGUF()
    g.kv("general.architecture", gq.STR, ARCH)
    g.kv("test.u8", gq.U8, 255).kv("test.i8", gq.I8, -128)
    g.kv("test.u16", gq.U16, 65535).kv("test.i16", gq.I16, -32768)
    g.kv("test.u32", gq.U32, 4294967295).kv("test.i32", gq.I32, -2147483648)
    g.kv("test.f32", gq.F32, 0.1).kv("test.f32.neg_zero", gq.F32, -0.0)
    g.kv("test.f32.inf", gq.F32, float("inf"))
    g.kv("test.bool.true", gq.BOOL, True).kv("test.bool.false", gq.BOOL, False)
    g.kv("test.str", gq.STR, "h\u00e9llo, \u4e16\u754c \U0001f999\n\t\"q\"\\")
    g.kv("test.str.empty", gq.STR, "")
    g.kv("test.u64", gq.U64, 2**64 - 1).kv("test.i64", gq.I64, -2**63)
    g.kv("test.f64", gq.F64, 0.1).kv("test.f64.min_subnormal", gq.F64, 5e-324)
    g.kv("test.arr.u8", gq.ARR, [0, 1, 255], gq.U8).kv("test.arr.i8", gq.ARR, [-128, 0, 127], gq.I8)
    g.kv("test.arr.u16", gq.ARR, [0, 65535], gq.U16).kv("test.arr.i16", gq.ARR, [-32768, 32767], gq.I16)
    g.kv("test.arr.u32", gq.ARR, [1, 2, 4294967295], gq.U32)
    g.kv("test.arr.i32", gq.ARR, [-1, 0, 2147483647], gq.I32)
    g.kv("test.arr.f32", gq.ARR, [0.5, -1.25, 3.0e38], gq.F32)
    g.kv("test.arr.bool", gq.ARR, [True, False, True], gq.BOOL)
    g.kv("test.arr.str", gq.ARR, ["a", "", "\u00fc\u00df", "Ġ t"], gq.STR)
    g.kv("test.arr.u64", gq.ARR, [0, 2**64 - 1], gq.U64)
    g.kv("test.arr.i64", gq.ARR, [-2**63, 2**63 - 1], gq.I64)
    g.kv("test.arr.f64", gq.ARR, [0.1, -2.5e-300], gq.F64)
    g.kv("test.arr.empty_u32", gq.ARR, [], gq.U32)
    g.kv("test.arr.empty_str", gq.ARR, [], gq.STR)
    return g


def f32_tensor(name: str, ne: list[int], seed: int) -> gq.RawTensor:
    x = np.random.default_rng(seed).standard_normal(int(np.prod(ne))).astype("<f4")
    return gq.RawTensor(name, ne, 0, x.tobytes())


def write_misc() -> list[dict]:
    d = OUT / "misc"
    d.mkdir(parents=True)
    files = []

    def emit(name, g: gq.RawGGUF, note):
        p = d / name
        p.write_bytes(g.build())
        r = GGUFReader(str(p))           # must parse
        del r
        info = describe_file(p, prefix=name[:-5] + ".")
        info["what"] = note
        files.append(info)

    emit("kv_all_types.gguf", kv_all_types(),
         "no tensors; one key per value type (13 scalar kinds incl. an empty string, -0.0, inf, "
         "u64/i64 extremes, f64 min subnormal) and an array of every element type, two of them "
         "empty; the exact values are under kv")
    for align in (64, 1):
        g = gq.RawGGUF(alignment=align)
        g.kv("general.architecture", gq.STR, ARCH).kv("general.alignment", gq.U32, align)
        g.tensors += [f32_tensor("a", [7], 1), f32_tensor("b", [5, 3], 2), f32_tensor("c", [33], 3)]
        emit(f"align{align}.gguf", g,
             f"general.alignment = {align}: the data section and every tensor offset are "
             f"multiples of {align} (tensor sizes 28, 60, 132 bytes)")
    g = gq.RawGGUF(trailing_padding=False)
    g.kv("general.architecture", gq.STR, ARCH)
    g.tensors += [f32_tensor("a", [9], 4), f32_tensor("b", [3], 5)]
    emit("no_trailing_padding.gguf", g,
         "valid: the file ends right after the last tensor's 12 bytes (GGUFWriter would pad to 32; "
         "llama.cpp only requires offset + size <= file size)")
    g = gq.RawGGUF()
    g.kv("general.architecture", gq.STR, ARCH)
    g.kv("tokenizer.ggml.tokens", gq.ARR, ["<a>", "b", "c"], gq.STR)
    emit("no_tensors.gguf", g, "valid: tensor_count 0; GGUFWriter pads the header to 32 anyway")
    return files


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sdist", type=Path, default=DEFAULT_SDIST)
    ap.add_argument("--check-c", action="store_true",
                    help="also compile ggml-quants.c from the sdist (gcc) and write c_cross_check.json")
    ap.add_argument("--skip-models", action="store_true", help="types/, misc/, malformed/ only")
    args = ap.parse_args()

    import gen_gguf_fixtures_malformed as gm
    import gen_gguf_fixtures_models as gmod

    keep = {}
    for name in ("GGUF_NOTES.md", "c_cross_check.json"):
        if (OUT / name).exists():
            keep[name] = (OUT / name).read_bytes()
    # What the other generators wrote here survives this one: models_iq.json and its files
    # (gen_gguf_fixtures_iq.py), split/ (gen_gguf_fixtures_split.py).
    if (OUT / "models_iq.json").exists():
        keep["models_iq.json"] = (OUT / "models_iq.json").read_bytes()
        for m in json.loads(keep["models_iq.json"])["models"]:
            for name in (m["file"], m["reference_logits"]):
                keep[name] = (OUT / name).read_bytes()
    if (OUT / "split").exists():
        for f in sorted((OUT / "split").iterdir()):
            keep[f"split/{f.name}"] = f.read_bytes()
    if args.skip_models and (OUT / "models").exists():
        keep_models = tempfile.mkdtemp()
        shutil.copytree(OUT / "models", Path(keep_models) / "models")
        for n in ("models.json", "convert_survey.json"):
            if (OUT / n).exists():
                keep[n] = (OUT / n).read_bytes()
    else:
        keep_models = None
    if OUT.exists():
        shutil.rmtree(OUT)
    OUT.mkdir(parents=True)
    if keep_models:
        shutil.copytree(Path(keep_models) / "models", OUT / "models")
        shutil.rmtree(keep_models)
    for name, b in keep.items():
        (OUT / name).parent.mkdir(parents=True, exist_ok=True)
        (OUT / name).write_bytes(b)

    seed = 20251201
    types = write_types(seed)
    misc = write_misc()
    malformed = gm.write_malformed(OUT / "malformed", rel)
    manifest = dict(
        generator="tests/gen_gguf_fixtures.py",
        versions=dict(gguf=gguf.__version__ if hasattr(gguf, "__version__") else "0.19.0",
                      numpy=np.__version__, python=sys.version.split()[0]),
        seed=seed,
        conventions=dict(
            ne="GGUF order: ne[0] is the fastest-varying dimension (columns of a row-major matrix)",
            numpy_shape="reversed(ne): row-major shape, the layout of the dequantised .f32 files",
            offset="relative to the data section (as stored in the tensor info)",
            file_offset="absolute: data_offset + offset",
            sha256="of the tensor's n_bytes stored bytes (no padding)",
            notes_check="every quantised tensor is also dequantised by gen_gguf_fixtures_quant."
                        "dequantize_from_notes, a scalar transcription of GGUF_NOTES.md section 3; the "
                        "generator asserts it equals gguf-py bit for bit",
            dequantized="gguf.quants.dequantize (gguf-py 0.19.0) of the stored bytes, raw little-endian f32, "
                        "row-major; one file per GGUF, each tensor at dequantized_offset (bytes), "
                        "dequantized_count floats",
            source="the f32 the tensor was quantised from (when it was), same layout, at source_offset",
            json_floats="non-finite KV values are written as the strings 'inf', '-inf', 'nan'",
        ),
        gguf_py_quantize=dict(
            can=sorted(GGUFPY_QUANTIZES) + ["F16 (numpy astype)"],
            cannot=sorted(K_TYPES) + ["Q8_K (no (de)quantiser at all; it is ggml's dot-product "
                                      "intermediate, never a stored tensor type)"],
            k_types_here="random valid blocks; Q4_K also one tensor quantised by a numpy port "
                         "of quantize_row_q4_K_ref",
        ),
        types=types, misc=misc)
    (OUT / "manifest.json").write_text(gq.dump_json(jsonable(manifest)))
    (OUT / "malformed.json").write_text(gq.dump_json(malformed))

    with tempfile.TemporaryDirectory(prefix="waste-gguf-") as tmp:
        tmp = Path(tmp)
        llama_dir = None
        if not args.skip_models or args.check_c:
            llama_dir = gmod.extract_sdist(args.sdist, tmp)
        if not args.skip_models:
            gmod.write_models(OUT, llama_dir, args.sdist, tmp, rel)
        if args.check_c:
            cc = check_c(llama_dir, tmp, types)
            (OUT / "c_cross_check.json").write_text(gq.dump_json(cc))
    total = sum(p.stat().st_size for p in OUT.rglob("*") if p.is_file())
    print(f"wrote {OUT} ({total / 1e6:.2f} MB, {sum(1 for p in OUT.rglob('*') if p.is_file())} files)")


def check_c(llama_dir: Path, tmp: Path, types: list[dict]) -> dict:
    """ggml-quants.c (the sdist's) vs gguf-py: dequantisation bit for bit on every quantised
    fixture tensor; quantize_row_*_ref vs gguf-py's quantize / the Q4_K port byte for byte."""
    lib = gq.GgmlQuantsC(llama_dir / "ggml" / "src", tmp)
    res = dict(compiled_with=lib.cmd, dequantize=[], quantize_ref=[])
    for f in types:
        for t in f["tensors"]:
            ty = t["ggml_type"]
            if ty not in gq.C_DEQUANT:
                continue
            blob = (OUT / f["file"]).read_bytes()[t["file_offset"]:t["file_offset"] + t["n_bytes"]]
            c = lib.dequantize(ty, blob, t["n_elements"])
            py = np.fromfile(OUT / t["dequantized"], dtype="<f4", count=t["dequantized_count"],
                             offset=t["dequantized_offset"])
            res["dequantize"].append(dict(type=ty, tensor=t["name"],
                                          bit_identical=bool(np.array_equal(c.view("<u4"), py.view("<u4")))))
            if t.get("source") and ty in gq.C_QUANT_REF:
                x = np.fromfile(OUT / t["source"], dtype="<f4", count=t["n_elements"],
                                offset=t["source_offset"])
                blk, ts = block_info(ty)
                ref = lib.quantize_ref(ty, x, ts, blk)
                res["quantize_ref"].append(dict(type=ty, tensor=t["name"], byte_identical=ref == blob,
                                                ours="gguf.quants.quantize" if ty != "Q4_K" else
                                                "gen_gguf_fixtures_quant.quantize_q4_k_ref"))
    rng = np.random.default_rng(7)
    x = np.concatenate([(rng.standard_normal((256, 256)) * s).astype(np.float32) for s in (1e-3, 1, 50)])
    x[0] = 0
    x[1] = 2.5
    x[2] = np.abs(x[2])
    x[3] = -np.abs(x[3])
    res["quantize_ref"].append(dict(type="Q4_K", tensor="768 extra random rows (scales 1e-3, 1, 50; "
                                    "zero, constant, all-positive, all-negative rows)",
                                    byte_identical=lib.quantize_ref("Q4_K", x, 144, 256)
                                    == gq.quantize_q4_k_ref(x).tobytes()))
    res["all_ok"] = all(d["bit_identical"] for d in res["dequantize"]) and \
        all(d["byte_identical"] for d in res["quantize_ref"])
    assert res["all_ok"], res
    return res


if __name__ == "__main__":
    main()
