"""tests/fixtures/gguf/models/tiny-mixtral_spm-q8_0.gguf: a Mixtral GGUF as the files people download
have it, a SentencePiece ("llama") vocabulary with byte fallback and `▁` spaces, made end to end the
way those files are made, for the test that runs it from text to text
(tests/integration/gguf.rs, `a_mixtral_gguf_with_a_sentencepiece_vocabulary_runs_from_text_to_text`).

The checkpoint is tiny-mixtral's shape (tests/fixtures/tiny-mixtral/config.json) with the vocabulary
of tests/fixtures/tokenizer_families/llama_spm (a tokenizer.model trained with Llama's settings,
1000 pieces, and transformers' LlamaTokenizer of it), random seeded weights, and Mixtral-Instruct's
chat template (tests/fixtures/chat_templates/mixtral). llama.cpp's convert_hf_to_gguf.py (pinned
sdist, unpatched: a tokenizer.model takes its `_set_vocab_sentencepiece` path) writes the file at
--outtype q8_0. Its references, in models_spm.json:

- ids: transformers' tokenizer of the checkpoint on a text (`tokenizer(text)`, BOS added as the
  release's tokenizer adds it; the text without specials too), the chat template through
  `apply_chat_template` (ids and text);
- logits: transformers on the weights `gguf.quants.dequantize` gives for the file, mapped back to
  HF names (gen_gguf_fixtures_models.gguf_to_hf), at every position of the text's ids, and the
  greedy continuation;
- text: transformers' decoding of the prompt and of the prompt with its continuation, so the
  continuation's text is what a streaming front end shows after the prompt.

Run: python3 tests/gen_gguf_fixtures_spm.py [--sdist SDIST]
Needs torch, transformers 5.24, sentencepiece, protobuf and gguf (the generator of models.json's
environment). CPU, one thread, about a minute; a re-run reproduces the files.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gen_gguf_fixtures_models as gm  # noqa: E402
import gen_gguf_fixtures_quant as gq  # noqa: E402

import torch  # noqa: E402
import transformers  # noqa: E402

ROOT = gm.ROOT
OUT = ROOT / "tests" / "fixtures" / "gguf"
SPM = gm.FIX / "tokenizer_families" / "llama_spm"
NAME = "tiny-mixtral_spm"
# Words the 1000-piece vocabulary holds, digits it splits, and characters it has no piece for
# (byte fallback: "é", "—", "日本").
TEXT = "The old lighthouse keeper counted 1234 ships — café nights, 日本 mornings."
CHAT = [{"role": "user", "content": "Where is the lighthouse?"},
        {"role": "assistant", "content": "On the  rocks, 2 miles north."},
        {"role": "user", "content": "And the café?"}]


def checkpoint(seed: int, tmp: Path) -> tuple[Path, dict]:
    """tiny-mixtral's shape with the SentencePiece vocabulary, seeded weights, Mixtral's template."""
    from transformers import MixtralConfig, MixtralForCausalLM
    cfg = json.loads((gm.FIX / "tiny-mixtral" / "config.json").read_text())
    cfg.update(vocab_size=1000, bos_token_id=1, eos_token_id=2, pad_token_id=None)
    model = gm.seeded_model(MixtralConfig, MixtralForCausalLM, cfg, seed)
    hf = tmp / f"seed-{seed}" / NAME            # the converter derives general.name from the directory
    model.save_pretrained(str(hf))
    for f in ("tokenizer.model", "tokenizer.json"):
        shutil.copy(SPM / f, hf / f)
    tc = json.loads((SPM / "tokenizer_config.json").read_text())
    tc["chat_template"] = json.loads((gm.FIX / "chat_templates" / "mixtral" / "tokenizer_config.json")
                                     .read_text())["chat_template"]
    (hf / "tokenizer_config.json").write_text(json.dumps(tc, indent=2))
    cfg = json.loads((hf / "config.json").read_text())
    cfg["dtype"] = "float32"
    return hf, cfg


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sdist", type=Path, default=Path.home() / ".cache/waste-peers/llama_cpp_python-0.3.36.tar.gz")
    args = ap.parse_args()
    torch.set_num_threads(1)
    out = OUT / "models" / f"{NAME}-q8_0.gguf"
    rel = lambda p: str(p.relative_to(OUT))  # noqa: E731
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        llama_dir = gm.extract_sdist(args.sdist, tmp)
        info = gm.sdist_info(args.sdist, llama_dir)
        tried = []
        for seed in range(4000, 4050):
            hf, cfg = checkpoint(seed, tmp)
            tok = transformers.AutoTokenizer.from_pretrained(str(hf))
            prompt = tok(TEXT)["input_ids"]
            ok, last, cmd = gm.convert(llama_dir, hf, "q8_0", out, [])
            assert ok, last
            r, G = gm.read_gguf(out)
            assert r.fields["tokenizer.ggml.model"].contents() == "llama"
            weights, rows = gm.gguf_to_hf("llama", G, cfg)
            res = gm.hf_logits(cfg, weights, prompt, tmp, f"spm-{seed}")
            # Clear margins (no near-ties in routing or top-1), and a continuation that does
            # not end at </s> before it has shown some text.
            good = (res["min_router_gap"] > gm.GAP_MIN and res["min_top1_gap"] > gm.GAP_MIN
                    and tok.eos_token_id not in res["greedy"])
            tried.append(dict(seed=seed, min_router_gap=res["min_router_gap"], min_top1_gap=res["min_top1_gap"],
                              eos_in_greedy=tok.eos_token_id in res["greedy"]))
            if good:
                break
        else:
            raise SystemExit(f"no seed gave clear margins: {tried}")
        lp = out.with_suffix(".logits.f32")
        lp.write_bytes(res["logits"].astype("<f4").tobytes())
        chat_ids = tok.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=True, return_dict=False)
        chat_text = tok.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False)
        prompt_text = tok.decode(prompt, skip_special_tokens=True)
        full_text = tok.decode(prompt + res["greedy"], skip_special_tokens=True)
        assert full_text.startswith(prompt_text)
        entry = gm.describe_model(out, rel)
        entry.update(
            source=f"random (seeded) MixtralForCausalLM of tests/fixtures/tiny-mixtral's shape, vocab_size 1000, "
                   f"the tokenizer of tests/fixtures/tokenizer_families/llama_spm, Mixtral-Instruct's chat "
                   f"template; see hf_config",
            arch="llama", outtype="q8_0", hf_config=cfg, seed=seed, seeds_tried=tried,
            command=" ".join(cmd).replace(str(hf), f"<out>/seed-{seed}/{NAME}"), converter=info,
            gguf_to_hf=rows, prompt_ids=prompt, greedy_ids=res["greedy"],
            min_router_gap=res["min_router_gap"], min_top1_gap=res["min_top1_gap"],
            reference_logits=rel(lp), logits_shape=[len(prompt), cfg["vocab_size"]],
            reference_logits_note="transformers MixtralForCausalLM (hf_config; f32, eager, 1 thread) on the "
                                  "weights gguf.quants.dequantize gives for this file, mapped back to HF names "
                                  "(gguf_to_hf); row-major [T, 1000]",
            text=dict(text=TEXT, ids=prompt, content_ids=tok(TEXT, add_special_tokens=False)["input_ids"],
                      prompt_text=prompt_text, continuation_text=full_text[len(prompt_text):],
                      decode_markup=tok.decode(prompt + res["greedy"], skip_special_tokens=False),
                      note="ids: tokenizer(text) (BOS added); content_ids: add_special_tokens=False; "
                           "prompt_text / continuation_text: decode(ids) and what decode(ids + greedy_ids) "
                           "adds to it, skip_special_tokens=True; decode_markup: decode(ids + greedy_ids) "
                           "with the special tokens kept"),
            chat=dict(messages=CHAT, add_generation_prompt=True, ids=chat_ids, text=chat_text))
    doc = dict(generator="tests/gen_gguf_fixtures_spm.py", converter=info,
               versions=dict(torch=torch.__version__, transformers=transformers.__version__,
                             gguf=gm.md.version("gguf"), sentencepiece=gm.md.version("sentencepiece"),
                             numpy=np.__version__, python=sys.version.split()[0]),
               models=[entry])
    (OUT / "models_spm.json").write_text(gq.dump_json(doc))
    print(f"{rel(out)}: seed {seed}, {len(prompt)} prompt ids, greedy {res['greedy']}")


if __name__ == "__main__":
    main()
