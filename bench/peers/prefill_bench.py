#!/usr/bin/env python3
"""Long prompts, side by side: llama.cpp's prompt processing (its default
batch and `-b N -ub N`, its best) against WASTE's chunked prefill, cold, on
the peer benchmark's model and containers (peer_bench.py writes them; run
it with --keep first), in a "machine" cgroup and a capped one.

    sudo python3 bench/peers/prefill_bench.py --layers 12 --lengths 512,2048 \\
        --machine-cap 6G --cap 1536M --budget 1.4G

Per run: tok/s (llama-bench's avg_ts; WASTE bench's tok_per_s), GB the
process read (/proc/PID/io), peak RSS. Prints a table and writes
WORK/prefill-results.json with every command and figure.

Prompts past the GGUF's stated 4,096-token context (8K, 16K) need
`--long-gguf`: the same model written with a 32,768-token context (its
tensors are the same bytes), which both engines then read, WASTE in place:

    sudo python3 bench/peers/prefill_bench.py --long-gguf --lengths 2048,8192 \
        --cap 1536M --machine-cap none --engines waste,waste-plan-chunk,llama-default

Engines: `llama-default` (its batch of 512), `llama-best` (`-b N -ub N`),
`waste` (the plan's chunk, larger on cache lent for a long prompt),
`waste-plan-chunk` (held to the plan's chunk: no lending), `waste-64`.
"""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import peer_bench as pb  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--work", type=Path, default=Path("/var/tmp/waste-peers"))
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "waste-peers")
    ap.add_argument("--waste", default=str(pb.ROOT / "target" / "release" / "waste"))
    ap.add_argument("--format", default="q4", help="the WASTE container's expert format")
    ap.add_argument("--lengths", default="512,2048", help="prompt lengths in tokens")
    ap.add_argument("--machine-cap", default="6G", help="the 'machine' cgroup (the machine, scaled)")
    ap.add_argument("--cap", default="1536M", help="the capped cgroup")
    ap.add_argument("--budget", default="1.4G", help="WASTE's --budget")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--engines", default="llama-default,llama-best,waste,waste-64")
    ap.add_argument("--long-gguf", action="store_true",
                    help="write (if missing) and run the GGUF with a 32,768-token context, WASTE in place")
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: the page cache is dropped before every run and the runs use memory cgroups")
    if a.long_gguf:
        gguf = a.work / f"qwen3moe-random-{a.layers}l-ctx32k.gguf"
        if not gguf.exists():
            a.work.mkdir(parents=True, exist_ok=True)
            pb.log(f"writing {gguf}")
            pb.write_gguf(gguf, a.layers, context=32768)
        container = gguf
    else:
        gguf = a.work / f"qwen3moe-random-{a.layers}l.gguf"
        container = a.work / f"qwen3moe-random-{a.layers}l-{a.format}.waste"
        for p in (gguf, container / "manifest.json"):
            if not p.exists():
                sys.exit(f"{p} is missing: run peer_bench.py --layers {a.layers} --formats {a.format} --keep first")
    bins = pb.build_llama(a.cache)
    groups = {f"{c} cgroup": pb.Cgroup(name, pb.parse_size(c))
              for c, name in ((a.machine_cap, "waste-prefill-machine"), (a.cap, "waste-prefill-cap")) if c != "none"}
    engines = a.engines.split(",")
    t = str(a.threads)
    bench = [str(bins / "llama-bench"), "-m", str(gguf), "-t", t, "-r", "1", "--repack", "0", "-o", "json", "-n", "0"]
    results = {"loadavg_start": pb.loadavg(), "args": {k: str(v) for k, v in vars(a).items()}, "runs": []}
    try:
        for n in [int(x) for x in a.lengths.split(",")]:
            for where, group in groups.items():
                cmds = {
                    "llama-default": bench + ["-p", str(n)],
                    "llama-best": bench + ["-p", str(n), "-b", str(n), "-ub", str(n)],
                    "waste": [a.waste, "bench", str(container), "--prefill", str(n), "--ctx", str(n + 16),
                              "--budget", a.budget, "--threads", t, "--json"],
                }
                # The same engine held to the 64-token chunks it used before
                # the planner picked them (the chunk size's share of a gain),
                # and to the plan's own chunk (lent cache's share).
                cmds["waste-64"] = cmds["waste"] + ["--chunk", "64"]
                if "waste-plan-chunk" in engines:
                    plan = json.loads(subprocess.check_output([a.waste, "plan", str(container), "--ctx", str(n + 16),
                                                               "--budget", a.budget, "--threads", t, "--json"]))
                    cmds["waste-plan-chunk"] = cmds["waste"] + ["--chunk", str(plan["prefill_chunk"])]
                for engine in engines:
                    r = pb.run(cmds[engine], group)
                    tps = None
                    if r["status"] == 0:
                        tail = pb.parse_json_tail(r["stdout"])
                        tps = tail[0]["avg_ts"] if engine.startswith("llama") else tail["tok_per_s"]
                        if engine.startswith("waste"):
                            r["chunk"] = tail.get("chunk_run") or tail.get("chunk")
                    r.update({"engine": engine, "where": where, "tokens": n, "tok_per_s": tps})
                    pb.log(f"{engine:<14} {where:<14} {n:>6} tokens: {tps} tok/s, "
                           f"{r['read_bytes'] / 1e9:.1f} GB read, peak RSS {r['peak_rss_bytes'] / 1e9:.2f} GB")
                    results["runs"].append(r)
    finally:
        for g in groups.values():
            g.remove()
    pb.save_results(a.work / "prefill-results.json", results,
                    ["prompt", "engine", "cgroup", "chunk", "tok/s", "GB read", "peak RSS GB"])
    for r in results["runs"]:
        tps = "-" if r["tok_per_s"] is None else f"{r['tok_per_s']:.1f}"
        print(f"| {r['tokens']} | {r['engine']} | {r['where']} | {r.get('chunk') or '-'} | {tps} | "
              f"{r['read_bytes'] / 1e9:.1f} | {r['peak_rss_bytes'] / 1e9:.2f} |")


if __name__ == "__main__":
    main()
