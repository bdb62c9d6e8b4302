#!/usr/bin/env python3
"""Several choices (`n`) through the official `openai` client:

    test_choices.py CACHED_URL PLAIN_URL API_KEY MODEL_ID

CACHED_URL is a server with the prefix cache on, PLAIN_URL the same model with
`--cache-sessions 0`. A request for n choices with seed S must answer, as choice
i, exactly what a one-choice request with seed S + i answers on the plain server
(text, finish reason, log-probabilities), for chat and legacy completions,
whole and streamed (each streamed choice's deltas joined, its own finish reason,
one usage chunk at the end); usage counts the prompt once and every choice's
tokens. The prompt is evaluated once: the cached server's /stats count the
choices after the first as prefix-cache hits, each reusing all but the
prompt's last token. `n` past the server's bound, or 0, is a 400 naming `n`.

Exits 0 printing "all choice checks passed", 1 with the failures listed.
"""
import json
import sys
import urllib.request

import openai

CACHED, PLAIN, KEY, MODEL = sys.argv[1:5]
failures = []
N = 3
SEED = 41


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL", what, flush=True)


def stats(base):
    req = urllib.request.Request(base + "/stats", headers={"Authorization": "Bearer " + KEY})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.load(r)["prefix_cache"]


cached = openai.OpenAI(base_url=CACHED + "/v1", api_key=KEY, max_retries=0, timeout=120)
plain = openai.OpenAI(base_url=PLAIN + "/v1", api_key=KEY, max_retries=0, timeout=120)
MESSAGES = [{"role": "user", "content": "Who made the light?"}]
PROMPT = "In the beginning"
CHAT = dict(model=MODEL, messages=MESSAGES, max_tokens=8, temperature=1.0, logprobs=True, top_logprobs=2)
TEXT = dict(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=1.0, logprobs=2)


def chat_logprobs(choice):
    return [(t.token, round(t.logprob, 5)) for t in choice.logprobs.content]


def chat_one(seed):
    return plain.chat.completions.create(seed=seed, **CHAT)


def chat_choices():
    before = stats(CACHED)
    r = cached.chat.completions.create(n=N, seed=SEED, **CHAT)
    after = stats(CACHED)
    check(len(r.choices) == N and [c.index for c in r.choices] == list(range(N)), f"chat n={N}: {r.choices}")
    singles = [chat_one(SEED + i) for i in range(N)]
    for c, one in zip(r.choices, singles):
        o = one.choices[0]
        what = f"chat choice {c.index}"
        check(c.message.content == o.message.content, f"{what}: {c.message.content!r} != {o.message.content!r}")
        check(c.finish_reason == o.finish_reason, f"{what}: finish {c.finish_reason} != {o.finish_reason}")
        check(chat_logprobs(c) == chat_logprobs(o), f"{what}: log-probabilities differ")
    texts = {c.message.content for c in r.choices}
    check(len(texts) > 1, f"chat: {N} seeds gave one answer {texts}")
    check(r.usage.prompt_tokens == singles[0].usage.prompt_tokens, f"chat usage {r.usage}")
    total = sum(s.usage.completion_tokens for s in singles)
    check(r.usage.completion_tokens == total, f"chat usage {r.usage}: completion != {total}")
    hits = after["hits"] - before["hits"]
    reused = after["tokens_reused"] - before["tokens_reused"]
    prompt = singles[0].usage.prompt_tokens
    check(hits >= N - 1, f"chat: {hits} prefix-cache hits for {N} choices")
    check(reused >= (N - 1) * (prompt - 1), f"chat: {reused} tokens reused, prompt {prompt}")
    return r


def chat_stream(whole):
    stream = cached.chat.completions.create(n=N, seed=SEED, stream=True, stream_options={"include_usage": True},
                                            **CHAT)
    content, finish, usage, order = {}, {}, None, []
    for chunk in stream:
        if chunk.usage is not None:
            check(usage is None, "chat stream: two usage chunks")
            usage = chunk.usage
        for c in chunk.choices:
            if not order or order[-1] != c.index:
                order.append(c.index)
            content[c.index] = content.get(c.index, "") + (c.delta.content or "")
            if c.finish_reason:
                finish[c.index] = c.finish_reason
    check(order == list(range(N)), f"chat stream: choices came in order {order}")
    for c in whole.choices:
        check(content.get(c.index) == c.message.content,
              f"chat stream choice {c.index}: {content.get(c.index)!r} != {c.message.content!r}")
        check(finish.get(c.index) == c.finish_reason, f"chat stream choice {c.index}: finish {finish}")
    check(usage is not None and usage.completion_tokens == whole.usage.completion_tokens
          and usage.prompt_tokens == whole.usage.prompt_tokens, f"chat stream usage {usage} vs {whole.usage}")


def text_choices():
    r = cached.completions.create(n=N, seed=SEED, **TEXT)
    check([c.index for c in r.choices] == list(range(N)), f"text n={N}: {r.choices}")
    for c in r.choices:
        o = plain.completions.create(seed=SEED + c.index, **TEXT).choices[0]
        what = f"text choice {c.index}"
        check(c.text == o.text, f"{what}: {c.text!r} != {o.text!r}")
        check([round(x, 5) for x in c.logprobs.token_logprobs] == [round(x, 5) for x in o.logprobs.token_logprobs],
              f"{what}: log-probabilities differ")
    joined = {}
    for chunk in cached.completions.create(n=N, seed=SEED, stream=True, **TEXT):
        for c in chunk.choices:
            joined[c.index] = joined.get(c.index, "") + c.text
    check(joined == {c.index: c.text for c in r.choices}, f"text stream {joined}")


def refused():
    for n in (0, 9):
        try:
            cached.chat.completions.create(n=n, **CHAT)
            check(False, f"n={n} was answered")
        except openai.BadRequestError as e:
            check(e.body is not None and e.body.get("param") == "n", f"n={n}: {e.body}")


for test in (lambda: chat_stream(chat_choices()), text_choices, refused):
    try:
        test()
    except Exception as exc:  # noqa: BLE001 - a crash is a failure with its cause
        check(False, f"raised {exc!r}")
if failures:
    print(f"{len(failures)} failure(s)")
    sys.exit(1)
print("all choice checks passed")
