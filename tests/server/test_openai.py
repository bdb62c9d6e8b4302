#!/usr/bin/env python3
"""Tests `waste serve` with the official openai client and raw HTTP.

Usage: test_openai.py BASE_URL API_KEY MODEL_ID BODY_LIMIT
Exits 0 when every check passed, 1 with the failures listed otherwise.
"""
import http.client
import json
import sys
import threading
import urllib.parse

import openai

BASE, KEY, MODEL, BODY_LIMIT = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
URL = urllib.parse.urlparse(BASE)
client = openai.OpenAI(base_url=BASE + "/v1", api_key=KEY, max_retries=0, timeout=120)
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL", what, flush=True)


def raw(method, path, body=None, key=KEY, headers=None):
    conn = http.client.HTTPConnection(URL.hostname, URL.port, timeout=120)
    h = {"Content-Type": "application/json"}
    if key is not None:
        h["Authorization"] = "Bearer " + key
    h.update(headers or {})
    data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
    conn.request(method, path, body=data, headers=h)
    r = conn.getresponse()
    out = (r.status, dict(r.getheaders()), r.read())
    conn.close()
    return out


def error_shape(status, body, want, what):
    check(status == want, f"{what}: status {status}, want {want}: {body[:200]!r}")
    try:
        e = json.loads(body)["error"]
        check(isinstance(e["message"], str) and e["message"] and "type" in e, f"{what}: error shape {e}")
    except Exception as exc:  # noqa: BLE001 - any parse failure is a failed check
        check(False, f"{what}: body is not an OpenAI error: {body[:200]!r} ({exc})")


def chat(**kw):
    args = dict(model=MODEL, messages=[{"role": "user", "content": "In the beginning"}], max_tokens=16, seed=7)
    args.update(kw)
    return client.chat.completions.create(**args)


def test_models():
    ids = [m.id for m in client.models.list().data]
    check(ids == [MODEL], f"models list {ids}")
    check(client.models.retrieve(MODEL).id == MODEL, "models retrieve")
    try:
        client.models.retrieve("no-such-model")
        check(False, "unknown model retrieve did not fail")
    except openai.NotFoundError:
        pass


def test_chat():
    a = chat(temperature=0.9)
    b = chat(temperature=0.9)
    text = a.choices[0].message.content
    check(isinstance(text, str) and len(text) > 0, f"chat content {text!r}")
    check(a.choices[0].finish_reason in ("stop", "length"), f"finish {a.choices[0].finish_reason}")
    check(text == b.choices[0].message.content, "same seed gives the same chat answer")
    u = a.usage
    check(u.prompt_tokens > 0 and 0 < u.completion_tokens <= 16, f"usage {u}")
    check(u.total_tokens == u.prompt_tokens + u.completion_tokens, f"usage total {u}")
    # Content parts are the same message as a string.
    c = chat(temperature=0.9, messages=[{"role": "user", "content": [{"type": "text", "text": "In the beginning"}]}])
    check(c.choices[0].message.content == text, "content parts equal the string form")
    # Streaming: the same tokens, then a usage chunk and the end.
    stream = chat(temperature=0.9, stream=True, stream_options={"include_usage": True})
    parts, finish, usage = [], None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for ch in chunk.choices:
            if ch.delta.content:
                parts.append(ch.delta.content)
            if ch.finish_reason:
                finish = ch.finish_reason
    check("".join(parts) == text, f"streamed {''.join(parts)!r} != {text!r}")
    check(finish == a.choices[0].finish_reason, f"stream finish {finish}")
    check(usage is not None and usage.completion_tokens == u.completion_tokens, f"stream usage {usage}")
    # Logprobs: one entry per generated token, with alternatives.
    lp = chat(temperature=0.9, logprobs=True, top_logprobs=2)
    content = lp.choices[0].logprobs.content
    check(len(content) == lp.usage.completion_tokens, f"logprobs entries {len(content)}")
    check(all(len(t.top_logprobs) == 2 and t.logprob <= 0 for t in content), "top_logprobs")


def test_completions_and_stop():
    base = client.completions.create(model=MODEL, prompt="And God said", max_tokens=24, temperature=0)
    text = base.choices[0].text
    check(len(text) > 4, f"completion text {text!r}")
    check(base.usage.total_tokens == base.usage.prompt_tokens + base.usage.completion_tokens, "completion usage")
    again = client.completions.create(model=MODEL, prompt="And God said", max_tokens=24, temperature=0)
    check(again.choices[0].text == text, "greedy completions repeat")
    parts = [c.choices[0].text for c in client.completions.create(
        model=MODEL, prompt="And God said", max_tokens=24, temperature=0, stream=True) if c.choices]
    check("".join(parts) == text, f"streamed completion {''.join(parts)!r} != {text!r}")
    stop = text[len(text) // 2: len(text) // 2 + 3]
    if stop.strip():
        cut = client.completions.create(model=MODEL, prompt="And God said", max_tokens=24, temperature=0, stop=[stop, "zzzz"])
        want = text[: text.index(stop)]
        check(cut.choices[0].text == want, f"stop {stop!r}: {cut.choices[0].text!r} != {want!r}")
        check(cut.choices[0].finish_reason == "stop", f"stop finish {cut.choices[0].finish_reason}")
        streamed = "".join(c.choices[0].text for c in client.completions.create(
            model=MODEL, prompt="And God said", max_tokens=24, temperature=0, stop=stop, stream=True) if c.choices)
        check(streamed == want, f"streamed stop {streamed!r} != {want!r}")
    else:
        check(False, f"no usable stop string in {text!r}")


def test_errors():
    s, _, b = raw("POST", "/v1/chat/completions", b"{not json")
    error_shape(s, b, 400, "malformed JSON")
    msgs = [{"role": "user", "content": "hi"}]
    for bad in ({"messages": msgs, "temperature": "hot"}, {"messages": "hi"}, {"messages": msgs, "n": 9},
                {"messages": msgs, "max_tokens": -1}, {"messages": msgs, "stop": 5}, {},
                {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}):
        s, _, b = raw("POST", "/v1/chat/completions", bad)
        error_shape(s, b, 400, f"bad request {bad}")
    s, _, b = raw("POST", "/v1/completions", {"prompt": 5})
    error_shape(s, b, 400, "completions prompt type")
    s, _, b = raw("POST", "/v1/chat/completions", b"x" * (BODY_LIMIT + 1))
    error_shape(s, b, 413, "oversized body")
    s, _, b = raw("POST", "/v1/chat/completions", {"messages": msgs}, key=None)
    error_shape(s, b, 401, "missing key")
    s, _, b = raw("GET", "/v1/models", key=KEY + "x")
    error_shape(s, b, 401, "wrong key")
    # Another model's name is answered by this one, with a warning header
    # (llama-server's behaviour; --strict-model-name makes it a 404).
    s, h, b = raw("POST", "/v1/chat/completions", {"model": "nope", "messages": msgs, "max_tokens": 2})
    check(s == 200 and "nope" in h.get("x-waste-warning", ""), f"unknown model: {s} {h} {b[:200]!r}")
    s, _, b = raw("GET", "/v1/nothing")
    error_shape(s, b, 404, "unknown route")
    s, _, b = raw("GET", "/health", key=None)
    check(s == 200 and json.loads(b)["status"] == "ok", "health without key")


def sse_request(body, disconnect):
    """Streams one request; returns (status, events, terminated)."""
    conn = http.client.HTTPConnection(URL.hostname, URL.port, timeout=120)
    conn.request("POST", "/v1/chat/completions", body=json.dumps(body).encode(),
                 headers={"Content-Type": "application/json", "Authorization": "Bearer " + KEY})
    r = conn.getresponse()
    if r.status != 200:
        r.read()
        conn.close()
        return r.status, [], False
    events, done = [], False
    while True:
        line = r.readline()
        if not line:
            break
        line = line.decode().rstrip("\n")
        if not line:
            continue
        if not line.startswith("data: "):
            raise ValueError(f"not an SSE data line: {line!r}")
        payload = line[6:]
        if payload == "[DONE]":
            done = True
            break
        events.append(json.loads(payload))
        if disconnect and len(events) >= 2:
            break
    conn.close()
    return 200, events, done


def test_load():
    statuses, broken, lock = [], [], threading.Lock()

    def client_thread(k):
        for i in range(25):
            body = {"model": MODEL, "messages": [{"role": "user", "content": f"Verse {k} {i}"}], "max_tokens": 8,
                    "temperature": 0.8, "seed": k * 100 + i}
            try:
                if (k + i) % 2 == 0:
                    disconnect = i % 5 == 0
                    body["stream"] = True
                    status, events, done = sse_request(body, disconnect)
                    ok = status != 200 or disconnect or (done and events and events[-1]["choices"][0]["finish_reason"])
                    if not ok:
                        with lock:
                            broken.append((k, i, events[-1:] if events else None))
                else:
                    status, _, b = raw("POST", "/v1/chat/completions", body)
                    if status == 200:
                        json.loads(b)["choices"][0]["message"]["content"]
            except Exception as exc:  # noqa: BLE001 - recorded as a failure
                with lock:
                    broken.append((k, i, repr(exc)))
                status = 0
            with lock:
                statuses.append(status)

    threads = [threading.Thread(target=client_thread, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    check(len(statuses) == 200, f"load: {len(statuses)} requests finished")
    check(all(s == 200 for s in statuses), f"load statuses {sorted(set(statuses))}")
    check(not broken, f"load: malformed or unterminated streams {broken[:3]}")
    s, _, b = raw("GET", "/health")
    check(s == 200, "server answers after the load test")
    print(f"load: {len(statuses)} requests, statuses {sorted(set(statuses))}", flush=True)


def test_first_hour():
    """What clients notice: system_fingerprint everywhere, legacy
    completions' alternatives most likely first, an over-long prompt named
    by its own field, CORS for the allowed origin, /metrics."""
    a = chat(temperature=0)
    check(isinstance(a.system_fingerprint, str) and a.system_fingerprint.startswith("fp_"), f"chat fingerprint {a.system_fingerprint!r}")
    c = client.completions.create(model=MODEL, prompt="And God said", max_tokens=6, temperature=0.7, seed=3, logprobs=4)
    check(c.system_fingerprint == a.system_fingerprint, f"completion fingerprint {c.system_fingerprint!r}")
    for top in c.choices[0].logprobs.top_logprobs:
        values = list(top.values())
        check(values == sorted(values, reverse=True), f"legacy top_logprobs not most likely first: {top}")
    chunks = list(chat(temperature=0, stream=True))
    check(all(ch.system_fingerprint == a.system_fingerprint for ch in chunks), "chunk fingerprints")
    long = "and the " * 4000
    s, _, b = raw("POST", "/v1/completions", {"prompt": long, "max_tokens": 1})
    check(s == 400 and json.loads(b)["error"]["param"] == "prompt", f"over-long completion prompt: {s} {b[:200]!r}")
    s, _, b = raw("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": long}], "max_tokens": 1})
    check(s == 400 and json.loads(b)["error"]["param"] == "messages", f"over-long chat prompt: {s} {b[:200]!r}")
    # CORS: the server was started with --cors-origin http://app.test.
    pre = {"Origin": "http://app.test", "Access-Control-Request-Method": "POST",
           "Access-Control-Request-Headers": "authorization, content-type"}
    s, h, _ = raw("OPTIONS", "/v1/chat/completions", key=None, headers=pre)
    check(s == 204 and h.get("access-control-allow-origin") == "http://app.test", f"preflight: {s} {h}")
    check("POST" in h.get("access-control-allow-methods", ""), f"preflight methods: {h}")
    s, h, _ = raw("OPTIONS", "/v1/chat/completions", key=None, headers={**pre, "Origin": "http://evil.test"})
    check(s == 403 and "access-control-allow-origin" not in h, f"preflight from another origin: {s} {h}")
    s, h, _ = raw("GET", "/v1/models", headers={"Origin": "http://app.test"})
    check(s == 200 and h.get("access-control-allow-origin") == "http://app.test", f"CORS answer: {s} {h}")
    s, h, b = raw("GET", "/metrics")
    text = b.decode()
    check(s == 200 and h.get("content-type", "").startswith("text/plain"), f"metrics: {s} {h}")
    for name in ("waste_http_requests_total", "waste_completion_tokens_total", "waste_queue_requests",
                 "waste_expert_picks_total", "waste_expert_cache_reuse_ratio", "waste_expert_bytes_read_total"):
        check(f"# TYPE {name} " in text, f"metrics lack {name}")
    ok = [l for l in text.splitlines() if l.startswith('waste_http_requests_total{code="2xx"}')]
    check(ok and float(ok[0].split()[-1]) > 0, f"metrics count no 2xx answers: {ok}")


for test in (test_models, test_chat, test_completions_and_stop, test_errors, test_first_hour, test_load):
    try:
        test()
        print("ok", test.__name__, flush=True)
    except Exception as exc:  # noqa: BLE001 - a crash is a failure with its cause
        check(False, f"{test.__name__} raised {exc!r}")
if failures:
    print(f"{len(failures)} failure(s)")
    sys.exit(1)
print("all server checks passed")
