#!/usr/bin/env python3
"""Tests `waste serve`'s Anthropic Messages API with the official `anthropic`
client and raw HTTP:

    test_anthropic.py BASE_URL API_KEY MODEL_ID          # bible-moe (ChatML)
    test_anthropic.py BASE_URL API_KEY MODEL_ID tools [CASE]   # scripted tool call (CASE of tool_call_expected.json, qwen3)

The first form runs against any model with a chat template (the Rust test
uses examples/bible-moe.waste, 256 positions): POST /v1/messages answered and
streamed (the exact event order), system as a string and as blocks, text
blocks, stop_sequences, max_tokens, temperature 0 determinism, top_p / top_k
/ metadata accepted, both ways of sending the key, Anthropic's error shape,
and POST /v1/messages/count_tokens equal to the input_tokens of the same
request run.

The `tools` form runs against the server of test_tool_calls.py: the tiny
Qwen3-MoE fixture with Qwen3's chat template (context raised to 2048) and
examples/sampler-script scripted with tool_call_expected.json's `answer_ids`
then its `end_of_turn_id`, so the model writes

    <tool_call>\\n{"name": "get_weather", "arguments": {"city": "Paris"}}\\n</tool_call>

then <|im_end|>; the server must answer that as a `tool_use` block with
stop_reason "tool_use", stream it as input_json_delta, leave it as text with
tool_choice none, and accept the tool_result sent back. The prompt counts
must equal transformers' (tool_call_expected.json), which holds only when
the server turns Anthropic tools into OpenAI-style
{"type": "function", "function": {"name", "description", "parameters"}}
in that key order (the template renders `tools | tojson`), a tool_use turn
into an assistant message with content "" and compact JSON arguments, and a
tool_result into a {"role": "tool"} message.

Temperature, top_p and top_k go through extra_body: anthropic 2.x dropped
them from messages.create's keywords (the API still takes them). Exits 0
printing "all anthropic checks passed" when every check passed, 1 with the
failures listed otherwise.
"""
import http.client
import json
import pathlib
import sys
import threading
import urllib.parse

import anthropic

BASE, KEY, MODEL = sys.argv[1:4]
MODE = sys.argv[4] if len(sys.argv) > 4 else "basic"
URL = urllib.parse.urlparse(BASE)
# The SDK appends /v1/messages to base_url itself.
client = anthropic.Anthropic(base_url=BASE, api_key=KEY, max_retries=0, timeout=120)
failures = []
RAW_TYPES = {"message_start", "content_block_start", "content_block_delta", "content_block_stop",
             "message_delta", "message_stop"}


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL", what, flush=True)


def raw(method, path, body=None, headers=None, auth="x-api-key"):
    """One request; `auth` is "x-api-key", "bearer" or None. Returns
    (status, lower-cased headers, body bytes)."""
    conn = http.client.HTTPConnection(URL.hostname, URL.port, timeout=120)
    h = {"Content-Type": "application/json", "anthropic-version": "2023-06-01"}
    if auth == "x-api-key":
        h["x-api-key"] = KEY
    elif auth == "bearer":
        h["Authorization"] = "Bearer " + KEY
    h.update(headers or {})
    h = {k: v for k, v in h.items() if v is not None}  # None drops a header
    data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
    conn.request(method, path, body=data, headers=h)
    r = conn.getresponse()
    out = (r.status, {k.lower(): v for k, v in r.getheaders()}, r.read())
    conn.close()
    return out


def error_shape(status, body, want_status, want_type, what):
    """Anthropic's error body: {"type": "error", "error": {"type", "message"}}."""
    check(status == want_status, f"{what}: status {status}, want {want_status}: {body[:200]!r}")
    try:
        doc = json.loads(body)
        check(doc.get("type") == "error", f"{what}: top-level type {doc.get('type')!r}")
        e = doc["error"]
        check(e.get("type") == want_type, f"{what}: error type {e.get('type')!r}, want {want_type}")
        check(isinstance(e.get("message"), str) and e["message"], f"{what}: error message {e}")
    except Exception as exc:  # noqa: BLE001 - any parse failure is a failed check
        check(False, f"{what}: body is not an Anthropic error: {body[:200]!r} ({exc})")


def text_of(message):
    return "".join(b.text for b in message.content if b.type == "text")


def message_shape(m, what, max_tokens):
    check(m.type == "message" and m.role == "assistant", f"{what}: type/role {m.type} {m.role}")
    check(isinstance(m.id, str) and m.id.startswith("msg_"), f"{what}: id {m.id!r}")
    check(m.model == MODEL, f"{what}: model {m.model!r}")
    check(m.stop_reason in ("end_turn", "max_tokens", "stop_sequence", "tool_use"), f"{what}: stop_reason {m.stop_reason!r}")
    check(prompt_of(m.usage) > 0, f"{what}: input_tokens {prompt_of(m.usage)}")
    check(0 < m.usage.output_tokens <= max_tokens, f"{what}: output_tokens {m.usage.output_tokens} (max {max_tokens})")
    if m.stop_reason == "max_tokens":
        check(m.usage.output_tokens == max_tokens, f"{what}: stopped at {m.usage.output_tokens} of {max_tokens}")
    if m.stop_reason != "stop_sequence":
        check(m.stop_sequence is None, f"{what}: stop_sequence {m.stop_sequence!r} with {m.stop_reason}")


ASK = [{"role": "user", "content": "In the beginning"}]


def ask(**kw):
    """messages.create with greedy sampling unless told otherwise."""
    extra = kw.pop("extra_body", {"temperature": 0})
    args = dict(model=MODEL, max_tokens=16, messages=ASK)
    args.update(kw)
    return client.messages.create(extra_body=extra, **args)


def collect(**kw):
    """Streams one request with messages.stream(); returns (raw events in
    order, the final message, the text deltas)."""
    extra = kw.pop("extra_body", {"temperature": 0})
    args = dict(model=MODEL, max_tokens=16, messages=ASK)
    args.update(kw)
    events, texts = [], []
    with client.messages.stream(extra_body=extra, **args) as stream:
        for ev in stream:
            if ev.type in RAW_TYPES:
                events.append(ev)
            elif ev.type == "text":
                texts.append(ev.text)
        final = stream.get_final_message()
    return events, final, texts


def check_event_order(events, what):
    """message_start, then per block start / deltas / stop with the same
    index (0, 1, ...), then one message_delta, then message_stop."""
    types = [e.type for e in events]
    check(types[:1] == ["message_start"], f"{what}: first event {types[:1]}")
    check(types[-2:] == ["message_delta", "message_stop"], f"{what}: last events {types[-2:]}")
    check(types.count("message_delta") == 1 and types.count("message_start") == 1, f"{what}: {types}")
    open_index, next_index = None, 0
    for e in events[1:-2]:
        if e.type == "content_block_start":
            check(open_index is None and e.index == next_index, f"{what}: block start {e.index} while {open_index} open")
            open_index = e.index
        elif e.type == "content_block_delta":
            check(e.index == open_index, f"{what}: delta for {e.index} while {open_index} open")
        elif e.type == "content_block_stop":
            check(e.index == open_index, f"{what}: stop for {e.index} while {open_index} open")
            open_index, next_index = None, next_index + 1
        else:
            check(False, f"{what}: {e.type} between the blocks")
    check(open_index is None, f"{what}: block {open_index} never stopped")
    start = events[0].message if events else None
    if start is not None:
        check(start.content == [] and start.stop_reason is None and start.stop_sequence is None,
              f"{what}: message_start message {start}")
        check(start.role == "assistant" and start.model == MODEL and start.id.startswith("msg_"), f"{what}: {start}")


def sse_events(body, auth="x-api-key"):
    """Raw SSE of one streamed request: (status, content type, [(event name,
    data)]). Every frame must be `event: NAME` + `data: JSON` with
    data.type == NAME; pings are kept (they are allowed anywhere)."""
    conn = http.client.HTTPConnection(URL.hostname, URL.port, timeout=120)
    h = {"Content-Type": "application/json", "anthropic-version": "2023-06-01", "x-api-key": KEY}
    if auth == "bearer":
        del h["x-api-key"]
        h["Authorization"] = "Bearer " + KEY
    conn.request("POST", "/v1/messages", body=json.dumps(body).encode(), headers=h)
    r = conn.getresponse()
    ctype = r.getheader("content-type", "")
    if r.status != 200:
        data = r.read()
        conn.close()
        return r.status, ctype, data
    frames, name, data = [], None, []
    for line in r:
        line = line.decode().rstrip("\r\n")
        if line == "":
            if name is not None or data:
                frames.append((name, "\n".join(data)))
            name, data = None, []
        elif line.startswith("event:"):
            name = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].lstrip(" "))
        elif line.startswith(":"):
            pass  # an SSE comment
        else:
            check(False, f"raw stream: not an SSE line {line!r}")
    conn.close()
    return 200, ctype, frames


# --------------------------------------------------------------- basic mode


def test_messages():
    a = ask()
    message_shape(a, "greedy", 16)
    text = text_of(a)
    check(len(a.content) == 1 and a.content[0].type == "text" and text, f"content {a.content}")
    b = ask()
    check(text_of(b) == text, f"temperature 0 repeats: {text_of(b)!r} != {text!r}")
    check(prompt_of(b.usage) == prompt_of(a.usage), "same input, same input_tokens")
    check(a.id != b.id, f"message ids repeat: {a.id}")
    # A string content is one text block; several blocks are joined as written.
    blocks = ask(messages=[{"role": "user", "content": [{"type": "text", "text": "In the "},
                                                         {"type": "text", "text": "beginning"}]}])
    check(text_of(blocks) == text and prompt_of(blocks.usage) == prompt_of(a.usage),
          f"text blocks != string content: {text_of(blocks)!r} {blocks.usage}")
    # max_tokens stops the message.
    short = ask(max_tokens=3)
    check(short.stop_reason == "max_tokens" and short.usage.output_tokens == 3, f"max_tokens 3: {short}")
    check(text.startswith(text_of(short)), f"max_tokens 3 text {text_of(short)!r} is not a prefix of {text!r}")
    # Sampling parameters and metadata are accepted; a seed-free sampled
    # answer still has the message shape.
    s = ask(extra_body={"temperature": 0.9, "top_p": 0.9, "top_k": 40}, metadata={"user_id": "user-123"})
    message_shape(s, "sampled", 16)
    # A system prompt, as a string and as one block, is the same prompt.
    sys_s = ask(system="Answer as the Preacher would.")
    sys_b = ask(system=[{"type": "text", "text": "Answer as the Preacher would."}])
    check(prompt_of(sys_s.usage) > prompt_of(a.usage), f"system not in the prompt: {sys_s.usage} vs {a.usage}")
    check(prompt_of(sys_b.usage) == prompt_of(sys_s.usage) and text_of(sys_b) == text_of(sys_s),
          f"system blocks != system string: {sys_b.usage} {sys_s.usage}")
    two = ask(system=[{"type": "text", "text": "Answer as the Preacher"}, {"type": "text", "text": " would."}])
    message_shape(two, "system of two blocks", 16)
    # A conversation of several turns.
    turns = ask(messages=[{"role": "user", "content": "And God said"},
                          {"role": "assistant", "content": "Let there be light"},
                          {"role": "user", "content": [{"type": "text", "text": "And there was"}]}])
    message_shape(turns, "several turns", 16)
    check(prompt_of(turns.usage) > prompt_of(a.usage), f"turns {turns.usage}")
    return a


def test_stop_sequences(a):
    text = text_of(a)
    stop = text[len(text) // 2: len(text) // 2 + 3]
    if not stop.strip():
        check(False, f"no usable stop sequence in {text!r}")
        return
    want = text[: text.index(stop)]
    cut = ask(stop_sequences=["zzzz", stop])
    check(text_of(cut) == want, f"stop {stop!r}: {text_of(cut)!r} != {want!r}")
    check(cut.stop_reason == "stop_sequence" and cut.stop_sequence == stop,
          f"stop: {cut.stop_reason} {cut.stop_sequence!r}")
    events, final, texts = collect(stop_sequences=[stop])
    check("".join(texts) == want, f"streamed stop {''.join(texts)!r} != {want!r}")
    deltas = [e for e in events if e.type == "message_delta"]
    if deltas:
        check(deltas[0].delta.stop_reason == "stop_sequence" and deltas[0].delta.stop_sequence == stop,
              f"streamed stop delta {deltas[0].delta}")
    check(final.stop_sequence == stop, f"streamed final stop_sequence {final.stop_sequence!r}")


def test_stream(a):
    text = text_of(a)
    events, final, texts = collect()
    check_event_order(events, "stream")
    check("".join(texts) == text, f"streamed {''.join(texts)!r} != {text!r}")
    check(text_of(final) == text and final.stop_reason == a.stop_reason, f"final {final}")
    blocks = [e for e in events if e.type == "content_block_start"]
    check(len(blocks) == 1 and blocks[0].content_block.type == "text" and blocks[0].content_block.text == "",
          f"block starts {blocks}")
    deltas = [e.delta for e in events if e.type == "content_block_delta"]
    check(all(d.type == "text_delta" and d.text for d in deltas), f"text deltas {deltas[:3]}")
    start, delta = events[0].message, [e for e in events if e.type == "message_delta"]
    check(prompt_of(start.usage) == prompt_of(a.usage), f"message_start usage {start.usage} vs {a.usage}")
    if delta:
        check(delta[0].delta.stop_reason == a.stop_reason, f"message_delta stop_reason {delta[0].delta}")
        check(delta[0].usage.output_tokens == a.usage.output_tokens, f"message_delta usage {delta[0].usage}")
    check(final.usage.output_tokens == a.usage.output_tokens and prompt_of(final.usage) == prompt_of(a.usage),
          f"final usage {final.usage} vs {a.usage}")
    # max_tokens ends a stream with stop_reason max_tokens.
    events, final, _ = collect(max_tokens=2)
    check_event_order(events, "stream max_tokens")
    check(final.stop_reason == "max_tokens" and final.usage.output_tokens == 2, f"stream max_tokens: {final}")
    # The raw frames: `event:` names the data's type; pings allowed; no
    # OpenAI-style [DONE]; the content type of SSE.
    status, ctype, frames = sse_events({"model": MODEL, "max_tokens": 8, "messages": ASK, "stream": True,
                                        "temperature": 0})
    check(status == 200 and ctype.startswith("text/event-stream"), f"raw stream: {status} {ctype}")
    if status == 200:
        names = [n for n, _ in frames]
        check(all(n is not None for n in names), f"raw stream: a frame without `event:` {frames[:3]}")
        for name, data in frames:
            check(data != "[DONE]", "raw stream sends [DONE]")
            try:
                doc = json.loads(data)
            except ValueError:
                check(False, f"raw stream: data is not JSON: {data!r}")
                continue
            check(doc.get("type") == name, f"raw stream: event {name!r} carries type {doc.get('type')!r}")
        kept = [n for n in names if n != "ping"]
        check(kept[:1] == ["message_start"] and kept[-1:] == ["message_stop"], f"raw stream order {kept}")
    # A prompt the context cannot hold is an HTTP error before any event.
    long = "and the " * 4000
    status, _, body = sse_events({"model": MODEL, "max_tokens": 8, "stream": True,
                                  "messages": [{"role": "user", "content": long}]})
    error_shape(status, body, 400, "invalid_request_error", "over-long streamed prompt")


def test_auth():
    body = {"model": MODEL, "max_tokens": 2, "messages": ASK}
    for auth in ("x-api-key", "bearer"):
        s, _, b = raw("POST", "/v1/messages", body, auth=auth)
        check(s == 200 and json.loads(b).get("type") == "message", f"{auth}: {s} {b[:200]!r}")
        s, _, b = raw("POST", "/v1/messages/count_tokens", {"model": MODEL, "messages": ASK}, auth=auth)
        check(s == 200 and isinstance(json.loads(b).get("input_tokens"), int), f"count_tokens {auth}: {s} {b[:200]!r}")
    # The anthropic-version header is not required (curl users forget it).
    s, _, b = raw("POST", "/v1/messages", body, headers={"anthropic-version": None})
    check(s == 200, f"without anthropic-version: {s} {b[:200]!r}")
    s, _, b = raw("POST", "/v1/messages", body, auth=None)
    error_shape(s, b, 401, "authentication_error", "no key")
    s, _, b = raw("POST", "/v1/messages", body, auth=None, headers={"x-api-key": KEY + "x"})
    error_shape(s, b, 401, "authentication_error", "wrong x-api-key")
    s, _, b = raw("POST", "/v1/messages/count_tokens", {"model": MODEL, "messages": ASK}, auth=None)
    error_shape(s, b, 401, "authentication_error", "count_tokens without a key")
    # The SDK's three ways: api_key (X-Api-Key in anthropic < 1, Authorization
    # in 2.x), auth_token (Authorization: Bearer), and an explicit x-api-key
    # header with the Authorization header omitted.
    for name, c in (
        ("auth_token", anthropic.Anthropic(base_url=BASE, auth_token=KEY, max_retries=0, timeout=120)),
        ("x-api-key header", anthropic.Anthropic(base_url=BASE, api_key=KEY, max_retries=0, timeout=120,
                                                 default_headers={"x-api-key": KEY,
                                                                  "Authorization": anthropic.Omit()})),
    ):
        try:
            m = c.messages.create(model=MODEL, max_tokens=2, messages=ASK)
            check(m.type == "message", f"{name}: {m}")
        except anthropic.APIError as exc:
            check(False, f"{name}: {exc!r}")
    try:
        anthropic.Anthropic(base_url=BASE, api_key=KEY + "x", max_retries=0).messages.create(
            model=MODEL, max_tokens=2, messages=ASK)
        check(False, "a wrong key was accepted")
    except anthropic.AuthenticationError as exc:
        check(exc.status_code == 401 and exc.type == "authentication_error", f"wrong key: {exc.status_code} {exc.type}")


def test_errors():
    msgs = ASK
    s, _, b = raw("POST", "/v1/messages", b"{not json")
    error_shape(s, b, 400, "invalid_request_error", "malformed JSON")
    s, _, b = raw("POST", "/v1/messages", {"model": MODEL, "messages": msgs})
    error_shape(s, b, 400, "invalid_request_error", "missing max_tokens")
    if s == 400:
        check("max_tokens" in json.loads(b)["error"]["message"], f"missing max_tokens not named: {b[:200]!r}")
    bad_bodies = [
        {"model": MODEL, "max_tokens": 8},
        {"model": MODEL, "max_tokens": 8, "messages": []},
        {"model": MODEL, "max_tokens": 8, "messages": "hi"},
        {"model": MODEL, "max_tokens": -1, "messages": msgs},
        {"model": MODEL, "max_tokens": "8", "messages": msgs},
        {"model": MODEL, "max_tokens": 8, "messages": [{"role": "robot", "content": "hi"}]},
        {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": 5}]},
        {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "text"}]}]},
        {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]}]},
        {"model": MODEL, "max_tokens": 8, "messages": msgs, "temperature": "hot"},
        {"model": MODEL, "max_tokens": 8, "messages": msgs, "temperature": 1.5},
        {"model": MODEL, "max_tokens": 8, "messages": msgs, "top_p": 2},
        {"model": MODEL, "max_tokens": 8, "messages": msgs, "top_k": -3},
        {"model": MODEL, "max_tokens": 8, "messages": msgs, "stop_sequences": "Amen"},
        {"model": MODEL, "max_tokens": 8, "messages": msgs, "stop_sequences": [""]},
        {"model": MODEL, "max_tokens": 8, "messages": msgs, "system": 5},
        {"model": MODEL, "max_tokens": 8, "messages": msgs, "tools": {"name": "f"}},
        {"model": MODEL, "max_tokens": 8, "messages": msgs, "tools": [{"name": "f"}]},
        {"model": MODEL, "max_tokens": 8, "messages": msgs, "tool_choice": {"type": "sometimes"}},
        # tool_choice may only be given with tools (Anthropic's own rule).
        {"model": MODEL, "max_tokens": 8, "messages": msgs, "tool_choice": {"type": "any"}},
        {"model": MODEL, "max_tokens": 8, "messages": msgs, "stream": "yes"},
    ]
    for bad in bad_bodies:
        s, _, b = raw("POST", "/v1/messages", bad)
        error_shape(s, b, 400, "invalid_request_error", f"bad request {json.dumps(bad)[:120]}")
    s, _, b = raw("POST", "/v1/messages/count_tokens", {"model": MODEL})
    error_shape(s, b, 400, "invalid_request_error", "count_tokens without messages")
    long = "and the " * 4000
    s, _, b = raw("POST", "/v1/messages", {"model": MODEL, "max_tokens": 8,
                                            "messages": [{"role": "user", "content": long}]})
    error_shape(s, b, 400, "invalid_request_error", "over-long prompt")
    # The SDK maps the statuses to its exception types.
    try:
        client.messages.create(model=MODEL, max_tokens=8, messages=[{"role": "robot", "content": "hi"}])
        check(False, "a bad role was accepted")
    except anthropic.BadRequestError as exc:
        check(exc.type == "invalid_request_error" and exc.api_message, f"BadRequestError {exc.type} {exc.api_message}")
    # Another model's name is answered by this one, with the warning header
    # (as on the OpenAI routes).
    s, h, b = raw("POST", "/v1/messages", {"model": "claude-nope", "max_tokens": 2, "messages": msgs})
    check(s == 200 and "claude-nope" in h.get("x-waste-warning", ""), f"unknown model: {s} {h} {b[:200]!r}")


def test_count_tokens():
    cases = [
        dict(messages=ASK),
        dict(messages=ASK, system="Answer as the Preacher would."),
        dict(messages=ASK, system=[{"type": "text", "text": "Answer as the Preacher"},
                                   {"type": "text", "text": " would."}]),
        dict(messages=[{"role": "user", "content": "And God said"},
                       {"role": "assistant", "content": [{"type": "text", "text": "Let there be light"}]},
                       {"role": "user", "content": "And there was"}]),
    ]
    for kw in cases:
        counted = client.messages.count_tokens(model=MODEL, **kw)
        ran = client.messages.create(model=MODEL, max_tokens=1, extra_body={"temperature": 0}, **kw)
        check(type(counted.input_tokens) is int and counted.input_tokens == prompt_of(ran.usage),
              f"count_tokens {counted.input_tokens} != run {prompt_of(ran.usage)} for {json.dumps(kw)[:100]}")
    # count_tokens never generates: it does not take max_tokens, and answers
    # only input_tokens.
    s, _, b = raw("POST", "/v1/messages/count_tokens", {"model": MODEL, "messages": ASK})
    check(s == 200 and set(json.loads(b)) == {"input_tokens"}, f"count_tokens body {b[:200]!r}")


def test_parallel():
    results, lock = [], threading.Lock()

    def one(k):
        try:
            m = client.messages.create(model=MODEL, max_tokens=4, messages=[{"role": "user", "content": f"Verse {k}"}],
                                       extra_body={"temperature": 0.8})
            ok = m.type == "message"
        except Exception as exc:  # noqa: BLE001 - recorded as a failure
            ok = repr(exc)
        with lock:
            results.append(ok)

    threads = [threading.Thread(target=one, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    check(results == [True] * 6, f"parallel requests: {results}")


# ---------------------------------------------------------------- tool mode


E = None
TOOLS = None


def prompt_of(usage):
    """The prompt's tokens: Anthropic's input_tokens leave out those a cache
    supplied (the server's prefix cache, across this script's requests)."""
    return usage.input_tokens + (usage.cache_read_input_tokens or 0) + (usage.cache_creation_input_tokens or 0)


def load_expected():
    global E, TOOLS
    case = sys.argv[5] if len(sys.argv) > 5 else "qwen3"
    E = json.loads((pathlib.Path(__file__).parent / "tool_call_expected.json").read_text())["cases"][case]
    f = E["tools"][0]["function"]
    TOOLS = [{"name": f["name"], "description": f["description"], "input_schema": f["parameters"]}]


def tool_ask(**kw):
    args = dict(model=MODEL, max_tokens=len(E["answer_ids"]) + 16, messages=E["ask"], tools=TOOLS)
    args.update(kw)
    return args


def test_tool_use():
    for choice in (None, {"type": "auto"}, {"type": "any"}, {"type": "tool", "name": "get_weather"}):
        kw = {} if choice is None else {"tool_choice": choice}
        m = client.messages.create(extra_body={"temperature": 0}, **tool_ask(**kw))
        what = f"tool_choice {choice}"
        message_shape(m, what, len(E["answer_ids"]) + 16)
        check(m.stop_reason == "tool_use", f"{what}: stop_reason {m.stop_reason!r}")
        uses = [b for b in m.content if b.type == "tool_use"]
        # A model that reasons (a <think> block, gpt-oss's analysis channel)
        # answers a thinking block first.
        check(len(uses) == 1 and [b.type for b in m.content if b.type != "thinking"] == ["tool_use"],
              f"{what}: content {m.content}")
        thinking = [b for b in m.content if b.type == "thinking"]
        want = [E["reasoning"]] if E["reasoning"] else []
        check([b.thinking for b in thinking] == want and all(b.signature for b in thinking),
              f"{what}: thinking {thinking}, want {want}")
        if uses:
            u = uses[0]
            check(u.name == "get_weather" and u.input == {"city": "Paris"}, f"{what}: tool_use {u}")
            check(isinstance(u.id, str) and u.id.startswith("toolu_"), f"{what}: tool_use id {u.id!r}")
        check(prompt_of(m.usage) == E["ask_prompt_tokens"],
              f"{what}: {prompt_of(m.usage)} input tokens, transformers {E['ask_prompt_tokens']}")
        check(m.usage.output_tokens == len(E["answer_ids"]) + 1,
              f"{what}: {m.usage.output_tokens} output tokens for a {len(E['answer_ids'])}-token answer")
    counted = client.messages.count_tokens(model=MODEL, messages=E["ask"], tools=TOOLS)
    check(counted.input_tokens == E["ask_prompt_tokens"],
          f"count_tokens with tools {counted.input_tokens}, transformers {E['ask_prompt_tokens']}")
    # A tool the request does not declare cannot be chosen.
    s, _, b = raw("POST", "/v1/messages", dict(tool_ask(tool_choice={"type": "tool", "name": "nope"})))
    error_shape(s, b, 400, "invalid_request_error", "tool_choice names an unknown tool")
    return m


def test_tool_stream(answer):
    events, final, _ = [], None, None
    with client.messages.stream(extra_body={"temperature": 0}, **tool_ask()) as stream:
        for ev in stream:
            if ev.type in RAW_TYPES:
                events.append(ev)
        final = stream.get_final_message()
    check_event_order(events, "tool stream")
    thinking = {e.index for e in events if e.type == "content_block_start" and e.content_block.type == "thinking"}
    starts = [e.content_block for e in events if e.type == "content_block_start" and e.index not in thinking]
    check(len(starts) == 1 and starts[0].type == "tool_use", f"tool stream blocks {starts}")
    if starts and starts[0].type == "tool_use":
        check(starts[0].name == "get_weather" and starts[0].input == {} and starts[0].id.startswith("toolu_"),
              f"tool_use start {starts[0]}")
    deltas = [e.delta for e in events if e.type == "content_block_delta" and e.index not in thinking]
    check(deltas and all(d.type == "input_json_delta" for d in deltas), f"tool deltas {deltas[:3]}")
    joined = "".join(d.partial_json for d in deltas if d.type == "input_json_delta")
    try:
        check(json.loads(joined) == {"city": "Paris"}, f"input_json_delta joined {joined!r}")
    except ValueError:
        check(False, f"input_json_delta pieces are not JSON together: {joined!r}")
    check(final.stop_reason == "tool_use", f"tool stream stop_reason {final.stop_reason}")
    uses = [b for b in final.content if b.type == "tool_use"]
    check(len(uses) == 1 and uses[0].input == {"city": "Paris"}, f"tool stream final {final.content}")
    check(final.usage.output_tokens == answer.usage.output_tokens, f"tool stream usage {final.usage}")


def test_tool_text():
    """tool_choice none, or no tools: the same output is text."""
    for kw in ({"tool_choice": {"type": "none"}}, {"tools": None}):
        args = tool_ask(**kw)
        if args.get("tools") is None:
            del args["tools"]
        m = client.messages.create(extra_body={"temperature": 0}, **args)
        check(m.stop_reason == "end_turn", f"{kw}: stop_reason {m.stop_reason}")
        check([b.type for b in m.content if b.type != "thinking"] == ["text"] and text_of(m) == E["call_text"],
              f"{kw}: content {m.content}")


def test_tool_round_trip(answer):
    use = [b for b in answer.content if b.type == "tool_use"][0]
    messages = E["ask"] + [
        {"role": "assistant", "content": [{"type": "tool_use", "id": use.id, "name": use.name, "input": use.input}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": E["tool_result"]}]},
    ]
    m = client.messages.create(model=MODEL, max_tokens=8, messages=messages, tools=TOOLS,
                               extra_body={"temperature": 0})
    check(prompt_of(m.usage) == E["round_trip_prompt_tokens"],
          f"round trip: {prompt_of(m.usage)} input tokens, transformers {E['round_trip_prompt_tokens']}")
    # Eight scripted tokens are the start of another call, cut short: text.
    check(m.stop_reason == "max_tokens" and m.usage.output_tokens == 8, f"round trip {m}")
    counted = client.messages.count_tokens(model=MODEL, messages=messages, tools=TOOLS)
    check(counted.input_tokens == prompt_of(m.usage), f"round trip count_tokens {counted.input_tokens}")
    # tool_result content as blocks, and is_error, are accepted.
    messages[-1]["content"] = [{"type": "tool_result", "tool_use_id": use.id, "is_error": True,
                                "content": [{"type": "text", "text": E["tool_result"]}]}]
    m = client.messages.create(model=MODEL, max_tokens=8, messages=messages, tools=TOOLS)
    message_shape(m, "tool_result blocks", 8)
    # A tool_result for an id no tool_use carries is the client's error.
    messages[-1]["content"] = [{"type": "tool_result", "tool_use_id": "toolu_unknown", "content": "x"}]
    s, _, b = raw("POST", "/v1/messages", {"model": MODEL, "max_tokens": 8, "messages": messages, "tools": TOOLS})
    error_shape(s, b, 400, "invalid_request_error", "tool_result for an unknown tool_use_id")


def run(tests):
    for test, args in tests:
        try:
            out = test(*args)
            print("ok", test.__name__, flush=True)
        except Exception as exc:  # noqa: BLE001 - a crash is a failure with its cause
            out = None
            check(False, f"{test.__name__} raised {exc!r}")
        yield out


if MODE == "basic":
    (a,) = run([(test_messages, ())])
    if a is not None:
        list(run([(test_stop_sequences, (a,)), (test_stream, (a,))]))
    list(run([(test_auth, ()), (test_errors, ()), (test_count_tokens, ()), (test_parallel, ())]))
elif MODE == "tools":
    load_expected()
    (answer,) = run([(test_tool_use, ())])
    list(run([(test_tool_text, ())]))
    if answer is not None and any(b.type == "tool_use" for b in answer.content):
        list(run([(test_tool_stream, (answer,)), (test_tool_round_trip, (answer,))]))
    else:
        check(False, "no tool_use to stream or send a result for")
else:
    print(f"unknown mode {MODE!r} (basic or tools)")
    sys.exit(2)
if failures:
    print(f"{len(failures)} failure(s)")
    sys.exit(1)
print("all anthropic checks passed")
