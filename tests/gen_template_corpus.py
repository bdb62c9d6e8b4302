#!/usr/bin/env python3
"""Expected renderings of llama.cpp's corpus of real chat templates, by transformers.

Run by hand (not by CI), offline, CPU only, a few seconds:

    python3 tests/gen_template_corpus.py                  # render the stored templates
    python3 tests/gen_template_corpus.py --extract SDIST  # first (re)extract them from the sdist

`--extract` takes the llama-cpp-python 0.3.36 sdist (llama_cpp_python-0.3.36.tar.gz, from
PyPI), copies every `vendor/llama.cpp/models/templates/*.jinja` byte for byte into
tests/fixtures/chat_templates/llamacpp/ and writes SOURCES.md there (sdist name and sha256, the
path inside, each file's sha256). Without it the stored files are checked against SOURCES.md.

Rendering: each template is attached to a minimal fast tokenizer (the byte-level tokenizer.json
of tests/fixtures/tiny-qwen3_moe; the vocabulary does not matter for text) together with the
special tokens of that model's tokenizer_config.json (table SPECIALS below), and every case is
rendered by transformers' own `tokenizer.apply_chat_template(messages, tools=...,
add_generation_prompt=..., tokenize=False, **kwargs)`: the same code path, the same Jinja
environment (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols, the
`{% generation %}` extension, `raise_exception`, `strftime_now`, Python-`json.dumps` `tojson`,
`dict`, `namespace`), the same message normalisation (None-valued keys dropped,
`reasoning_content` aliased to `thinking`). `strftime_now` reads `datetime.now()`; it is pinned
to FIXED_NOW by replacing `datetime` in transformers.utils.chat_template_utils. A case the
template rejects records the exception (class, module, message) instead of the text.

Writes tests/fixtures/chat_templates/llamacpp/expected.json: the inputs (messages as given,
messages as the template sees them, the same in the engine's wire form with key order kept as
JSON text, tools and tools_json) and per template its special tokens (and a tokenizer_config.json
text carrying them), the variables and Jinja features it uses, and `cases_file`:
llamacpp/expected/<template>.json with, per case, the kwargs (and kwargs_json) and `text` or
`error`.
"""

import argparse
import datetime as _dt
import hashlib
import json
import os
import sys
import tarfile

import jinja2
import tokenizers
import transformers
import transformers.utils.chat_template_utils as ctu
from transformers import PreTrainedTokenizerFast
from transformers.utils.chat_template_utils import (
    _alias_reasoning_fields,
    _get_template_variables,
    _normalize_chat_messages,
)

ROOT = os.path.dirname(os.path.abspath(__file__))
FIX = os.path.join(ROOT, "fixtures")
OUT = os.path.join(FIX, "chat_templates", "llamacpp")
TOKENIZER_JSON = os.path.join(FIX, "tiny-qwen3_moe", "tokenizer.json")
SDIST_NAME = "llama_cpp_python-0.3.36.tar.gz"
INNER = "llama_cpp_python-0.3.36/vendor/llama.cpp/models/templates/"
CASES_DIR = "expected"

# strftime_now() sees this as datetime.now() (naive local time, as transformers calls it).
FIXED_NOW = _dt.datetime(2026, 11, 30, 9, 30, 0)


class _FixedDatetime(_dt.datetime):
    @classmethod
    def now(cls, tz=None):
        return FIXED_NOW if tz is None else FIXED_NOW.replace(tzinfo=tz)


# ---------------------------------------------------------------------------------------------
# Special tokens per template: what the released checkpoint's tokenizer_config.json declares
# (bos_token, eos_token, pad_token, unk_token), as transformers passes them to the template via
# special_tokens_map. No Hub access here: these are from knowledge of the released files, and the
# ones marked "unverified" are best guesses. Only templates that read a variable depend on it
# (see README "llama.cpp template corpus"); for the others it is inert but still passed.
# ---------------------------------------------------------------------------------------------
QWEN = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
LLAMA3 = {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}
HERMES = {"bos_token": "<|begin_of_text|>", "eos_token": "<|im_end|>"}
DEEPSEEK = {"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>"}
MISTRAL = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
COHERE = {"bos_token": "<BOS_TOKEN>", "eos_token": "<|END_OF_TURN_TOKEN|>", "pad_token": "<PAD>"}
KIMI = {"bos_token": "[BOS]", "eos_token": "[EOS]", "pad_token": "[PAD]", "unk_token": "[UNK]"}
MINIMAX = {"bos_token": "]~!b[", "eos_token": "[e~[", "unk_token": "]!d~["}
GLM = {"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"}
GEMMA = {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>"}
LFM = {"bos_token": "<|startoftext|>", "eos_token": "<|im_end|>", "pad_token": "<|pad|>"}
GRANITE = {"bos_token": "<|end_of_text|>", "eos_token": "<|end_of_text|>", "pad_token": "<|end_of_text|>"}

# template file -> (special tokens, provenance note)
SPECIALS = {
    "Apertus-8B-Instruct.jinja": ({"bos_token": "<s>", "eos_token": "<|assistant_end|>"}, "unverified"),
    "Apriel-1.6-15b-Thinker-fixed.jinja": (MISTRAL, "Pixtral/Mistral tokenizer; unverified"),
    "Bielik-11B-v3.0-Instruct.jinja": ({"bos_token": "<s>", "eos_token": "<|im_end|>"}, "unverified"),
    "ByteDance-Seed-OSS.jinja": ({"bos_token": "<seed:bos>", "eos_token": "<seed:eos>",
                                  "pad_token": "<seed:pad>"}, "the template sets these itself"),
    "Cohere2MoE.jinja": (COHERE, "Cohere tokenizer; unverified for this model"),
    "CohereForAI-c4ai-command-r-plus-tool_use.jinja": (COHERE, "c4ai-command-r-plus"),
    "CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja": (COHERE, "c4ai-command-r7b-12-2024"),
    "GLM-4.6.jinja": (GLM, "zai-org GLM-4.5/4.6 (no bos_token)"),
    "GLM-4.7-Flash.jinja": (GLM, "as GLM-4.6"),
    "GigaChat3-10B-A1.8B.jinja": ({"bos_token": "<s>", "eos_token": "</s>"}, "unverified"),
    "GigaChat3.1-10B-A1.8B.jinja": ({"bos_token": "<s>", "eos_token": "</s>"}, "unverified"),
    "HuggingFaceTB-SmolLM3-3B.jinja": ({"eos_token": "<|im_end|>", "pad_token": "<|im_end|>"}, "not read"),
    "Kimi-K2-Instruct.jinja": (KIMI, "moonshotai Kimi tokenizer_config"),
    "Kimi-K2-Thinking.jinja": (KIMI, "moonshotai Kimi tokenizer_config"),
    "Kimi-K3.jinja": (KIMI, "as Kimi-K2; not read"),
    "LFM2-8B-A1B.jinja": (LFM, "LiquidAI LFM2"),
    "LFM2.5-8B-A1B.jinja": (LFM, "as LFM2"),
    "LFM2.5-Instruct.jinja": (LFM, "as LFM2"),
    "MiMo-VL.jinja": (QWEN, "Qwen2.5-VL tokenizer; not read"),
    "MiniMax-M1.jinja": (MINIMAX, "MiniMax tokenizer; not read"),
    "MiniMax-M2.jinja": (MINIMAX, "MiniMax-M2 tokenizer_config; not read (the template writes ]~!b[ itself)"),
    "MiniMax-M3.jinja": (MINIMAX, "the template sets its own bos/eos"),
    "Mistral-Small-3.2-24B-Instruct-2506.jinja": (MISTRAL, "Mistral"),
    "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja": ({"bos_token": "<s>", "eos_token": "<|im_end|>"}, "not read; unverified"),
    "NVIDIA-Nemotron-Nano-v2.jinja": ({"bos_token": "<s>", "eos_token": "<SPECIAL_12>"}, "not read; unverified"),
    "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja": (HERMES, "Hermes-2-Pro-Llama-3-8B"),
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja": (HERMES, "Hermes-3-Llama-3.1-8B"),
    "Qwen-QwQ-32B.jinja": (QWEN, "Qwen (no bos_token)"),
    "Qwen-Qwen2.5-7B-Instruct.jinja": (QWEN, "Qwen (no bos_token)"),
    "Qwen-Qwen3-0.6B.jinja": (QWEN, "Qwen (no bos_token)"),
    "Qwen3-Coder.jinja": (QWEN, "Qwen (no bos_token)"),
    "Qwen3.5-4B.jinja": (QWEN, "Qwen (no bos_token)"),
    "Reka-Edge.jinja": ({"eos_token": "<|endoftext|>"}, "not read; unverified"),
    "Spark2.5.jinja": ({"eos_token": "<|im_end|>"}, "not read; unverified"),
    "StepFun3.5-Flash.jinja": ({"bos_token": "<s>", "eos_token": "<|im_end|>"}, "unverified"),
    "deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja": (DEEPSEEK, "DeepSeek-R1-Distill"),
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja": (DEEPSEEK, "DeepSeek-R1-Distill"),
    "deepseek-ai-DeepSeek-V3.1.jinja": (DEEPSEEK, "DeepSeek-V3.x"),
    "deepseek-ai-DeepSeek-V3.2.jinja": (DEEPSEEK, "DeepSeek-V3.x"),
    "deepseek-ai-DeepSeek-V4-Flash-0731.jinja": (DEEPSEEK, "DeepSeek tokenizer; unverified for V4"),
    "deepseek-ai-DeepSeek-V4.jinja": (DEEPSEEK, "DeepSeek tokenizer; unverified for V4"),
    "fireworks-ai-llama-3-firefunction-v2.jinja": (LLAMA3, "Llama 3"),
    "google-gemma-2-2b-it.jinja": (GEMMA, "Gemma 2"),
    "google-gemma-4-31B-it-interleaved.jinja": (GEMMA, "as Gemma 2/3; unverified for Gemma 4"),
    "google-gemma-4-31B-it.jinja": (GEMMA, "as Gemma 2/3; unverified for Gemma 4"),
    "ibm-granite-granite-3.3-2B-Instruct.jinja": (GRANITE, "Granite; not read"),
    "ibm-granite-granite-4.0.jinja": (GRANITE, "Granite; not read"),
    "ibm-granite-granite-4.1.jinja": (GRANITE, "Granite; not read"),
    "inclusionai-ling-3.0-flash.jinja": ({"eos_token": "<|role_end|>"}, "not read; unverified"),
    "llama-cpp-deepseek-r1.jinja": (DEEPSEEK, "llama.cpp's own DeepSeek-R1 template"),
    "llama-cpp-rwkv-world.jinja": ({"bos_token": "", "eos_token": "\n\n"}, "llama.cpp's RWKV template; RWKV has no BOS text"),
    "meetkai-functionary-medium-v3.1.jinja": (LLAMA3, "Llama 3.1 based"),
    "meetkai-functionary-medium-v3.2.jinja": (LLAMA3, "Llama 3.1 based"),
    "meta-llama-Llama-3.1-8B-Instruct.jinja": (LLAMA3, "Llama 3.1 Instruct"),
    "meta-llama-Llama-3.2-3B-Instruct.jinja": (LLAMA3, "Llama 3.2 Instruct"),
    "meta-llama-Llama-3.3-70B-Instruct.jinja": (LLAMA3, "Llama 3.3 Instruct"),
    "microsoft-Phi-3.5-mini-instruct.jinja": ({"bos_token": "<s>", "eos_token": "<|endoftext|>",
                                               "unk_token": "<unk>", "pad_token": "<|endoftext|>"}, "Phi-3.5-mini"),
    "mistralai-Ministral-3-14B-Reasoning-2512.jinja": (MISTRAL, "Mistral"),
    "mistralai-Mistral-Nemo-Instruct-2407.jinja": (MISTRAL, "Mistral"),
    "moonshotai-Kimi-K2.jinja": (KIMI, "moonshotai Kimi tokenizer_config"),
    "muse-glimmer.jinja": ({"bos_token": "<s>", "eos_token": "</s>"}, "unverified"),
    "openai-gpt-oss-120b.jinja": ({"bos_token": "<|startoftext|>", "eos_token": "<|return|>",
                                   "pad_token": "<|endoftext|>"}, "gpt-oss; not read"),
    "openbmb-MiniCPM5-1B.jinja": ({"bos_token": "<s>", "eos_token": "<|im_end|>"}, "as MiniCPM4; unverified"),
    "poolside-Laguna-S-2.1.jinja": ({"eos_token": "<|im_end|>"}, "not read; unverified"),
    "poolside-Laguna-XS-2.1.jinja": ({"eos_token": "<|im_end|>"}, "not read; unverified"),
    "poolside-Laguna-XS.2.jinja": ({"eos_token": "<|im_end|>"}, "not read; unverified"),
    "tencent-Hy3.jinja": ({"bos_token": "<｜hy_begin_of_sentence:opensource｜>",
                           "eos_token": "<｜hy_eos:opensource｜>",
                           "pad_token": "<｜hy_pad:opensource｜>"}, "the template sets these itself"),
    "unsloth-Apriel-1.5.jinja": (MISTRAL, "Pixtral/Mistral tokenizer; unverified"),
    "unsloth-mistral-Devstral-Small-2507.jinja": (MISTRAL, "Mistral"),
    "upstage-Solar-Open-100B.jinja": ({"eos_token": "<|endoftext|>"}, "not read; unverified"),
}

# ---------------------------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------------------------
TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather",
        "description": "Current weather for a city, in °C or °F.",
        "parameters": {"type": "object",
                       "properties": {"city": {"type": "string", "description": "City name, e.g. Zürich"},
                                      "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                       "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "get_time",
        "description": "Local time in an IANA time zone.",
        "parameters": {"type": "object",
                       "properties": {"timezone": {"type": "string", "description": "e.g. Europe/Paris"}},
                       "required": ["timezone"]}}},
]

SYSTEM = {"role": "system", "content": "You are a helpful assistant. Answer briefly."}
# Tool call ids are 9 alphanumerics: Mistral's templates reject anything else.
CALLS = [
    {"id": "call0A1b2", "type": "function",
     "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}},
    {"id": "call3C4d5", "type": "function",
     "function": {"name": "get_time", "arguments": {"timezone": "Europe/Paris"}}},
]

CONVERSATIONS = {
    # (1) system/user/assistant/user
    "basic": [SYSTEM,
              {"role": "user", "content": "Hello! What's the capital of France?"},
              {"role": "assistant", "content": "The capital of France is Paris."},
              {"role": "user", "content": "And of Japan (日本)?"}],
    # (3) a tool round trip: two parallel calls (arguments as dicts), two results
    "tool_round_trip": [SYSTEM,
                        {"role": "user", "content": "What's the weather and the time in Paris?"},
                        {"role": "assistant", "content": "", "tool_calls": CALLS},
                        {"role": "tool", "tool_call_id": "call0A1b2",
                         "content": "{\"temperature\": 18, \"condition\": \"cloudy\"}"},
                        {"role": "tool", "tool_call_id": "call3C4d5", "content": "14:05"}],
    # the same with a null content beside the calls (as the OpenAI SDK sends it back);
    # transformers drops the None key, so the template sees no `content` at all
    "tool_round_trip_null_content": [SYSTEM,
                                     {"role": "user", "content": "What's the weather and the time in Paris?"},
                                     {"role": "assistant", "content": None, "tool_calls": CALLS},
                                     {"role": "tool", "tool_call_id": "call0A1b2",
                                      "content": "{\"temperature\": 18, \"condition\": \"cloudy\"}"},
                                     {"role": "tool", "tool_call_id": "call3C4d5", "content": "14:05"}],
    # one call, one result (Llama 3.x templates allow a single call per turn)
    "tool_round_trip_single": [{"role": "user", "content": "What's the weather in Paris?"},
                               {"role": "assistant", "content": "", "tool_calls": CALLS[:1]},
                               {"role": "tool", "tool_call_id": "call0A1b2",
                                "content": "{\"temperature\": 18, \"condition\": \"cloudy\"}"}],
    # the two calls with `arguments` as JSON text, as the OpenAI wire format has them
    "tool_round_trip_string_args": [SYSTEM,
                                    {"role": "user", "content": "What's the weather and the time in Paris?"},
                                    {"role": "assistant", "content": "",
                                     "tool_calls": [dict(c, function=dict(c["function"], arguments=json.dumps(
                                         c["function"]["arguments"], ensure_ascii=False))) for c in CALLS]},
                                    {"role": "tool", "tool_call_id": "call0A1b2",
                                     "content": "{\"temperature\": 18, \"condition\": \"cloudy\"}"},
                                    {"role": "tool", "tool_call_id": "call3C4d5", "content": "14:05"}],
    # (4) reasoning_content on an earlier assistant turn
    "reasoning": [SYSTEM,
                  {"role": "user", "content": "What is 17 × 3?"},
                  {"role": "assistant", "content": "17 × 3 = 51.",
                   "reasoning_content": "17 × 3 = 10 × 3 + 7 × 3 = 30 + 21 = 51."},
                  {"role": "user", "content": "And 17 × 4?"}],
    # reasoning_content on the last turn (after the last user message: templates keep it)
    "reasoning_last": [{"role": "user", "content": "What is 17 × 3?"},
                       {"role": "assistant", "content": "17 × 3 = 51.",
                        "reasoning_content": "17 × 3 = 10 × 3 + 7 × 3 = 30 + 21 = 51."}],
    # (5) no system message
    "no_system": [{"role": "user", "content": "Hi there."},
                  {"role": "assistant", "content": "Hello! How can I help?"},
                  {"role": "user", "content": "Tell me a short joke."}],
}

# name -> (conversation, with tools, add_generation_prompt, kwargs)
CASES = {
    "basic": ("basic", False, True, {}),
    "basic_no_generation_prompt": ("basic", False, False, {}),
    "tools": ("basic", True, True, {}),
    "tool_round_trip": ("tool_round_trip", True, True, {}),
    "tool_round_trip_null_content": ("tool_round_trip_null_content", True, True, {}),
    "tool_round_trip_single": ("tool_round_trip_single", True, True, {}),
    "tool_round_trip_string_args": ("tool_round_trip_string_args", True, True, {}),
    "reasoning": ("reasoning", False, True, {}),
    "reasoning_last": ("reasoning_last", False, False, {}),
    "no_system": ("no_system", False, True, {}),
}
# Extra cases with template variables, only for templates that read the variable.
VAR_CASES = {
    "enable_thinking": [("basic_thinking_off", "basic", False, True, {"enable_thinking": False}),
                        ("basic_thinking_on", "basic", False, True, {"enable_thinking": True})],
    "reasoning_effort": [("basic_reasoning_effort_high", "basic", False, True, {"reasoning_effort": "high"})],
    "date_string": [("basic_date_string", "basic", False, True, {"date_string": "30 Nov 2026"})],
}

# Variables of interest for the README table.
SPECIAL_VARS = ["bos_token", "eos_token", "pad_token", "unk_token", "date_string", "enable_thinking",
                "reasoning_effort"]


def sha256_bytes(b):
    return hashlib.sha256(b).hexdigest()


def extract(sdist):
    with open(sdist, "rb") as f:
        sdist_sha = sha256_bytes(f.read())
    os.makedirs(OUT, exist_ok=True)
    rows = []
    with tarfile.open(sdist, "r:gz") as tar:
        for m in sorted(tar.getmembers(), key=lambda m: m.name):
            if m.isfile() and m.name.startswith(INNER) and m.name.endswith(".jinja") \
                    and "/" not in m.name[len(INNER):]:
                data = tar.extractfile(m).read()
                name = m.name[len(INNER):]
                with open(os.path.join(OUT, name), "wb") as out:
                    out.write(data)
                rows.append((name, len(data), sha256_bytes(data)))
    with open(os.path.join(OUT, "SOURCES.md"), "w", encoding="utf-8") as f:
        f.write("# Sources of the llama.cpp chat-template corpus\n\n")
        f.write(f"Every `*.jinja` file here is a byte-for-byte copy of `{INNER}<name>` inside the\n")
        f.write(f"PyPI sdist `{os.path.basename(sdist)}` (llama-cpp-python 0.3.36, which vendors\n")
        f.write("llama.cpp), extracted by `python3 tests/gen_template_corpus.py --extract SDIST`.\n\n")
        f.write(f"- sdist: `{os.path.basename(sdist)}`\n")
        f.write(f"- sdist sha256: `{sdist_sha}`\n")
        f.write(f"- path inside: `{INNER}`\n")
        f.write(f"- files: {len(rows)} (the directory's README.md, which lists the `get_chat_template.py`\n"
                "  commands llama.cpp used to fetch some of them from the Hub, is not copied)\n\n")
        f.write("| file | bytes | sha256 |\n|---|---|---|\n")
        for name, size, sha in rows:
            f.write(f"| `{name}` | {size} | `{sha}` |\n")
    print(f"extracted {len(rows)} templates from {sdist} (sha256 {sdist_sha})", file=sys.stderr)


def check_sources():
    """The stored templates are the files SOURCES.md lists, unchanged."""
    listed = {}
    with open(os.path.join(OUT, "SOURCES.md"), encoding="utf-8") as f:
        for line in f:
            if line.startswith("| `") and line.rstrip().endswith("` |"):
                cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
                listed[cells[0]] = cells[2]
    present = sorted(n for n in os.listdir(OUT) if n.endswith(".jinja"))
    if sorted(listed) != present:
        sys.exit(f"SOURCES.md lists {len(listed)} templates, {len(present)} present")
    for n in present:
        with open(os.path.join(OUT, n), "rb") as f:
            if sha256_bytes(f.read()) != listed[n]:
                sys.exit(f"{n}: sha256 differs from SOURCES.md")
    return present


def wire(messages):
    """The engine's ChatMessage form: role, content, the other keys as JSON text (order kept)."""
    out = []
    for m in messages:
        rest = {k: v for k, v in m.items() if k not in ("role", "content")}
        out.append({"role": m["role"], "content": m.get("content"),
                    "extra": json.dumps(rest, ensure_ascii=False) if rest else None})
    return out


def make_tokenizer(template, specials):
    tok = PreTrainedTokenizerFast(tokenizer_file=TOKENIZER_JSON, **specials)
    tok.chat_template = template
    got = tok.special_tokens_map
    assert got == specials, (got, specials)
    return tok


def render(tok, messages, tools, agp, kwargs):
    try:
        text = tok.apply_chat_template(messages, tools=tools, add_generation_prompt=agp, tokenize=False,
                                       **kwargs)
        return {"text": text}
    except Exception as e:  # noqa: BLE001 - every failure is a fixture
        return {"error": {"type": type(e).__name__, "module": type(e).__module__, "message": str(e)}}


def features(template):
    """Jinja features a template uses, from its parsed AST (transformers' environment)."""
    env = ctu._compile_jinja_template(template).environment
    ast = env.parse(template)
    n = jinja2.nodes

    def is_generation(block):  # {% generation %}: a CallBlock of transformers' AssistantTracker
        node = block.call.node if isinstance(block.call, n.Call) else None
        return isinstance(node, n.ExtensionAttribute) and node.name == "_generation_support"

    macros = {x.name for x in ast.find_all(n.Macro)}
    blocks = list(ast.find_all(n.CallBlock))
    statements = {name for name, cls in [
        ("break", n.Break), ("continue", n.Continue), ("macro", n.Macro), ("set_block", n.AssignBlock),
        ("filter_block", n.FilterBlock), ("namespace_assign", n.NSRef), ("slice", n.Slice),
        ("conditional_expression", n.CondExpr), ("modulo", n.Mod), ("tilde_concat", n.Concat),
        ("dict_literal", n.Dict), ("with", n.With), ("include", n.Include), ("import", n.Import),
    ] if any(True for _ in ast.find_all(cls))}
    if any(x.else_ for x in ast.find_all(n.For)):
        statements.add("for_else")
    if any(x.test is not None for x in ast.find_all(n.For)):
        statements.add("for_if_filter")
    if any(x.recursive for x in ast.find_all(n.For)):
        statements.add("recursive_loop")
    if any(is_generation(b) for b in blocks):
        statements.add("generation_block")
    if any(not is_generation(b) for b in blocks):
        statements.add("call_block")
    return {
        "filters": sorted({x.name for x in ast.find_all(n.Filter)}),
        "tests": sorted({x.name for x in ast.find_all(n.Test)}),
        # obj.method(...) calls: Python str/dict/list methods the sandbox allows
        "methods": sorted({x.node.attr for x in ast.find_all(n.Call) if isinstance(x.node, n.Getattr)}),
        # calls of global functions (not the template's own macros)
        "functions": sorted({x.node.name for x in ast.find_all(n.Call)
                             if isinstance(x.node, n.Name) and x.node.name not in macros}),
        "macros": len(macros),
        "loop_attributes": sorted({x.attr for x in ast.find_all(n.Getattr)
                                   if isinstance(x.node, n.Name) and x.node.name == "loop"}),
        "statements": sorted(statements),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--extract", metavar="SDIST", help=f"path to {SDIST_NAME}")
    args = ap.parse_args()
    if args.extract:
        extract(args.extract)
    names = check_sources()
    missing = [n for n in names if n not in SPECIALS]
    if missing:
        sys.exit(f"no SPECIALS entry for {missing}")

    ctu.datetime = _FixedDatetime  # strftime_now() -> FIXED_NOW

    template_messages = {}
    for cname, msgs in CONVERSATIONS.items():
        seen = _alias_reasoning_fields(_normalize_chat_messages(json.loads(json.dumps(msgs))))
        template_messages[cname] = seen

    out = {
        "generator": "tests/gen_template_corpus.py",
        "versions": {"transformers": transformers.__version__, "jinja2": jinja2.__version__,
                     "tokenizers": tokenizers.__version__, "python": sys.version.split()[0]},
        "strftime_now": {"now": FIXED_NOW.isoformat(),
                         "note": "datetime.now() as strftime_now sees it (naive local time)"},
        "conversations": CONVERSATIONS,
        # What the template sees after apply_chat_template's normalisation: None-valued keys
        # dropped, then `thinking` (first) and `reasoning_content` set from reasoning_content.
        "template_messages": template_messages,
        "wire": {c: wire(m) for c, m in CONVERSATIONS.items()},
        "template_wire": {c: wire(m) for c, m in template_messages.items()},
        "tools": TOOLS,
        "tools_json": json.dumps(TOOLS, ensure_ascii=False),
        "templates": {},
    }
    summary = []
    all_cases = {}
    for name in names:
        with open(os.path.join(OUT, name), encoding="utf-8") as f:
            template = f.read()
        specials, note = SPECIALS[name]
        tok = make_tokenizer(template, dict(specials))
        variables = sorted(_get_template_variables(template))
        cases = []
        plan = [(cn, *spec) for cn, spec in CASES.items()]
        for var, extra in VAR_CASES.items():
            if var in variables:
                plan += extra
        for case_name, conv, with_tools, agp, kwargs in plan:
            case = {"name": case_name, "conversation": conv, "tools": with_tools,
                    "add_generation_prompt": agp, "kwargs": kwargs,
                    "kwargs_json": json.dumps(kwargs, ensure_ascii=False)}
            case.update(render(tok, json.loads(json.dumps(CONVERSATIONS[conv])),
                               TOOLS if with_tools else None, agp, kwargs))
            cases.append(case)
        out["templates"][name] = {
            "special_tokens": specials,
            # Ready for ChatTemplate::new(template, Some(tokenizer_config)): key order as passed.
            "tokenizer_config": json.dumps(specials, ensure_ascii=False),
            "special_tokens_note": note,
            "reads": [v for v in SPECIAL_VARS if v in variables],
            "uses_strftime_now": "strftime_now" in template,
            "features": features(template),
            # The renderings, one file per template (relative to llamacpp/).
            "cases_file": f"{CASES_DIR}/{name[:-len('.jinja')]}.json",
            "case_count": len(cases),
            "error_cases": [c["name"] for c in cases if "error" in c],
        }
        all_cases[name] = cases
        errs = [c["name"] for c in cases if "error" in c]
        summary.append(f"{name}: {len(cases)} cases, {len(errs)} errors {errs if errs else ''}")
    cases_dir = os.path.join(OUT, CASES_DIR)
    os.makedirs(cases_dir, exist_ok=True)
    for stale in os.listdir(cases_dir):
        os.remove(os.path.join(cases_dir, stale))
    size = 0
    for name, cases in all_cases.items():
        path = os.path.join(OUT, out["templates"][name]["cases_file"])
        with open(path, "w", encoding="utf-8") as f:
            json.dump({"template": name, "cases": cases}, f, ensure_ascii=False, indent=1)
            f.write("\n")
        size += os.path.getsize(path)
    with open(os.path.join(OUT, "expected.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print("\n".join(summary), file=sys.stderr)
    total = sum(len(c) for c in all_cases.values())
    nerr = sum("error" in c for cs in all_cases.values() for c in cs)
    print(f"{len(names)} templates, {total} cases, {nerr} errors; expected.json "
          f"{os.path.getsize(os.path.join(OUT, 'expected.json'))} bytes, {CASES_DIR}/ {size} bytes",
          file=sys.stderr)


if __name__ == "__main__":
    main()
