"""Short turns after the saved 16K conversation of prompt_cache_restart.py (docs/PERFORMANCE.md,
"Prompt cache on disk"): each run restores WORKDIR/cache-after-turn-1, starts a server with
--prompt-cache-dir and sends turn A (the conversation, a placeholder answer and a new question).

    write: times A, then how long its state takes to reach the disk (/stats' written).
    next:  sends turn B, extending A, the moment A's answer arrives (while A's state is written).

Usage: prompt_cache_turns.py write|next WASTE WORKDIR
"""
import importlib.util
import os
import shutil
import sys
import time

mode, waste, work = sys.argv[1], sys.argv[2], sys.argv[3]
# The server start, requests and system prompt are prompt_cache_restart.py's.
sys.argv = ["prompt_cache_restart.py", waste, os.path.join(work, "q4.waste"), work, "0"]
spec = importlib.util.spec_from_file_location("restart", os.path.join(os.path.dirname(__file__), "prompt_cache_restart.py"))
restart = importlib.util.module_from_spec(spec)
restart.MEASURE = False
spec.loader.exec_module(restart)

cache, pristine = os.path.join(work, "cache"), os.path.join(work, "cache-after-turn-1")


def written(url, n):
    while restart.stats(url)["prefix_cache"]["disk"]["written"] < n:
        time.sleep(0.05)
    return restart.stats(url)["prefix_cache"]["disk"]


for i in range(3):
    shutil.rmtree(cache, ignore_errors=True)
    shutil.copytree(pristine, cache)
    p, url, _ = restart.start(["--prompt-cache-dir", cache])
    turn_a = [{"role": "system", "content": restart.SYSTEM}, {"role": "user", "content": "List the tools."},
              {"role": "assistant", "content": "x"}, {"role": "user", "content": f"question {i}"}]
    a, t_a = restart.post(url, {"messages": turn_a, "max_tokens": 4, "temperature": 0})
    answered = time.time()
    if mode == "write":
        d = written(url, 1)
        print(f"run {i+1}: answer {t_a:.2f} s, then the write {time.time() - answered:.2f} s; "
              f"files {d['files']} bytes {d['bytes']}, load {restart.load():.2f}", flush=True)
    else:
        turn_b = turn_a + [{"role": "assistant", "content": a["choices"][0]["message"]["content"]},
                           {"role": "user", "content": "and then?"}]
        b, t_b = restart.post(url, {"messages": turn_b, "max_tokens": 4, "temperature": 0})
        d = written(url, 2)
        u = b["usage"]
        print(f"run {i+1}: turn A {t_a:.2f} s; turn B sent at once: {t_b:.2f} s (cached "
              f"{u['prompt_tokens_details']['cached_tokens']} of {u['prompt_tokens']}); both written "
              f"{time.time() - answered:.2f} s after A; files {d['files']}, load {restart.load():.2f}", flush=True)
    restart.stop(p)
