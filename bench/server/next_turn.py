"""A turn sent the moment the previous answer arrives, while that answer's state is written
(docs/PERFORMANCE.md, "Prompt cache on disk"). Run in prompt_cache_restart.py's WORKDIR:
    cd /work/m && python3 $REPO/bench/server/next_turn.py WASTE
"""
import json, shutil, subprocess, sys, time, urllib.request
import os
sys.argv = ["x", sys.argv[1], "q4.waste", os.getcwd(), "0"]
exec(open(__file__.replace(__file__.split("/")[-1], "prompt_cache_restart.py")).read().split("# ~15.9K bytes")[0])
words = "tool schema: read_file(path) returns the file; edit_file(path, old, new) replaces text; run(cmd) runs a shell command. "
system = (words * 200)[:15900]
for i in range(3):
    shutil.rmtree(os.path.join(os.getcwd(), "cache"), ignore_errors=True); shutil.copytree(os.path.join(os.getcwd(), "cache-after-turn-1"), os.path.join(os.getcwd(), "cache"))
    p, url, up = start(["--prompt-cache-dir", os.path.join(os.getcwd(), "cache")])
    msgs = [{"role": "system", "content": system}, {"role": "user", "content": "List the tools."}, {"role": "assistant", "content": "x"}, {"role": "user", "content": f"question {i}"}]
    a, t = post(url, {"messages": msgs, "max_tokens": 4, "temperature": 0})
    t0 = time.time()
    msgs2 = msgs + [{"role": "assistant", "content": a["choices"][0]["message"]["content"]}, {"role": "user", "content": "and then?"}]
    b, t2 = post(url, {"messages": msgs2, "max_tokens": 4, "temperature": 0})
    while stats(url)["prefix_cache"]["disk"]["written"] < 2:
        time.sleep(0.05)
    d = stats(url)["prefix_cache"]["disk"]
    print(f"run {i+1}: turn A {t:.2f} s; turn B sent at once: {t2:.2f} s (cached {b['usage']['prompt_tokens_details']['cached_tokens']} of {b['usage']['prompt_tokens']}); both written {time.time()-t0:.2f} s after A; files {d['files']}, load {load():.2f}", flush=True)
    stop(p)
