#!/usr/bin/env python3
"""Writes tests/server/tool_call_expected.json for the end-to-end tool-call
tests (tests/integration/server.rs, server_parses_each_familys_tool_call,
running test_tool_calls.py): tiny fixtures given their family's real chat
template (Qwen3's, and llama.cpp's Qwen3.5, GLM-4.6, MiniMax-M2 and gpt-oss-120b copies
in tests/fixtures/chat_templates/llamacpp), as transformers tokenizes them.
Run by hand, offline:

    python3 tests/server/gen_tool_call_expected.py

Stored: the tool call the template asks for (`call_text`), the whole answer
the model is made to write (`answer_text`: the call after the reasoning a
thinking template expects: a `<think>` block, or its rest and `</think>`
where the generation prompt opened the block, as transformers renders it;
gpt-oss reasons in its analysis channel inside the call text) and its ids
as transformers tokenizes it (`answer_ids`; the Rust test hands them to
examples/sampler-script, which makes the model write them, then the
end-of-turn token), the reasoning the server must split out (`reasoning`),
and the prompt token counts of the request with tools and of the round trip
that sends the tool's result back, so the suite needs no transformers at
run time.
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
# The server hands arguments back as compact JSON; the client sends them
# back verbatim and the server gives the template the object they spell,
# as vLLM does (templates iterate `arguments.items()`).
ARGUMENTS = '{"city":"Paris"}'
# What a thinking model writes before the call.
REASONING = "Let me check the weather."
LLAMACPP = ROOT / "tests/fixtures/chat_templates/llamacpp"

# (case, tiny fixture, chat template: the Qwen3 tokenizer_config's or a
# llama.cpp corpus file, the call the template asks the model to write)
CASES = [
    ("qwen3", "tiny-qwen3_moe", "qwen3",
     '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'),
    ("qwen3_5", "tiny-qwen3_5_moe_text", "Qwen3.5-4B.jinja",
     "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>"),
    ("glm4_moe", "tiny-glm4_moe", "GLM-4.6.jinja",
     "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>"),
    ("minimax_m2", "tiny-minimax_m2", "MiniMax-M2.jinja",
     '<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">Paris</parameter>\n</invoke>\n</minimax:tool_call>'),
    # Harmony: the analysis channel is reasoning, the commentary channel to
    # functions.NAME a call. The tiny fixture's vocabulary has no harmony
    # special tokens, so they are text here, for transformers and for us alike.
    ("gpt_oss", "tiny-gpt_oss", "openai-gpt-oss-120b.jinja",
     "<|channel|>analysis<|message|>The user wants the weather.<|end|><|start|>assistant"
     '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"Paris"}<|call|>'),
]


def round_trip(call_id, content=""):
    return ASK + [
        {"role": "assistant", "content": content, "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "tool_call_id": call_id, "content": "Sunny, 21 C"},
    ]


def count(tok, messages):
    ids = tok.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True, tokenize=True)
    if hasattr(ids, "keys"):
        ids = ids["input_ids"]
    return len(ids)


# gpt-oss's template writes today's date (`strftime_now`), and dates differ
# in length as tokens: the counts are taken with this date written in
# instead, and tests/integration/server.rs gives the server the same.
TEMPLATE_DATE = "2026-12-01"


def template_source(template):
    if template == "qwen3":
        return json.loads((ROOT / "tests/fixtures/chat_templates/qwen3/tokenizer_config.json").read_text())["chat_template"]
    return pin_date((LLAMACPP / template).read_text())


def pin_date(source):
    return source.replace('strftime_now("%Y-%m-%d")', json.dumps(TEMPLATE_DATE))


def case(name, fixture, template, call_text):
    with tempfile.TemporaryDirectory() as tmp:
        d = pathlib.Path(tmp) / name
        shutil.copytree(ROOT / "tests/fixtures" / fixture, d)
        cfg = json.loads((d / "tokenizer_config.json").read_text())
        cfg["chat_template"] = template_source(template)
        cfg["model_max_length"] = 2048
        (d / "tokenizer_config.json").write_text(json.dumps(cfg))
        tok = AutoTokenizer.from_pretrained(str(d))
        if name == "gpt_oss":
            answer_text, reasoning = call_text, "The user wants the weather."
        elif "</think>" not in cfg["chat_template"]:
            answer_text, reasoning = call_text, None
        else:
            prompt = tok.apply_chat_template(ASK, tools=TOOLS, add_generation_prompt=True, tokenize=False)
            opened = prompt.rstrip().endswith("<think>")
            answer_text = ("" if opened else "<think>\n") + f"{REASONING}\n</think>\n\n{call_text}"
            reasoning = REASONING
        answer_ids = tok(answer_text, add_special_tokens=False)["input_ids"]
        assert tok.decode(answer_ids) == answer_text
        try:
            null_content_tokens = count(tok, round_trip("call_x", content=None))
        except Exception:
            null_content_tokens = None
        return {
            "fixture": fixture,
            "template": template,
            "tools": TOOLS,
            "ask": ASK,
            "call_text": call_text,
            "answer_text": answer_text,
            "answer_ids": answer_ids,
            "reasoning": reasoning,
            # The fixture's end-of-sequence token ends the scripted answer.
            "end_of_turn_id": tok.eos_token_id,
            "arguments": ARGUMENTS,
            "tool_result": "Sunny, 21 C",
            "ask_prompt_tokens": count(tok, ASK),
            # No template here renders the call id.
            "round_trip_prompt_tokens": count(tok, round_trip("call_x")),
            # A null content beside the call: Qwen3's template reads it (and
            # fails, None here); the others render the turn without it.
            "null_content_prompt_tokens": null_content_tokens,
        }


def main():
    doc = {
        "generator": "tests/server/gen_tool_call_expected.py",
        "versions": {"transformers": transformers.__version__, "python": sys.version.split()[0]},
        "template_date": TEMPLATE_DATE,
        "cases": {name: case(name, fixture, template, text) for name, fixture, template, text in CASES},
    }
    path = ROOT / "tests/server/tool_call_expected.json"
    path.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
