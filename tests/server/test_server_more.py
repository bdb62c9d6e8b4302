#!/usr/bin/env python3
"""More checks of `waste serve`, one per server the Rust test starts:

  queue  BASE KEY MODEL           the server runs with --queue 1: a burst past
                                  the limit is answered 503 with Retry-After
  cancel BASE KEY MODEL           a client that stops reading mid-stream (the
                                  openai client's close(), a raw socket close)
                                  stops its generation within one token, seen
                                  in the server's GET /stats
  stream BASE KEY MODEL           finish_reason and usage of streams
  tools  BASE KEY MODEL           the container's chat template renders tools
                                  (prompt tokens equal transformers', stored in
                                  tools_expected.json), and the answer's tool path

Exits 0 when every check passed, 1 with the failures listed.
"""
import http.client
import json
import pathlib
import socket
import sys
import threading
import time
import urllib.parse

import openai

MODE, BASE, KEY, MODEL = sys.argv[1:5]
URL = urllib.parse.urlparse(BASE)
client = openai.OpenAI(base_url=BASE + "/v1", api_key=KEY, max_retries=0, timeout=120)
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL", what, flush=True)


def raw(method, path, body=None):
    conn = http.client.HTTPConnection(URL.hostname, URL.port, timeout=120)
    h = {"Content-Type": "application/json", "Authorization": "Bearer " + KEY}
    conn.request(method, path, body=None if body is None else json.dumps(body).encode(), headers=h)
    r = conn.getresponse()
    out = (r.status, {k.lower(): v for k, v in r.getheaders()}, r.read())
    conn.close()
    return out


def stats():
    s, _, b = raw("GET", "/stats")
    check(s == 200, f"/stats status {s}")
    return json.loads(b)


def wait_idle():
    """The engine thread has finished every request it took (bounded wait)."""
    for _ in range(600):
        st = stats()
        if st["queue"]["pending"] == 0:
            return st
        time.sleep(0.05)
    check(False, "the server never became idle")
    return stats()


# A greedy completion of this prompt runs to max_tokens without an end token
# (the bible-moe model writes verses), long enough to be cut short.
LONG = dict(model=MODEL, prompt="In the beginning", temperature=0, max_tokens=230)


def test_queue():
    before = stats()
    check(before["queue"]["limit"] == 1, f"queue limit {before['queue']}")
    n = 8
    barrier = threading.Barrier(n)
    results, lock = [], threading.Lock()

    def one(k):
        barrier.wait()
        s, h, b = raw("POST", "/v1/completions", dict(LONG, seed=k))
        with lock:
            results.append((s, h, b))

    threads = [threading.Thread(target=one, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    statuses = sorted(s for s, _, _ in results)
    check(set(statuses) <= {200, 503}, f"statuses {statuses}")
    check(200 in statuses, f"no request was served: {statuses}")
    busy = [(h, b) for s, h, b in results if s == 503]
    check(busy, f"a burst of {n} past a queue of 1 got no 503: {statuses}")
    for h, b in busy:
        check(h.get("retry-after", "").isdigit() and int(h["retry-after"]) >= 1, f"Retry-After {h.get('retry-after')!r}")
        e = json.loads(b)["error"]
        check(e["code"] == "server_overloaded" and e["type"] == "server_error" and e["message"], f"503 body {e}")
    after = wait_idle()
    check(after["requests"]["rejected"] - before["requests"]["rejected"] == len(busy), f"stats rejected {after['requests']}")
    # The openai client raises its own exception type for 503.
    try:
        client.completions.create(**LONG)
    except openai.APIStatusError as exc:  # noqa: F841 - only reached if the server is still busy
        check(False, f"an idle server answered {exc.status_code}")
    print(f"queue: {statuses}", flush=True)


def test_cancel():
    before = wait_idle()
    # The openai client stops reading and closes the stream.
    stream = client.completions.create(stream=True, **LONG)
    got = 0
    for chunk in stream:
        if chunk.choices and chunk.choices[0].text:
            got += 1
            if got == 2:
                break
    stream.close()
    st = wait_idle()
    check(st["requests"]["cancelled"] == before["requests"]["cancelled"] + 1, f"openai close: {st['requests']}")
    last = st["last_cancelled"] or {}
    check(last.get("generated", LONG["max_tokens"]) < LONG["max_tokens"], f"the generation ran on: {last}")
    check(last.get("generated", 99) - last.get("delivered", 0) <= 1, f"more than one token after the disconnect: {last}")
    # A raw socket that goes away after the first events.
    conn = http.client.HTTPConnection(URL.hostname, URL.port, timeout=120)
    body = dict(model=MODEL, messages=[{"role": "user", "content": "In the beginning"}], temperature=0,
                max_tokens=200, stream=True)
    conn.request("POST", "/v1/chat/completions", body=json.dumps(body).encode(),
                 headers={"Content-Type": "application/json", "Authorization": "Bearer " + KEY})
    r = conn.getresponse()
    check(r.status == 200, f"stream status {r.status}")
    events = 0
    while events < 3:
        line = r.readline()
        if not line:
            break
        if line.startswith(b"data: "):
            events += 1
    conn.sock.close()
    conn.close()
    st2 = wait_idle()
    check(st2["requests"]["cancelled"] == st["requests"]["cancelled"] + 1, f"socket close: {st2['requests']}")
    last = st2["last_cancelled"] or {}
    check(last.get("generated", 200) < 200, f"the chat generation ran on: {last}")
    check(st2["max_tokens_after_disconnect"] <= 1, f"max tokens after a disconnect {st2['max_tokens_after_disconnect']}")
    # A non-streaming request whose client hangs up while it runs.
    payload = json.dumps(dict(LONG)).encode()
    sock = socket.create_connection((URL.hostname, URL.port))
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode()
                 + b"\r\nContent-Type: application/json\r\nContent-Length: " + str(len(payload)).encode()
                 + b"\r\n\r\n" + payload)
    for _ in range(2000):
        if stats()["queue"]["pending"] == 1:
            break
    sock.close()
    st3 = wait_idle()
    # A non-streaming client sees nothing until the end, so its hang-up may
    # land before the engine starts the job (dropped while queued) or while
    # it runs (cancelled): either way the generation must not complete.
    r2, r3 = st2["requests"], st3["requests"]
    check(r3["completed"] == r2["completed"], f"non-stream hang-up completed: {r3}")
    if r3["cancelled"] == r2["cancelled"] + 1:
        last = st3["last_cancelled"] or {}
        check(last.get("generated", 230) < 230, f"the non-stream generation ran on: {last}")
    else:
        check(r3["dropped_queued"] == r2["dropped_queued"] + 1, f"non-stream hang-up: {r3}")
        last = {}
    check(st3["max_tokens_after_disconnect"] <= 1, f"max tokens after a disconnect {st3['max_tokens_after_disconnect']}")
    # The server goes on serving.
    ok = client.completions.create(model=MODEL, prompt="And God said", max_tokens=4, temperature=0)
    check(ok.usage.completion_tokens == 4, f"after cancellations: {ok.usage}")
    print(f"cancel: {st3['requests']}, last {last}", flush=True)


def collect(stream):
    """(text, finish reasons, usage chunks, chunks) of a chat or completion stream."""
    text, finishes, usages, chunks = [], [], [], 0
    for c in stream:
        chunks += 1
        if c.usage is not None:
            usages.append(c.usage)
            check(c.choices == [], f"the usage chunk has choices {c.choices}")
        for ch in c.choices:
            piece = ch.delta.content if hasattr(ch, "delta") else ch.text
            text.append(piece or "")
            if ch.finish_reason:
                finishes.append(ch.finish_reason)
    return "".join(text), finishes, usages, chunks


def test_stream():
    msgs = [{"role": "user", "content": "In the beginning"}]
    # Length: exactly max_tokens tokens, said once, last.
    full = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=5, temperature=0)
    check(full.choices[0].finish_reason == "length" and full.usage.completion_tokens == 5, f"non-stream {full}")
    text, fin, usages, _ = collect(client.chat.completions.create(
        model=MODEL, messages=msgs, max_tokens=5, temperature=0, stream=True, stream_options={"include_usage": True}))
    check(fin == ["length"], f"stream finish reasons {fin}")
    check(text == full.choices[0].message.content, f"stream text {text!r}")
    check(len(usages) == 1, f"{len(usages)} usage chunks")
    if usages:
        u = usages[0]
        check((u.prompt_tokens, u.completion_tokens) == (full.usage.prompt_tokens, 5), f"stream usage {u}")
        check(u.total_tokens == u.prompt_tokens + u.completion_tokens, f"stream total {u}")
    # No usage chunk unless asked.
    _, fin, usages, _ = collect(client.chat.completions.create(
        model=MODEL, messages=msgs, max_tokens=5, temperature=0, stream=True))
    check(fin == ["length"] and usages == [], f"without include_usage: {fin} {usages}")
    # A stop string: finish "stop", the text cut before it, usage counts
    # the tokens generated up to the stop.
    base = client.completions.create(model=MODEL, prompt="And God said", max_tokens=24, temperature=0).choices[0].text
    stop = base[len(base) // 2: len(base) // 2 + 3]
    check(bool(stop.strip()), f"no usable stop string in {base!r}")
    want = base[: base.index(stop)]
    text, fin, usages, _ = collect(client.completions.create(
        model=MODEL, prompt="And God said", max_tokens=24, temperature=0, stop=stop, stream=True,
        stream_options={"include_usage": True}))
    check(text == want and fin == ["stop"], f"stop stream {text!r} {fin}")
    full = client.completions.create(model=MODEL, prompt="And God said", max_tokens=24, temperature=0, stop=stop)
    check(len(usages) == 1 and usages[0].completion_tokens == full.usage.completion_tokens < 24,
          f"stop usage {usages} vs {full.usage}")
    check(full.choices[0].finish_reason == "stop", f"stop finish {full.choices[0].finish_reason}")


def test_tools():
    """Prompt token counts against transformers' (tools_expected.json, written
    offline by gen_tools_expected.py), then the answer's tool path."""
    expected = json.loads((pathlib.Path(__file__).parent / "tools_expected.json").read_text())
    counts = {}
    for case in expected["cases"]:
        kw = {"tools": case["tools"]} if case["tools"] else {}
        r = client.chat.completions.create(model=MODEL, messages=case["messages"], max_tokens=12, temperature=0, **kw)
        counts[case["name"]] = r
        check(r.usage.prompt_tokens == case["prompt_tokens"],
              f"{case['name']}: {r.usage.prompt_tokens} prompt tokens, transformers {case['prompt_tokens']}")
    plain, with_tools = counts["no tools"], counts["tools"]
    check(with_tools.usage.prompt_tokens > plain.usage.prompt_tokens + 20, "the tools are in the prompt")
    ask = expected["cases"][1]
    none = client.chat.completions.create(model=MODEL, messages=ask["messages"], tools=ask["tools"],
                                          tool_choice="none", max_tokens=12, temperature=0)
    check(none.usage.prompt_tokens == plain.usage.prompt_tokens, "tool_choice none leaves the tools out")
    # This model writes verses, not tool calls: the answer is text, and the
    # stream (held back while a call could still come) carries the same.
    m = with_tools.choices[0].message
    raw_text = m.content or ""
    check("<tool_call>" not in raw_text, "the model wrote a tool call tag that was not parsed")
    check(m.tool_calls is None and with_tools.choices[0].finish_reason in ("stop", "length"), f"answer {m}")
    text, fin, usages, _ = collect(client.chat.completions.create(
        model=MODEL, messages=ask["messages"], tools=ask["tools"], max_tokens=12, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    check(text == raw_text, f"tools stream {text!r} != {raw_text!r}")
    check(fin == [with_tools.choices[0].finish_reason], f"tools stream finish {fin}")
    check(len(usages) == 1 and usages[0].prompt_tokens == with_tools.usage.prompt_tokens, f"tools stream usage {usages}")


if MODE == "queue":
    test_queue()
elif MODE == "cancel":
    test_cancel()
elif MODE == "stream":
    test_stream()
elif MODE == "tools":
    test_tools()
else:
    print(f"unknown mode {MODE}")
    sys.exit(2)
if failures:
    print(f"{len(failures)} failure(s)")
    sys.exit(1)
print(f"all {MODE} checks passed")
