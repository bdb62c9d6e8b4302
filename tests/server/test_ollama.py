#!/usr/bin/env python3
"""Tests `waste serve`'s Ollama API with the official `ollama` Python client
and raw HTTP:

    test_ollama.py BASE_URL API_KEY MODEL_ID          # bible-moe (ChatML, 256 positions)
    test_ollama.py BASE_URL API_KEY MODEL_ID tools [CASE]   # scripted tool call (tool_call_expected.json, qwen3)
    test_ollama.py BASE_URL API_KEY MODEL_ID format   # constrained `format` (a schema, "json")

Field names follow Ollama's docs/api.md and api/types.go (ollama/ollama at
v0.33.0-rc2, 2026-08-21): POST /api/chat and /api/generate (NDJSON streams by
default, one object with "stream": false), the final object's statistics
(done, done_reason, total_duration, load_duration, prompt_eval_count,
prompt_eval_duration, eval_count, eval_duration), `options` (num_predict,
temperature, top_k, top_p, min_p, seed, stop, num_ctx, repeat_penalty and the
runner options clients send), `format` ("json" or a JSON schema), GET
/api/tags, POST /api/show, GET /api/ps, GET /api/version, and errors as
{"error": "..."}. The server runs with --api-key, so every request carries
`Authorization: Bearer KEY` (the ollama client sends the headers it is given).

Both routes must agree with the OpenAI ones: the same conversation at
temperature 0 gives the same text and the same token counts on /api/chat and
/v1/chat/completions, and /api/generate with raw=true equals /v1/completions.
Options a client leaves out take Ollama's documented defaults, repeat_penalty
1.1 over the last 64 tokens among them: an Ollama request without it equals
an OpenAI one with that penalty made explicit, and one with repeat_penalty 1
equals the OpenAI default.

The `tools` form runs against the server of test_tool_calls.py (the tiny
Qwen3-MoE fixture with Qwen3's template, examples/sampler-script playing
tool_call_expected.json's answer_ids and end_of_turn_id): the call comes back in
message.tool_calls with `arguments` as a JSON object, not a string.

Exits 0 printing "all ollama checks passed" when every check passed, 1 with
the failures listed otherwise.
"""
import http.client
import json
import pathlib
import re
import sys
import urllib.parse

import jsonschema
import ollama

from json_prefix import json_prefix_ok

BASE, KEY, MODEL = sys.argv[1:4]
MODE = sys.argv[4] if len(sys.argv) > 4 else "basic"
URL = urllib.parse.urlparse(BASE)
client = ollama.Client(host=BASE, headers={"Authorization": "Bearer " + KEY}, timeout=120)
failures = []
STATS = ("total_duration", "load_duration", "prompt_eval_count", "prompt_eval_duration", "eval_count", "eval_duration")
RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,9})?(Z|[+-]\d\d:\d\d)$")
ASK = [{"role": "user", "content": "In the beginning"}]
GREEDY = {"temperature": 0, "num_predict": 16}
# Ollama's default repeat penalty (api.DefaultOptions), as the OpenAI route's
# vLLM-style field; both look at the last 64 tokens by default.
OLLAMA_REPEAT_PENALTY = 1.1


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL", what, flush=True)


def raw(method, path, body=None, key=KEY, headers=None):
    """(status, lower-cased headers, body bytes) of one request."""
    conn = http.client.HTTPConnection(URL.hostname, URL.port, timeout=120)
    h = {"Content-Type": "application/json"}
    if key is not None:
        h["Authorization"] = "Bearer " + key
    h.update(headers or {})
    data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
    conn.request(method, path, body=data, headers=h)
    r = conn.getresponse()
    out = (r.status, {k.lower(): v for k, v in r.getheaders()}, r.read())
    conn.close()
    return out


def ndjson(path, body):
    """A streamed answer read line by line: (status, content type, objects).
    Every line must be one JSON object (the ollama client json.loads each
    line, so an empty line breaks it)."""
    conn = http.client.HTTPConnection(URL.hostname, URL.port, timeout=120)
    conn.request("POST", path, body=json.dumps(body).encode(),
                 headers={"Content-Type": "application/json", "Authorization": "Bearer " + KEY})
    r = conn.getresponse()
    ctype = r.getheader("content-type", "")
    if r.status != 200:
        data = r.read()
        conn.close()
        return r.status, ctype, data
    objects = []
    for line in r:
        text = line.decode().rstrip("\r\n")
        check(text != "", f"{path}: an empty line in the NDJSON stream")
        if not text:
            continue
        try:
            objects.append(json.loads(text))
        except ValueError:
            check(False, f"{path}: not a JSON line: {text[:200]!r}")
    conn.close()
    return 200, ctype, objects


def error_shape(status, body, want, what):
    check(status == want, f"{what}: status {status}, want {want}: {body[:200]!r}")
    try:
        doc = json.loads(body)
        check(isinstance(doc.get("error"), str) and doc["error"], f"{what}: error body {doc}")
    except ValueError:
        check(False, f"{what}: body is not JSON: {body[:200]!r}")


def final_stats(obj, what, num_predict=None):
    """The last object of an answer: done, done_reason and the statistics
    under Ollama's names, as integers (durations in nanoseconds)."""
    check(obj.get("done") is True, f"{what}: done {obj.get('done')!r}")
    check(obj.get("done_reason") in ("stop", "length"), f"{what}: done_reason {obj.get('done_reason')!r}")
    for k in STATS:
        v = obj.get(k)
        check(type(v) is int and v >= 0, f"{what}: {k} = {v!r}")
    if all(type(obj.get(k)) is int for k in STATS):
        check(obj["prompt_eval_count"] > 0 and obj["eval_count"] > 0, f"{what}: counts {obj}")
        check(obj["total_duration"] >= obj["prompt_eval_duration"] + obj["eval_duration"] > 0,
              f"{what}: total_duration {obj['total_duration']} < prompt + eval")
        if num_predict is not None:
            check(obj["eval_count"] <= num_predict, f"{what}: eval_count {obj['eval_count']} > {num_predict}")
            if obj.get("done_reason") == "length":
                check(obj["eval_count"] == num_predict, f"{what}: length at {obj['eval_count']} of {num_predict}")
    check(obj.get("model") in (MODEL, MODEL + ":latest"), f"{what}: model {obj.get('model')!r}")
    check(isinstance(obj.get("created_at"), str) and RFC3339.match(obj["created_at"]), f"{what}: created_at {obj.get('created_at')!r}")


# --------------------------------------------------------------- basic mode


def openai_chat(messages, max_tokens, repetition_penalty=OLLAMA_REPEAT_PENALTY):
    s, _, b = raw("POST", "/v1/chat/completions",
                  {"model": MODEL, "messages": messages, "max_tokens": max_tokens, "temperature": 0,
                   "repetition_penalty": repetition_penalty})
    check(s == 200, f"/v1/chat/completions {s} {b[:200]!r}")
    return json.loads(b) if s == 200 else None


def test_meta():
    s, h, b = raw("GET", "/api/version")
    check(s == 200 and h.get("content-type", "").startswith("application/json"), f"/api/version {s} {h}")
    if s == 200:
        v = json.loads(b).get("version")
        check(isinstance(v, str) and re.match(r"^\d+\.\d+\.\d+", v), f"/api/version {b[:200]!r}")
    # Clients probe the root before anything else ("Ollama is running").
    s, _, b = raw("GET", "/")
    check(s == 200, f"GET / {s} {b[:100]!r}")
    tags = client.list()
    names = [m.model for m in tags.models]
    check(len(names) == 1 and names[0] in (MODEL, MODEL + ":latest"), f"/api/tags models {names}")
    s, _, b = raw("GET", "/api/tags")
    entry = (json.loads(b).get("models") or [{}])[0] if s == 200 else {}
    for k, t in (("name", str), ("model", str), ("modified_at", str), ("size", int), ("digest", str), ("details", dict)):
        check(isinstance(entry.get(k), t), f"/api/tags {k} = {entry.get(k)!r}")
    check(RFC3339.match(entry.get("modified_at", "")), f"/api/tags modified_at {entry.get('modified_at')!r}")
    details = entry.get("details") or {}
    for k, t in (("parent_model", str), ("format", str), ("family", str), ("families", list),
                 ("parameter_size", str), ("quantization_level", str)):
        check(isinstance(details.get(k), t), f"/api/tags details.{k} = {details.get(k)!r}")
    show = client.show(MODEL)
    info = show.modelinfo or {}
    arch = info.get("general.architecture")
    check(isinstance(arch, str) and arch, f"/api/show general.architecture {arch!r}")
    ctx = info.get(f"{arch}.context_length")
    check(type(ctx) is int and ctx > 0, f"/api/show {arch}.context_length {ctx!r}")
    check("completion" in (show.capabilities or []), f"/api/show capabilities {show.capabilities}")
    check(isinstance(show.template, str) and show.template, "/api/show template")
    check(show.details is not None and show.details.family, f"/api/show details {show.details}")
    check(isinstance(info.get("general.parameter_count"), int), f"/api/show general.parameter_count {info.get('general.parameter_count')!r}")
    try:
        client.show("no-such-model")
        check(False, "/api/show of an unknown model did not fail")
    except ollama.ResponseError as exc:
        check(exc.status_code == 404 and exc.error, f"/api/show unknown: {exc.status_code} {exc.error!r}")
    ps = client.ps()
    check(len(ps.models) == 1 and ps.models[0].model in (MODEL, MODEL + ":latest"), f"/api/ps {ps}")
    if ps.models:
        p = ps.models[0]
        check(p.size is not None and p.size > 0 and p.size_vram is not None and p.expires_at is not None, f"/api/ps {p}")
        check(p.context_length == ctx, f"/api/ps context_length {p.context_length} != show {ctx}")
    return ctx


def test_chat():
    a = client.chat(model=MODEL, messages=ASK, options=GREEDY)
    check(a.message.role == "assistant" and isinstance(a.message.content, str) and a.message.content,
          f"chat message {a.message}")
    check(not a.message.tool_calls, f"chat tool_calls {a.message.tool_calls}")
    final_stats(a.model_dump(), "chat", 16)
    b = client.chat(model=MODEL, messages=ASK, options=GREEDY)
    check(b.message.content == a.message.content, "temperature 0 repeats")
    o = openai_chat(ASK, 16)
    if o:
        check(o["choices"][0]["message"]["content"] == a.message.content,
              f"/api/chat {a.message.content!r} != /v1/chat/completions {o['choices'][0]['message']['content']!r}")
        check((o["usage"]["prompt_tokens"], o["usage"]["completion_tokens"]) == (a.prompt_eval_count, a.eval_count),
              f"counts: openai {o['usage']} ollama {a.prompt_eval_count} {a.eval_count}")
    # repeat_penalty 1 turns Ollama's default off: the OpenAI route's own default.
    off = client.chat(model=MODEL, messages=ASK, options=dict(GREEDY, repeat_penalty=1.0))
    o = openai_chat(ASK, 16, repetition_penalty=1.0)
    if o:
        check(o["choices"][0]["message"]["content"] == off.message.content,
              f"repeat_penalty 1: /api/chat {off.message.content!r} != /v1/chat/completions {o['choices'][0]['message']['content']!r}")
    # The client's stream: pieces with done false, then one final object.
    parts = list(client.chat(model=MODEL, messages=ASK, options=GREEDY, stream=True))
    check(parts and all(p.done is False for p in parts[:-1]) and parts[-1].done is True, "stream done flags")
    check("".join(p.message.content or "" for p in parts) == a.message.content, "streamed chat text")
    if parts:
        final_stats(parts[-1].model_dump(), "chat stream final", 16)
        check(parts[-1].eval_count == a.eval_count, f"stream eval_count {parts[-1].eval_count} != {a.eval_count}")
    # Streaming is the default when "stream" is absent.
    s, ctype, objs = ndjson("/api/chat", {"model": MODEL, "messages": ASK, "options": GREEDY})
    check(s == 200 and ctype.startswith("application/x-ndjson"), f"default stream: {s} {ctype}")
    if s == 200 and objs:
        check(all(o.get("done") is False for o in objs[:-1]), "default stream done flags")
        check(all(o.get("message", {}).get("role") == "assistant" for o in objs), "default stream roles")
        check("".join(o["message"].get("content", "") for o in objs) == a.message.content, "default stream text")
        final_stats(objs[-1], "default stream final", 16)
    s, h, body = raw("POST", "/api/chat", {"model": MODEL, "messages": ASK, "options": GREEDY, "stream": False})
    check(s == 200 and h.get("content-type", "").startswith("application/json"), f"stream false: {s} {h}")
    # num_predict ends the answer with done_reason "length".
    short = client.chat(model=MODEL, messages=ASK, options={"temperature": 0, "num_predict": 3})
    check(short.done_reason == "length" and short.eval_count == 3, f"num_predict 3: {short.done_reason} {short.eval_count}")
    check(a.message.content.startswith(short.message.content), "num_predict 3 gives a prefix")
    # A seed repeats a sampled answer.
    sampled = {"temperature": 0.9, "seed": 42, "num_predict": 16, "top_k": 40, "top_p": 0.9, "min_p": 0.05}
    s1 = client.chat(model=MODEL, messages=ASK, options=sampled)
    s2 = client.chat(model=MODEL, messages=ASK, options=sampled)
    check(s1.message.content == s2.message.content, "the same seed repeats")
    # Options clients send that mean nothing here are accepted.
    more = dict(GREEDY, num_ctx=2048, repeat_penalty=1.1, repeat_last_n=64, num_gpu=1, num_thread=2, use_mmap=True,
                num_batch=8, numa=False, presence_penalty=0.0, frequency_penalty=0.0)
    r = client.chat(model=MODEL, messages=ASK, options=more, keep_alive="5m")
    final_stats(r.model_dump(), "runner options", 16)
    # stop cuts the text before the stop string.
    text = a.message.content
    stop = text[len(text) // 2: len(text) // 2 + 3]
    if stop.strip():
        cut = client.chat(model=MODEL, messages=ASK, options=dict(GREEDY, stop=["zzzz", stop]))
        want = text[: text.index(stop)]
        check(cut.message.content == want, f"stop {stop!r}: {cut.message.content!r} != {want!r}")
        check(cut.done_reason == "stop", f"stop done_reason {cut.done_reason}")
    else:
        check(False, f"no usable stop string in {text!r}")
    # System and several turns reach the template as on the OpenAI route.
    turns = [{"role": "system", "content": "Answer as the Preacher would."},
             {"role": "user", "content": "And God said"},
             {"role": "assistant", "content": "Let there be light"},
             {"role": "user", "content": "And there was"}]
    t = client.chat(model=MODEL, messages=turns, options=GREEDY)
    o = openai_chat(turns, 16)
    if o:
        check(o["usage"]["prompt_tokens"] == t.prompt_eval_count and o["choices"][0]["message"]["content"] == t.message.content,
              f"turns: openai {o['usage']} ollama {t.prompt_eval_count}")
    # The model named with the :latest tag is this model, without a warning.
    s, h, _ = raw("POST", "/api/chat", {"model": MODEL + ":latest", "messages": ASK, "options": GREEDY, "stream": False})
    check(s == 200 and "x-waste-warning" not in h, f"{MODEL}:latest: {s} {h.get('x-waste-warning')}")
    s, h, _ = raw("POST", "/api/chat", {"model": "llama3.2", "messages": ASK, "options": GREEDY, "stream": False})
    check(s == 200 and "llama3.2" in h.get("x-waste-warning", ""), f"another model's name: {s} {h}")
    return a


def test_generate(chat_answer):
    prompt = "In the beginning"
    g = client.generate(model=MODEL, prompt=prompt, options=GREEDY)
    check(isinstance(g.response, str) and g.response, f"generate response {g.response!r}")
    final_stats(g.model_dump(), "generate", 16)
    # Without raw the prompt is the user's message in the chat template.
    check(g.response == chat_answer.message.content and g.prompt_eval_count == chat_answer.prompt_eval_count,
          f"generate {g.response!r}/{g.prompt_eval_count} != chat {chat_answer.message.content!r}/{chat_answer.prompt_eval_count}")
    sys_g = client.generate(model=MODEL, prompt=prompt, system="Answer as the Preacher would.", options=GREEDY)
    sys_c = client.chat(model=MODEL, messages=[{"role": "system", "content": "Answer as the Preacher would."}] + ASK,
                        options=GREEDY)
    check((sys_g.response, sys_g.prompt_eval_count) == (sys_c.message.content, sys_c.prompt_eval_count),
          f"generate system {sys_g.prompt_eval_count} != chat {sys_c.prompt_eval_count}")
    # raw: the prompt as it is, like /v1/completions.
    r = client.generate(model=MODEL, prompt="And God said", raw=True, options=GREEDY)
    s, _, b = raw("POST", "/v1/completions", {"model": MODEL, "prompt": "And God said", "max_tokens": 16, "temperature": 0,
                                            "repetition_penalty": OLLAMA_REPEAT_PENALTY})
    if s == 200:
        c = json.loads(b)
        check(c["choices"][0]["text"] == r.response, f"raw generate {r.response!r} != completion {c['choices'][0]['text']!r}")
        check(c["usage"]["prompt_tokens"] == r.prompt_eval_count, f"raw prompt {r.prompt_eval_count} != {c['usage']}")
    else:
        check(False, f"/v1/completions {s} {b[:200]!r}")
    # On a prompt the model loops on, the default penalty changes the greedy
    # answer ("and all the Levites" for a fourth "and the Levites"): the
    # default is applied, not only accepted.
    loop, longer = "and the and the and the and the", dict(GREEDY, num_predict=24)
    d = client.generate(model=MODEL, prompt=loop, raw=True, options=longer)
    n = client.generate(model=MODEL, prompt=loop, raw=True, options=dict(longer, repeat_penalty=1.0))
    check(d.response != n.response, f"the default repeat_penalty changed nothing: {d.response!r}")
    s, ctype, objs = ndjson("/api/generate", {"model": MODEL, "prompt": prompt, "options": GREEDY})
    check(s == 200 and ctype.startswith("application/x-ndjson"), f"generate default stream {s} {ctype}")
    if s == 200 and objs:
        check("".join(o.get("response", "") for o in objs) == g.response, "generate streamed text")
        check(all(o.get("done") is False for o in objs[:-1]), "generate stream done flags")
        final_stats(objs[-1], "generate stream final", 16)
    parts = list(client.generate(model=MODEL, prompt=prompt, options=GREEDY, stream=True))
    check("".join(p.response or "" for p in parts) == g.response, "generate client stream text")
    # No prompt: the model is loaded (done_reason "load"); with keep_alive 0,
    # "unloaded" (the model stays, as it is the only one).
    s, _, b = raw("POST", "/api/generate", {"model": MODEL, "stream": False})
    d = json.loads(b) if s == 200 else {}
    check(s == 200 and d.get("done") is True and d.get("response") == "" and d.get("done_reason") == "load",
          f"load: {s} {b[:200]!r}")
    s, _, b = raw("POST", "/api/generate", {"model": MODEL, "stream": False, "keep_alive": 0})
    d = json.loads(b) if s == 200 else {}
    check(s == 200 and d.get("done") is True and d.get("done_reason") == "unload", f"unload: {s} {b[:200]!r}")


# A schema the model can always finish within the context (every string
# bounded, no free-form keys).
PERSON = {"type": "object",
          "properties": {"age": {"type": "integer", "minimum": 0, "maximum": 150},
                         "available": {"type": "boolean"},
                         "name": {"type": "string", "pattern": "^[A-Z][a-z]{1,8}$"}},
          "required": ["age", "available", "name"], "additionalProperties": False}


def test_format(context):
    budget = max(16, min(180, context - 48))
    for seed in range(4):
        opts = {"temperature": 0.8, "seed": seed, "num_predict": budget}
        for what, answer in (
            ("chat", lambda: client.chat(model=MODEL, messages=[{"role": "user", "content": "Who is here? Answer in JSON."}],
                                         format=PERSON, options=opts).message.content),
            ("generate", lambda: client.generate(model=MODEL, prompt="Who is here? Answer in JSON.", format=PERSON,
                                                 options=opts).response),
        ):
            text = answer()
            try:
                jsonschema.validate(json.loads(text), PERSON)
            except (ValueError, jsonschema.ValidationError) as exc:
                check(False, f"format schema {what} seed {seed}: {text!r} ({exc})")
    # "json": a JSON object; cut by num_predict it is still a JSON prefix.
    for seed in range(4):
        r = client.chat(model=MODEL, messages=[{"role": "user", "content": "Answer in JSON."}], format="json",
                        options={"temperature": 0.8, "seed": seed, "num_predict": budget})
        text = r.message.content
        if r.done_reason == "stop":
            try:
                check(isinstance(json.loads(text), dict), f"format json: not an object {text!r}")
            except ValueError:
                check(False, f"format json seed {seed}: not JSON {text!r}")
        else:
            check(json_prefix_ok(text), f"format json seed {seed} cut at {r.eval_count}: not a JSON prefix {text!r}")
    test_format_refusals()


def test_format_refusals():
    """A format that is not one, or a schema no text satisfies, is a 400
    naming the problem."""
    for bad in ("xml", {"type": "integer", "minimum": 5, "maximum": 1}, {"type": "string", "pattern": "(?=a)b"}, 5):
        s, _, b = raw("POST", "/api/chat", {"model": MODEL, "messages": ASK, "format": bad, "stream": False})
        error_shape(s, b, 400, f"format {bad!r}")
        s, _, b = raw("POST", "/api/generate", {"model": MODEL, "prompt": "x", "format": bad, "stream": False})
        error_shape(s, b, 400, f"generate format {bad!r}")


def test_errors():
    s, _, b = raw("POST", "/api/chat", b"{not json")
    error_shape(s, b, 400, "malformed JSON")
    for path, bad in (
        ("/api/chat", {"messages": ASK, "stream": False}),
        ("/api/chat", {"model": MODEL, "messages": "hi", "stream": False}),
        ("/api/chat", {"model": MODEL, "messages": [{"content": "hi"}], "stream": False}),
        ("/api/chat", {"model": MODEL, "messages": ASK, "options": {"temperature": "hot"}, "stream": False}),
        ("/api/chat", {"model": MODEL, "messages": ASK, "options": {"num_predict": "many"}, "stream": False}),
        ("/api/chat", {"model": MODEL, "messages": ASK, "options": {"stop": 5}, "stream": False}),
        ("/api/chat", {"model": MODEL, "messages": ASK, "options": 5, "stream": False}),
        ("/api/chat", {"model": MODEL, "stream": False, "messages": [
            {"role": "user", "content": "what is this?", "images": ["iVBORw0KGgo="]}]}),
        ("/api/chat", {"model": MODEL, "messages": ASK, "stream": "yes"}),
        ("/api/generate", {"prompt": "x", "stream": False}),
        ("/api/generate", {"model": MODEL, "prompt": 5, "stream": False}),
        ("/api/show", {}),
    ):
        s, _, b = raw("POST", path, bad)
        error_shape(s, b, 400, f"{path} {json.dumps(bad)[:100]}")
    long = "and the " * 4000
    s, _, b = raw("POST", "/api/chat", {"model": MODEL, "messages": [{"role": "user", "content": long}], "stream": False})
    error_shape(s, b, 400, "over-long prompt")
    s, _, b = raw("POST", "/api/chat", {"model": MODEL, "messages": ASK, "stream": False}, key=None)
    error_shape(s, b, 401, "no key")
    s, _, b = raw("GET", "/api/tags", key=KEY + "x")
    error_shape(s, b, 401, "wrong key")
    try:
        ollama.Client(host=BASE, headers={"Authorization": "Bearer nope"}).chat(model=MODEL, messages=ASK)
        check(False, "a wrong key was accepted")
    except ollama.ResponseError as exc:
        check(exc.status_code == 401, f"wrong key status {exc.status_code}")


# ---------------------------------------------------------------- tool mode


def test_tools():
    case = sys.argv[5] if len(sys.argv) > 5 else "qwen3"
    E = json.loads((pathlib.Path(__file__).parent / "tool_call_expected.json").read_text())["cases"][case]
    n = len(E["answer_ids"])
    opts = {"temperature": 0, "num_predict": n + 16}
    # Raw, with the tools exactly as tool_call_expected.json has them, so the
    # prompt is transformers' (the ollama client reorders a tool's keys).
    s, _, b = raw("POST", "/api/chat", {"model": MODEL, "messages": E["ask"], "tools": E["tools"], "options": opts,
                                         "stream": False})
    d = json.loads(b) if s == 200 else {}
    check(s == 200, f"tools chat {s} {b[:200]!r}")
    msg = d.get("message", {})
    check(msg.get("content") == "", f"content beside the call {msg.get('content')!r}")
    check(msg.get("thinking") == E["reasoning"], f"thinking {msg.get('thinking')!r}, want {E['reasoning']!r}")
    calls = msg.get("tool_calls") or []
    check(len(calls) == 1, f"tool_calls {calls}")
    if calls:
        f = calls[0].get("function", {})
        check(f.get("name") == "get_weather", f"call name {f.get('name')!r}")
        check(f.get("arguments") == {"city": "Paris"}, f"arguments must be an object: {f.get('arguments')!r}")
        check(f.get("index") == 0, f"function.index {f.get('index')!r}")
    if d:
        final_stats(d, "tools chat", n + 16)
        check(d.get("done_reason") == "stop", f"tools done_reason {d.get('done_reason')!r}")
        check(d.get("prompt_eval_count") == E["ask_prompt_tokens"],
              f"{d.get('prompt_eval_count')} prompt tokens, transformers {E['ask_prompt_tokens']}")
        check(d.get("eval_count") == n + 1, f"eval_count {d.get('eval_count')} for a {n}-token answer")
    # The client parses the same answer.
    r = client.chat(model=MODEL, messages=E["ask"], tools=E["tools"], options=opts)
    tc = r.message.tool_calls or []
    check(len(tc) == 1 and tc[0].function.name == "get_weather" and dict(tc[0].function.arguments) == {"city": "Paris"},
          f"client tool_calls {tc}")
    # Streamed: one object carries the call, then the final one.
    parts = list(client.chat(model=MODEL, messages=E["ask"], tools=E["tools"], options=opts, stream=True))
    carrying = [p for p in parts if p.message.tool_calls]
    check(len(carrying) == 1 and carrying[0].message.tool_calls[0].function.arguments == {"city": "Paris"},
          f"streamed tool_calls in {len(carrying)} objects")
    check("".join(p.message.content or "" for p in parts) == "", "streamed content beside the call")
    streamed = "".join(p.message.thinking or "" for p in parts)
    check(streamed == (E["reasoning"] or ""), f"streamed thinking {streamed!r}")
    check(parts and parts[-1].done and parts[-1].done_reason == "stop", "tools stream end")
    # Without tools the same output is text.
    r = client.chat(model=MODEL, messages=E["ask"], options=opts)
    check(r.message.content == E["call_text"] and not r.message.tool_calls, f"without tools: {r.message}")
    # The result sent back: the assistant's call (arguments an object) and a
    # tool message naming the tool.
    back = E["ask"] + [
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "get_weather",
                                                                           "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": E["tool_result"], "tool_name": "get_weather"},
    ]
    r = client.chat(model=MODEL, messages=back, tools=E["tools"], options={"temperature": 0, "num_predict": 8})
    check(r.prompt_eval_count > E["ask_prompt_tokens"], f"round trip prompt {r.prompt_eval_count}")
    # Eight scripted tokens are a call cut short: text, done_reason length.
    check(r.done_reason == "length" and r.eval_count == 8 and not r.message.tool_calls, f"round trip {r}")


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
    (context,) = run([(test_meta, ())])
    (answer,) = run([(test_chat, ())])
    if answer is not None:
        list(run([(test_generate, (answer,))]))
    list(run([(test_format_refusals, ()), (test_errors, ())]))
elif MODE == "format":
    list(run([(test_format, (256,))]))
elif MODE == "tools":
    list(run([(test_tools, ())]))
else:
    print(f"unknown mode {MODE!r} (basic or tools)")
    sys.exit(2)
if failures:
    print(f"{len(failures)} failure(s)")
    sys.exit(1)
print("all ollama checks passed")
