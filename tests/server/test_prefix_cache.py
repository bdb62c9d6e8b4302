#!/usr/bin/env python3
"""The prefix cache through the official `openai` client:

    test_prefix_cache.py CACHED_URL PLAIN_URL API_KEY MODEL_ID

CACHED_URL is a server with the cache on (`--cache-sessions`), PLAIN_URL the same
model with `--cache-sessions 0`. A ten-turn conversation (each turn's answer
appended to the history, greedy, and every third turn seeded sampling) goes to
both. Every answer and usage must be the same on both servers, and from the second
turn on the cached server must resume the previous turn's state: its /stats say
the turn reused at least the previous prompt's tokens and evaluated only the rest
(the previous answer as the template renders it and the new user message),
counted by the server, not timed.

Exits 0 printing "all prefix-cache checks passed", 1 with the failures listed.
"""
import json
import sys
import urllib.request

import openai

CACHED, PLAIN, KEY, MODEL = sys.argv[1:5]
failures = []


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
QUESTIONS = ["Who made the light?", "And the waters?", "What of the earth?", "And the stars?", "Who named them?",
             "And the beasts?", "What was good?", "Who rested?", "And the garden?", "Which tree?"]
messages = [{"role": "system", "content": "Answer briefly."}]
previous_prompt = 0
for turn, question in enumerate(QUESTIONS):
    messages.append({"role": "user", "content": question})
    kw = dict(model=MODEL, messages=messages, max_tokens=6)
    kw.update({"temperature": 0.9, "seed": 100 + turn} if turn % 3 == 2 else {"temperature": 0})
    before = stats(CACHED)
    a = cached.chat.completions.create(**kw)
    after = stats(CACHED)
    b = plain.chat.completions.create(**kw)
    what = f"turn {turn + 1}"
    check(a.choices[0].message.content == b.choices[0].message.content,
          f"{what}: cached {a.choices[0].message.content!r} != plain {b.choices[0].message.content!r}")
    check(a.usage.prompt_tokens == b.usage.prompt_tokens and a.usage.completion_tokens == b.usage.completion_tokens,
          f"{what}: usage {a.usage} != {b.usage}")
    reused = after["tokens_reused"] - before["tokens_reused"]
    evaluated = after["prompt_tokens_evaluated"] - before["prompt_tokens_evaluated"]
    check(reused + evaluated == a.usage.prompt_tokens, f"{what}: reused {reused} + evaluated {evaluated} != {a.usage.prompt_tokens}")
    if turn == 0:
        check(reused == 0 and after["misses"] == before["misses"] + 1, f"{what}: a first turn resumed something {after}")
    else:
        check(after["hits"] == before["hits"] + 1, f"{what}: no prefix hit {before} -> {after}")
        check(reused >= previous_prompt, f"{what}: reused {reused} of the previous prompt's {previous_prompt} tokens")
        check(evaluated <= a.usage.prompt_tokens - previous_prompt,
              f"{what}: evaluated {evaluated}, more than the {a.usage.prompt_tokens - previous_prompt} new tokens")
    print(f"turn {turn + 1}: prompt {a.usage.prompt_tokens}, reused {reused}, evaluated {evaluated}", flush=True)
    previous_prompt = a.usage.prompt_tokens
    messages.append({"role": "assistant", "content": a.choices[0].message.content})
plain_stats = stats(PLAIN)
check(plain_stats["hits"] == 0 and plain_stats["sessions"] == 0, f"the plain server cached: {plain_stats}")
if failures:
    print(f"{len(failures)} failure(s)")
    sys.exit(1)
print("all prefix-cache checks passed")
