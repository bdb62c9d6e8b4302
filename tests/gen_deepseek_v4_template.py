#!/usr/bin/env python3
"""Hold WASTE's Jinja port of DeepSeek-V4's chat format to the release's own encoder.

DeepSeek-V4's release has no Jinja chat template: its format is Python,
`encoding/encoding_dsv4.py` (`encode_messages`), with golden files in `encoding/tests/`.
A container converted from it carries host/engine/src/convert/templates/deepseek_v4.jinja
instead (convert/templates.rs). This script

  1. checks that the encoder it is given reproduces the release's golden files
     (tests/test_input_N.json -> tests/test_output_N.txt), so it is the release's logic;
  2. renders every case below with that encoder and with the Jinja port through
     transformers' own `apply_chat_template` (its Jinja environment), and requires them equal;
  3. writes tests/fixtures/chat_templates/deepseek_v4/expected.json: the cases in the
     engine's wire form (role, content, extra JSON text; tools as JSON text; the template
     variables) and the encoder's text, which tests/integration/deepseek_v4.rs renders
     through the component.

Conventions of the port (see its header): `tools` join the first system message (an empty
one is prepended without one), `thinking` selects thinking_mode "thinking", the final
turn opener needs add_generation_prompt (every case here that ends with a user turn passes
it). `reasoning_effort` and the quick-instruction tasks are not carried.

How to run (by hand, never by CI; offline, a second):

    python3 tests/gen_deepseek_v4_template.py DIR

where DIR holds the release's `encoding_dsv4.py` and `tests/` (the copy used is named in
tests/fixtures/chat_templates/README.md). Needs transformers 5.24, tokenizers.
"""

import copy
import hashlib
import importlib.util
import json
import os
import sys

from tokenizers import Tokenizer
from transformers import PreTrainedTokenizerFast

ROOT = os.path.dirname(os.path.abspath(__file__))
TEMPLATE = os.path.join(ROOT, "..", "host", "engine", "src", "convert", "templates", "deepseek_v4.jinja")
OUT = os.path.join(ROOT, "fixtures", "chat_templates", "deepseek_v4", "expected.json")
TOKENIZER_JSON = os.path.join(ROOT, "fixtures", "tiny-qwen3_moe", "tokenizer.json")
BOS, EOS = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather at a place, now.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "城市 or city"},
        "days": {"type": "integer"}}, "required": ["city"]}}}
CLOCK = {"type": "function", "function": {
    "name": "time_in", "description": "Local time.",
    "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}}}}


def call(id_, name, args):
    return {"id": id_, "type": "function", "function": {"name": name, "arguments": args}}


CASES = [
    ("single_user", [{"role": "user", "content": "What is 2+2?"}], None),
    ("system_user", [{"role": "system", "content": "You are terse."},
                     {"role": "user", "content": "Name a colour."}], None),
    ("multi_turn", [{"role": "system", "content": "Be kind."},
                    {"role": "user", "content": "Hi"},
                    {"role": "assistant", "content": "Hello! How can I help?"},
                    {"role": "user", "content": "Tell me a joke about \"quotes\" & <tags>."}], None),
    ("reasoning_history", [{"role": "user", "content": "2+3?"},
                           {"role": "assistant", "content": "5", "reasoning_content": "Add them."},
                           {"role": "user", "content": "And 4+4?"}], None),
    ("ends_with_assistant", [{"role": "user", "content": "Hi"},
                             {"role": "assistant", "content": "Hey.", "reasoning_content": "Greet back."}], None),
    ("tools_no_system", [{"role": "user", "content": "Weather in Paris?"}], [WEATHER]),
    ("tool_round_trip", [
        {"role": "system", "content": "Use tools when useful."},
        {"role": "user", "content": "Weather in 北京 for 3 days, and the time there?"},
        {"role": "assistant", "content": "", "reasoning_content": "Two tools.",
         "tool_calls": [call("c1", "get_weather", {"city": "北京", "days": 3}),
                        call("c2", "time_in", {"zone": "Asia/Shanghai"})]},
        # Results arrive out of call order: the encoder sorts them by call.
        {"role": "tool", "tool_call_id": "c2", "content": "09:30"},
        {"role": "tool", "tool_call_id": "c1", "content": "{\"temp\": 21}"},
        {"role": "assistant", "content": "Sunny, 21°C; it is 09:30.", "reasoning_content": "Summarise."},
        {"role": "user", "content": "Thanks! And tomorrow?"}], [WEATHER, CLOCK]),
    ("tool_then_user", [
        {"role": "user", "content": "Time in Tokyo?"},
        {"role": "assistant", "content": "Checking.", "tool_calls": [call("t1", "time_in", {"zone": "Asia/Tokyo"})]},
        {"role": "tool", "tool_call_id": "t1", "content": "18:00"},
        {"role": "user", "content": "In 24h format please."}], [CLOCK]),
    ("non_json_arguments", [
        {"role": "user", "content": "Raw call"},
        {"role": "assistant", "content": "", "tool_calls": [call("r1", "time_in", "not json")]},
        {"role": "tool", "tool_call_id": "r1", "content": "ok"}], [CLOCK]),
]


def load_encoder(d):
    spec = importlib.util.spec_from_file_location("encoding_dsv4", os.path.join(d, "encoding_dsv4.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def check_golden(enc, d):
    """The release's own tests: inputs 1-2 (thinking mode, tools attached to the first
    message as its test does), 3 (thinking), 4 (chat)."""
    modes = {1: "thinking", 2: "thinking", 3: "thinking", 4: "chat"}
    for n, mode in modes.items():
        td = json.load(open(os.path.join(d, "tests", f"test_input_{n}.json")))
        if isinstance(td, dict):
            messages = td["messages"]
            if "tools" in td:
                messages[0]["tools"] = td["tools"]
        else:
            messages = td
        gold = open(os.path.join(d, "tests", f"test_output_{n}.txt")).read()
        got = enc.encode_messages(messages, thinking_mode=mode)
        assert got == gold, f"the encoder does not reproduce the release's golden file {n}"
    print("encoder reproduces the release's 4 golden files")


def encoder_input(messages, tools):
    """A chat template's (messages, tools) as the encoder takes them: OpenAI tool-call
    arguments as JSON text, tools on the first system message."""
    msgs = copy.deepcopy(messages)
    for m in msgs:
        for c in m.get("tool_calls") or []:
            if not isinstance(c["function"]["arguments"], str):
                c["function"]["arguments"] = json.dumps(c["function"]["arguments"], ensure_ascii=False)
    if tools:
        if not msgs or msgs[0]["role"] != "system":
            msgs.insert(0, {"role": "system", "content": ""})
        msgs[0]["tools"] = tools
    return msgs


def wire(messages):
    """The engine's ChatMessage form: role, content, and every other key as JSON text
    (in the given order)."""
    out = []
    for m in messages:
        extra = {k: v for k, v in m.items() if k not in ("role", "content")}
        out.append({"role": m["role"], "content": m.get("content"),
                    "extra": json.dumps(extra, ensure_ascii=False) if extra else None})
    return out


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    d = sys.argv[1]
    enc = load_encoder(d)
    check_golden(enc, d)
    template = open(TEMPLATE, encoding="utf-8").read()
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_file(TOKENIZER_JSON), bos_token=BOS, eos_token=EOS)
    cases = []
    for name, messages, tools in CASES:
        for thinking in (False, True):
            want = enc.encode_messages(encoder_input(messages, tools),
                                       thinking_mode="thinking" if thinking else "chat")
            got = tok.apply_chat_template(messages, tools=tools, chat_template=template, tokenize=False,
                                          add_generation_prompt=True, thinking=thinking)
            assert got == want, f"{name} thinking={thinking}:\n--- port\n{got!r}\n--- encoder\n{want!r}"
            cases.append({"name": name, "thinking": thinking, "messages": wire(messages),
                          "tools_json": json.dumps(tools, ensure_ascii=False) if tools else None,
                          "vars_json": json.dumps({"thinking": thinking}), "add_generation_prompt": True,
                          "text": want})
    sha = hashlib.sha256(open(os.path.join(d, "encoding_dsv4.py"), "rb").read()).hexdigest()
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump({"generator": "tests/gen_deepseek_v4_template.py", "encoder_sha256": sha,
                   "bos_token": BOS, "eos_token": EOS, "cases": cases}, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"{len(cases)} cases: the port equals the encoder; wrote {OUT}")


if __name__ == "__main__":
    main()
