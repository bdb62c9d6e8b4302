"""The model prompt_cache_restart.py measures: bench/peers/peer_bench.py's Qwen3-MoE
quarter-scale GGUF (12 layers, byte-level vocabulary) with 16 experts a layer and a 32K
context, so the whole model sits in a 4G budget and a 16K-token prompt fits.

Usage: make_model.py OUT.gguf   (then: waste convert OUT.gguf q4.waste --experts q4 --trunk q4)"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "peers"))
import gguf  # noqa: E402
import peer_bench  # noqa: E402

peer_bench.SHAPE["experts"] = 16
context_length = gguf.GGUFWriter.add_context_length
gguf.GGUFWriter.add_context_length = lambda self, n: context_length(self, 32768)
print(peer_bench.write_gguf(Path(sys.argv[1]), 12))
