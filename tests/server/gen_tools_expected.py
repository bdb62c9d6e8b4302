#!/usr/bin/env python3
"""Writes tests/server/tools_expected.json: prompt token counts of chat
requests with tools, as transformers renders and tokenizes them with
bible-moe's tokenizer and Kimi's chat template (the container the server
test builds: examples/bible-moe.waste with the template of
tests/fixtures/chat_templates/kimi). Run by hand, offline:

    python3 tests/server/gen_tools_expected.py

The server test compares `usage.prompt_tokens` with these counts, so the
suite needs no transformers at run time.
"""
import json
import pathlib
import shutil
import sys
import tempfile

import transformers
from transformers import AutoTokenizer

ROOT = pathlib.Path(__file__).resolve().parents[2]

# Keys in the usual, unsorted order: the server must hand the tools to the
# template as the client wrote them, as transformers does.
TOOLS = [{"type": "function", "function": {"name": "verse", "parameters": {"type": "object"}}}]
ASK = [{"role": "user", "content": "Where is light?"}]
ROUND_TRIP = ASK + [
    {"role": "assistant", "content": "", "tool_calls": [
        {"function": {"arguments": "{\"book\": \"Genesis\"}", "name": "verse"}, "id": "call_1", "type": "function"}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "Genesis 1:3"},
]
CASES = [
    {"name": "no tools", "messages": ASK, "tools": None},
    {"name": "tools", "messages": ASK, "tools": TOOLS},
    {"name": "tool round trip", "messages": ROUND_TRIP, "tools": TOOLS},
]


def main():
    with tempfile.TemporaryDirectory() as tmp:
        d = pathlib.Path(tmp) / "bible-tools.waste"
        shutil.copytree(ROOT / "examples/bible-moe.waste", d)
        kimi = json.loads((ROOT / "tests/fixtures/chat_templates/kimi/tokenizer_config.json").read_text())
        cfg = json.loads((d / "tokenizer_config.json").read_text())
        cfg["chat_template"] = kimi["chat_template"]
        (d / "tokenizer_config.json").write_text(json.dumps(cfg))
        tok = AutoTokenizer.from_pretrained(str(d))
        out = []
        for case in CASES:
            ids = tok.apply_chat_template(case["messages"], tools=case["tools"], add_generation_prompt=True,
                                          tokenize=True)
            if hasattr(ids, "keys"):
                ids = ids["input_ids"]
            out.append(dict(case, prompt_tokens=len(ids)))
    doc = {
        "generator": "tests/server/gen_tools_expected.py",
        "versions": {"transformers": transformers.__version__, "python": sys.version.split()[0]},
        "cases": out,
    }
    path = ROOT / "tests/server/tools_expected.json"
    path.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
