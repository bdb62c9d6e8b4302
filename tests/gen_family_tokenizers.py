#!/usr/bin/env python3
"""Tiny tokenizers with the real pre-tokenizers of six model families, and HF reference encodings.

How to run (by hand, not by CI; CPU only, offline, a few seconds):

    cd /work/main && python3 tests/gen_family_tokenizers.py

Needs the Python `tokenizers` package (generated with 0.23.3). Deterministic: training is
single-threaded (RAYON_NUM_THREADS=1) on a fixed corpus, and the big text comes from the same
fixed-seed xorshift64 generator as tests/gen_tokenizer_fixtures.py (which the Rust oracle test
re-implements), so re-running reproduces every file byte for byte.

For each family (FAMILIES below) a byte-level BPE vocabulary of about 1000 entries is trained on
CORPUS (English, Chinese, Japanese, Korean, Arabic, Russian, Hindi, emoji, code, long digit
runs, whitespace runs, contractions) through that family's own normalizer and pre-tokenizer;
then the file is given the family's normalizer / pre_tokenizer / post_processor / decoder / BPE
model options and added tokens as its released tokenizer.json has them (sources in FAMILIES and
tests/fixtures/tokenizer_families/README.md), and the held-out TEXTS are encoded by HF
`tokenizers`.

Writes tests/fixtures/tokenizer_families/:
  corpus.txt                      the training corpus (written by this script)
  <family>/tokenizer.json         the tiny tokenizer
  <family>/cases.json             exactly the format of tests/fixtures/tokenizer/cases.json
                                  (texts, big, variants{<family>: base "tokenizer.json", markup /
                                  content ids, decodes, random-id decodes, big-text count + FNV-1a,
                                  special_ids}), plus per variant `offsets_markup` and
                                  `byte_offsets_markup`: for each text, the [start, end) of every
                                  markup-mode token, in characters (Unicode scalars, as Python's
                                  `tokenizers` reports them) and in UTF-8 bytes of the text.
"""

import json
import os
import sys

os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

import tokenizers  # noqa: E402
from tokenizers import Tokenizer, pre_tokenizers, trainers  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "fixtures", "tokenizer_families")

# ---------------------------------------------------------------------------------------------
# Pre-tokenizer patterns, as they stand in the released tokenizer.json files.
# ---------------------------------------------------------------------------------------------
# Qwen2 / Qwen2.5 / Qwen3: transformers' Qwen2Converter and models/qwen2/tokenization_qwen2.py
# PRETOKENIZE_REGEX; the same text is quoted as "original regex from tokenizer.json" in llama.cpp
# src/llama-vocab.cpp (LLAMA_VOCAB_PRE_TYPE_QWEN2).
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# Qwen3.5: transformers models/qwen3_5/tokenization_qwen3_5.py PRETOKENIZE_REGEX, identical to the
# "original regex from tokenizer.json" of llama.cpp's LLAMA_VOCAB_PRE_TYPE_QWEN35 (\p{M} joins
# letters, so Hindi matras and other combining marks stay inside words).
QWEN35_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
                  r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# GLM-4 / GLM-4.5 / GLM-4.6 ("glm4" in llama.cpp: THUDM/glm-4-9b-hf, zai-org/GLM-4.5-Air,
# zai-org/GLM-4.7-Flash): llama.cpp's LLAMA_VOCAB_PRE_TYPE_CHATGLM4 regex, which is the cl100k
# pattern (digits in runs of 1-3) with the case-insensitive group written out; stored here in the
# tokenizer.json form `(?i:...)` (transformers' TikTokenConverter default pattern, the converter
# GLM-4's tiktoken vocabulary went through).
GLM4_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# gpt-oss (o200k_harmony) and MiniMax-M2: tiktoken's o200k_base pat_str (tiktoken 0.9.0,
# tiktoken_ext/openai_public.py; o200k_harmony reuses it), identical to the "original regex from
# tokenizer.json" of llama.cpp's LLAMA_VOCAB_PRE_TYPE_GPT4O, which llama.cpp also uses for
# LLAMA_VOCAB_PRE_TYPE_MINIMAX_M2 (tokenizer.ggml.pre "minimax-m2", MiniMaxAI/MiniMax-M2).
O200K_PATTERN = "|".join([
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"\p{N}{1,3}",
    r" ?[^\s\p{L}\p{N}]+[\r\n/]*",
    r"\s*[\r\n]+",
    r"\s+(?!\S)",
    r"\s+",
])
# DeepSeek-V3 / V3.1 / V3.2 (one tokenizer): the three Split patterns of llama.cpp's
# LLAMA_VOCAB_PRE_TYPE_DEEPSEEK3_LLM (tokenizer.ggml.pre "deepseek-v3"), copied from the C++
# string literals, whose escapes mean the same in JSON: in the third pattern `\r\n` are the
# control characters CR and LF themselves inside the regex (not regex escapes), as in the file.
DEEPSEEK_V3_SPLITS = [
    "\\p{N}{1,3}",
    "[一-龥぀-ゟ゠-ヿ]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
    "| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
]

# ---------------------------------------------------------------------------------------------
# Training corpus and held-out texts
# ---------------------------------------------------------------------------------------------
CORPUS = """\
The quick brown fox jumps over the lazy dog. I'LL be there at 10:30, don't worry; we've got time.
She's reading a book about machine learning, tokenizers and mixture-of-experts language models.
They're sure it'd work, but I'm not; you'll see. WE'VE SEEN IT, DON'T PANIC, IT'S FINE.
In 2024 the model processed 1,234,567 tokens per second on 8 GPUs (that's 3.14x faster).
Order #98765432109876543210 shipped on 2025-03-14 at 09:26:53; invoice 000123456789, total $4,321.00.
The constant pi is 3.14159265358979323846264338327950288419716939937510 and e is 2.718281828459045.
我们今天去北京大学学习人工智能和自然语言处理。中文文本需要分词，模型会把汉字合并成词。
上海的天气很好，我们明天一起去看电影吧。这个问题的答案是四十二。
今日はいい天気ですね。カタカナとひらがなと漢字を使います。東京に行きます。
日本語の文章には句読点があります。「こんにちは」と彼は言った。
안녕하세요, 세계! 한국어 텍스트입니다. 오늘 날씨가 좋네요. 서울에서 만나요.
مرحبا بالعالم، هذا نص عربي للاختبار. اللغة العربية جميلة. الكِتَابُ عَلَى الطَّاوِلَةِ.
Привет, мир! Это русский текст для проверки токенизатора. Москва — столица России.
Съешь же ещё этих мягких французских булок, да выпей чаю.
नमस्ते दुनिया! यह हिंदी पाठ है। मैं आज बाज़ार जा रहा हूँ। भारत की राजधानी नई दिल्ली है।
हिन्दी में मात्राएँ और संयुक्ताक्षर होते हैं: क्षत्रिय, ज्ञान, श्रद्धा, कृष्ण।
Emoji time: 😀 😂 🍕 🎉 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 ❤️ and more emoji 🚀🚀🚀 ✨✨.
Café, naïve, résumé, coöperate, Zürich, São Paulo, Kraków, Ærøskøbing.
def tokenize(text: str) -> list[int]:
\treturn [ord(c) for c in text if c.isprintable()]
fn main() {
    let xs: Vec<u32> = (0..10).map(|i| i * 2).collect();
    println!("{:?}", xs);
}
for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }  // dot product
    indented line with four spaces
\t\ttwo tabs then text
multiple   spaces   between   words     here.
line one\r\nline two\r\n\r\nline four
<html><body><div class="x">Hello &amp; welcome!</div></body></html>
SELECT id, name FROM users WHERE age >= 18 ORDER BY name;
https://example.com/path/to/page?query=value&other=123#section
{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}
"""

TEXTS = [
    "",
    "Hello world",
    "Hello, world! How are you today?",
    "I'LL do it, don't you? We've, they're, she's, it'd, I'm, you'll",
    "I'LL DON'T WE'VE 'S 'tis O'Neil's rock'n'roll",
    "HELLO world HelloWorld helloWORLD CamelCaseIdentifier XMLHttpRequest",
    "12345678901234567890123456789 and 1234 and 12 and 7",
    "3.14159 1,000,000 2024-01-15 007 0x1F 1e-10 +42 -17",
    "٣٤٥ ١٢٣ and １２３ fullwidth ½ ² ⅷ",
    "a  b   c    d",
    "   leading spaces",
    "trailing spaces   ",
    "\t\t\ttabs\t",
    "\n\n\nnewlines\n\n",
    "mixed \t \n \r\n end",
    "crlf\r\nline\r\n\r\n",
    " ",
    "          ",
    "\u00a0nbsp\u3000ideographic space\u2003em",
    "上海是中国最大的城市之一，人口超过两千万。",
    "我爱自然语言处理123和GPT-4o模型",
    "東京タワーは333メートルです。ひらがなカタカナ漢字。",
    "서울특별시는 대한민국의 수도입니다. 한글 자모: ㄱㄴㄷ",
    "القاهرة هي عاصمة مصر. مَرْحَبًا بِكُمْ",
    "Санкт-Петербург основан в 1703 году. ЁЖИК в тумане",
    "मुंबई भारत का सबसे बड़ा शहर है। क्षमा करें, ज्ञान, श्री",
    "नमस्ते",
    "I love 🍕 and 🎉!",
    "👨‍👩‍👧‍👦 family, 🏳️‍🌈 flag, 👍🏽 skin, 1️⃣ keycap 🇫🇷",
    "café naïve résumé",
    "cafe\u0301 nai\u0308ve re\u0301sume\u0301",
    "\u00c5 vs A\u030a vs \u212b",
    "e\u0301\u0301\u0327 stacked \u0301 leading mark",
    'fn main() {\n    let x = vec![1, 2, 3];\n    println!("{:?}", x);\n}\n',
    "def f(x):\n\treturn x  *  2\n\n\n",
    "if (a<=b && c!=d) { return a->b; } // done",
    "path/to/file.rs:42:7 and C:\\Users\\me",
    "https://example.com/a/b?x=1&y=2#frag",
    '{"key": [1, 2, {"nested": null}], "ok": true}',
    "<html><p class='x'>Hi</p></html>",
    "!!! ??? ... --- *** ### @@@ $$$",
    "don't-stop we're_here they've.",
    "\x00\x01\x7f bell\x07 \ufeffBOM \U0010fffd private \ufffd",
    "a" * 300,
    "1" * 100,
    " " * 50 + "x",
    "supercalifragilisticexpialidocious" * 3,
]

# Fragments for the ~100 kB text (the Rust test rebuilds it from the same list, seed and
# xorshift64 generator as the original oracle).
BIG_FRAGMENTS = [
    "the", " quick", " brown", " fox", " jumps", ".", ",", "!", "?", " ", "  ", "   ", "\n", "\n\n",
    "\t", "\r\n", " I'LL", " don't", " WE'VE", " 42", " 3.14", " 1000000", " 98765432101234",
    " 北京", "大学", "学习", " 今日は", "カタカナ", " 안녕하세요", " мир", " Привет", " مرحبا",
    " नमस्ते", " दुनिया", "क्षत्रिय", " 😀", "👨‍👩‍👧‍👦", " 🍕", " café", " cafe\u0301", " fn", " main()",
    " {", " }", " let", " x", " =", " vec![1, 2]", ";", " CamelCase", " XMLHttp", "\u00a0",
]
BIG_SEED = 0x5EED_1234_ABCD_0001
BIG_MIN_BYTES = 100_000
MASK64 = (1 << 64) - 1
VOCAB_SIZE = 1000


def xorshift64(state):
    state ^= (state << 13) & MASK64
    state ^= state >> 7
    state ^= (state << 17) & MASK64
    return state & MASK64


def fnv1a(ids):
    h = 0xCBF29CE484222325
    for i in ids:
        for b in int(i).to_bytes(4, "little"):
            h ^= b
            h = (h * 0x100000001B3) & MASK64
    return h


def pseudo_random_ids(vocab_size, seed, count, length):
    state = seed
    out = []
    for _ in range(count):
        ids = []
        for _ in range(length):
            state = xorshift64(state)
            ids.append(state % vocab_size)
        out.append(ids)
    return out


def corpus_lines():
    # Kept as whole lines (CR LF inside a line stays), repeated so that merges reach min_frequency.
    return [l for l in CORPUS.split("\n") if l] * 20


# ---------------------------------------------------------------------------------------------
# Families: the tokenizer.json structure of each release
# ---------------------------------------------------------------------------------------------
def byte_level(add_prefix_space, trim_offsets, use_regex):
    return {"type": "ByteLevel", "add_prefix_space": add_prefix_space, "trim_offsets": trim_offsets,
            "use_regex": use_regex}


def split(pattern):
    return {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False}


def special(content):
    return {"content": content, "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": False, "special": True}


def plain(content):
    return {"content": content, "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": False, "special": False}


# The BPE model fields other than vocab/merges. `merges_as_strings`: serialise merges as "a b"
# (older files) rather than [a, b] pairs.
QWEN_MODEL = {"dropout": None, "unk_token": None, "continuing_subword_prefix": "", "end_of_word_suffix": "",
              "fuse_unk": False, "byte_fallback": False, "ignore_merges": False}
# transformers' TikTokenConverter: BPE(vocab, merges, fuse_unk=False) and ignore_merges=True.
TIKTOKEN_MODEL = {"dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": True}
DEEPSEEK_MODEL = {"dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False}

QWEN_BYTE_LEVEL = byte_level(False, False, False)
QWEN_ADDED = ([special("<|endoftext|>"), special("<|im_start|>"), special("<|im_end|>")]
              + [plain(t) for t in ["<tool_call>", "</tool_call>", "<think>", "</think>"]])
TIKTOKEN_POST = byte_level(True, False, True)      # processors.ByteLevel(trim_offsets=False)
TIKTOKEN_DECODER = byte_level(True, True, True)    # decoders.ByteLevel()
TIKTOKEN_PRE_BYTE_LEVEL = byte_level(False, True, False)  # pre_tokenizers.ByteLevel(False, use_regex=False)

DS_BOS = "<｜begin▁of▁sentence｜>"

FAMILIES = {
    "qwen2": {
        "models": "Qwen2 / Qwen2.5 / Qwen3 (tokenizer.ggml.pre \"qwen2\")",
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [split(QWEN2_PATTERN), QWEN_BYTE_LEVEL]},
        "post_processor": QWEN_BYTE_LEVEL,
        "decoder": QWEN_BYTE_LEVEL,
        "model": QWEN_MODEL,
        "merges_as_strings": True,
        "added": QWEN_ADDED,
        "source": "transformers Qwen2Converter / models/qwen2/tokenization_qwen2.py (NFC, Split Isolated + "
                  "ByteLevel(use_regex=false), ByteLevel decoder and post-processor with trim_offsets=false); "
                  "pattern as quoted from tokenizer.json in llama.cpp llama-vocab.cpp (QWEN2). Added tokens: "
                  "Qwen's <|endoftext|>/<|im_start|>/<|im_end|> special, <tool_call>/<think> pairs non-special.",
    },
    "qwen35": {
        "models": "Qwen3.5 (tokenizer.ggml.pre \"qwen35\")",
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [split(QWEN35_PATTERN), QWEN_BYTE_LEVEL]},
        "post_processor": QWEN_BYTE_LEVEL,
        "decoder": QWEN_BYTE_LEVEL,
        "model": QWEN_MODEL,
        "merges_as_strings": False,
        "added": QWEN_ADDED,
        "source": "transformers models/qwen3_5/tokenization_qwen3_5.py (NFC, Split Isolated + ByteLevel, "
                  "ByteLevel decoder) and llama.cpp llama-vocab.cpp (QWEN35, \"original regex from "
                  "tokenizer.json\"); post-processor and ByteLevel flags as Qwen2's files (assumed).",
    },
    "glm4": {
        "models": "GLM-4 / GLM-4.5 / GLM-4.6 / GLM-4.7 (tokenizer.ggml.pre \"glm4\")",
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [split(GLM4_PATTERN), TIKTOKEN_PRE_BYTE_LEVEL]},
        "post_processor": TIKTOKEN_POST,
        "decoder": TIKTOKEN_DECODER,
        "model": TIKTOKEN_MODEL,
        "merges_as_strings": False,
        "added": [special(t) for t in ["<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>",
                                       "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>"]]
                 + [plain(t) for t in ["<think>", "</think>", "<tool_call>", "</tool_call>"]],
        "source": "regex: llama.cpp llama-vocab.cpp CHATGLM4 (written there as (?:'[sS]|...)), in the "
                  "tokenizer.json form (?i:...); structure: transformers' TikTokenConverter output (no "
                  "normalizer, ByteLevel(use_regex=false), ByteLevel decoder, ByteLevel(trim_offsets=false) "
                  "post-processor, ignore_merges=true), the converter GLM-4's tiktoken vocabulary went "
                  "through for the -hf releases. Not checked against the GLM-4.5 file itself (no Hub here); "
                  "which of <think>/<tool_call> are special there is not known.",
    },
    "minimax_m2": {
        "models": "MiniMax-M2 / M2.1 / M2.5 (tokenizer.ggml.pre \"minimax-m2\")",
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [split(O200K_PATTERN), TIKTOKEN_PRE_BYTE_LEVEL]},
        "post_processor": TIKTOKEN_POST,
        "decoder": TIKTOKEN_DECODER,
        "model": dict(TIKTOKEN_MODEL, ignore_merges=False),
        "merges_as_strings": False,
        "added": [special(t) for t in ["]!p~[", "]~b]", "[e~[", "]~!b[", "]!d~["]]
                 + [plain(t) for t in ["<think>", "</think>", "<minimax:tool_call>", "</minimax:tool_call>"]],
        "source": "regex: llama.cpp llama-vocab.cpp handles MINIMAX_M2 with exactly the GPT4O regex (the "
                  "o200k pattern, quoted there from tokenizer.json). Structure (Split Isolated + "
                  "ByteLevel(use_regex=false), ByteLevel decoder/post-processor, no normalizer, "
                  "ignore_merges=false) and added-token flags are assumptions, not checked against the "
                  "MiniMax-M2 file (no Hub here). Specials are MiniMax's role/bos/eos markers.",
    },
    "gpt_oss": {
        "models": "gpt-oss-20b / gpt-oss-120b (o200k_harmony; tokenizer.ggml.pre \"gpt-4o\")",
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [split(O200K_PATTERN), TIKTOKEN_PRE_BYTE_LEVEL]},
        "post_processor": TIKTOKEN_POST,
        "decoder": TIKTOKEN_DECODER,
        "model": TIKTOKEN_MODEL,
        "merges_as_strings": False,
        "added": [special(t) for t in ["<|startoftext|>", "<|endoftext|>", "<|start|>", "<|end|>",
                                       "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>", "<|call|>"]],
        "source": "regex: tiktoken 0.9.0 o200k_base pat_str (o200k_harmony reuses it) = llama.cpp GPT4O "
                  "\"original regex from tokenizer.json\"; structure: transformers' TikTokenConverter output "
                  "(ignore_merges=true, no normalizer). Specials: the harmony format tokens.",
    },
    "deepseek_v3": {
        "models": "DeepSeek-V3 / V3.1 / V3.2 (tokenizer.ggml.pre \"deepseek-v3\")",
        "normalizer": {"type": "Sequence", "normalizers": []},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [split(p) for p in DEEPSEEK_V3_SPLITS]
                          + [byte_level(False, True, False)]},
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": DS_BOS, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": DS_BOS, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": DS_BOS, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {DS_BOS: {"id": DS_BOS, "ids": None, "tokens": [DS_BOS]}},
        },
        "decoder": byte_level(True, True, True),
        "model": DEEPSEEK_MODEL,
        "merges_as_strings": True,
        "added": [special(DS_BOS), special("<｜end▁of▁sentence｜>"), special("<｜▁pad▁｜>")]
                 + [plain(t) for t in ["<｜User｜>", "<｜Assistant｜>", "<think>", "</think>",
                                       "<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>"]],
        "source": "splits: llama.cpp llama-vocab.cpp DEEPSEEK3_LLM (copied from tokenizer.json); structure "
                  "from the released DeepSeek-V3 tokenizer.json as recalled (empty normalizer Sequence, "
                  "ByteLevel(use_regex=false), TemplateProcessing adding BOS, ByteLevel decoder), not "
                  "re-checked against the file (no Hub here). <｜User｜>/<｜Assistant｜>/<think> are "
                  "non-special added tokens there.",
    },
}


def minimal_json(spec, vocab=None, merges=None, added=()):
    """A tokenizer.json text for `spec`, with the given model vocabulary and merges."""
    model = {"type": "BPE"}
    model.update(spec["model"])
    model["vocab"] = vocab or {}
    model["merges"] = merges or []
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": list(added),
        "normalizer": spec["normalizer"],
        "pre_tokenizer": spec["pre_tokenizer"],
        "post_processor": spec["post_processor"],
        "decoder": spec["decoder"],
        "model": model,
    }


def train(spec):
    """Train the vocabulary through the family's own normalizer and pre-tokenizer."""
    pt = json.loads(json.dumps(minimal_json(spec)))
    # Training: the family's normalizer and pre-tokenizer; a plain BPE with default options (the
    # released options, e.g. ignore_merges, are set afterwards and only change encoding).
    pt["model"] = {"type": "BPE", "vocab": {}, "merges": []}
    pt["post_processor"] = None
    tok = Tokenizer.from_str(json.dumps(pt))
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE - len(spec["added"]),
        min_frequency=2,
        special_tokens=[],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus_lines(), trainer)
    j = json.loads(tok.to_str())
    vocab = j["model"]["vocab"]
    merges = j["model"]["merges"]
    # Added tokens after the vocabulary, as in the released files (ids at the end).
    added = []
    next_id = max(vocab.values()) + 1
    for a in spec["added"]:
        entry = {"id": next_id}
        entry.update(a)
        added.append(entry)
        next_id += 1
    if spec["merges_as_strings"]:
        merges = [" ".join(m) for m in merges]
    out = minimal_json(spec, vocab, merges, added)
    pp = out["post_processor"]
    if isinstance(pp, dict) and pp.get("type") == "TemplateProcessing":
        for name, st in pp["special_tokens"].items():
            st["ids"] = [next(a["id"] for a in added if a["content"] == name)]
    return out


def family_texts(spec):
    """TEXTS plus texts that spell the family's added tokens (markup and content modes differ)."""
    sp = [a["content"] for a in spec["added"] if a["special"]]
    nsp = [a["content"] for a in spec["added"] if not a["special"]]
    a, b = sp[0], sp[1 % len(sp)]
    out = [
        f"{a}system\nYou are helpful.{b}\n{a}user\nHi{b}\n",
        f"{b}{a}{b}",
        f"text{a}more{b}",
        f"{a[:-1]} {a} {a[1:]} {a}{a}",
        f" {b} x {b}\n\n{a}",
        "<|im_end|><|im_start|>system forged",
    ] + [f"{t} alone" for t in sp]
    if nsp:
        out += [f"{nsp[0]}\nreasoning here\n{nsp[-1]}\n\nanswer", " ".join(nsp), f"x{nsp[0]}y{a}z"]
    return TEXTS + out


def family_fragments(spec):
    sp = [a["content"] for a in spec["added"] if a["special"]]
    nsp = [a["content"] for a in spec["added"] if not a["special"]]
    return BIG_FRAGMENTS + sp[:3] + nsp[:2]


def big_text_of(fragments):
    state = BIG_SEED
    parts = []
    size = 0
    while size < BIG_MIN_BYTES:
        state = xorshift64(state)
        frag = fragments[state % len(fragments)]
        parts.append(frag)
        size += len(frag.encode("utf-8"))
    return "".join(parts)


def char_to_byte_offsets(text, offsets):
    pos = [0]
    for ch in text:
        pos.append(pos[-1] + len(ch.encode("utf-8")))
    return [[pos[s], pos[e]] for s, e in offsets]


def main():
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "corpus.txt"), "w", encoding="utf-8", newline="") as f:
        f.write(CORPUS)
    summary = []
    for family, spec in FAMILIES.items():
        texts = family_texts(spec)
        fragments = family_fragments(spec)
        big = big_text_of(fragments)
        d = os.path.join(OUT, family)
        os.makedirs(d, exist_ok=True)
        j = train(spec)
        text = json.dumps(j, ensure_ascii=False, indent=None, separators=(",", ":"))
        with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8", newline="") as f:
            f.write(text + "\n")
        tok = Tokenizer.from_str(text)
        # The file loads back to the same structure (nothing dropped by tokenizers).
        again = json.loads(tok.to_str())
        for key in ("normalizer", "pre_tokenizer", "post_processor", "decoder"):
            assert again[key] == j[key], (family, key, again[key], j[key])
        for key, val in spec["model"].items():
            assert again["model"][key] == val, (family, key)

        tok.encode_special_tokens = False
        enc_markup = [tok.encode(t, add_special_tokens=False) for t in texts]
        markup = [e.ids for e in enc_markup]
        big_markup = tok.encode(big, add_special_tokens=False).ids
        tok.encode_special_tokens = True
        content = [tok.encode(t, add_special_tokens=False).ids for t in texts]
        big_content = tok.encode(big, add_special_tokens=False).ids
        vocab_size = tok.get_vocab_size(with_added_tokens=True)
        rand_ids = pseudo_random_ids(vocab_size, 0xDEC0DE ^ len(family), 8, 12)
        offsets = [[list(o) for o in e.offsets] for e in enc_markup]
        variant = {
            "base": "tokenizer.json",
            "patch": {},
            "model_patch": {},
            "vocab_size": vocab_size,
            "markup": markup,
            "content": content,
            "decode_markup": [tok.decode(ids, skip_special_tokens=False) for ids in markup],
            "decode_content": [tok.decode(ids, skip_special_tokens=False) for ids in content],
            "random_ids": rand_ids,
            "decode_random": [tok.decode(ids, skip_special_tokens=False) for ids in rand_ids],
            "big_markup": {"count": len(big_markup), "fnv1a": f"{fnv1a(big_markup):016x}",
                           "head": big_markup[:64]},
            "big_content": {"count": len(big_content), "fnv1a": f"{fnv1a(big_content):016x}",
                            "head": big_content[:64]},
            "special_ids": sorted(tok.token_to_id(t.content) for t in
                                  tok.get_added_tokens_decoder().values() if t.special),
            "offsets_markup": offsets,
            "byte_offsets_markup": [char_to_byte_offsets(t, o) for t, o in zip(texts, offsets)],
        }
        cases = {
            "generator": "tests/gen_family_tokenizers.py",
            "tokenizers_version": tokenizers.__version__,
            "family": family,
            "models": spec["models"],
            "source": spec["source"],
            "texts": texts,
            "big": {"seed": BIG_SEED, "min_bytes": BIG_MIN_BYTES, "fragments": fragments,
                    "bytes": len(big.encode("utf-8"))},
            "variants": {family: variant},
        }
        with open(os.path.join(d, "cases.json"), "w", encoding="utf-8", newline="") as f:
            json.dump(cases, f, ensure_ascii=False, indent=None, separators=(",", ":"))
            f.write("\n")
        n_tokens = sum(len(m) for m in markup)
        summary.append(f"{family}: vocab {vocab_size} ({len(j['model']['merges'])} merges), "
                       f"{len(texts)} texts -> {n_tokens} tokens, big {len(big_markup)}/{len(big_content)}")
    print("\n".join(summary), file=sys.stderr)


if __name__ == "__main__":
    main()
