#!/usr/bin/env python3
"""Split a GGUF fixture into parts the way llama.cpp's tools write split models, for the test
that a split file equals its unsplit twin.

    python3 tests/gen_gguf_fixtures_split.py LLAMA_CPP_DIR

LLAMA_CPP_DIR is the llama.cpp tree of the pinned llama-cpp-python 0.3.36 sdist (the one
bench/peers/peer_bench.py extracts to ~/.cache/waste-peers/llama.cpp-0.3.36); its vendored
gguf-py is used. The parts are written by gguf-py's `GGUFWriter(split_max_tensors=N)`, the
writer `convert_hf_to_gguf.py --split-max-tensors` uses: `NAME-00001-of-00003.gguf` ...,
every key in the first part, `split.no` / `split.count` in each and `split.tensors.count` in
the first (`llama-gguf-split --split` writes the same keys and names). The tensors' bytes are
copied as stored, so every part's tensors are the unsplit file's, bit for bit.

Writes tests/fixtures/gguf/split/wide-qwen3moe-q4_k_m-0000{1,2,3}-of-00003.gguf from
tests/fixtures/gguf/models/wide-qwen3moe-q4_k_m.gguf.
"""

import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
SOURCE = ROOT / "fixtures/gguf/models/wide-qwen3moe-q4_k_m.gguf"
OUT = ROOT / "fixtures/gguf/split"
PARTS = 3


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.path.insert(0, str(Path(sys.argv[1]) / "gguf-py"))
    import gguf  # the vendored copy

    reader = gguf.GGUFReader(SOURCE)
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    per_part = math.ceil(len(reader.tensors) / PARTS)
    OUT.mkdir(parents=True, exist_ok=True)
    for old in OUT.glob("*.gguf"):
        old.unlink()
    # GGUFWriter names the parts from this path: OUT/NAME-0000i-of-00003.gguf.
    writer = gguf.GGUFWriter(OUT / SOURCE.name, arch, split_max_tensors=per_part)
    for field in reader.fields.values():
        # The writer adds the architecture, the GGUF.* virtual fields and the split keys itself.
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        val_type = field.types[0]
        sub_type = field.types[-1] if val_type == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), val_type, sub_type=sub_type)
    for t in reader.tensors:
        writer.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for t in reader.tensors:
        writer.write_tensor_data(t.data)
    writer.close()

    parts = sorted(OUT.glob("*.gguf"))
    names = [p.name for p in parts]
    want = [f"{SOURCE.stem}-{i:05d}-of-{PARTS:05d}.gguf" for i in range(1, PARTS + 1)]
    if names != want:
        sys.exit(f"expected parts {want}, the writer made {names}")
    # Read back: the parts together hold every tensor of the source, bytes unchanged.
    held = {}
    for p in parts:
        r = gguf.GGUFReader(p)
        assert r.fields["split.count"].contents() == PARTS
        for t in r.tensors:
            held[t.name] = bytes(t.data.tobytes())
    for t in reader.tensors:
        assert held.pop(t.name) == bytes(t.data.tobytes()), t.name
    assert not held, f"extra tensors {list(held)}"
    for p in parts:
        print(f"{p.relative_to(ROOT.parent)}: {p.stat().st_size} bytes")


if __name__ == "__main__":
    main()
