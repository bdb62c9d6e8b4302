#!/usr/bin/env python3
"""Writes tests/server/tool_call_expected.json for the end-to-end tool-call
test (tests/integration/server.rs, server_parses_the_models_tool_call,
running test_tool_calls.py): the tiny Qwen3-MoE fixture given Qwen3's real
chat template (tests/fixtures/chat_templates/qwen3), as transformers
tokenizes it. Run by hand, offline:

    python3 tests/server/gen_tool_call_expected.py

Stored: the ids of the tool call the model is made to write (the text
Qwen3's template asks for, tokenized by transformers; the Rust test hands
them to examples/sampler-script, which makes the model write them, then
the end-of-turn token), and the prompt token counts of the request with
tools and of the round trip that sends the tool's result back, so the suite
needs no transformers at run time.
"""
import json
import pathlib
import shutil
import sys
import tempfile

import transformers
from transformers import AutoTokenizer

ROOT = pathlib.Path(__file__).resolve().parents[2]

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
# What Qwen3's template tells the model to answer (and renders for an
# assistant turn with tool_calls).
CALL_TEXT = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
# The server hands arguments back as compact JSON; the client sends them
# back verbatim and the template renders the string as it is.
ARGUMENTS = '{"city":"Paris"}'


def round_trip(call_id):
    return ASK + [
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": "get_weather", "arguments": ARGUMENTS}}]},
        {"role": "tool", "tool_call_id": call_id, "content": "Sunny, 21 C"},
    ]


def count(tok, messages):
    ids = tok.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True, tokenize=True)
    if hasattr(ids, "keys"):
        ids = ids["input_ids"]
    return len(ids)


def main():
    with tempfile.TemporaryDirectory() as tmp:
        d = pathlib.Path(tmp) / "qwen3-tools"
        shutil.copytree(ROOT / "tests/fixtures/tiny-qwen3_moe", d)
        qwen3 = json.loads((ROOT / "tests/fixtures/chat_templates/qwen3/tokenizer_config.json").read_text())
        cfg = json.loads((d / "tokenizer_config.json").read_text())
        cfg["chat_template"] = qwen3["chat_template"]
        cfg["model_max_length"] = 2048
        (d / "tokenizer_config.json").write_text(json.dumps(cfg))
        tok = AutoTokenizer.from_pretrained(str(d))
        call_ids = tok(CALL_TEXT, add_special_tokens=False)["input_ids"]
        assert tok.decode(call_ids) == CALL_TEXT
        doc = {
            "generator": "tests/server/gen_tool_call_expected.py",
            "versions": {"transformers": transformers.__version__, "python": sys.version.split()[0]},
            "tools": TOOLS,
            "ask": ASK,
            "call_text": CALL_TEXT,
            "call_ids": call_ids,
            "end_of_turn_id": tok.convert_tokens_to_ids("<|im_end|>"),
            "arguments": ARGUMENTS,
            "tool_result": "Sunny, 21 C",
            "ask_prompt_tokens": count(tok, ASK),
            # The call id is rendered nowhere by Qwen3's template.
            "round_trip_prompt_tokens": count(tok, round_trip("call_x")),
        }
    path = ROOT / "tests/server/tool_call_expected.json"
    path.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
