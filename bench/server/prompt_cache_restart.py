"""Issue 37 item 3: a 16K-token conversation's next turn after a restart, with and without
--prompt-cache-dir (docs/PERFORMANCE.md, "Prompt cache on disk").

Usage: prompt_cache_restart.py WASTE MODEL WORKDIR RUNS_WITH

MODEL is the peer benchmark's byte-level Qwen3-MoE shape (one token per byte), so the
system prompt below is ~16K tokens. Turn 1 runs once on a server with the cache (its state
is saved), then each run restores that directory, drops the page cache (root), restarts the
server and times turn 2; last, one server without the cache times the same turn 2."""
import json, os, shutil, subprocess, sys, time, urllib.request

waste, model, work, runs = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
common = ["--ctx", "17408", "--budget", "4G", "--threads", "2", "--cache-sessions", "1", "--quiet",
          "--chat-template", os.path.join(os.path.dirname(os.path.abspath(__file__)), "chatml.jinja"), "--port", "0"]

def start(extra):
    t0 = time.time()
    p = subprocess.Popen([waste, "serve", model] + common + extra, stderr=subprocess.PIPE, text=True)
    for line in p.stderr:
        if "http://" in line:
            url = line[line.index("http://"):].split()[0]
            return p, url, time.time() - t0
        print("  server:", line.rstrip(), flush=True)
    raise SystemExit("server did not start")

def post(url, body):
    req = urllib.request.Request(url + "/v1/chat/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    t0 = time.time()
    with urllib.request.urlopen(req, timeout=7200) as r:
        a = json.load(r)
    return a, time.time() - t0

def stats(url):
    with urllib.request.urlopen(url + "/stats") as r:
        return json.load(r)

def stop(p):
    p.kill(); p.wait()

def load():
    return os.getloadavg()[0]

# ~15.9K bytes of system prompt: one token per byte in this vocabulary.
WORDS = "tool schema: read_file(path) returns the file; edit_file(path, old, new) replaces text; run(cmd) runs a shell command. "
SYSTEM = (WORDS * 200)[:15900]
MEASURE = globals().get("MEASURE", True)


def main():
    system = SYSTEM
    turn1 = [{"role": "system", "content": system}, {"role": "user", "content": "List the tools."}]
    cache = os.path.join(work, "cache")
    pristine = os.path.join(work, "cache-after-turn-1")
    shutil.rmtree(cache, ignore_errors=True); shutil.rmtree(pristine, ignore_errors=True)

    p, url, up = start(["--prompt-cache-dir", cache])
    print(f"turn 1 server up in {up:.1f} s, load {load():.2f}", flush=True)
    a1, t1 = post(url, {"messages": turn1, "max_tokens": 16, "temperature": 0})
    while stats(url)["prefix_cache"]["disk"]["written"] < 1:
        time.sleep(0.2)
    disk = stats(url)["prefix_cache"]["disk"]
    print(f"turn 1: {a1['usage']['prompt_tokens']} prompt tokens in {t1:.1f} s; saved {disk['bytes']} bytes, load {load():.2f}", flush=True)
    stop(p)
    shutil.copytree(cache, pristine)
    turn2 = turn1 + [{"role": "assistant", "content": a1["choices"][0]["message"]["content"] or ""},
                     {"role": "user", "content": "Now read the file src/main.rs and tell me what it does, then edit it to print the version first."}]
    body2 = {"messages": turn2, "max_tokens": 16, "temperature": 0}
    results = {"with": [], "without": []}
    answers = []
    for i in range(runs):
        shutil.rmtree(cache); shutil.copytree(pristine, cache)
        subprocess.run(["sh", "-c", "sync; echo 3 > /proc/sys/vm/drop_caches"], check=False)
        l0 = load()
        p, url, up = start(["--prompt-cache-dir", cache])
        a, t = post(url, body2)
        stop(p)
        u = a["usage"]
        results["with"].append((up, t))
        answers.append(a["choices"][0]["message"]["content"])
        print(f"with cache, run {i+1}: start {up:.1f} s, turn 2 {t:.2f} s, prompt {u['prompt_tokens']}, cached {u['prompt_tokens_details']['cached_tokens']}, load {l0:.2f}-{load():.2f}", flush=True)
    subprocess.run(["sh", "-c", "sync; echo 3 > /proc/sys/vm/drop_caches"], check=False)
    l0 = load()
    p, url, up = start([])
    a, t = post(url, body2)
    stop(p)
    u = a["usage"]
    results["without"].append((up, t))
    print(f"without cache: start {up:.1f} s, turn 2 {t:.2f} s, prompt {u['prompt_tokens']}, cached {u['prompt_tokens_details']['cached_tokens']}, load {l0:.2f}-{load():.2f}", flush=True)
    print("same answer:", all(x == a["choices"][0]["message"]["content"] for x in answers), repr(answers[0]))
    print(json.dumps(results))


if MEASURE:
    main()
