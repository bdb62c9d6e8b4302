#!/usr/bin/env python3
"""A forced tool call from a model with random weights, through the official
clients:

    test_forced_tool.py BASE_URL API_KEY MODEL_ID [SEEDS [thinking-off]]

The server runs a tiny random-weight fixture with a template whose call
comes first: Qwen2.5's (Hermes `<tool_call>` JSON, no reasoning before a
call), or a reasoning family's with `thinking-off` (Anthropic `thinking`
disabled, OpenAI `reasoning_effort` none), so nothing but the token mask
makes the answer a call. For Anthropic's `tool_choice` any and
tool, and OpenAI's `tool_choice` "required" and a named function, every
answer must be exactly one call of an allowed tool whose input validates
against that tool's schema with `jsonschema` (stop_reason "tool_use",
finish_reason "tool_calls").

Exits 0 printing "all forced tool checks passed" when every check passed, 1
with the failures listed otherwise.
"""
import json
import sys

import anthropic
import jsonschema
import openai

BASE, KEY, MODEL = sys.argv[1:4]
SEEDS = int(sys.argv[4]) if len(sys.argv) > 4 else 6
THINKING_OFF = len(sys.argv) > 5 and sys.argv[5] == "thinking-off"
ANTHROPIC_EXTRA = {"thinking": {"type": "disabled"}} if THINKING_OFF else {}
OPENAI_EXTRA = {"reasoning_effort": "none"} if THINKING_OFF else {}
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL", what, flush=True)


# Bounded schemas: a call always fits in max_tokens.
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10},
                                            "days": {"type": "integer", "minimum": 1, "maximum": 7},
                                            "unit": {"enum": ["C", "F"]}},
           "required": ["city", "days", "unit"], "additionalProperties": False}
ALARM = {"type": "object", "properties": {"hour": {"type": "integer", "minimum": 0, "maximum": 23},
                                          "label": {"type": "string", "pattern": "^[a-z]{1,8}$"}},
         "required": ["hour"], "additionalProperties": False}
SCHEMAS = {"get_weather": WEATHER, "set_alarm": ALARM}
ASK = [{"role": "user", "content": "Call a tool."}]
LIMIT = 400  # the XML syntaxes spell a call in ~200 of the fixtures' 512-entry vocabulary's tokens


def valid(name, arguments, allowed, what):
    check(name in allowed, f"{what}: called {name!r}, allowed {allowed}")
    if name in SCHEMAS:
        try:
            jsonschema.validate(arguments, SCHEMAS[name])
        except jsonschema.ValidationError as exc:
            check(False, f"{what}: {arguments!r} breaks {name}'s schema: {exc.message}")


def anthropic_calls():
    client = anthropic.Anthropic(base_url=BASE, api_key=KEY, max_retries=0)
    tools = [{"name": n, "description": n, "input_schema": s} for n, s in SCHEMAS.items()]
    for choice, allowed in (({"type": "any"}, list(SCHEMAS)), ({"type": "tool", "name": "set_alarm"}, ["set_alarm"])):
        for seed in range(SEEDS):
            what = f"anthropic {choice} seed {seed}"
            m = client.messages.create(model=MODEL, max_tokens=LIMIT, messages=ASK, tools=tools, tool_choice=choice,
                                       extra_body={"temperature": 1.0, "seed": seed, **ANTHROPIC_EXTRA})
            uses = [b for b in m.content if b.type == "tool_use"]
            check(m.stop_reason == "tool_use" and len(uses) == 1, f"{what}: {m.stop_reason} {m.content}")
            for u in uses:
                valid(u.name, u.input, allowed, what)


def openai_calls():
    client = openai.OpenAI(base_url=BASE + "/v1", api_key=KEY, max_retries=0)
    tools = [{"type": "function", "function": {"name": n, "description": n, "parameters": s}}
             for n, s in SCHEMAS.items()]
    for choice, allowed in (("required", list(SCHEMAS)),
                            ({"type": "function", "function": {"name": "get_weather"}}, ["get_weather"])):
        for seed in range(SEEDS):
            what = f"openai {choice} seed {seed}"
            r = client.chat.completions.create(model=MODEL, messages=ASK, tools=tools, tool_choice=choice,
                                               max_tokens=LIMIT, temperature=1.0, seed=seed,
                                               extra_body=OPENAI_EXTRA)
            c = r.choices[0]
            calls = c.message.tool_calls or []
            check(c.finish_reason == "tool_calls" and len(calls) == 1, f"{what}: {c.finish_reason} {c.message}")
            for t in calls:
                try:
                    args = json.loads(t.function.arguments)
                except ValueError:
                    check(False, f"{what}: arguments not JSON {t.function.arguments!r}")
                    continue
                valid(t.function.name, args, allowed, what)


for test in (anthropic_calls, openai_calls):
    try:
        test()
        print("ok", test.__name__, flush=True)
    except Exception as exc:  # noqa: BLE001 - a crash is a failure with its cause
        check(False, f"{test.__name__} raised {exc!r}")
if failures:
    print(f"{len(failures)} failure(s)")
    sys.exit(1)
print("all forced tool checks passed")
