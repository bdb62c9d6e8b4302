#!/usr/bin/env python3
"""Train the small Qwen3-MoE that ships in models/bible-moe/ on the King James Bible.

Purpose
-------
No real weights can be downloaded on the build machines, so the README's main command
needs a model that is trained here and small enough to commit.  This script builds one:

  * corpus: the King James Bible from Debian's `bible-kjv-text` package (public domain),
    printed chapter by chapter with the package's own reader (`bible -l0 ...`);
    verse numbers are dropped, each chapter becomes "Book N" followed by one verse per
    line, and an `<|endoftext|>` token separates books;
  * held-out slice: every 50th chapter (chapter index 49, 99, ... in canonical order,
    23 chapters, about 2% of the text) never reaches the tokenizer trainer or the model;
    it is written to models/bible-moe/heldout.txt (and its first two chapters to
    heldout-sample.txt, which the Rust tests evaluate);
  * tokenizer: byte-level BPE, vocabulary 4096, trained by the `tokenizers` library on the
    training chapters; specials `<|endoftext|>` (0), `<|im_start|>` (1), `<|im_end|>` (2);
    a ChatML chat template in tokenizer_config.json;
  * model: transformers `Qwen3MoeForCausalLM`, float32, every layer a sparse MoE block
    (see MODEL_CONFIG below: hidden 256, 4 layers, 8 experts top-2 of width 128,
    4 query heads / 2 KV heads of dim 64, tied embeddings, context 256; about 5.0M
    parameters, 20 MB of f32 safetensors);
  * training: AdamW on random 256-token windows of the training stream, with the
    router load-balancing loss; the learning rate follows a warm-up and a cosine decay
    over the wall-clock budget (--minutes), because the machine is shared and the number
    of steps that fit is not known in advance.  The checkpoint with the best held-out
    loss (measured every --eval-every seconds on a fixed subset) is kept.

The loss curve (train loss and held-out perplexity against steps and minutes) is written
to models/bible-moe/training_log.json; docs/MODEL_CARD.md quotes it.  The reference
values the Rust tests compare against (greedy continuation, held-out perplexity) are
recorded by the companion script tests/ref_bible_moe.py, which reloads the saved
checkpoint with from_pretrained.

How to run (by hand, never by CI; CPU only)
-------------------------------------------
    apt-get install -y bible-kjv-text              # provides /usr/bin/bible + the text
    nice -n 19 python3 tests/train_bible_moe.py --minutes 40
    python3 tests/ref_bible_moe.py                 # reference.json for the tests
    ./target/release/waste convert models/bible-moe examples/bible-moe.waste

It uses one thread (torch.set_num_threads(1)) so that it can share a small machine; the
run is seeded, but the number of steps depends on the wall clock, so two runs on
different machines give different (equally good) weights.  --smoke runs two minutes to
check that the loss falls and writes nothing under models/.

Versions used for the committed checkpoint: torch 2.15.0+cu132 (CPU), transformers
5.24.0, tokenizers 0.23.3, Python 3.11 (also written into training_log.json).
"""

import argparse
import json
import math
import os
import platform
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import tokenizers
import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import GenerationConfig, Qwen3MoeConfig, Qwen3MoeForCausalLM

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "models" / "bible-moe"

VOCAB_SIZE = 4096
SEQ_LEN = 256
HELDOUT_EVERY = 50          # chapter i is held out when i % 50 == 49
SAMPLE_CHAPTERS = 2         # heldout-sample.txt: the first two held-out chapters
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
TOKENIZER_CONFIG = {
    "tokenizer_class": "PreTrainedTokenizerFast",
    "bos_token": None,
    "eos_token": "<|endoftext|>",
    "pad_token": "<|endoftext|>",
    "unk_token": None,
    "add_bos_token": False,
    "add_eos_token": False,
    "clean_up_tokenization_spaces": False,
    "model_max_length": SEQ_LEN,
    "chat_template": CHAT_TEMPLATE,
}
MODEL_CONFIG = dict(
    vocab_size=VOCAB_SIZE,
    hidden_size=256,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    hidden_act="silu",
    intermediate_size=512,          # unused: no dense layers (mlp_only_layers is empty)
    moe_intermediate_size=128,
    num_experts=8,
    num_experts_per_tok=2,
    norm_topk_prob=True,
    decoder_sparse_step=1,
    mlp_only_layers=[],
    output_router_logits=False,     # switched on for the training forward only
    router_aux_loss_coef=0.01,
    max_position_embeddings=SEQ_LEN,
    rms_norm_eps=1e-6,
    attention_bias=False,
    tie_word_embeddings=True,
    initializer_range=0.02,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    pad_token_id=0,
    bos_token_id=None,
    eos_token_id=0,                 # <|endoftext|> ends a book
)


# --------------------------------------------------------------------------- corpus
def read_chapters(bible_cmd: str):
    """[(book, chapter_number, [verse, ...])] in canonical order, from the package reader."""
    raw = subprocess.run([bible_cmd, "-l0", "Gen1:1-Rev22:21"], check=True,
                         capture_output=True, text=True, cwd="/tmp").stdout
    chapters = []
    for line in raw.split("\n"):
        if not line.strip():
            continue
        if line.startswith("  "):                     # "  12 verse text"
            num, text = line.strip().split(" ", 1)
            assert num.isdigit(), line
            chapters[-1][2].append(text.strip())
        else:                                         # "1 Samuel 3"
            book, num = line.rsplit(" ", 1)
            assert num.isdigit(), line
            chapters.append((book, int(num), []))
    assert len(chapters) == 1189, len(chapters)
    assert sum(len(c[2]) for c in chapters) == 31102
    return chapters


def chapter_text(ch) -> str:
    book, num, verses = ch
    return f"{book} {num}\n" + "\n".join(verses) + "\n"


def split_corpus(chapters):
    train, held = [], []
    for i, ch in enumerate(chapters):
        (held if i % HELDOUT_EVERY == HELDOUT_EVERY - 1 else train).append(ch)
    return train, held


def join_chapters(chs) -> str:
    return "\n".join(chapter_text(c) for c in chs)


# --------------------------------------------------------------------------- tokenizer
def train_tokenizer(train_chapters) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE, special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator((chapter_text(c) for c in train_chapters), trainer=trainer)
    assert tok.get_vocab_size() == VOCAB_SIZE, tok.get_vocab_size()
    for i, s in enumerate(SPECIAL_TOKENS):
        assert tok.token_to_id(s) == i
    return tok


def training_stream(tok: Tokenizer, train_chapters) -> torch.Tensor:
    """All training chapters as one id stream; <|endoftext|> after every book."""
    ids = []
    for i, ch in enumerate(train_chapters):
        ids += tok.encode(chapter_text(ch) + "\n").ids
        if i + 1 == len(train_chapters) or train_chapters[i + 1][0] != ch[0]:
            ids.append(0)
    return torch.tensor(ids, dtype=torch.long)


def window_batches(ids: torch.Tensor, window: int):
    """The evaluation windows shared with the engine: window k is ids[k*(W-1) : k*(W-1)+W],
    so consecutive windows overlap by one token and every id after the first is predicted
    exactly once, from the ids before it in its window."""
    out, start = [], 0
    while start + 1 < len(ids):
        out.append(ids[start:start + window])
        start += window - 1
    return out


@torch.no_grad()
def heldout_nll(model, windows):
    total, count = 0.0, 0
    for w in windows:
        logits = model(input_ids=w[None, :]).logits[0, :-1].float()
        nll = torch.nn.functional.cross_entropy(logits, w[1:], reduction="sum")
        total += nll.item()
        count += len(w) - 1
    return total / count


# --------------------------------------------------------------------------- main
def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=40.0, help="wall-clock training budget")
    ap.add_argument("--smoke", action="store_true", help="2-minute run, writes nothing")
    ap.add_argument("--batch", type=int, default=16, help="windows per step")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=60, help="warm-up steps")
    ap.add_argument("--eval-every", type=float, default=180.0, help="seconds between evals")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--bible", default="bible", help="the bible-kjv reader")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    if args.smoke:
        args.minutes = 2.0
        args.eval_every = 55.0
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    t_start = time.time()

    chapters = read_chapters(args.bible)
    train_ch, held_ch = split_corpus(chapters)
    tok = train_tokenizer(train_ch)
    stream = training_stream(tok, train_ch)
    held_text = join_chapters(held_ch)
    held_ids = torch.tensor(tok.encode(held_text).ids, dtype=torch.long)
    held_windows = window_batches(held_ids, SEQ_LEN)
    # A fixed subset for the periodic checkpoint choice (the full slice is scored by
    # tests/ref_bible_moe.py); every 3rd window keeps the eval under ~10 s.
    eval_windows = held_windows[::3]
    print(f"corpus: {len(train_ch)} train chapters, {len(stream)} tokens; "
          f"{len(held_ch)} held-out chapters, {len(held_ids)} tokens, "
          f"{len(held_windows)} windows ({len(eval_windows)} in the periodic eval); "
          f"prep {time.time() - t_start:.1f}s", flush=True)

    cfg = Qwen3MoeConfig(**MODEL_CONFIG)
    cfg._attn_implementation = "sdpa"
    model = Qwen3MoeForCausalLM(cfg).to(torch.float32)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {n_params / 1e6:.2f}M parameters", flush=True)

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    budget = args.minutes * 60.0
    t0 = time.time()
    log = {"steps": [], "evals": []}
    best = (float("inf"), None)
    next_eval = args.eval_every
    step = 0
    while True:
        elapsed = time.time() - t0
        if elapsed >= budget:
            break
        frac = elapsed / budget
        warm = min(1.0, (step + 1) / args.warmup)
        lr = args.lr * warm * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * frac)))
        for g in opt.param_groups:
            g["lr"] = lr
        starts = torch.randint(0, len(stream) - SEQ_LEN - 1, (args.batch,))
        batch = torch.stack([stream[s:s + SEQ_LEN] for s in starts.tolist()])
        model.train()
        out = model(input_ids=batch, labels=batch, output_router_logits=True)
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        # out.loss includes the aux term; log the language-model part separately.
        lm = out.loss.item() - cfg.router_aux_loss_coef * out.aux_loss.item()
        log["steps"].append({"step": step, "min": round(elapsed / 60, 3),
                             "loss": round(lm, 4), "lr": lr})
        if step % 20 == 0:
            print(f"step {step} {elapsed / 60:.1f}min loss {lm:.3f} aux {out.aux_loss.item():.3f} "
                  f"lr {lr:.2e} {elapsed / step:.2f}s/step", flush=True)
        if time.time() - t0 >= next_eval or time.time() - t0 >= budget:
            model.eval()
            nll = heldout_nll(model, eval_windows)
            log["evals"].append({"step": step, "min": round((time.time() - t0) / 60, 3),
                                 "heldout_subset_nll": round(nll, 4),
                                 "heldout_subset_ppl": round(math.exp(nll), 3)})
            print(f"  eval step {step}: held-out subset nll {nll:.4f} ppl {math.exp(nll):.2f}",
                  flush=True)
            if nll < best[0]:
                best = (nll, {k: v.detach().clone() for k, v in model.state_dict().items()})
            next_eval = time.time() - t0 + args.eval_every
    train_minutes = (time.time() - t0) / 60
    model.eval()
    nll = heldout_nll(model, eval_windows)
    log["evals"].append({"step": step, "min": round(train_minutes, 3),
                         "heldout_subset_nll": round(nll, 4),
                         "heldout_subset_ppl": round(math.exp(nll), 3)})
    if nll < best[0]:
        best = (nll, None)
    elif best[1] is not None:
        model.load_state_dict(best[1])
    print(f"done: {step} steps in {train_minutes:.1f} min; kept held-out subset nll "
          f"{best[0]:.4f} (ppl {math.exp(best[0]):.2f})", flush=True)

    ids = torch.tensor([tok.encode("And God said").ids])
    gen = model.generate(ids, max_new_tokens=40, do_sample=False, pad_token_id=0)
    sample = tok.decode(gen[0].tolist())
    print("greedy:", repr(sample), flush=True)
    if args.smoke:
        return

    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    for f in ["model.safetensors", "config.json", "generation_config.json"]:
        if (out / f).exists():
            (out / f).unlink()
    model.config.output_router_logits = False
    model.generation_config = GenerationConfig(
        do_sample=True, temperature=0.8, top_p=0.95, max_new_tokens=128,
        pad_token_id=0, eos_token_id=0, bos_token_id=None)
    model.save_pretrained(out, safe_serialization=True)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(TOKENIZER_CONFIG, indent=2) + "\n")
    (out / "heldout.txt").write_text(held_text)
    (out / "heldout-sample.txt").write_text(join_chapters(held_ch[:SAMPLE_CHAPTERS]))
    log.update({
        "command": " ".join([Path(sys.argv[0]).name] + sys.argv[1:]),
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "parameters": n_params,
        "train_tokens": len(stream),
        "heldout_tokens": len(held_ids),
        "heldout_chapters": [f"{b} {n}" for b, n, _ in held_ch],
        "steps_done": step,
        "tokens_seen": step * args.batch * SEQ_LEN,
        "train_minutes": round(train_minutes, 2),
        "kept_heldout_subset_nll": round(best[0], 4),
        "greedy_sample": sample,
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "transformers": transformers.__version__,
                     "tokenizers": tokenizers.__version__},
    })
    (out / "training_log.json").write_text(json.dumps(log, indent=1) + "\n")
    print(f"wrote {out}", flush=True)


if __name__ == "__main__":
    main()
