#!/usr/bin/env python3
"""WASTE side by side with llama.cpp on a MoE model bigger than RAM (issue 23).

Run by hand as root on an otherwise idle machine (never by CI):

    python3 bench/peers/peer_bench.py                      # the issue's model: 48 layers, 33 GB GGUF
    python3 bench/peers/peer_bench.py --layers 12 --formats q4

What it does, in one go (bench/peers/README.md has the details and the disk it needs):

1. builds llama.cpp from the pinned llama-cpp-python 0.3.36 sdist (`pip download` fetches it;
   the build is cached under ~/.cache/waste-peers, outside the clone);
2. writes a Qwen3-MoE-shaped GGUF with random Q4_K matrices and experts and Q8_0 embeddings
   directly (no bf16 intermediate), with a dominant token embedding so routing stays diverse;
3. converts that same file with `waste convert` (q4 experts: the same bytes per token as
   llama.cpp reads; rvq3: our default);
4. with the page cache dropped before every run, measures llama.cpp with the whole machine,
   llama.cpp inside a memory cgroup of --cap, and WASTE with --budget (also inside the cgroup):
   decode tok/s, prefill tok/s of a --prompt-tokens prompt, process start to first generated
   token, peak RSS, bytes read from disk (/proc/PID/io), the greedy tokens, and WASTE's routing
   diversity; prints one table of ratios and writes everything to WORK/results.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
SDIST = "llama_cpp_python-0.3.36.tar.gz"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"

# The model: Qwen3-MoE shape, random weights.
SHAPE = dict(hidden=2048, heads=32, kv_heads=4, head_dim=128, experts=256, expert_width=768, top_k=8, vocab=151_936)
QK_K = 256
Q4_K_BLOCK = 144  # {f16 d; f16 dmin; u8 scales[12]; u8 qs[128]}
Q8_0_BLOCK = 34  # {f16 d; i8 qs[32]}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def loadavg() -> str:
    return Path("/proc/loadavg").read_text().split()[0]


# ---------------------------------------------------------------- the model


class Noise:
    """Fast reproducible random bytes: a 64 MB pool from numpy's generator,
    read at random offsets and XOR-ed with a per-call random word, so every
    tensor differs without paying numpy's ~130 MB/s for 33 GB."""

    POOL = 64 << 20

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        pool = np.frombuffer(self.rng.bytes(self.POOL), dtype=np.uint64)
        self.pool = np.concatenate([pool, pool])

    def bytes(self, n: int) -> np.ndarray:
        words = -(-n // 8)
        out = np.empty(words, dtype=np.uint64)
        done = 0
        while done < words:
            take = min(words - done, len(self.pool) // 2)
            at = int(self.rng.integers(0, len(self.pool) // 2))
            np.bitwise_xor(self.pool[at : at + take], np.uint64(self.rng.integers(0, 2**63)), out=out[done : done + take])
            done += take
        return out.view(np.uint8)[:n]


def q4_k(noise: Noise, rows: int, cols: int, std: float) -> np.ndarray:
    """Random Q4_K blocks whose values have about `std`: random 6-bit scales
    and mins and 4-bit quants, `d` and `dmin` chosen so that d*sc*q - dmin*m
    is centred (mean sc*q ~ 236, mean m ~ 31.5)."""
    blocks = rows * cols // QK_K
    b = noise.bytes(blocks * Q4_K_BLOCK).reshape(blocks, Q4_K_BLOCK)
    d = np.float16(std / 150.0)
    dmin = np.float16(float(d) * 7.5)
    b[:, 0:2] = np.frombuffer(d.tobytes(), dtype=np.uint8)
    b[:, 2:4] = np.frombuffer(dmin.tobytes(), dtype=np.uint8)
    return b.reshape(rows, cols // QK_K * Q4_K_BLOCK)


def q8_0(noise: Noise, rows: int, cols: int, std: float) -> np.ndarray:
    blocks = rows * cols // 32
    b = noise.bytes(blocks * Q8_0_BLOCK).reshape(blocks, Q8_0_BLOCK)
    b[:, 0:2] = np.frombuffer(np.float16(std / 73.0).tobytes(), dtype=np.uint8)  # int8 uniform: std 73.9
    return b.reshape(rows, cols // 32 * Q8_0_BLOCK)


def write_gguf(path: Path, layers: int, seed: int = 23, context: int = 4096) -> dict:
    """The GGUF, streamed tensor by tensor with gguf-py's writer; `context`
    is the trained context it states (the weights do not depend on it)."""
    import gguf

    s = SHAPE
    h, hd, nh, nkv, e, w, v = (s[k] for k in ("hidden", "head_dim", "heads", "kv_heads", "experts", "expert_width", "vocab"))
    noise = Noise(seed)
    rng = np.random.default_rng(seed + 1)
    Q4K, Q80, F32 = gguf.GGMLQuantizationType.Q4_K, gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.F32

    # A byte-level vocabulary: the 256 byte symbols (so any prompt tokenizes
    # the same way in both engines, one token per byte), <|endoftext|>, and
    # fillers that decode to text of their own. No merges.
    byte_symbols = bytes_to_unicode()
    tokens = [byte_symbols[b] for b in range(256)] + ["<|endoftext|>", "ĠĠ"]
    tokens += [f"t{i}" for i in range(len(tokens), v)]
    types = [1] * 256 + [3] + [1] * (v - 257)

    # (name, byte shape, ggml type, maker); makers run while writing.
    plan: list[tuple[str, list[int], object, object]] = []
    # A dominant token embedding (std 1) over attention and expert outputs
    # (std 0.002 weights): the router sees mostly the token, so consecutive
    # tokens route differently, as in trained models (the trap the issue names).
    plan.append(("token_embd.weight", [v, h // 32 * Q8_0_BLOCK], Q80, lambda: q8_0(noise, v, h, 1.0)))
    for l in range(layers):
        p = f"blk.{l}."
        ones = lambda n: np.ones(n, dtype=np.float32)
        plan += [
            (p + "attn_norm.weight", [h], F32, lambda: ones(h)),
            (p + "attn_q.weight", [nh * hd, h // QK_K * Q4_K_BLOCK], Q4K, lambda: q4_k(noise, nh * hd, h, 0.02)),
            (p + "attn_k.weight", [nkv * hd, h // QK_K * Q4_K_BLOCK], Q4K, lambda: q4_k(noise, nkv * hd, h, 0.02)),
            (p + "attn_v.weight", [nkv * hd, h // QK_K * Q4_K_BLOCK], Q4K, lambda: q4_k(noise, nkv * hd, h, 0.02)),
            (p + "attn_output.weight", [h, nh * hd // QK_K * Q4_K_BLOCK], Q4K, lambda: q4_k(noise, h, nh * hd, 0.002)),
            (p + "attn_q_norm.weight", [hd], F32, lambda: ones(hd)),
            (p + "attn_k_norm.weight", [hd], F32, lambda: ones(hd)),
            (p + "ffn_norm.weight", [h], F32, lambda: ones(h)),
            (p + "ffn_gate_inp.weight", [e, h], F32, lambda: rng.standard_normal((e, h), dtype=np.float32)),
            (p + "ffn_gate_exps.weight", [e, w, h // QK_K * Q4_K_BLOCK], Q4K, lambda: q4_k(noise, e * w, h, 0.02).reshape(e, w, -1)),
            (p + "ffn_up_exps.weight", [e, w, h // QK_K * Q4_K_BLOCK], Q4K, lambda: q4_k(noise, e * w, h, 0.02).reshape(e, w, -1)),
            (p + "ffn_down_exps.weight", [e, h, w // QK_K * Q4_K_BLOCK], Q4K, lambda: q4_k(noise, e * h, w, 0.002).reshape(e, h, -1)),
        ]
    plan.append(("output_norm.weight", [h], F32, lambda: np.ones(h, dtype=np.float32)))
    plan.append(("output.weight", [v, h // 32 * Q8_0_BLOCK], Q80, lambda: q8_0(noise, v, h, 0.05)))

    wr = gguf.GGUFWriter(str(path), "qwen3moe")
    wr.add_name("WASTE peer benchmark: random Qwen3-MoE shape")
    wr.add_block_count(layers)
    wr.add_context_length(context)
    wr.add_embedding_length(h)
    wr.add_feed_forward_length(w)
    wr.add_expert_feed_forward_length(w)
    wr.add_head_count(nh)
    wr.add_head_count_kv(nkv)
    wr.add_key_length(hd)
    wr.add_value_length(hd)
    wr.add_rope_freq_base(1_000_000.0)
    wr.add_layer_norm_rms_eps(1e-6)
    wr.add_expert_count(e)
    wr.add_expert_used_count(s["top_k"])
    wr.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M)
    wr.add_tokenizer_model("gpt2")
    wr.add_tokenizer_pre("qwen2")
    wr.add_token_list(tokens)
    wr.add_token_types(types)
    wr.add_token_merges(["Ġ Ġ"])  # llama.cpp refuses a BPE vocabulary without merges: one, two spaces
    wr.add_eos_token_id(256)
    wr.add_add_bos_token(False)
    for name, shape, ty, _ in plan:
        dtype = np.float32 if ty == F32 else np.uint8
        nbytes = int(np.prod(shape)) * (4 if ty == F32 else 1)
        wr.add_tensor_info(name, shape, np.dtype(dtype), nbytes, raw_dtype=ty)
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_ti_data_to_file()
    for i, (name, shape, ty, make) in enumerate(plan):
        wr.write_tensor_data(np.ascontiguousarray(make()).reshape(shape))
        if name.endswith("ffn_down_exps.weight"):
            log(f"  wrote layer {name.split('.')[1]} of {layers}")
    wr.close()
    return {"layers": layers, **s, "bytes": path.stat().st_size}


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table (what byte-level BPE tokens are spelled in)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def model_bytes(layers: int) -> tuple[int, int]:
    """(GGUF bytes, routed-expert bytes read per token) for `layers` layers."""
    s = SHAPE
    h, w, e = s["hidden"], s["expert_width"], s["experts"]
    expert = 3 * h * w // QK_K * Q4_K_BLOCK
    attn = (s["heads"] * s["head_dim"] * h * 2 + s["kv_heads"] * s["head_dim"] * h * 2) // QK_K * Q4_K_BLOCK
    per_layer = e * expert + attn + e * h * 4 + 4 * (2 * h + 2 * s["head_dim"])
    table = s["vocab"] * h // 32 * Q8_0_BLOCK
    return layers * per_layer + 2 * table, layers * s["top_k"] * expert


# ---------------------------------------------------------------- llama.cpp


def build_llama(cache: Path) -> Path:
    """llama.cpp's tools from the pinned sdist, built once into `cache`."""
    bin_dir = cache / "llama.cpp-0.3.36" / "build" / "bin"
    if (bin_dir / "llama-bench").exists() and (bin_dir / "llama-completion").exists():
        return bin_dir
    cache.mkdir(parents=True, exist_ok=True)
    sdist = cache / SDIST
    if not sdist.exists():
        log("downloading the llama-cpp-python 0.3.36 sdist")
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", "llama-cpp-python",
             "llama-cpp-python==0.3.36", "-d", str(cache)],
            check=True,
        )
    import hashlib

    digest = hashlib.sha256(sdist.read_bytes()).hexdigest()
    if digest != SDIST_SHA256:
        sys.exit(f"{sdist}: sha256 {digest}, expected {SDIST_SHA256}")
    src = cache / "llama.cpp-0.3.36"
    if not (src / "CMakeLists.txt").exists():
        with tarfile.open(sdist) as t:
            prefix = "llama_cpp_python-0.3.36/vendor/llama.cpp/"
            members = [m for m in t.getmembers() if m.name.startswith(prefix)]
            for m in members:
                m.name = m.name[len(prefix):]
            t.extractall(src, members=[m for m in members if m.name], filter="data")
    cmake = shutil.which("cmake") or sys.exit("cmake not found: `python3 -m pip install cmake`")
    log("building llama.cpp (GGML_NATIVE=ON; ~3 minutes on 2 cores)")
    subprocess.run(
        [cmake, "-S", str(src), "-B", str(src / "build"), "-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON",
         "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_SERVER=OFF"],
        check=True, stdout=subprocess.DEVNULL,
    )
    subprocess.run(
        [cmake, "--build", str(src / "build"), "-j", str(os.cpu_count() or 2), "--target", "llama-bench", "llama-completion"],
        check=True, stdout=subprocess.DEVNULL,
    )
    return bin_dir


def build_llama_server(cache: Path) -> Path:
    """`llama-server` from the same sdist and build tree (the time-to-first-
    token bench), configured in only when asked for: it adds minutes of
    compiling that the other benches do not need."""
    bin_dir = build_llama(cache)
    if (bin_dir / "llama-server").exists():
        return bin_dir / "llama-server"
    src = cache / "llama.cpp-0.3.36"
    cmake = shutil.which("cmake") or sys.exit("cmake not found: `python3 -m pip install cmake`")
    log("building llama-server (~5 minutes on 2 cores)")
    subprocess.run([cmake, "-S", str(src), "-B", str(src / "build"), "-DLLAMA_BUILD_SERVER=ON"],
                   check=True, stdout=subprocess.DEVNULL)
    subprocess.run([cmake, "--build", str(src / "build"), "-j", str(os.cpu_count() or 2), "--target", "llama-server"],
                   check=True, stdout=subprocess.DEVNULL)
    return bin_dir / "llama-server"


# ---------------------------------------------------------------- running


class Cgroup:
    """A memory cgroup of `limit` bytes (v1 `memory.limit_in_bytes` where the
    v1 memory controller is mounted, else v2 `memory.max`)."""

    def __init__(self, name: str, limit: int):
        v1 = Path("/sys/fs/cgroup/memory")
        if (v1 / "memory.limit_in_bytes").exists():
            self.dir, self.knob, self.version = v1 / name, "memory.limit_in_bytes", 1
        else:
            root = Path("/sys/fs/cgroup")
            if "memory" not in (root / "cgroup.controllers").read_text():
                sys.exit("no memory cgroup controller (v1 or v2) is available")
            (root / "cgroup.subtree_control").write_text("+memory")
            self.dir, self.knob, self.version = root / name, "memory.max", 2
        self.dir.mkdir(exist_ok=True)
        (self.dir / self.knob).write_text(str(limit))

    def enter(self) -> None:
        (self.dir / "cgroup.procs").write_text(str(os.getpid()))

    def remove(self) -> None:
        try:
            self.dir.rmdir()
        except OSError:
            pass


def save_results(path: Path, results: dict, columns: list[str]) -> None:
    """Ends a run's `results` (the load average now), writes them to `path`
    as JSON, and prints the load line and the header of the table of
    `columns` that the caller's rows then fill."""
    results["loadavg_end"] = loadavg()
    path.write_text(json.dumps(results, indent=1))
    print(f"\nload average {results['loadavg_start']} at the start, {results['loadavg_end']} at the end")
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))


def parse_size(v: str) -> int:
    """`1536M` or `6G` (binary units), as the cgroup options take them."""
    return int(float(v[:-1]) * {"G": 1 << 30, "M": 1 << 20}[v[-1].upper()])


def process_read_bytes(pid: int) -> int | None:
    """Bytes process `pid` has had read from storage (`read_bytes` of
    /proc/PID/io); None once the process is gone."""
    try:
        for line in Path(f"/proc/{pid}/io").read_text().splitlines():
            if line.startswith("read_bytes:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def drop_caches() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3")


def run(cmd: list[str], cgroup: Cgroup | None, first_output: bool = False) -> dict:
    """Runs `cmd` cold (page cache dropped): wall time, time to its first
    byte of stdout, peak RSS, bytes it read from disk, stdout, stderr."""
    drop_caches()
    start = time.monotonic()
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=cgroup.enter if cgroup else None
    )
    read_bytes = 0
    first = None
    out = b""
    os.set_blocking(proc.stdout.fileno(), False)
    err_chunks = []
    os.set_blocking(proc.stderr.fileno(), False)
    status = 0
    usage = None
    while True:
        read_bytes = process_read_bytes(proc.pid) or read_bytes
        chunk = proc.stdout.read()
        if chunk:
            if first is None:
                first = time.monotonic() - start
            out += chunk
        err_chunks.append(proc.stderr.read() or b"")
        # Reaped here, not by Popen, to get this child's own peak RSS.
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        time.sleep(0.02)
    proc.returncode = os.waitstatus_to_exitcode(status)
    out += proc.stdout.read() or b""
    err_chunks.append(proc.stderr.read() or b"")
    wall = time.monotonic() - start
    rusage = usage
    return {
        "cmd": " ".join(cmd),
        "status": proc.returncode,
        "wall_s": wall,
        "first_output_s": first,
        "peak_rss_bytes": rusage.ru_maxrss * 1024,
        "read_bytes": read_bytes,
        "stdout": out.decode(errors="replace"),
        "stderr": b"".join(err_chunks).decode(errors="replace")[-4000:],
    }


def parse_json_tail(text: str):
    """The last JSON value a tool printed (llama-bench -o json, waste --json)."""
    for start in [i for i, c in enumerate(text) if c in "[{"]:
        try:
            return json.loads(text[start:])
        except json.JSONDecodeError:
            continue
    raise ValueError(f"no JSON in: {text[-500:]}")


def measure_llama(bins: Path, gguf: Path, a, cgroup: Cgroup | None, prompt: str) -> dict:
    t = str(a.threads)
    bench = [str(bins / "llama-bench"), "-m", str(gguf), "-t", t, "-r", "1", "--repack", "0", "-o", "json"]
    tps = lambda r: parse_json_tail(r["stdout"])[0]["avg_ts"] if r["status"] == 0 else None
    dec = cold_runs(lambda: run(bench + ["-p", "0", "-n", str(a.tokens)], cgroup), tps, a.rounds)
    pre = run(bench + ["-p", str(a.prompt_tokens), "-n", "0"], cgroup)
    pre["tok_per_s"] = tps(pre)
    # -nr: as --repack 0 above (the repack buffer is the model's size and
    # is refused, or OOM-killed inside a cgroup, past RAM).
    gen = run(
        [str(bins / "llama-completion"), "-m", str(gguf), "-p", prompt, "-n", str(a.tokens), "--temp", "0",
         "-t", t, "-c", "512", "-no-cnv", "--no-display-prompt", "--no-warmup", "-s", "0", "-nr"],
        cgroup,
    )
    return {"decode": dec, "prefill": pre, "generate": gen}


def cold_runs(one, tok_per_s, rounds: int) -> dict:
    """`rounds` cold runs of a decode measurement: the median run, with
    every run's tok/s beside it (the disk's speed moves run to run)."""
    runs = []
    for _ in range(rounds):
        r = one()
        r["tok_per_s"] = tok_per_s(r)
        runs.append(r)
    ok = sorted((r for r in runs if r["tok_per_s"] is not None), key=lambda r: r["tok_per_s"])
    median = dict(ok[len(ok) // 2] if ok else runs[0])
    median["all_tok_per_s"] = [r["tok_per_s"] for r in runs]
    return median


# Router lookahead settings every WASTE decode figure is given with: the
# engine's default and off, so a reader sees lookahead's share.
LOOKAHEADS = (6, 0)


def measure_waste(waste: str, container: Path, a, cgroup: Cgroup | None, prompt: str, tag: str) -> dict:
    """`tag` names this run's routing log (one per run, never overwritten)."""
    common = ["--budget", a.budget, "--threads", str(a.threads)]
    tps = lambda r: parse_json_tail(r["stdout"])["tok_per_s"] if r["status"] == 0 else None
    decode = {}
    for la in LOOKAHEADS:
        decode[la] = cold_runs(
            lambda: run([waste, "bench", str(container), "--tokens", str(a.tokens), "--json", "--ctx", "512",
                         "--lookahead", str(la)] + common, cgroup),
            tps, a.rounds,
        )
    pre = run([waste, "bench", str(container), "--prefill", str(a.prompt_tokens), "--json", "--ctx", "512"] + common, cgroup)
    gen = run(
        [waste, "run", str(container), prompt, "-n", str(a.tokens), "--temp", "0", "--ctx", "512", "--seed", "0",
         "--route-log", str(a.work / f"routes-{tag}.jsonl")] + common,
        cgroup,
    )
    pre["tok_per_s"] = tps(pre)
    for r in (*decode.values(), pre):
        r["bench"] = parse_json_tail(r["stdout"]) if r["status"] == 0 else None
    return {"decode": decode[LOOKAHEADS[0]], "decode_lookahead_off": decode[0], "prefill": pre, "generate": gen}


def routing_diversity(path: Path) -> dict | None:
    """Distinct experts per layer over the logged decode steps and the mean
    overlap of consecutive steps' top-k (the collapse check of the issue)."""
    if not path.exists():
        return None
    steps = [json.loads(l)["layers"] for l in path.read_text().splitlines() if l.strip()]
    if len(steps) < 2:
        return None
    layers = len(steps[0])
    distinct = [len({e for s in steps for e in s[l]}) for l in range(layers)]
    overlap = [len(set(a[l]) & set(b[l])) for a, b in zip(steps, steps[1:]) for l in range(layers)]
    return {"steps": len(steps), "distinct_per_layer_mean": sum(distinct) / layers,
            "consecutive_overlap_mean": sum(overlap) / len(overlap)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=48)
    ap.add_argument("--work", type=Path, default=Path("/var/tmp/waste-peers"), help="where the GGUF and containers go")
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "waste-peers", help="llama.cpp build cache")
    ap.add_argument("--waste", default=str(ROOT / "target" / "release" / "waste"))
    ap.add_argument("--formats", default="q4,rvq3", help="expert formats to convert to (q4: llama.cpp's bytes per token)")
    ap.add_argument("--cap", default="4G", help="memory cgroup limit for the capped runs")
    ap.add_argument("--machine-cap", default=None,
                    help="run the 'whole machine' rows in a cgroup of this size: a smaller model against a "
                         "proportionally smaller machine (e.g. --layers 12 --machine-cap 6G --cap 1G for 1/4 scale)")
    ap.add_argument("--budget", default="4G", help="WASTE's --budget")
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3, help="cold decode runs per engine and setting (median reported)")
    ap.add_argument("--keep", action="store_true", help="keep the GGUF and containers afterwards")
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: the page cache is dropped before every run and the capped runs use a memory cgroup")
    if not Path(a.waste).exists():
        sys.exit(f"{a.waste}: build it first (cargo build --release -p waste-cli)")
    formats = [f for f in a.formats.split(",") if f]
    gguf_bytes, per_token = model_bytes(a.layers)
    a.work.mkdir(parents=True, exist_ok=True)
    # What is still to be written (a rerun with --keep reuses the files).
    gguf_path = a.work / f"qwen3moe-random-{a.layers}l.gguf"
    need = 0 if gguf_path.exists() else gguf_bytes
    for fmt, share in (("q4", 0.95), ("rvq3", 0.7)):
        if fmt in formats and not (a.work / f"qwen3moe-random-{a.layers}l-{fmt}.waste" / "manifest.json").exists():
            need += share * gguf_bytes
    free = shutil.disk_usage(a.work).free
    if free < need:
        sys.exit(f"{a.work}: {free / 1e9:.1f} GB free, the run needs about {need / 1e9:.1f} GB (--layers fewer, --formats q4)")
    cap = parse_size(a.cap)

    bins = build_llama(a.cache)
    gguf = a.work / f"qwen3moe-random-{a.layers}l.gguf"
    if not gguf.exists():
        log(f"writing {gguf} ({gguf_bytes / 1e9:.1f} GB)")
        write_gguf(gguf, a.layers)
    containers = {}
    for fmt in formats:
        c = a.work / f"qwen3moe-random-{a.layers}l-{fmt}.waste"
        if not (c / "manifest.json").exists():
            log(f"converting to {c} ({fmt} experts)")
            t = time.monotonic()
            subprocess.run([a.waste, "convert", str(gguf), str(c), "--experts", fmt, "--jobs", str(a.threads)], check=True)
            log(f"  {time.monotonic() - t:.0f} s")
        containers[fmt] = c

    prompt = "The quick brown fox jumps over the lazy dog, again."[: a.prompt_tokens]
    group = Cgroup("waste-peers", cap)
    machine = Cgroup("waste-peers-machine", parse_size(a.machine_cap)) if a.machine_cap else None
    whole = f"{a.machine_cap} cgroup (the machine, scaled)" if a.machine_cap else "whole machine"
    results = {"loadavg_start": loadavg(), "model": {"layers": a.layers, **SHAPE, "gguf_bytes": gguf_bytes,
               "routed_bytes_per_token_q4k": per_token}, "args": {k: str(v) for k, v in vars(a).items()}, "runs": {}}
    try:
        results["runs"][f"llama.cpp, {whole}"] = measure_llama(bins, gguf, a, machine, prompt)
        results["runs"][f"llama.cpp, {a.cap} cgroup"] = measure_llama(bins, gguf, a, group, prompt)
        for fmt, c in containers.items():
            for where, cgroup, tag in ((whole, machine, "machine"), (f"{a.cap} cgroup", group, "cap")):
                tag = f"{c.stem}-{tag}"
                results["runs"][f"WASTE {fmt}, --budget {a.budget}, {where}"] = measure_waste(
                    a.waste, c, a, cgroup, prompt, tag)
                results[f"routing_{tag}"] = routing_diversity(a.work / f"routes-{tag}.jsonl")
    finally:
        group.remove()
        if machine:
            machine.remove()
    results["loadavg_end"] = loadavg()
    (a.work / "results.json").write_text(json.dumps(results, indent=1))
    print_table(results)
    if not a.keep:
        gguf.unlink()
        for c in containers.values():
            shutil.rmtree(c)


def picks(bench: dict | None) -> str:
    """Where a WASTE decode's expert picks came from, and the lookahead's
    recall, from its bench JSON; '-' for llama.cpp."""
    if not bench or "reused" not in bench:
        return "-"
    recall = bench.get("lookahead_recall")
    named = f", lookahead named {100 * recall:.0f}%" if recall is not None else ""
    return (f"{bench['reused']} reused / {bench['prefetched']} prefetched / {bench['missed']} read "
            f"({100 * bench['reuse_rate']:.0f}% reuse{named})")


def print_table(r: dict) -> None:
    runs = r["runs"]
    base = next(iter(runs.values()))
    fmt = lambda x, f="{:.3f}": "-" if x is None else f.format(x)
    print(f"\nmodel: {r['model']['layers']} layers, GGUF {r['model']['gguf_bytes'] / 1e9:.1f} GB; load average "
          f"{r['loadavg_start']} at the start, {r['loadavg_end']} at the end")
    print("| run | decode tok/s (median; all runs) | x first row | prefill tok/s | first token s | peak RSS GB | GB the process read / decoded token | expert picks (median run) | tokens |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, m in runs.items():
        p, g = m["prefill"], m["generate"]
        decodes = [(name, m["decode"])]
        if "decode_lookahead_off" in m:
            decodes = [(f"{name}, lookahead {LOOKAHEADS[0]}", m["decode"]),
                       (f"{name}, lookahead off", m["decode_lookahead_off"])]
        for label, d in decodes:
            ratio = d["tok_per_s"] / base["decode"]["tok_per_s"] if d["tok_per_s"] and base["decode"]["tok_per_s"] else None
            per_tok = d["read_bytes"] / 1e9 / max(1, int(r["args"]["tokens"]))
            every = ", ".join(fmt(x, "{:.2f}") for x in d.get("all_tok_per_s", []))
            print(f"| {label} | {fmt(d['tok_per_s'])} ({every}) | {fmt(ratio, '{:.1f}x')} | {fmt(p['tok_per_s'])} | "
                  f"{fmt(g['first_output_s'], '{:.1f}')} | {g['peak_rss_bytes'] / 1e9:.2f} | {per_tok:.2f} | "
                  f"{picks(d.get('bench'))} | {g['stdout'].strip()[:40]!r} |")
    for k, v in r.items():
        if k.startswith("routing_"):
            print(f"{k}: {v}")


if __name__ == "__main__":
    main()
