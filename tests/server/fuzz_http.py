#!/usr/bin/env python3
"""Mutation fuzzing of `waste serve`'s request bodies over HTTP.

The request parser lives in the server crate, above wasmtime, where cargo-fuzz
would have to instrument wasmtime too; this drives the running server instead,
black-box: valid OpenAI requests (chat and completions, streamed or not, with
tools, logprobs, stop strings, logit_bias, template variables) mutated by JSON-aware
edits (keys dropped, added, retyped; numbers at and past their bounds; deep
nesting; long, empty and non-ASCII strings) and by byte edits (flips,
truncations, insertions, invalid UTF-8), from a fixed seed so a run replays.

Invariants, each a failure when broken:
  * every answer is one of the statuses the API documents (200, 400, 413, 415,
    422, 429, 503), never a 5xx other than 503, never a dropped connection;
  * an error answer is JSON in OpenAI's error shape; a 200 is a whole JSON
    completion or a whole event stream ending in `data: [DONE]`;
  * /health answers after every batch, and a fixed greedy request still gets the
    same text at the end as at the start.

Usage: fuzz_http.py BASE_URL API_KEY [--seconds S | --requests N] [--seed K]
Prints one summary line: requests, seconds, statuses, failures.
"""

import argparse
import http.client
import json
import random
import sys
import time
import urllib.parse

SEEDS = [
    ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "And God said"}], "max_tokens": 8}),
    ("/v1/chat/completions", {"model": "m", "messages": [{"role": "system", "content": "Be brief."},
                                                       {"role": "user", "content": "Who made the light?"}],
                              "max_tokens": 6, "temperature": 0.7, "top_p": 0.9, "seed": 3, "stream": True}),
    ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 4,
                              "logprobs": True, "top_logprobs": 3, "stop": ["\n", "God"],
                              "logit_bias": {"17": -5, "100": 2}, "presence_penalty": 0.5}),
    ("/v1/chat/completions", {"model": "m", "max_tokens": 4,
                              "messages": [{"role": "user", "content": "add 2 and 2"},
                                           {"role": "assistant", "content": None, "tool_calls": [
                                               {"id": "c1", "type": "function",
                                                "function": {"name": "add", "arguments": "{\"a\": 2, \"b\": 2}"}}]},
                                           {"role": "tool", "tool_call_id": "c1", "content": "4"}],
                              "tools": [{"type": "function", "function": {"name": "add", "parameters": {
                                  "type": "object", "properties": {"a": {"type": "number"}}}}}],
                              "chat_template_kwargs": {"enable_thinking": False}}),
    ("/v1/completions", {"model": "m", "prompt": "In the beginning", "max_tokens": 8, "temperature": 0}),
    ("/v1/completions", {"model": "m", "prompt": "And", "max_tokens": 5, "stream": True, "stream_options": {"include_usage": True},
                         "frequency_penalty": 1.0, "top_k": 5, "min_p": 0.05, "echo": False}),
]

ALLOWED = {200, 400, 413, 415, 422, 429, 503}
WEIRD_VALUES = [None, True, False, 0, -1, 1, 2**31, 2**63, -2**63, 2**64 + 1, 1e308, -1e308, 1e-320, 0.5, -0.0,
                "", "x" * 10000, "\u0000", "\ud7ff\ue000\U0010ffff", "<|im_start|>", "{{ raise }}", [], {}, [[[]]],
                {"a": {"b": {"c": []}}}, [1, "2", None], "NaN", "Infinity"]


def mutate_json(rng, value, depth=0):
    if isinstance(value, dict) and value and rng.random() < 0.7:
        value = dict(value)
        key = rng.choice(list(value))
        op = rng.random()
        if op < 0.25:
            del value[key]
        elif op < 0.5:
            value[key] = rng.choice(WEIRD_VALUES)
        elif op < 0.75 and depth < 4:
            value[key] = mutate_json(rng, value[key], depth + 1)
        else:
            value[rng.choice(["n", "best_of", "max_completion_tokens", "response_format", "user", "zzz", key + "_"])] = \
                rng.choice(WEIRD_VALUES)
        return value
    if isinstance(value, list) and value and rng.random() < 0.7:
        value = list(value)
        i = rng.randrange(len(value))
        op = rng.random()
        if op < 0.3:
            del value[i]
        elif op < 0.6 and depth < 4:
            value[i] = mutate_json(rng, value[i], depth + 1)
        else:
            value.insert(i, rng.choice(WEIRD_VALUES + [value[i]] * 3))
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return rng.choice([value * 10, -value, value + 1, 0, 2**53, 1e9, -1e9])
    if isinstance(value, str):
        return rng.choice([value * 50, "", value[::-1], value + "\udcff"[:0] + "\u202e", "\n" * 100])
    return rng.choice(WEIRD_VALUES)


def mutate_bytes(rng, data):
    data = bytearray(data)
    for _ in range(rng.randint(1, 6)):
        op = rng.random()
        if op < 0.3 and data:
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        elif op < 0.5 and data:
            del data[rng.randrange(len(data)):]
        elif op < 0.7:
            at = rng.randrange(len(data) + 1)
            data[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        elif op < 0.85:
            at = rng.randrange(len(data) + 1)
            data[at:at] = rng.choice([b"\xff\xfe", b"[" * 2000, b"{\"a\":" * 500, b"\"\\ud800\"", b"1e99999", b",,"])
        else:
            data += b"\x00" * rng.randint(1, 64)
    return bytes(data)


def make_body(rng):
    path, seed = rng.choice(SEEDS)
    body = seed
    for _ in range(rng.randint(0, 4)):
        body = mutate_json(rng, body)
    try:
        raw = json.dumps(body).encode()
    except (TypeError, ValueError):
        raw = json.dumps(seed).encode()
    if rng.random() < 0.3:
        raw = mutate_bytes(rng, raw)
    if rng.random() < 0.05:
        raw = b"[" * 100000 + b"]" * 100000
    return path, raw


class Exchange:
    def __init__(self, base, key):
        u = urllib.parse.urlparse(base)
        self.host, self.port, self.key = u.hostname, u.port, key

    def request(self, method, path, body=None, content_type="application/json"):
        conn = http.client.HTTPConnection(self.host, self.port, timeout=120)
        headers = {"Authorization": f"Bearer {self.key}"}
        if body is not None:
            headers["Content-Type"] = content_type
        conn.request(method, path, body=body, headers=headers)
        r = conn.getresponse()
        data = r.read()
        conn.close()
        return r.status, r.getheader("Content-Type") or "", data


def check(status, ctype, data, why):
    if status not in ALLOWED:
        return f"status {status}: {data[:300]!r} for {why}"
    if status != 200:
        try:
            err = json.loads(data)
            assert isinstance(err["error"]["message"], str) and err["error"]["message"]
        except Exception:
            return f"status {status} without an OpenAI error body: {data[:300]!r} for {why}"
        return None
    if ctype.startswith("text/event-stream"):
        text = data.decode("utf-8", "replace")
        if not text.rstrip().endswith("data: [DONE]"):
            return f"an event stream that does not end in [DONE]: {text[-300:]!r} for {why}"
        for line in text.splitlines():
            if line.startswith("data: ") and line != "data: [DONE]":
                try:
                    json.loads(line[6:])
                except ValueError:
                    return f"an event that is not JSON: {line[:300]!r} for {why}"
        return None
    try:
        json.loads(data)
    except ValueError:
        return f"a 200 that is not JSON: {data[:300]!r} for {why}"
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("base")
    ap.add_argument("key")
    ap.add_argument("--seconds", type=float, default=0)
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--seed", type=int, default=16)
    ap.add_argument("--max-body", type=int, default=16 << 20, help="the server's --max-body in bytes")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    ex = Exchange(a.base, a.key)
    probe = json.dumps({"model": "m", "prompt": "And God said", "max_tokens": 12, "temperature": 0}).encode()
    status, _, first = ex.request("POST", "/v1/completions", probe)
    assert status == 200, first
    want = json.loads(first)["choices"][0]["text"]
    started = time.time()
    statuses, failures, n = {}, [], 0
    while (time.time() - started < a.seconds) if a.seconds else (n < a.requests):
        path, raw = make_body(rng)
        ctype = "application/json" if rng.random() < 0.97 else rng.choice(["text/plain", "application/json; charset=utf-8", ""])
        why = f"request {n} to {path} ({len(raw)} bytes: {raw[:120]!r})"
        try:
            status, rtype, data = ex.request("POST", path, raw, ctype)
        except (BrokenPipeError, ConnectionResetError) as e:
            # Past --max-body the server answers 413 and closes without
            # reading the rest, so the sender may see its pipe break.
            if len(raw) <= a.max_body:
                failures.append(f"connection dropped ({e!r}) for {why}")
            status = "413-closed"
        except Exception as e:
            failures.append(f"no answer ({e!r}) for {why}")
            status = "none"
        else:
            if ctype not in ("application/json", "application/json; charset=utf-8") and status not in (415, 413):
                failures.append(f"status {status} for Content-Type {ctype!r}: {why}")
            problem = check(status, rtype, data, why)
            if problem:
                failures.append(problem)
        statuses[status] = statuses.get(status, 0) + 1
        n += 1
        if n % 50 == 0:
            s, _, _ = ex.request("GET", "/health")
            if s != 200:
                failures.append(f"/health answered {s} after {n} requests")
        if len(failures) >= 10:
            break
    status, _, last = ex.request("POST", "/v1/completions", probe)
    if status != 200 or json.loads(last)["choices"][0]["text"] != want:
        failures.append(f"the greedy probe changed after fuzzing: {status} {last[:300]!r}")
    took = time.time() - started
    hist = " ".join(f"{k}:{v}" for k, v in sorted(statuses.items(), key=lambda kv: str(kv[0])))
    print(f"http fuzz: {n} requests in {took:.0f} s, seed {a.seed}, statuses {hist}, failures {len(failures)}")
    for f in failures:
        print("FAIL", f)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
