#!/usr/bin/env python3
"""Time to the first token of a long `/v1/messages` request (issue 34 item 7):
an agent's first turn, a long system prompt plus tool schemas, sent to
`waste serve` and to llama.cpp's own `llama-server` (built from the pinned
sdist), each serving the peer benchmark's 32,768-token-context GGUF in a
memory cgroup, cold: the server is started, its page cache dropped once it
answers /health, then one streamed request with `max_tokens: 1`. Reported:
seconds from sending the request to the first text delta, the prompt's
tokens as the server counted them, the bytes the server read while
answering, and its peak RSS.

    sudo python3 bench/peers/ttft_bench.py --work /var/tmp/waste-peers \\
        --waste ~/.cache/waste-ci-target/release/waste --tokens 16384

Both servers render the same chat template (Qwen3's, from the tests'
fixtures: the peer GGUF has none, being random weights over a byte
vocabulary), so they see the same prompt, one token per byte. llama.cpp runs
with `--no-repack` (as the prefill bench's `--repack 0`) and one slot
(`-np 1`, so the slot has the whole context); WASTE at `--budget` with
`--cache-sessions 0` by default (a kept conversation state is a whole
context of KV inside the budget: two at 17K tokens take 0.86 GB, and the
server then refuses a 1.4G budget as under its floor).
llama-server maps the file, so dropping the page cache after start makes
it read its trunk again during the request; WASTE holds its trunk in its
own memory from start. The trunk is 1.1% of the file.
"""

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import peer_bench as pb  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
TEMPLATE = REPO / "tests/fixtures/chat_templates/llamacpp/Qwen-Qwen3-0.6B.jinja"

AGENT_TEXT = (
    "You are an interactive command-line coding agent. Use the tools below to read, search and edit "
    "the user's repository; explain what you change and why; never invent file contents; run the tests "
    "after every change and report their output faithfully. Keep answers short unless asked otherwise. "
)


def tool(i: int) -> dict:
    return {
        "name": f"tool_{i}",
        "description": f"Tool {i}: reads or changes part of the workspace as its parameters say. " * 3,
        "input_schema": {
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "A path inside the workspace, relative to its root."},
                "pattern": {"type": "string", "description": "A regular expression to search for."},
                "limit": {"type": "integer", "description": "At most this many results.", "minimum": 1},
            },
            "required": ["path"],
        },
    }


def request_body(tokens: int) -> bytes:
    """A request of about `tokens` tokens (one a byte here): a tool's schema
    per 2048 tokens (the template renders each as JSON, about 1.2x its
    `json.dumps`), a system prompt filling the rest, one short user turn."""
    tools = [tool(i) for i in range(max(tokens // 2048, 1))]
    room = max(tokens - int(1.2 * len(json.dumps(tools))) - 300, 0)
    system = (AGENT_TEXT * (room // len(AGENT_TEXT) + 1))[:room]
    body = {
        "model": "peer",
        "max_tokens": 1,
        "stream": True,
        "system": system,
        "tools": tools,
        "messages": [{"role": "user", "content": "Which tool lists the files?"}],
    }
    return json.dumps(body).encode()


def peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def wait_healthy(port: int, proc: subprocess.Popen, limit_s: float) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"the server exited ({proc.returncode}) before it answered /health")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.5)
    sys.exit(f"no healthy server on port {port} within {limit_s} s")


def first_token(port: int, body: bytes) -> dict:
    """Sends the request; seconds to the first text delta, the input tokens
    the server reported (message_start's usage), and the whole reply's time."""
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/messages",
        data=body,
        headers={"content-type": "application/json", "anthropic-version": "2023-06-01", "x-api-key": "none"},
    )
    start = time.monotonic()
    ttft, input_tokens, events = None, None, []
    try:
        reply = urllib.request.urlopen(req, timeout=7200)
    except urllib.error.HTTPError as e:
        sys.exit(f"the server answered {e.code}: {e.read()[:500].decode('utf-8', 'replace')}")
    with reply as r:
        for raw in r:
            line = raw.decode("utf-8", "replace").strip()
            if not line.startswith("data:"):
                continue
            event = json.loads(line[5:])
            events.append(event.get("type"))
            if event.get("type") == "message_start":
                input_tokens = event.get("message", {}).get("usage", {}).get("input_tokens")
            if event.get("type") == "content_block_delta" and ttft is None:
                ttft = time.monotonic() - start
            if event.get("type") == "message_delta":
                input_tokens = event.get("usage", {}).get("input_tokens") or input_tokens
    return {"ttft_s": ttft, "total_s": time.monotonic() - start, "input_tokens": input_tokens, "events": events}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, default=Path("/var/tmp/waste-peers"))
    ap.add_argument("--cache", type=Path, default=Path("/var/tmp/waste-peers"))
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--waste", default=str(REPO / "target/release/waste"))
    ap.add_argument("--tokens", type=int, default=16384, help="the request's size in tokens, about")
    ap.add_argument("--cap", default="1536M", help="the servers' memory cgroup ('none': no cgroup)")
    ap.add_argument("--budget", default="1.4G")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--engines", default="llama-server,waste")
    ap.add_argument("--cache-sessions", type=int, default=0,
                    help="WASTE's kept conversation states (each a whole --ctx of KV inside --budget: at 17K "
                         "tokens the default two do not fit 1.4G beside the trunk)")
    a = ap.parse_args()

    gguf = a.work / f"qwen3moe-random-{a.layers}l-ctx32k.gguf"
    if not gguf.exists():
        sys.exit(f"{gguf} is missing: run prefill_bench.py --long-gguf first")
    server = pb.build_llama_server(a.cache) if "llama-server" in a.engines else None
    ctx, t, port = a.tokens + a.tokens // 8 + 1024, str(a.threads), 18090
    cmds = {
        "llama-server": [str(server or "llama-server"), "-m", str(gguf), "-c", str(ctx), "-t", t, "-np", "1", "--no-repack",
                         "--port", str(port), "--jinja", "--chat-template-file", str(TEMPLATE), "--no-webui"],
        "waste": [a.waste, "serve", str(gguf), "--port", str(port), "--ctx", str(ctx), "--budget", a.budget,
                  "--threads", t, "--chat-template", str(TEMPLATE), "--cache-sessions", str(a.cache_sessions)],
    }
    group = pb.Cgroup("waste-ttft", pb.parse_size(a.cap)) if a.cap != "none" else None
    body = request_body(a.tokens)
    results = {"loadavg_start": pb.loadavg(), "args": {k: str(v) for k, v in vars(a).items()}, "runs": []}
    try:
        for engine in a.engines.split(","):
            log_path = a.work / f"ttft-{engine}.log"
            with open(log_path, "wb") as log:
                proc = subprocess.Popen(cmds[engine], stdout=log, stderr=subprocess.STDOUT,
                                        preexec_fn=group.enter if group else None)
            try:
                wait_healthy(port, proc, 600)
                pb.drop_caches()
                before = pb.process_read_bytes(proc.pid) or 0
                r = first_token(port, body)
                r.update({"engine": engine, "read_bytes": (pb.process_read_bytes(proc.pid) or 0) - before,
                          "peak_rss_bytes": peak_rss(proc.pid), "loadavg": pb.loadavg(), "log": str(log_path)})
            finally:
                proc.terminate()
                proc.wait(timeout=60)
            ttft = "-" if r["ttft_s"] is None else f"{r['ttft_s']:.1f} s"
            pb.log(f"{engine:<13} {r['input_tokens']} input tokens: first token after {ttft}, "
                   f"{r['read_bytes'] / 1e9:.1f} GB read, peak RSS {r['peak_rss_bytes'] / 1e9:.2f} GB")
            results["runs"].append(r)
    finally:
        if group:
            group.remove()
    pb.save_results(a.work / "ttft-results.json", results,
                    ["engine", "input tokens", "first token, s", "prompt tok/s", "GB read", "peak RSS GB"])
    for r in results["runs"]:
        rate = "-" if not (r["ttft_s"] and r["input_tokens"]) else f"{r['input_tokens'] / r['ttft_s']:.1f}"
        ttft = "-" if r["ttft_s"] is None else f"{r['ttft_s']:.1f}"
        print(f"| {r['engine']} | {r['input_tokens']} | {ttft} | {rate} | {r['read_bytes'] / 1e9:.1f} | "
              f"{r['peak_rss_bytes'] / 1e9:.2f} |")


if __name__ == "__main__":
    if os.geteuid() != 0:
        sys.exit("run as root: the cgroup and dropping the page cache need it")
    main()
