#!/usr/bin/env python3
"""Record transformers' reference outputs for models/bible-moe (reference.json).

Companion of tests/train_bible_moe.py.  It reloads the saved checkpoint with
`from_pretrained` (float32, eager attention, CPU, one thread) and the tokenizer with the
`tokenizers` library, and records what the Rust tests in tests/integration/bible.rs
compare the engine against:

  * greedy: the prompt "And God said", its ids, and the 32 greedily generated ids
    (no end-of-sequence stop), with the smallest top-1/top-2 logit gap over those steps
    (a correct f32 engine cannot flip a choice whose gap is far above f32 rounding);
  * perplexity of models/bible-moe/heldout-sample.txt and heldout.txt, scored in windows
    of the context (256 tokens; window k = ids[k*255 : k*255+256], each on a fresh
    state, so every id after the first is predicted once): token count, the ids of the
    sample (so a tokenizer mismatch is reported as such), the summed and mean negative
    log-likelihood and the perplexity; for the sample also every token's NLL.

How to run (by hand, never by CI)
---------------------------------
    python3 tests/ref_bible_moe.py [--dir models/bible-moe]

Deterministic: the same checkpoint and versions give the same file.
"""

import argparse
import json
import math
import os
import platform
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import tokenizers
import torch
import transformers
from tokenizers import Tokenizer
from transformers import GenerationConfig, Qwen3MoeForCausalLM

torch.set_num_threads(1)
torch.use_deterministic_algorithms(True)
transformers.logging.set_verbosity_error()

REPO = Path(__file__).resolve().parent.parent
PROMPT = "And God said"
GREEDY_TOKENS = 32


def windows(ids, window):
    """Must match window_batches in train_bible_moe.py and Model::perplexity in the engine."""
    out, start = [], 0
    while start + 1 < len(ids):
        out.append(ids[start:start + window])
        start += window - 1
    return out


@torch.no_grad()
def score(model, ids, window):
    nlls = []
    for w in windows(ids, window):
        t = torch.tensor([w])
        logits = model(input_ids=t).logits[0, :-1].double()
        nll = torch.nn.functional.cross_entropy(logits, t[0, 1:], reduction="none")
        nlls += nll.tolist()
    assert len(nlls) == len(ids) - 1
    total = math.fsum(nlls)
    return {
        "tokens": len(ids),
        "scored": len(nlls),
        "windows": len(windows(ids, window)),
        "window": window,
        "nll_sum": total,
        "mean_nll": total / len(nlls),
        "perplexity": math.exp(total / len(nlls)),
    }, nlls


@torch.no_grad()
def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", type=Path, default=REPO / "models" / "bible-moe")
    args = ap.parse_args()
    d = args.dir
    model = Qwen3MoeForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager").eval()
    tok = Tokenizer.from_file(str(d / "tokenizer.json"))
    window = model.config.max_position_embeddings

    prompt_ids = tok.encode(PROMPT).ids
    gc = GenerationConfig(max_new_tokens=GREEDY_TOKENS, min_new_tokens=GREEDY_TOKENS, do_sample=False,
                          num_beams=1, eos_token_id=None, pad_token_id=0, bos_token_id=None,
                          temperature=None, top_p=None, top_k=None)
    gen = model.generate(torch.tensor([prompt_ids]), generation_config=gc,
                         return_dict_in_generate=True, output_logits=True)
    greedy = gen.sequences[0, len(prompt_ids):].tolist()
    steps = torch.stack([l[0].float() for l in gen.logits])
    top2 = torch.topk(steps, 2, dim=-1).values
    min_gap = (top2[:, 0] - top2[:, 1]).min().item()
    # The greedy ids must also be what a full forward over prompt + greedy argmaxes.
    full = model(input_ids=gen.sequences).logits[0]
    assert full[len(prompt_ids) - 1:-1].argmax(-1).tolist() == greedy

    sample_text = (d / "heldout-sample.txt").read_text()
    sample_ids = tok.encode(sample_text).ids
    sample, sample_nlls = score(model, sample_ids, window)
    full_text = (d / "heldout.txt").read_text()
    heldout, _ = score(model, tok.encode(full_text).ids, window)

    ref = {
        "generator": "tests/ref_bible_moe.py",
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "transformers": transformers.__version__, "tokenizers": tokenizers.__version__},
        "prompt_text": PROMPT,
        "prompt_ids": prompt_ids,
        "greedy_ids": greedy,
        "greedy_text": tok.decode(greedy),
        "greedy_min_top1_gap": min_gap,
        "heldout_sample": dict(sample, file="heldout-sample.txt", ids=sample_ids,
                               token_nll=[round(x, 6) for x in sample_nlls]),
        "heldout": dict(heldout, file="heldout.txt"),
    }
    (d / "reference.json").write_text(json.dumps(ref, indent=1) + "\n")
    print(f"greedy: {PROMPT!r} -> {ref['greedy_text']!r} (min top-1 gap {min_gap:.4f})")
    print(f"heldout-sample: {sample['scored']} scored tokens, ppl {sample['perplexity']:.4f}")
    print(f"heldout: {heldout['scored']} scored tokens, ppl {heldout['perplexity']:.4f}")


if __name__ == "__main__":
    main()
