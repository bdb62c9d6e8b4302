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
counted by the server, not timed. Each answer's usage reports the reused tokens as
`prompt_tokens_details.cached_tokens` (0 on the plain server). Then a short
conversation through the official `anthropic` client, streamed and not, whose
usage must split the prompt into `input_tokens` and `cache_read_input_tokens`
exactly as the server counted it.

Exits 0 printing "all prefix-cache checks passed", 1 with the failures listed.
"""
import json
import sys
import urllib.request

import anthropic
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
    check(a.usage.prompt_tokens_details.cached_tokens == reused,
          f"{what}: cached_tokens {a.usage.prompt_tokens_details} but the server reused {reused}")
    check(b.usage.prompt_tokens_details.cached_tokens == 0, f"{what}: the plain server says {b.usage.prompt_tokens_details}")
    print(f"turn {turn + 1}: prompt {a.usage.prompt_tokens}, reused {reused}, evaluated {evaluated}", flush=True)
    previous_prompt = a.usage.prompt_tokens
    messages.append({"role": "assistant", "content": a.choices[0].message.content})
claude = anthropic.Anthropic(base_url=CACHED, api_key=KEY, max_retries=0, timeout=120)
history = []
for turn, question in enumerate(["Who made the light?", "And the waters?", "What of the earth?"]):
    history.append({"role": "user", "content": question})
    kw = dict(model=MODEL, system="Answer briefly.", messages=history, max_tokens=6, extra_body={"temperature": 0})
    before = stats(CACHED)
    if turn == 1:
        with claude.messages.stream(**kw) as s:
            m = s.get_final_message()
    else:
        m = claude.messages.create(**kw)
    after = stats(CACHED)
    reused = after["tokens_reused"] - before["tokens_reused"]
    evaluated = after["prompt_tokens_evaluated"] - before["prompt_tokens_evaluated"]
    what = f"anthropic turn {turn + 1}" + (" (streamed)" if turn == 1 else "")
    u = m.usage
    check(u.cache_read_input_tokens == reused and u.input_tokens == evaluated and u.cache_creation_input_tokens == 0,
          f"{what}: usage {u}, the server reused {reused} and evaluated {evaluated}")
    check(turn == 0 or reused > 0, f"{what}: nothing resumed")
    history.append({"role": "assistant", "content": "".join(b.text for b in m.content if b.type == "text") or "."})
    print(f"{what}: input {u.input_tokens}, cache read {u.cache_read_input_tokens}", flush=True)
plain_stats = stats(PLAIN)
check(plain_stats["hits"] == 0 and plain_stats["sessions"] == 0, f"the plain server cached: {plain_stats}")
if failures:
    print(f"{len(failures)} failure(s)")
    sys.exit(1)
print("all prefix-cache checks passed")
