"""How long writing a 16K conversation's state takes (docs/PERFORMANCE.md, "Prompt cache on disk").

Run in the WORKDIR prompt_cache_restart.py used (q4.waste and cache-after-turn-1 there):
    cd /work/m && python3 $REPO/bench/server/write_time.py WASTE
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
    body = {"messages": [{"role": "system", "content": system}, {"role": "user", "content": "List the tools."}, {"role": "assistant", "content": "x"}, {"role": "user", "content": f"question {i}"}], "max_tokens": 4, "temperature": 0}
    a, t = post(url, body)
    t0 = time.time()
    while stats(url)["prefix_cache"]["disk"]["written"] < 1:
        time.sleep(0.05)
    d = stats(url)["prefix_cache"]["disk"]
    print(f"run {i+1}: answer {t:.2f} s, then the write {time.time()-t0:.2f} s; files {d['files']} bytes {d['bytes']}, load {load():.2f}", flush=True)
    stop(p)
