"""tests/fixtures/gguf/malformed/: broken GGUF files for the reader's error paths.

Each case starts from one small valid file (base.gguf, also written) and breaks one thing. For
every case malformed.json records what is wrong, the field a good error message names, what
llama.cpp's reader does (from reading ggml/src/gguf.cpp and src/llama-model-loader.h of the
sdist; line numbers are of that copy) and what gguf-py 0.19.0's GGUFReader does (run here).
"""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

import numpy as np

import gen_gguf_fixtures_quant as gq

ARCH = "wastetest"


def base() -> gq.RawGGUF:
    g = gq.RawGGUF()
    g.kv("general.architecture", gq.STR, ARCH)
    g.kv("test.value", gq.U32, 7)
    g.kv("test.name", gq.STR, "base")
    a = np.arange(16, dtype="<f4") * 0.25
    b = np.array([1.0, -2.0, 3.5, 0.125], dtype="<f4")
    g.tensors.append(gq.RawTensor("a", [8, 2], 0, a.tobytes()))
    g.tensors.append(gq.RawTensor("b", [4], 0, b.tobytes()))
    return g


def kv_bytes(kvs) -> bytes:
    return b"".join(gq.gguf_str(k) + struct.pack("<I", vt) + gq.pack_value(vt, v, s) for k, vt, v, s in kvs)


def cases() -> list[tuple[str, bytes, str, str, str]]:
    """(file, bytes, what, field, llama_cpp)."""
    out = []
    B = base()
    good = B.build()
    hdr = B.header()

    def add(name, data, what, field, llama):
        out.append((name, data, what, field, llama))

    def variant(**kw):
        g = base()
        for k, v in kw.items():
            setattr(g, k, v)
        return g

    # --- truncation
    add("truncated_magic.gguf", good[:3], "file is 3 bytes: the magic is incomplete", "magic",
        "gguf.cpp:471 'failed to read magic'")
    add("truncated_header.gguf", good[:13], "file ends inside tensor_count (13 of the 24 header bytes)",
        "tensor_count", "gguf.cpp:547 'failed to read header'")
    k0 = 24 + len(kv_bytes(B.kvs[:1]))
    add("truncated_kv.gguf", good[:k0 + 5], "file ends inside the second KV pair's key string",
        "kv[1].key (test.value)", "gguf.cpp:616 'failed to read key-value pairs'")
    add("truncated_tensor_info.gguf", good[:len(hdr) - 10],
        "file ends inside the last tensor info (tensor 'b', in its offset field)",
        "tensor_info[1] (b).offset", "gguf.cpp:774 'failed to read tensor info'")
    ds = B.data_start()
    add("truncated_data.gguf", good[:ds + 64 + 8],
        "file ends 8 bytes into tensor 'b' (needs 16): data section shorter than the tensors",
        "tensor b data (offset 64, 16 bytes)",
        "gguf_init no_alloc accepts it; llama-model-loader.h:47 'tensor 'b' data is not within the "
        "file bounds, model is corrupted or incomplete'")
    # --- magic / version
    add("bad_magic.gguf", b"GGUG" + good[4:], "magic is 'GGUG'", "magic",
        "gguf.cpp:482 'invalid magic characters: 'GGUG', expected 'GGUF''")
    for v, llama in ((0, "gguf.cpp:495 'bad GGUF version: 0'"),
                     (1, "gguf.cpp:512 'GGUFv1 is no longer supported'"),
                     (2, "ACCEPTED: v2 has the v3 layout (v3 only added big-endian files); a "
                         "v3-only reader may reject it with the version in the message"),
                     (4, "gguf.cpp:516 'this GGUF file is version 4 but this software only supports up "
                         "to version 3'"),
                     (0x03000000, "gguf.cpp:507 'version 50331648 is extremely large, is there a "
                                  "mismatch between the host and model endianness?'")):
        nm = "version_big_endian.gguf" if v == 0x03000000 else f"version_{v}.gguf"
        what = ("version 0x03000000: a big-endian GGUF v3 read as little-endian" if v == 0x03000000
                else f"version {v}")
        add(nm, variant(version=v).build(), what, "version", llama)
    # --- counts
    add("tensor_count_2p62.gguf", variant(n_tensors=2**62).build(),
        "tensor_count = 2^62 (the file holds 2)", "tensor_count",
        "gguf.cpp:527 'number of tensors is 4611686018427387904 but must be in [0, ...]' "
        "(SIZE_MAX/sizeof(gguf_tensor_info))")
    add("kv_count_2p62.gguf", variant(n_kv=2**62).build(),
        "kv_count = 2^62 (the file holds 3)", "kv_count",
        "gguf.cpp:538 'number of key value pairs is 4611686018427387904 but must be in [0, ...]'")
    # --- strings / arrays / value types
    kv = list(B.kvs)
    bad = kv_bytes(kv[:2]) + gq.gguf_str("test.name") + struct.pack("<I", gq.STR) + \
        struct.pack("<Q", len(good) + 100) + b"base"
    add("string_len_past_eof.gguf", variant(raw_kv_bytes=bad).build()[:24 + len(bad)] + b"\0" * 8,
        f"value of 'test.name' declares {len(good) + 100} bytes; the file ends long before",
        "kv[2] test.name (string length)",
        "gguf.cpp:353 'string length N exceeds remaining file size M bytes'")
    bad = kv_bytes(kv[:1]) + struct.pack("<Q", 2**40) + b"test.value"
    add("key_len_past_eof.gguf", variant(raw_kv_bytes=bad).build()[:24 + len(bad)],
        "the second key's length is 2^40", "kv[1].key (string length)",
        "gguf.cpp:349 'string length 1099511627776 exceeds maximum 1073741824'")
    bad = kv_bytes(kv[:2]) + gq.gguf_str("test.big") + struct.pack("<IIQ", gq.ARR, gq.U8, 2**40) + b"\1\2\3\4"
    add("array_2p40.gguf", variant(raw_kv_bytes=bad, n_kv=3).build()[:24 + len(bad)] + b"\0" * 64,
        "array 'test.big' of u8 declares 2^40 elements (4 present)", "kv[2] test.big (array length)",
        "gguf.cpp:280 read(std::vector) returns false (n > GGUF_MAX_ARRAY_ELEMENTS = 2^30) -> "
        "gguf.cpp:616 'failed to read key-value pairs'")
    bad = kv_bytes(kv[:2]) + gq.gguf_str("test.name") + struct.pack("<I", 13) + b"\0" * 8
    add("bad_value_type.gguf", variant(raw_kv_bytes=bad).build(),
        "value type code 13 for 'test.name' (valid: 0..12)", "kv[2] test.name (value type)",
        "gguf.cpp:609 'key 'test.name' has invalid GGUF type 13'")
    bad = kv_bytes(kv[:2]) + gq.gguf_str("test.arr") + struct.pack("<IIQ", gq.ARR, 99, 1) + b"\0" * 8
    add("bad_array_elem_type.gguf", variant(raw_kv_bytes=bad).build(),
        "array 'test.arr' with element type code 99", "kv[2] test.arr (array element type)",
        "gguf.cpp:609 'key 'test.arr' has invalid GGUF type 99'")
    add("nested_array.gguf",
        variant(kvs=kv[:2] + [("test.nested", gq.ARR, [(gq.U32, [1, 2]), (gq.U32, [3])], gq.ARR)]).build(),
        "array of arrays (element type ARRAY); gguf-py writes and reads these", "kv[2] test.nested",
        "gguf.cpp:606 ARRAY inside an array hits the default case: 'key 'test.nested' has invalid GGUF type 9'")
    add("duplicate_key.gguf", variant(kvs=kv + [("test.value", gq.U32, 8, None)]).build(),
        "key 'test.value' appears twice (values 7 then 8)", "kv[3] test.value",
        "gguf.cpp:576 'duplicate key 'test.value' for KV pair 3'")
    add("empty_key.gguf", variant(kvs=kv[:1] + [("", gq.U32, 7, None)] + kv[2:]).build(),
        "the second key is the empty string", "kv[1].key", "gguf.cpp:572 'key 1 is empty'")
    # --- alignment
    for nm, vt, val, what, llama in (
            ("alignment_not_pow2.gguf", gq.U32, 48, "general.alignment = 48",
             "gguf.cpp:633 'alignment 48 is not a power of 2'"),
            ("alignment_zero.gguf", gq.U32, 0, "general.alignment = 0",
             "gguf.cpp:633 'alignment 0 is not a power of 2'"),
            ("alignment_wrong_type.gguf", gq.U64, 32, "general.alignment stored as u64 (must be u32)",
             "gguf.cpp:624 'key 'general.alignment' must be of type u32 but is u64'")):
        g = base()
        g.kvs.append(("general.alignment", vt, val, None))
        g.alignment = 32
        add(nm, g.build(), what, "general.alignment", llama)
    # --- tensor infos
    g = base()
    g.tensors[1].offset = 1 << 20
    g.tensors[1].store = False
    add("tensor_offset_past_eof.gguf", g.build(),
        "tensor 'b' offset 1048576: past the end of the file", "tensor b offset",
        "gguf.cpp:796 'tensor 'b' has offset 1048576, expected 64' (llama.cpp requires offsets to be "
        "exactly consecutive, padded); a reader that allows gaps must still check offset + size "
        "<= file size (llama-model-loader.h:47)")
    g = base()
    g.tensors[1].offset = 32
    add("tensor_overlap.gguf", g.build(),
        "tensor 'b' at offset 32 lies inside 'a' (bytes 0..64)", "tensor b offset",
        "gguf.cpp:796 'tensor 'b' has offset 32, expected 64'")
    g = base()
    g.tensors[1].offset = 68
    add("misaligned_offset.gguf", g.build(),
        "tensor 'b' offset 68 is not a multiple of the alignment 32 (and leaves a gap)", "tensor b offset",
        "gguf.cpp:796 'tensor 'b' has offset 68, expected 64'")
    g = base()
    g.tensors[1].ggml_type = 1000
    add("bad_ggml_type.gguf", g.build(), "tensor 'b' has ggml type code 1000", "tensor b type",
        "gguf.cpp:731 'tensor 'b' has invalid ggml type 1000. should be in [0, 43)'")
    g = base()
    g.tensors[1].ggml_type = 4
    add("removed_ggml_type.gguf", g.build(),
        "tensor 'b' has ggml type code 4 (Q4_2, removed; a hole in the enum)", "tensor b type",
        "gguf.cpp:741 block size 0: 'tensor 'b' of type 4 (DEPRECATED) has 4 elements per row, not a "
        "multiple of block size (0)'")
    g = base()
    g.tensors[1].ne = [4, 1, 1, 1, 1]
    add("n_dims_5.gguf", g.build(), "tensor 'b' has n_dims 5 (max 4)", "tensor b n_dims",
        "gguf.cpp:680 'tensor 'b' has invalid number of dimensions: 5 > 4'")
    g = base()
    g.tensors[0].ne = [8, 0]
    g.tensors[0].data = b""
    add("dim_zero.gguf", g.build(), "tensor 'a' has ne = [8, 0] (zero elements, zero bytes)",
        "tensor a ne[1]",
        "ACCEPTED: gguf.cpp:701 'a zero-element tensor is trivially representable'; an engine "
        "should still refuse it where a weight is expected")
    g = base()
    g.tensors[0].ne = [-1, 2]
    add("negative_dim.gguf", g.build(), "tensor 'a' has ne[0] = -1 (as int64)", "tensor a ne[0]",
        "gguf.cpp:693 'tensor 'a' dimension 0 has invalid number of elements: -1 < 0'")
    g = base()
    g.tensors[0].ne = [2**32, 2**32, 4]
    add("nelements_overflow.gguf", g.build(), "tensor 'a' has ne = [2^32, 2^32, 4]: 2^66 elements",
        "tensor a ne", "gguf.cpp:714 'incorrect shape for a tensor 'a' may cause overflow errors'")
    g = base()
    g.tensors[0].ne = [48, 1]
    g.tensors[0].ggml_type = 8
    g.tensors[0].data = b"\0" * 51
    add("row_not_block_multiple.gguf", g.build(),
        "Q8_0 tensor 'a' with ne[0] = 48, not a multiple of the block size 32", "tensor a ne[0]",
        "gguf.cpp:741 'tensor 'a' of type 8 (q8_0) has 48 elements per row, not a multiple of block size (32)'")
    g = base()
    g.tensors[1].name = "a"
    add("duplicate_tensor_name.gguf", g.build(), "two tensors named 'a'", "tensor_info[1].name",
        "gguf.cpp:666 'duplicate tensor name 'a' for tensor 1'")
    g = base()
    g.tensors[1].name = "x" * 64
    add("tensor_name_too_long.gguf", g.build(), "tensor name of 64 bytes (ggml allows at most 63)",
        "tensor_info[1].name", "gguf.cpp:658 'tensor name 1 is too long: 64 >= 64'")
    return out


_VERDICT = r"""
import sys, numpy as np
from gguf import GGUFReader
try:
    r = GGUFReader(sys.argv[1])
    for t in r.tensors:
        np.asarray(t.data).sum()
    print(f"accepts ({len(r.fields)} fields, {len(r.tensors)} tensors)")
except Exception as e:
    msg = str(e).splitlines()[0] if str(e) else ""
    print(f"raises {type(e).__name__}: {msg}"[:240])
"""


def _limit():
    import resource
    resource.setrlimit(resource.RLIMIT_AS, (768 << 20, 768 << 20))


def gguf_py_verdict(path: Path) -> str:
    """GGUFReader in a child process (768 MiB address space, 60 s): on some files it loops over
    the declared element count and would otherwise eat all memory."""
    try:
        p = subprocess.run([sys.executable, "-c", _VERDICT, str(path)], capture_output=True, text=True,
                           timeout=60, preexec_fn=_limit)
    except subprocess.TimeoutExpired:
        return "no verdict within 60 s (it iterates over the declared element count)"
    out = p.stdout.strip()
    if "MemoryError" in out or "MemoryError" in p.stderr:   # where exactly it runs out varies
        return ("runs out of memory: it iterates over the declared element count "
                "(MemoryError under a 768 MiB address-space limit)")
    if p.returncode != 0 or not out:
        err = [ln for ln in p.stderr.splitlines() if ln.strip()]
        return f"child failed (exit {p.returncode}): {err[-1] if err else ''}"[:240]
    return out


def write_malformed(d: Path, rel) -> list[dict]:
    d.mkdir(parents=True)
    (d / "base.gguf").write_bytes(base().build())
    out = [dict(file=rel(d / "base.gguf"), what="VALID: the file every case below starts from "
                "(3 KVs, F32 tensors 'a' ne [8, 2] at offset 0 and 'b' ne [4] at offset 64)",
                field=None, llama_cpp="accepted", gguf_py=gguf_py_verdict(d / "base.gguf"))]
    for name, data, what, field, llama in cases():
        p = d / name
        p.write_bytes(data)
        out.append(dict(file=rel(p), what=what, field=field, llama_cpp=llama, gguf_py=gguf_py_verdict(p)))
    return out
