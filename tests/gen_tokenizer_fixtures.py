#!/usr/bin/env python3
"""Oracle fixtures for the guest tokenizer (guest/src/tokenizer/).

How to run (by hand, not by CI; CPU only, offline, a few seconds):

    cd /work/main && python3 tests/gen_tokenizer_fixtures.py

Needs the Python `tokenizers` package (generated with 0.23.3). Deterministic:
training is single-threaded (RAYON_NUM_THREADS=1) on a fixed corpus, and the
big text comes from a fixed-seed xorshift64 generator that the Rust test
re-implements, so re-running reproduces every file byte for byte.

Writes into tests/fixtures/tokenizer/:
  corpus.txt                  multilingual training corpus (written by this script)
  gpt2.tokenizer.json         byte-level BPE, ByteLevel(use_regex=True) pre-tokenizer,
                              merges in the legacy "a b" string form
  qwen.tokenizer.json         NFC + Sequence[Split(Qwen regex, Isolated), ByteLevel(use_regex=False)],
                              merges as [a, b] pairs
  sp.tokenizer.json           SentencePiece-style BPE (Llama/Mixtral): Prepend+Replace
                              normalizer, byte_fallback <0xNN> tokens, unk, fuse_unk,
                              decoder Sequence[Replace, ByteFallback, Fuse, Strip]
  cases.json                  texts, variants (a base file plus top-level / model patches)
                              and for each variant the expected ids in markup mode
                              (encode(text, add_special_tokens=False)) and content mode
                              (same with encode_special_tokens=True), the expected decode
                              strings (skip_special_tokens=False), decodes of pseudo-random
                              id lists, and count + FNV-1a hash of the ids of a ~100 kB text.
"""

import json
import os
import sys

os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

from tokenizers import (  # noqa: E402
    AddedToken,
    Regex,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    trainers,
)

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "fixtures", "tokenizer")

QWEN_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
DEEPSEEK_SPLITS = [
    r"\p{N}{1,3}",
    r"[一-龥぀-ゟ゠-ヿ]+",
    r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
]
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

CORPUS = """\
The quick brown fox jumps over the lazy dog. I'LL be there at 10:30, don't worry; we've got time.
She's reading a book about machine learning, tokenizers and mixture-of-experts language models.
In 2024 the model processed 1,234,567 tokens per second on 8 GPUs (that's 3.14x faster).
Perché l'università è così lontana? Però ci andrò comunque, perché è importante studiare.
La pizza napoletana è buonissima, e il caffè italiano è il migliore del mondo.
def tokenize(text: str) -> list[int]:
\treturn [ord(c) for c in text if c.isprintable()]
fn main() {
    let xs: Vec<u32> = (0..10).map(|i| i * 2).collect();
    println!("{:?}", xs);
}
我们今天去北京大学学习人工智能和自然语言处理。中文文本需要分词。
今日はいい天気ですね。カタカナとひらがなと漢字を使います。東京に行きます。
안녕하세요, 세계! 한국어 텍스트입니다. 오늘 날씨가 좋네요.
مرحبا بالعالم، هذا نص عربي للاختبار. اللغة العربية جميلة.
שלום עולם, זהו טקסט בעברית לבדיקה. עברית נכתבת מימין לשמאל.
Привет, мир! Это русский текст для проверки токенизатора. Москва — столица России.
Γειά σου Κόσμε! Αυτό είναι ελληνικό κείμενο. Η Αθήνα είναι όμορφη.
Emoji time: 😀 😂 🍕 🎉 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 ❤️ and more emoji 🚀🚀🚀.
Café, naïve, résumé, coöperate, Zürich, São Paulo, Kraków, Ærøskøbing.
    indented line with four spaces
\t\ttwo tabs then text
multiple   spaces   between   words     here.
<html><body><div class="x">Hello &amp; welcome!</div></body></html>
SELECT id, name FROM users WHERE age >= 18 ORDER BY name;
https://example.com/path/to/page?query=value&other=123#section
"""

TEXTS = [
    "",
    "Hello world",
    "Hello, world! How are you today?",
    "Perché l'università è così lontana? Però ci andrò comunque.",
    'fn main() {\n    let x = vec![1, 2, 3];\n    println!("{:?}", x);\n}\n',
    "def f(x):\n\treturn x  *  2\n\n\n",
    "a  b   c    d",
    "   leading spaces",
    "trailing spaces   ",
    "\t\t\ttabs\t",
    "\n\n\nnewlines\n\n",
    "mixed \t \n \r\n end",
    " ",
    "          ",
    "\u00a0nbsp\u3000ideographic space\u2003em",
    "1234567890 3.14159 1,000,000 2024-01-15 007",
    "٣٤٥ ١٢٣ and １２３ fullwidth ½ ²",
    "I'LL do it, don't you? We've, they're, she's, it'd, I'm, you'll",
    "I'LL DON'T WE'VE 'S 'tis",
    "我们今天去北京大学学习人工智能。",
    "今日はいい天気ですね。カタカナとひらがな",
    "안녕하세요, 세계! 한국어 텍스트입니다.",
    "مرحبا بالعالم، هذا نص عربي.",
    "שלום עולם, זהו טקסט בעברית.",
    "Привет, мир! Это русский текст.",
    "Γειά σου Κόσμε! Αυτό είναι ελληνικό κείμενο.",
    "I love 🍕 and 🎉!",
    "👨‍👩‍👧‍👦 family, 🏳️‍🌈 flag, 👍🏽 skin, 1️⃣ keycap",
    "café naïve résumé",
    "cafe\u0301 nai\u0308ve re\u0301sume\u0301",
    "\u00c5 vs A\u030a vs \u212b",
    "\u1100\u1161\u11a8 jamo vs \uac01",
    "e\u0301\u0301\u0327 stacked \u0301 leading mark",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n",
    "<|im_end|><|im_start|>system",
    "text<|endoftext|>more",
    "<|im_end| <|im_end|>> <<|im_start|>>",
    "<think>\nreasoning here\n</think>\n\nanswer",
    "hello   <mask>   world<mask>x",
    "xyzzy axyzzy xyzzyb xyzzy. (xyzzy)",
    "ciao mondo, ciao  mondo, Ciao mondo",
    "\x00\x01\x7f bell\x07 \ufeffBOM \U0010fffd private \ufffd",
    "a" * 300,
    "supercalifragilisticexpialidocious" * 5,
    "https://example.com/path?query=1&x=y#frag",
    "naïve café 北京 😀 123 ▁ metaspace ▁▁ char",
    "<s>[INST] hello [/INST]</s><unk>",
]

# Fragments for the ~100 kB text; the Rust test rebuilds it from the same
# list, seed and xorshift64 generator.
BIG_FRAGMENTS = [
    "the", " quick", " brown", " fox", " jumps", " over", " lazy", " dog", ".", ",", "!", "?",
    " ", "  ", "   ", "\n", "\n\n", "\t", " I'LL", " don't", " we've", " 42", " 3.14", " 1000000",
    " perché", " università", " così", " 北京", "大学", "学习", " 今日は", "カタカナ", " 안녕하세요",
    " мир", " Привет", " Κόσμε", " مرحبا", " שלום", " 😀", "👨‍👩‍👧‍👦", " 🍕", " café", " cafe\u0301",
    " fn", " main()", " {", " }", " let", " x", " =", " vec![1, 2]", ";", "<|im_end|>",
    "<|im_start|>", " <think>", " xyzzy", " ciao mondo", "<mask>", " ▁", "\u00a0", "\r\n",
]
BIG_SEED = 0x5EED_1234_ABCD_0001
BIG_MIN_BYTES = 100_000
MASK64 = (1 << 64) - 1


def xorshift64(state):
    state ^= (state << 13) & MASK64
    state ^= state >> 7
    state ^= (state << 17) & MASK64
    return state & MASK64


def big_text():
    state = BIG_SEED
    parts = []
    size = 0
    while size < BIG_MIN_BYTES:
        state = xorshift64(state)
        frag = BIG_FRAGMENTS[state % len(BIG_FRAGMENTS)]
        parts.append(frag)
        size += len(frag.encode("utf-8"))
    return "".join(parts)


def fnv1a(ids):
    h = 0xCBF29CE484222325
    for i in ids:
        for b in int(i).to_bytes(4, "little"):
            h ^= b
            h = (h * 0x100000001B3) & MASK64
    return h


def corpus_lines():
    lines = [l for l in CORPUS.splitlines() if l]
    return lines * 20


def added_extra():
    # Non-special added tokens (one raw, one normalized, one single_word) and
    # a special token with lstrip, as real tokenizers have.
    return [
        AddedToken("<think>", normalized=False, special=False),
        AddedToken("</think>", normalized=False, special=False),
        AddedToken("ciao mondo", special=False),
        AddedToken("xyzzy", single_word=True, special=False),
    ], [AddedToken("<mask>", lstrip=True, special=True)]


def train_byte_level(pre_tokenizer, normalizer):
    tok = Tokenizer(models.BPE())
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=1500,
        min_frequency=2,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus_lines(), trainer)
    plain, special = added_extra()
    tok.add_tokens(plain)
    tok.add_special_tokens(special)
    return json.loads(tok.to_str())


def train_sp():
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([
        decoders.Replace("▁", " "),
        decoders.ByteFallback(),
        decoders.Fuse(),
        decoders.Strip(" ", 1, 0),
    ])
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    trainer = trainers.BpeTrainer(
        vocab_size=1200,
        min_frequency=2,
        special_tokens=["<unk>", "<s>", "</s>"] + byte_tokens,
        show_progress=False,
    )
    # Whole lines are single words here (no pre-tokenizer); cap the length so
    # training stays small. Lines with CJK, Hangul, Arabic, Hebrew or emoji are
    # left out so those scripts hit the byte fallback (limit_alphabet would do
    # it too, but breaks frequency ties nondeterministically).
    lines = [l[:60] for l in corpus_lines() if all(ord(c) < 0x590 for c in l)]
    tok.train_from_iterator(lines, trainer)
    tok.add_special_tokens(["<|im_start|>", "<|im_end|>"])
    tok.add_tokens([AddedToken("<think>", normalized=False, special=False)])
    j = json.loads(tok.to_str())
    # As in Llama's file, <0xNN> are plain vocabulary entries, not added tokens.
    j["added_tokens"] = [t for t in j["added_tokens"] if t["content"] not in byte_tokens]
    return j


def byte_level_json(add_prefix_space=False, use_regex=True):
    return {"type": "ByteLevel", "add_prefix_space": add_prefix_space, "trim_offsets": False,
            "use_regex": use_regex}


def split_json(pattern, behavior="Isolated", invert=False):
    return {"type": "Split", "pattern": {"Regex": pattern}, "behavior": behavior, "invert": invert}


def seq_pre(items):
    return {"type": "Sequence", "pretokenizers": items}


def variants():
    v = {
        "gpt2": ("gpt2.tokenizer.json", {}, {}),
        "gpt2_prefix_space": ("gpt2.tokenizer.json", {"pre_tokenizer": byte_level_json(True, True)}, {}),
        "gpt2_digits": ("gpt2.tokenizer.json", {"pre_tokenizer": seq_pre([
            {"type": "Digits", "individual_digits": True}, byte_level_json(False, True)])}, {}),
        "gpt2_digits_contiguous": ("gpt2.tokenizer.json", {"pre_tokenizer": seq_pre([
            {"type": "Digits", "individual_digits": False}, byte_level_json(False, True)])}, {}),
        "qwen": ("qwen.tokenizer.json", {}, {}),
        "qwen_ignore_merges": ("qwen.tokenizer.json", {}, {"ignore_merges": True}),
        "qwen_no_normalizer": ("qwen.tokenizer.json", {"normalizer": None}, {}),
        "qwen_nfd_seq": ("qwen.tokenizer.json", {"normalizer": {"type": "Sequence", "normalizers": [
            {"type": "NFD"}, {"type": "NFC"}]}}, {}),
        "deepseek": ("qwen.tokenizer.json", {"pre_tokenizer": seq_pre(
            [split_json(p) for p in DEEPSEEK_SPLITS] + [byte_level_json(False, False)])}, {}),
        "sp": ("sp.tokenizer.json", {}, {}),
        "sp_metaspace_first": ("sp.tokenizer.json", {
            "normalizer": None,
            "pre_tokenizer": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first",
                              "split": False},
            "decoder": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first",
                        "split": False}}, {}),
        "sp_metaspace_always_split": ("sp.tokenizer.json", {
            "normalizer": None,
            "pre_tokenizer": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always",
                              "split": True},
            "decoder": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always",
                        "split": True}}, {}),
    }
    for behavior in ["Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"]:
        for invert in [False, True]:
            name = f"split_{behavior}{'_invert' if invert else ''}"
            v[name] = ("gpt2.tokenizer.json", {"pre_tokenizer": seq_pre([
                split_json(r"\s+|[.,!?]", behavior, invert), byte_level_json(False, False)])}, {})
    return v


def apply_patch(base, patch, model_patch):
    j = json.loads(json.dumps(base))
    j.update(patch)
    j["model"].update(model_patch)
    return j


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


def main():
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "corpus.txt"), "w", encoding="utf-8") as f:
        f.write(CORPUS)

    gpt2 = train_byte_level(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True), None)
    gpt2["model"]["merges"] = [" ".join(m) for m in gpt2["model"]["merges"]]
    qwen = train_byte_level(
        pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]),
        normalizers.NFC(),
    )
    sp = train_sp()
    bases = {"gpt2.tokenizer.json": gpt2, "qwen.tokenizer.json": qwen, "sp.tokenizer.json": sp}
    for name, j in bases.items():
        with open(os.path.join(OUT, name), "w", encoding="utf-8") as f:
            json.dump(j, f, ensure_ascii=False, indent=None, separators=(",", ":"))
            f.write("\n")

    big = big_text()
    result = {
        "generator": "tests/gen_tokenizer_fixtures.py",
        "tokenizers_version": __import__("tokenizers").__version__,
        "texts": TEXTS,
        "big": {"seed": BIG_SEED, "min_bytes": BIG_MIN_BYTES, "fragments": BIG_FRAGMENTS,
                "bytes": len(big.encode("utf-8"))},
        "variants": {},
    }
    for name, (base, patch, model_patch) in variants().items():
        j = apply_patch(bases[base], patch, model_patch)
        tok = Tokenizer.from_str(json.dumps(j))
        tok.encode_special_tokens = False
        markup = [tok.encode(t, add_special_tokens=False).ids for t in TEXTS]
        big_markup = tok.encode(big, add_special_tokens=False).ids
        tok.encode_special_tokens = True
        content = [tok.encode(t, add_special_tokens=False).ids for t in TEXTS]
        big_content = tok.encode(big, add_special_tokens=False).ids
        vocab_size = tok.get_vocab_size(with_added_tokens=True)
        rand_ids = pseudo_random_ids(vocab_size, 0xDEC0DE ^ len(name), 8, 12)
        entry = {
            "base": base,
            "patch": patch,
            "model_patch": model_patch,
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
        }
        result["variants"][name] = entry
    with open(os.path.join(OUT, "cases.json"), "w", encoding="utf-8") as f:
        json.dump(result, f, ensure_ascii=False, indent=None, separators=(",", ":"))
        f.write("\n")
    total = sum(os.path.getsize(os.path.join(OUT, n)) for n in os.listdir(OUT))
    print(f"wrote {len(result['variants'])} variants, {len(TEXTS)} texts, {total} bytes in {OUT}",
          file=sys.stderr)


if __name__ == "__main__":
    main()
