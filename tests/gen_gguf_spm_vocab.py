#!/usr/bin/env python3
"""A SentencePiece ("llama") vocabulary as a GGUF file holds it, beside transformers' tokenizer of
the same model and its ids, for the test that WASTE rebuilds Mixtral- and Llama-style GGUF
vocabularies (tests/integration/gguf.rs).

    python3 tests/gen_gguf_spm_vocab.py LLAMA_CPP_DIR

LLAMA_CPP_DIR is the llama.cpp tree of the pinned llama-cpp-python 0.3.36 sdist (bench/peers
extracts it to ~/.cache/waste-peers/llama.cpp-0.3.36). Needs sentencepiece, protobuf,
tokenizers 0.23.3 and transformers 5.24 (no torch). CPU, offline, a few seconds; training is
single-threaded, so a re-run reproduces the files.

Writes tests/fixtures/tokenizer_families/llama_spm/:

- tokenizer.model: a SentencePiece BPE model trained on ../corpus.txt with Llama's trainer
  settings (BPE, byte fallback, split digits, identity normalisation, extra whitespace kept, a
  dummy prefix, <unk> <s> </s> at ids 0-2), 1000 pieces.
- tokenizer.json, tokenizer_config.json: transformers' LlamaTokenizer made from it (the
  conversion the Hub's Llama and Mixtral tokenizer.json files come from; transformers 5 writes
  a Metaspace pre-tokenizer where the Hub's older files have the equivalent Prepend + Replace
  normaliser).
- vocab.gguf: a GGUF file without tensors holding the tokenizer keys llama.cpp's converter
  writes for that tokenizer.model (`_set_vocab_sentencepiece`: `tokenizer.ggml.model` llama,
  tokens / scores / token_type from gguf-py's SentencePieceVocab, the special ids and
  add_bos/add_eos flags from gguf-py's SpecialVocab).
- cases.json: the shared texts of ../qwen2/cases.json with transformers' ids
  (`encode(text, add_special_tokens=False)`, specials parsed: `markup`; and not: `content`) and
  `decode_markup` (transformers' decoding of the markup ids, specials kept), and sentencepiece's
  own ids for each text (`spm`: 58 of 64 agree; transformers' merges differ from
  sentencepiece's on runs of spaces, and transformers is the reference here).
"""

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent / "fixtures/tokenizer_families"
OUT = ROOT / "llama_spm"


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.path.insert(0, str(Path(sys.argv[1]) / "gguf-py"))
    import gguf  # the vendored copy
    import sentencepiece as spm
    import tokenizers
    import transformers

    OUT.mkdir(parents=True, exist_ok=True)
    spm.SentencePieceTrainer.train(
        input=str(ROOT / "corpus.txt"),
        model_prefix=str(OUT / "tokenizer"),
        model_type="bpe",
        vocab_size=1000,
        byte_fallback=True,
        split_digits=True,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        add_dummy_prefix=True,
        allow_whitespace_only_pieces=True,
        character_coverage=0.9995,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
        num_threads=1,
        minloglevel=2,
        hard_vocab_limit=False,
    )
    (OUT / "tokenizer.vocab").unlink()

    # transformers converts tokenizer.model when it loads a LlamaTokenizer (Metaspace with
    # prepend_scheme "always", BPE merges from generate_merges, byte fallback).
    (OUT / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "LlamaTokenizer", "legacy": True, "add_bos_token": True}), encoding="utf-8"
    )
    hf = transformers.AutoTokenizer.from_pretrained(str(OUT))
    hf.save_pretrained(str(OUT))
    for extra in ["special_tokens_map.json", "added_tokens.json"]:
        (OUT / extra).unlink(missing_ok=True)

    # What convert_hf_to_gguf.py's `_set_vocab_sentencepiece` writes for this tokenizer.model,
    # through the same gguf-py classes, in a file with no tensors.
    vocab = gguf.SentencePieceVocab(OUT)
    tokens, scores, types = [], [], []
    for text, score, ty in vocab.all_tokens():
        tokens.append(text)
        scores.append(score)
        types.append(ty)
    writer = gguf.GGUFWriter(OUT / "vocab.gguf", "llama")
    writer.add_tokenizer_model(vocab.tokenizer_model)
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    gguf.SpecialVocab(OUT, n_vocab=len(tokens)).add_to_gguf(writer)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    writer.close()

    texts = json.loads((ROOT / "qwen2/cases.json").read_text(encoding="utf-8"))["texts"]
    texts += ["<s> twice <s>", "a</s>b", "  leading spaces", "tab\there", "\u00e9t\u00e9 \u4e2d\u6587 \U0001f600"]
    tk = tokenizers.Tokenizer.from_file(str(OUT / "tokenizer.json"))
    sp = spm.SentencePieceProcessor(model_file=str(OUT / "tokenizer.model"))
    markup = [tk.encode(t, add_special_tokens=False).ids for t in texts]
    tk.encode_special_tokens = True
    content = [tk.encode(t, add_special_tokens=False).ids for t in texts]
    spm_ids = [sp.encode(t) for t in texts]
    decoded = [tk.decode(ids, skip_special_tokens=False) for ids in markup]
    agree = sum(a == b for a, b in zip(content, spm_ids))
    print(f"transformers and sentencepiece agree on {agree} of {len(texts)} texts (content mode)")
    (OUT / "cases.json").write_text(
        json.dumps(
            {
                "generator": "tests/gen_gguf_spm_vocab.py",
                "tokenizers_version": tokenizers.__version__,
                "transformers_version": transformers.__version__,
                "sentencepiece_version": spm.__version__,
                "texts": texts,
                "markup": markup,
                "content": content,
                "decode_markup": decoded,
                "spm": spm_ids,
            },
            ensure_ascii=False,
            indent=1,
        )
        + "\n",
        encoding="utf-8",
    )


if __name__ == "__main__":
    main()
