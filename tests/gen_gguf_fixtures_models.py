"""tests/fixtures/gguf/models/ and the convert survey, for tests/gen_gguf_fixtures.py.

  tiny-qwen3_moe-f32.gguf    convert_hf_to_gguf.py --outtype f32 of tests/fixtures/tiny-qwen3_moe
                             (exact: its logits are tiny-qwen3_moe/reference_logits.f32, checked
                             with torch.equal after mapping the GGUF back to HF names)
  tiny-qwen3_moe-q8_0.gguf   the same with --outtype q8_0 (+ .logits.f32 from the dequantised weights)
  tiny-mixtral-q8_0.gguf     convert of tests/fixtures/tiny-mixtral (llama arch: q/k rows permuted;
                             expert width 40 is no multiple of 32, so ffn_down_exps falls back to F16)
  wide-qwen3moe-q4_k_m.gguf  a 1-layer qwen3moe with hidden 256 (so rows fit Q4_K's 256-blocks) and
                             tied embeddings (no output.weight): metadata by convert_hf_to_gguf.py,
                             tensors re-quantised here with llama-quantize's Q4_K_M choices (Q4_K
                             gate/up experts and q/k, Q6_K token_embd / attn_v, fallbacks Q5_0 / Q8_0
                             where ne[0] is no multiple of 256); + .logits.f32, HF config in models.json
  tiny-glm4_moe-q8_0.gguf    convert of tests/fixtures/tiny-glm4_moe (glm4moe: partial rotary, shared
                             experts, sigmoid routing; its MTP layer is block 4 of 5, nextn_predict_layers 1)
  tiny-deepseek_v3-q8_0.gguf convert of tests/fixtures/tiny-deepseek_v3 with `scoring_func: sigmoid`
                             added to a copy of its config.json, as every DeepSeek-V3 / Kimi-K2 release has
                             it (transformers 5's save_pretrained drops it, and without it the converter
                             writes no deepseek2.expert_gating_func: GGUF_NOTES.md 4.6); kv_b_proj split
                             into attn_k_b / attn_v_b; rows of 16 / 24 / 48 inputs fall back to F16
  tiny-gpt_oss-mxfp4-q8_0.gguf  convert of tests/fixtures/tiny-gpt_oss-mxfp4 (the release layout: the
                             experts are repacked to ggml MXFP4, the rest is q8_0)
  tiny-minimax_m2-q8_0.gguf  convert of tests/fixtures/tiny-minimax_m2 (every tensor copied, experts stacked)
  tiny-deepseek_v32-q8_0.gguf, tiny-glm_moe_dsa-q8_0.gguf  deepseek32 / glm-dsa: deepseek2 with the DSA
                             indexer (GGUF_NOTES.md 4.10)
  tiny-qwen3_next-q8_0.gguf  qwen3next: Gated DeltaNet layers, the converter's changes undone by
                             qwen3next_to_hf (GGUF_NOTES.md 4.11)
  tiny-qwen3_5_moe-q8_0.gguf qwen35moe: the text model of the vision-language release, value heads
                             tiled (qwen35_to_hf; GGUF_NOTES.md 4.12)
  tiny-kimi_linear-q8_0.gguf kimi-linear: KDA and MLA layers (kimi_linear_to_hf; GGUF_NOTES.md 4.13)
  The last nine: + .logits.f32 from transformers on the dequantised weights mapped back to HF names
  and layouts (gguf_to_hf), with the source's own config.json.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import json
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import torch
import transformers
from safetensors import safe_open
from safetensors.numpy import save_file

import gguf
from gguf import GGMLQuantizationType as QT
from gguf import GGUFReader, GGUFWriter

import gen_gguf_fixtures_quant as gq

torch.set_num_threads(1)
torch.use_deterministic_algorithms(True)
transformers.logging.set_verbosity_error()

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "tests" / "fixtures"
CONVERT = ROOT / "tests" / "gen_gguf_fixtures_convert.py"
GAP_MIN = 1e-4
# tiny-glm_moe_dsa's q8_0 weights put two biased router scores 8.1e-5 apart (its f32 weights clear
# 1e-4): still about 10^3 times the rounding an f32 engine adds to scores of order 1, so the file
# is kept, with its gap recorded in models.json
GAP_MIN_FOR = {"glm_moe_dsa": 5e-5}
N_GREEDY = 16


def sha256(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


# ---------------------------------------------------------------------------------------
# sdist and converter
# ---------------------------------------------------------------------------------------

def extract_sdist(sdist: Path, tmp: Path) -> Path:
    with tarfile.open(sdist) as tf:
        top = tf.getmembers()[0].name.split("/")[0]
        pre = f"{top}/vendor/llama.cpp/"
        want = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/", "ggml/src/", "ggml/include/")
        members = [m for m in tf.getmembers()
                   if m.name.startswith(pre) and m.name[len(pre):].startswith(want)]
        tf.extractall(tmp, members=members, filter="data")
        head = None
        try:
            f = tf.extractfile(f"{top}/.git/modules/vendor/llama.cpp/HEAD")
            head = f.read().decode().strip() if f else None
        except KeyError:
            pass
    d = tmp / top / "vendor" / "llama.cpp"
    (d / ".waste_sdist_info.json").write_text(json.dumps(dict(top=top, llama_cpp_commit=head)))
    return d


def sdist_info(sdist: Path, llama_dir: Path) -> dict:
    info = json.loads((llama_dir / ".waste_sdist_info.json").read_text())
    return dict(sdist=sdist.name, sdist_sha256=sha256(sdist.read_bytes()),
                llama_cpp_commit=info["llama_cpp_commit"],
                vendored_gguf_py=re.search(r'version = "([^"]+)"',
                                           (llama_dir / "gguf-py" / "pyproject.toml").read_text()).group(1))


def convert(llama_dir: Path, hf_dir: Path, outtype: str, out: Path, patches: list[str],
            raw: bool = False) -> tuple[bool, str, list[str]]:
    """Run the converter; returns (ok, last line of its log, the command as recorded)."""
    if raw:
        cmd = [sys.executable, str(llama_dir / "convert_hf_to_gguf.py"), str(hf_dir),
               "--outtype", outtype, "--outfile", str(out)]
    else:
        cmd = [sys.executable, str(CONVERT), str(llama_dir), *patches, "--",
               str(hf_dir), "--outtype", outtype, "--outfile", str(out)]
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    lines = [ln for ln in (p.stderr + p.stdout).splitlines() if ln.strip()]
    last = lines[-1] if lines else ""
    if p.returncode != 0:
        errs = [ln for ln in lines if re.match(r"^\w*(Error|Exception)\b", ln)]
        last = errs[-1] if errs else last
        hsh = [ln.split("chkhsh:")[1].strip() for ln in lines if "chkhsh:" in ln]
        if hsh:
            last += f" (chkhsh {hsh[0]})"

    def show(a):
        s = str(a)
        s = s.replace(str(llama_dir), "<sdist>/vendor/llama.cpp")
        s = s.replace(str(ROOT) + "/", "")
        s = s.replace(sys.executable, "python3")
        if s.startswith("/tmp/") or s.startswith(str(out.parent)):
            s = "<out>/" + Path(s).name
        return s
    return p.returncode == 0, last, [show(a) for a in cmd]


# ---------------------------------------------------------------------------------------
# GGUF -> HF names (the inverse of convert_hf_to_gguf.py for the archs used here)
# ---------------------------------------------------------------------------------------

def llama_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """conversion/llama.py LlamaModel.permute (rows of q_proj / k_proj, HF -> GGUF)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama_unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


NAME_MAP = {
    # gguf suffix (after blk.N.)  -> HF suffix (after model.layers.N.)
    "common": {
        "attn_norm.weight": "input_layernorm.weight",
        "ffn_norm.weight": "post_attention_layernorm.weight",
        "attn_q.weight": "self_attn.q_proj.weight", "attn_q.bias": "self_attn.q_proj.bias",
        "attn_k.weight": "self_attn.k_proj.weight", "attn_k.bias": "self_attn.k_proj.bias",
        "attn_v.weight": "self_attn.v_proj.weight", "attn_v.bias": "self_attn.v_proj.bias",
        "attn_output.weight": "self_attn.o_proj.weight", "attn_output.bias": "self_attn.o_proj.bias",
        "attn_q_norm.weight": "self_attn.q_norm.weight", "attn_k_norm.weight": "self_attn.k_norm.weight",
        "ffn_gate.weight": "mlp.gate_proj.weight", "ffn_up.weight": "mlp.up_proj.weight",
        "ffn_down.weight": "mlp.down_proj.weight",
    },
    "qwen3moe": {
        "ffn_gate_inp.weight": "mlp.gate.weight",
        "ffn_gate_exps.weight": "mlp.experts.{E}.gate_proj.weight",
        "ffn_up_exps.weight": "mlp.experts.{E}.up_proj.weight",
        "ffn_down_exps.weight": "mlp.experts.{E}.down_proj.weight",
    },
    "glm4moe": {
        "post_attention_norm.weight": "post_attention_layernorm.weight",
        "ffn_gate_inp.weight": "mlp.gate.weight",
        "exp_probs_b.bias": "mlp.gate.e_score_correction_bias",
        "ffn_gate_exps.weight": "mlp.experts.{E}.gate_proj.weight",
        "ffn_up_exps.weight": "mlp.experts.{E}.up_proj.weight",
        "ffn_down_exps.weight": "mlp.experts.{E}.down_proj.weight",
        "ffn_gate_shexp.weight": "mlp.shared_experts.gate_proj.weight",
        "ffn_up_shexp.weight": "mlp.shared_experts.up_proj.weight",
        "ffn_down_shexp.weight": "mlp.shared_experts.down_proj.weight",
    },
    "deepseek2": {
        "attn_q_a.weight": "self_attn.q_a_proj.weight",
        "attn_q_a_norm.weight": "self_attn.q_a_layernorm.weight",
        "attn_q_b.weight": "self_attn.q_b_proj.weight",
        "attn_kv_a_mqa.weight": "self_attn.kv_a_proj_with_mqa.weight",
        "attn_kv_a_norm.weight": "self_attn.kv_a_layernorm.weight",
        "attn_kv_b.weight": "self_attn.kv_b_proj.weight",
        # attn_k_b / attn_v_b: reassembled into self_attn.kv_b_proj.weight (gguf_to_hf)
    },
    "gpt-oss": {
        "post_attention_norm.weight": "post_attention_layernorm.weight",
        "attn_sinks.weight": "self_attn.sinks",
        "ffn_gate_inp.weight": "mlp.router.weight", "ffn_gate_inp.bias": "mlp.router.bias",
        # ffn_{gate,up,down}_exps.{weight,bias}: re-fused into mlp.experts.gate_up_proj[_bias] (interleaved)
        # and mlp.experts.down_proj[_bias] (gguf_to_hf)
    },
    "minimax-m2": {
        "ffn_gate_inp.weight": "block_sparse_moe.gate.weight",
        "exp_probs_b.bias": "block_sparse_moe.e_score_correction_bias",
        "ffn_gate_exps.weight": "block_sparse_moe.experts.{E}.w1.weight",
        "ffn_up_exps.weight": "block_sparse_moe.experts.{E}.w3.weight",
        "ffn_down_exps.weight": "block_sparse_moe.experts.{E}.w2.weight",
    },
    "llama": {
        "ffn_gate_inp.weight": "block_sparse_moe.gate.weight",
        "ffn_gate_exps.weight": "block_sparse_moe.experts.{E}.w1.weight",
        "ffn_up_exps.weight": "block_sparse_moe.experts.{E}.w3.weight",
        "ffn_down_exps.weight": "block_sparse_moe.experts.{E}.w2.weight",
    },
}
NAME_MAP["deepseek2"].update({k: v for k, v in NAME_MAP["glm4moe"].items() if k != "post_attention_norm.weight"})
NAME_MAP["qwen3next"] = {
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate_inp.weight": "mlp.gate.weight",
    "ffn_gate_exps.weight": "mlp.experts.{E}.gate_proj.weight",
    "ffn_up_exps.weight": "mlp.experts.{E}.up_proj.weight",
    "ffn_down_exps.weight": "mlp.experts.{E}.down_proj.weight",
    "ffn_gate_shexp.weight": "mlp.shared_expert.gate_proj.weight",
    "ffn_up_shexp.weight": "mlp.shared_expert.up_proj.weight",
    "ffn_down_shexp.weight": "mlp.shared_expert.down_proj.weight",
    "ffn_gate_inp_shexp.weight": "mlp.shared_expert_gate.weight",
    "ssm_ba.weight": "linear_attn.in_proj_ba.weight",
    "ssm_dt.bias": "linear_attn.dt_bias",
    "ssm_norm.weight": "linear_attn.norm.weight",
    "ssm_out.weight": "linear_attn.out_proj.weight",
    # attn_qkv + attn_gate, ssm_a, ssm_conv1d and the norms: undone in gguf_to_hf
}
NAME_MAP["qwen35moe"] = {k: v for k, v in NAME_MAP["qwen3next"].items() if k != "ssm_ba.weight"
                         and not k.startswith(("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"))}
NAME_MAP["qwen35moe"].update({
    "attn_qkv.weight": "linear_attn.in_proj_qkv.weight", "attn_gate.weight": "linear_attn.in_proj_z.weight",
    "ssm_beta.weight": "linear_attn.in_proj_b.weight", "ssm_alpha.weight": "linear_attn.in_proj_a.weight",
    # ffn_{gate,up,down}_exps: re-fused into mlp.experts.gate_up_proj / down_proj (qwen35_to_hf)
})
NAME_MAP["kimi-linear"] = {
    **{k: v for k, v in NAME_MAP["deepseek2"].items() if not k.startswith(("ffn_", "exp_probs_b"))},
    "ffn_gate_inp.weight": "block_sparse_moe.gate.weight",
    "exp_probs_b.bias": "block_sparse_moe.gate.e_score_correction_bias",
    "ffn_gate_exps.weight": "block_sparse_moe.experts.{E}.w1.weight",
    "ffn_up_exps.weight": "block_sparse_moe.experts.{E}.w3.weight",
    "ffn_down_exps.weight": "block_sparse_moe.experts.{E}.w2.weight",
    "ffn_gate_shexp.weight": "block_sparse_moe.shared_experts.gate_proj.weight",
    "ffn_up_shexp.weight": "block_sparse_moe.shared_experts.up_proj.weight",
    "ffn_down_shexp.weight": "block_sparse_moe.shared_experts.down_proj.weight",
    "ssm_f_a.weight": "self_attn.f_a_proj.weight", "ssm_f_b.weight": "self_attn.f_b_proj.weight",
    "ssm_g_a.weight": "self_attn.g_a_proj.weight", "ssm_g_b.weight": "self_attn.g_b_proj.weight",
    "ssm_beta.weight": "self_attn.b_proj.weight", "ssm_dt.bias": "self_attn.dt_bias",
    "ssm_norm.weight": "self_attn.o_norm.weight",
    # ssm_a and ssm_conv1d_{q,k,v}: undone in gguf_to_hf (kimi_linear_to_hf)
}
# deepseek32 (DeepSeek-V3.2) and glm-dsa (GLM-5): deepseek2 with the DSA indexer, copied
NAME_MAP["deepseek32"] = dict(NAME_MAP["deepseek2"], **{
    "indexer.k_norm.weight": "self_attn.indexer.k_norm.weight",
    "indexer.k_norm.bias": "self_attn.indexer.k_norm.bias",
    "indexer.proj.weight": "self_attn.indexer.weights_proj.weight",
    "indexer.attn_k.weight": "self_attn.indexer.wk.weight",
    "indexer.attn_q_b.weight": "self_attn.indexer.wq_b.weight",
})
NAME_MAP["glm-dsa"] = NAME_MAP["deepseek32"]
GLOBAL_MAP = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
              "output.weight": "lm_head.weight"}


def read_gguf(path: Path) -> tuple[GGUFReader, dict[str, np.ndarray]]:
    r = GGUFReader(str(path))
    out = {}
    for t in r.tensors:
        ne = [int(x) for x in t.shape]
        a = np.asarray(t.data)
        deq = gguf.quants.dequantize(a, t.tensor_type) if t.tensor_type not in (QT.F32,) else a
        out[t.name] = np.ascontiguousarray(deq, dtype=np.float32).reshape(list(reversed(ne)))
    return r, out


def qwen3next_to_hf(G: dict[str, np.ndarray], cfg: dict, hf: dict, rows: list[dict], fused_qkvz: bool) -> None:
    """Undoes Qwen3NextModel.modify_tensors (conversion/qwen.py:393-430) in place: pops what it
    rebuilds from G into hf. Norm weights were stored plus one (all but linear_attn.norm), A_log as
    -exp(A_log), the conv weight squeezed, and in_proj_qkvz ([q, k, v, z] per key head) split into
    attn_qkv ([q * nk, k * nk, v * nk]) and attn_gate (z)."""
    nk, nv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    dk, dv = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
    norms = ("attn_norm.weight", "post_attention_norm.weight", "attn_q_norm.weight", "attn_k_norm.weight")
    for name in list(G):
        if name == "output_norm.weight" or name.endswith(norms):
            G[name] = G[name] - np.float32(1)
        elif name.endswith(".ssm_a"):
            p = name[:-len("ssm_a")]
            h = "model.layers." + p.split(".")[1] + ".linear_attn.A_log"
            hf[h] = np.log(-G.pop(name))
            rows.append(dict(gguf=name, hf=h, transform="log(-x) (the converter stored -exp(A_log))"))
        elif name.endswith(".ssm_conv1d.weight"):
            h = "model.layers." + name.split(".")[1] + ".linear_attn.conv1d.weight"
            a = G.pop(name)
            hf[h] = np.ascontiguousarray(a.reshape(a.shape[0], 1, a.shape[1]))
            rows.append(dict(gguf=name, hf=h, transform="reshape [channels, kernel] -> [channels, 1, kernel]"))
        elif fused_qkvz and name.endswith(".attn_qkv.weight"):
            p = name[:-len("attn_qkv.weight")]
            qkv, z = G.pop(name), G.pop(p + "attn_gate.weight")
            H = qkv.shape[1]
            q = qkv[:nk * dk].reshape(nk, dk, H)
            k = qkv[nk * dk:2 * nk * dk].reshape(nk, dk, H)
            v = qkv[2 * nk * dk:].reshape(nk, nv // nk * dv, H)
            h = "model.layers." + p.split(".")[1] + ".linear_attn.in_proj_qkvz.weight"
            hf[h] = np.ascontiguousarray(np.concatenate([q, k, v, z.reshape(nk, nv // nk * dv, H)], axis=1)
                                         .reshape(-1, H))
            rows.append(dict(gguf=p + "attn_qkv.weight + attn_gate.weight", hf=h,
                             transform="per key head: its q, k, v rows of attn_qkv, then its z rows of attn_gate"))
    for n in norms + ("output_norm.weight",):
        rows.append(dict(gguf="blk.{L}." + n if n != "output_norm.weight" else n, hf="(the norm's HF name)",
                         transform="x - 1 (the converter stored 1 + x)"))


def qwen35_to_hf(G: dict[str, np.ndarray], cfg: dict, hf: dict, rows: list[dict]) -> None:
    """Undoes _LinearAttentionVReorderBase.modify_tensors (conversion/qwen.py:580-631): the value heads
    of every GDN tensor back from llama.cpp's tiled order to transformers' grouped one, and the experts
    re-fused as Qwen3.5 stores them; the rest is Qwen3-Next's (qwen3next_to_hf)."""
    nk, nv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    dk, dv = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
    r = nv // nk

    def grouped(a: np.ndarray, axis: int, hd: int) -> np.ndarray:
        a = np.moveaxis(a, axis, 0)
        g = a.reshape(r, nk, hd, *a.shape[1:]).swapaxes(0, 1).reshape(a.shape)
        return np.ascontiguousarray(np.moveaxis(g, 0, axis))
    for name in list(G):
        suf = name.split(".", 2)[-1]
        if suf == "attn_qkv.weight":
            a = G[name]
            G[name] = np.concatenate([a[:2 * nk * dk], grouped(a[2 * nk * dk:], 0, dv)])
        elif suf == "ssm_conv1d.weight":              # numpy [channels, kernel]
            a = G[name]
            G[name] = np.concatenate([a[:2 * nk * dk], grouped(a[2 * nk * dk:], 0, dv)])
        elif suf == "attn_gate.weight":
            G[name] = grouped(G[name], 0, dv)
        elif suf in ("ssm_beta.weight", "ssm_alpha.weight", "ssm_a", "ssm_dt.bias"):
            G[name] = grouped(G[name], 0, 1)
        elif suf == "ssm_out.weight":                 # numpy [H, value heads x dv]: the columns
            G[name] = grouped(G[name], 1, dv)
        elif suf == "ffn_gate_exps.weight":
            p = name[:-len("ffn_gate_exps.weight")]
            L = "model.layers." + p.split(".")[1] + ".mlp.experts."
            gate, up, down = G.pop(name), G.pop(p + "ffn_up_exps.weight"), G.pop(p + "ffn_down_exps.weight")
            hf[L + "gate_up_proj"] = np.ascontiguousarray(np.concatenate([gate, up], axis=1))
            hf[L + "down_proj"] = down
            rows.append(dict(gguf=p + "ffn_{gate,up}_exps.weight", hf=L + "gate_up_proj",
                             transform="concatenate along axis 1 (numpy [E, I, H] each) -> [E, 2I, H]"))
            rows.append(dict(gguf=p + "ffn_down_exps.weight", hf=L + "down_proj", transform="copy [E, H, I]"))
    rows.append(dict(gguf="blk.{L}.{attn_qkv (v rows), ssm_conv1d (v channels), attn_gate, ssm_beta, ssm_alpha, "
                          "ssm_a, ssm_dt.bias, ssm_out (columns)}", hf="(their HF names)",
                     transform="value heads from tiled [r, nk, hd] back to grouped [nk, r, hd]"))


def kimi_linear_to_hf(G: dict[str, np.ndarray], hf: dict, rows: list[dict]) -> None:
    """Undoes KimiLinearModel.modify_tensors (conversion/kimi_linear.py): A_log stored as -exp(A_log)
    (HF [1, 1, heads, 1]), the q/k/v convolutions' [channels, 1, kernel] stored as numpy
    (1, channels, 1, kernel)."""
    for name in list(G):
        suf = name.split(".", 2)[-1]
        layer = "model.layers." + name.split(".")[1] + ".self_attn." if name.startswith("blk.") else None
        if suf == "ssm_a":
            a = G.pop(name)
            hf[layer + "A_log"] = np.log(-a).reshape(1, 1, -1, 1)
            rows.append(dict(gguf=name, hf=layer + "A_log", transform="log(-x), reshaped to [1, 1, heads, 1]"))
        elif suf in ("ssm_conv1d_q.weight", "ssm_conv1d_k.weight", "ssm_conv1d_v.weight"):
            a = G.pop(name)
            h = layer + suf[len("ssm_conv1d_")] + "_conv1d.weight"
            hf[h] = np.ascontiguousarray(a.reshape(a.shape[1], 1, a.shape[3]))
            rows.append(dict(gguf=name, hf=h, transform="reshape (1, channels, 1, kernel) -> [channels, 1, kernel]"))


def gguf_to_hf(arch: str, G: dict[str, np.ndarray], cfg: dict) -> tuple[dict, list[dict]]:
    """Returns (HF tensors, mapping rows)."""
    table = dict(NAME_MAP["common"], **NAME_MAP[arch])
    hf, rows = {}, []
    G = dict(G)
    n_layers = cfg["num_hidden_layers"]
    for name in [n for n in G if re.match(r"blk\.(\d+)\.", n) and int(n.split(".")[1]) >= n_layers]:
        # glm4moe: block_count counts the MTP layer(s) (nextn_predict_layers); transformers skips them
        del G[name]
        rows.append(dict(gguf="blk.{N}.* (N >= num_hidden_layers)", hf="-",
                         transform="the MTP layer (nextn_predict_layers): not part of the forward pass, dropped"))
    for name in [n for n in G if n.endswith(".attn_k_b.weight")]:
        # deepseek2: kv_b_proj.view(n_head, nope + v, kv_lora) = cat(k_b.transpose(1, 2), v_b) (numpy order)
        p = name[:-len("attn_k_b.weight")]
        kb, vb = G.pop(name), G.pop(p + "attn_v_b.weight")
        kv = np.concatenate([kb.transpose(0, 2, 1), vb], axis=1)
        h = "model.layers." + p.split(".")[1] + ".self_attn.kv_b_proj.weight"
        hf[h] = np.ascontiguousarray(kv.reshape(-1, kv.shape[-1]))
        rows.append(dict(gguf=p + "attn_k_b.weight + attn_v_b.weight", hf=h,
                         transform="cat([k_b (numpy [n_head, kv_lora, nope]).transpose(0, 2, 1), v_b (numpy "
                                   "[n_head, v, kv_lora])], axis=1).reshape(n_head * (nope + v), kv_lora)"))
    for name in [n for n in G if arch == "gpt-oss" and n.endswith(".ffn_gate_exps.weight")]:
        # gpt-oss: HF experts.gate_up_proj [E, H, 2I], gate and up interleaved along the last axis
        p = name[:-len("ffn_gate_exps.weight")]
        L = "model.layers." + p.split(".")[1] + ".mlp.experts."
        g, u, d = G.pop(name), G.pop(p + "ffn_up_exps.weight"), G.pop(p + "ffn_down_exps.weight")
        gb, ub, db = G.pop(p + "ffn_gate_exps.bias"), G.pop(p + "ffn_up_exps.bias"), G.pop(p + "ffn_down_exps.bias")
        gu = np.empty((g.shape[0], 2 * g.shape[1], g.shape[2]), dtype=np.float32)
        gu[:, 0::2], gu[:, 1::2] = g, u
        gub = np.empty((gb.shape[0], 2 * gb.shape[1]), dtype=np.float32)
        gub[:, 0::2], gub[:, 1::2] = gb, ub
        hf[L + "gate_up_proj"] = np.ascontiguousarray(gu.transpose(0, 2, 1))
        hf[L + "down_proj"] = np.ascontiguousarray(d.transpose(0, 2, 1))
        hf[L + "gate_up_proj_bias"], hf[L + "down_proj_bias"] = gub, db
        rows.append(dict(gguf=p + "ffn_{gate,up}_exps.weight", hf=L + "gate_up_proj",
                         transform="interleave (gate even, up odd) along axis 1 of numpy [E, I, H], then "
                                   "transpose(0, 2, 1) -> [E, H, 2I]"))
        rows.append(dict(gguf=p + "ffn_down_exps.weight", hf=L + "down_proj",
                         transform="numpy [E, H, I] transpose(0, 2, 1) -> [E, I, H]"))
        rows.append(dict(gguf=p + "ffn_{gate,up}_exps.bias", hf=L + "gate_up_proj_bias",
                         transform="interleave (gate even, up odd) along axis 1 -> [E, 2I]"))
        rows.append(dict(gguf=p + "ffn_down_exps.bias", hf=L + "down_proj_bias", transform="copy [E, H]"))
    if arch == "kimi-linear":
        kimi_linear_to_hf(G, hf, rows)
    if arch == "qwen35moe":
        qwen35_to_hf(G, cfg, hf, rows)
    if arch in ("qwen3next", "qwen35moe"):
        qwen3next_to_hf(G, cfg, hf, rows, fused_qkvz=arch == "qwen3next")
    for name, a in G.items():
        if name in GLOBAL_MAP:
            hf[GLOBAL_MAP[name]] = a
            rows.append(dict(gguf=name, hf=GLOBAL_MAP[name], transform="copy"))
            continue
        m = re.match(r"blk\.(\d+)\.(.+)$", name)
        assert m, name
        L, suf = int(m.group(1)), m.group(2)
        h = f"model.layers.{L}." + table[suf]
        if "{E}" in h:
            for e in range(a.shape[0]):
                hf[h.replace("{E}", str(e))] = np.ascontiguousarray(a[e])
            rows.append(dict(gguf=name, hf=h.replace("{E}", "{0.." + str(a.shape[0] - 1) + "}"),
                             transform="split along the slowest axis (ne[2]): expert e = [e]"))
            continue
        tr = "copy"
        if arch == "llama" and suf in ("attn_q.weight", "attn_k.weight", "attn_q.bias", "attn_k.bias"):
            nh = cfg["num_attention_heads"] if suf.startswith("attn_q") else cfg["num_key_value_heads"]
            a = llama_unpermute(a, nh)
            tr = f"undo the rope permute over rows, n_head = {nh}"
        hf[h] = a
        rows.append(dict(gguf=name, hf=h, transform=tr))
    folded, seen = [], set()
    for r in rows:                      # fold over layers
        k = tuple(re.sub(r"(blk|layers)\.\d+\.", r"\1.{L}.", r[x]) for x in ("gguf", "hf", "transform"))
        if k not in seen:
            seen.add(k)
            folded.append(dict(gguf=k[0], hf=k[1], transform=k[2]))
    return hf, folded


# ---------------------------------------------------------------------------------------
# transformers forward on given weights
# ---------------------------------------------------------------------------------------

def router_gap(mod, x: torch.Tensor, k: int, passed_bias: torch.Tensor | None = None) -> float:
    """The smallest margin of the top-k expert selection of one router call, computed from its input:
    softmax routers p_(k) - p_(k+1); gpt-oss the k-th minus (k+1)-th logit (x W^T + b); sigmoid routers
    with e_score_correction_bias (glm4_moe, deepseek_v3) the k-th minus (k+1)-th biased score among the
    experts of the kept groups, and the kept-group margin (group score = sum of its 2 best); minimax_m2,
    whose block passes its bias to the router (`passed_bias`), the k-th minus (k+1)-th biased score."""
    x = x.reshape(-1, mod.weight.shape[1]).float()
    logits = torch.nn.functional.linear(x, mod.weight.float(), getattr(mod, "bias", None))
    if passed_bias is not None:
        top = (logits.sigmoid() + passed_bias).topk(k + 1, dim=-1).values
        return (top[:, k - 1] - top[:, k]).min().item()
    if hasattr(mod, "e_score_correction_bias"):
        choice = logits.sigmoid() + mod.e_score_correction_bias
        ng, tg, ne = mod.num_group, mod.topk_group, logits.shape[-1]
        gs = choice.view(-1, ng, ne // ng).topk(2, dim=-1)[0].sum(-1)
        gap = float("inf")
        if tg < ng:
            gt = gs.topk(tg + 1, dim=-1).values
            gap = (gt[:, tg - 1] - gt[:, tg]).min().item()
        keep = torch.zeros_like(gs).scatter_(1, gs.topk(tg, dim=-1)[1], 1).bool()
        mask = keep.unsqueeze(-1).expand(-1, ng, ne // ng).reshape(-1, ne)
        top = choice.masked_fill(~mask, float("-inf")).topk(k + 1, dim=-1).values
        return min(gap, (top[:, k - 1] - top[:, k]).min().item())
    if getattr(mod, "bias", None) is not None:
        top = torch.topk(logits, k + 1, dim=-1).values
    else:
        top = torch.topk(torch.softmax(logits, dim=-1), k + 1, dim=-1).values
    return (top[:, k - 1] - top[:, k]).min().item()


@torch.no_grad()
def hf_logits(config: dict, tensors: dict[str, np.ndarray], prompt_ids: list[int], tmp: Path,
              tag: str) -> dict:
    from transformers import AutoModelForCausalLM
    d = tmp / f"hf-{tag}"
    if d.exists():
        shutil.rmtree(d)
    d.mkdir()
    (d / "config.json").write_text(json.dumps(config))
    save_file({k: np.ascontiguousarray(v, dtype=np.float32) for k, v in tensors.items()},
              str(d / "model.safetensors"))
    model = AutoModelForCausalLM.from_pretrained(str(d), dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    for p in model.parameters():         # mmapped parameters round some matmuls differently
        p.data = p.data.clone()
    gaps = []
    top_k = config.get("num_experts_per_tok", config.get("num_experts_per_token"))   # Kimi-Linear: the latter

    def hook(mod, inp, out):
        gaps.append(router_gap(mod, inp[0], top_k, inp[1] if len(inp) > 1 else None))
    hs = [m.register_forward_hook(hook) for _, m in model.named_modules()
          if type(m).__name__.lower().endswith("topkrouter")]
    ids = torch.tensor([prompt_ids])
    logits = model(input_ids=ids).logits[0].float()
    seq = list(prompt_ids)
    top1 = []
    for _ in range(N_GREEDY):
        lg = model(input_ids=torch.tensor([seq])).logits[0, -1].float()
        t = torch.topk(lg, 2).values
        top1.append((t[0] - t[1]).item())
        seq.append(int(lg.argmax()))
    for h in hs:
        h.remove()
    t = torch.topk(logits, 2, dim=-1).values
    return dict(logits=logits.numpy(), greedy=seq[len(prompt_ids):], min_router_gap=min(gaps),
                min_top1_gap=min((t[:, 0] - t[:, 1]).min().item(), min(top1)))


def load_hf_dir(d: Path) -> dict[str, np.ndarray]:
    out = {}
    for f in sorted(d.glob("model*.safetensors")):
        with safe_open(str(f), framework="pt") as so:
            for k in so.keys():
                t = so.get_tensor(k)
                out[k] = t.float().numpy() if t.is_floating_point() else t.numpy()
    return out


# ---------------------------------------------------------------------------------------
# describing a GGUF
# ---------------------------------------------------------------------------------------

def kv_summary(r: GGUFReader) -> list[dict]:
    out = []
    for k, f in r.fields.items():
        if k.startswith("GGUF."):
            continue
        types = [gq.VTYPE_NAMES[int(t)] for t in f.types]
        v = f.contents()
        e = dict(key=k, type=types[0])
        if types[0] == "ARRAY":
            e["sub_type"] = types[1] if len(types) > 1 else None
            e["len"] = len(v)
            e["head"] = [x.item() if hasattr(x, "item") else x for x in v[:8]]
            e["sha256_of_json"] = sha256(json.dumps(v, ensure_ascii=False).encode())
        else:
            e["value"] = v.item() if hasattr(v, "item") else v
            if isinstance(e["value"], str) and len(e["value"]) > 400:
                e["value"] = e["value"][:400] + "..."
        out.append(e)
    return out


def tensor_table(r: GGUFReader, data: bytes) -> list[dict]:
    rows = []
    for t in r.tensors:
        ne = [int(x) for x in t.shape]
        blob = data[t.data_offset:t.data_offset + t.n_bytes]
        rows.append(dict(name=t.name, ggml_type=t.tensor_type.name, ne=ne, numpy_shape=list(reversed(ne)),
                         offset=int(t.data_offset - r.data_offset), file_offset=int(t.data_offset),
                         n_bytes=int(t.n_bytes), sha256=sha256(blob)))
    return rows


# ---------------------------------------------------------------------------------------
# tokenizer.json from the GGUF tokenizer keys (GGUF_NOTES.md section 8), checked against the original
# ---------------------------------------------------------------------------------------

# llama.cpp's qwen2 pre-tokenizer regex is this one (src/llama-vocab.cpp:388, the "original regex
# from tokenizer.json" comment); HF Qwen2/Qwen3 tokenizer.json: NFC, Split(isolated), ByteLevel(no regex)
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
TOKENIZER_TEXTS = [
    "A router sends every token to two experts; attention looks back at the cache.",
    "<|im_start|>user\nCiao, come stai?<|im_end|>\n<|im_start|>assistant\n",
    "  spaces   and\ttabs\n\n", "\u00dcn\u00efc\u00f6d\u00e9 \u4e16\u754c \U0001f999 3.14159 don't I'LL",
    "<|endoftext|>x<|im_end|>", "The keeper of the old lighthouse writes to his daughter about boats and birds.",
]


def rebuild_tokenizer(r: GGUFReader):
    """A tokenizers.Tokenizer built only from tokenizer.ggml.* (model gpt2, pre gpt-2 or qwen2)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    f = lambda k: r.fields[k].contents() if k in r.fields else None  # noqa: E731
    assert f("tokenizer.ggml.model") == "gpt2"
    tokens, types, merges = f("tokenizer.ggml.tokens"), f("tokenizer.ggml.token_type"), f("tokenizer.ggml.merges")
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)},
                               merges=[tuple(m.split(" ", 1)) for m in merges], fuse_unk=False, byte_fallback=False))
    pre = f("tokenizer.ggml.pre")
    if pre == "gpt-2":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    elif pre == "qwen2":
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(QWEN2_REGEX), "isolated"),
                                                     pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    else:
        raise ValueError(pre)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False) for i, t in enumerate(types) if t == 3])
    tok.add_tokens([AddedToken(tokens[i], special=False, normalized=False) for i, t in enumerate(types) if t == 4])
    return tok


def tokenizer_check(r: GGUFReader, hf_dir: Path) -> dict:
    from tokenizers import Tokenizer
    orig = Tokenizer.from_file(str(hf_dir / "tokenizer.json"))
    tok = rebuild_tokenizer(r)
    same = all(orig.encode(t).ids == tok.encode(t).ids and
               orig.decode(orig.encode(t).ids, skip_special_tokens=False) ==
               tok.decode(tok.encode(t).ids, skip_special_tokens=False) for t in TOKENIZER_TEXTS)
    assert same, "tokenizer rebuilt from the GGUF keys disagrees with tokenizer.json"
    return dict(texts=TOKENIZER_TEXTS, identical_ids_and_decode=same,
                recipe="gen_gguf_fixtures_models.rebuild_tokenizer: BPE(vocab = tokens by index, merges = "
                       "'a b' split at the first space), pre gpt-2 -> ByteLevel(add_prefix_space=false, "
                       "use_regex=true), decoder ByteLevel, token_type 3 -> special added tokens, 4 -> "
                       "non-special added tokens")


# ---------------------------------------------------------------------------------------
# models/
# ---------------------------------------------------------------------------------------

WIDE_CONFIG = dict(
    architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", vocab_size=512, hidden_size=256,
    intermediate_size=256, moe_intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
    num_key_value_heads=1, head_dim=64, num_experts=4, num_experts_per_tok=2, mlp_only_layers=[],
    decoder_sparse_step=1, norm_topk_prob=True, attention_bias=False, rms_norm_eps=1e-6,
    tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
    max_position_embeddings=512, hidden_act="silu", initializer_range=0.08, pad_token_id=0,
    bos_token_id=None, eos_token_id=2, sliding_window=None, use_sliding_window=False,
    output_router_logits=False, router_aux_loss_coef=0.001, use_cache=True, dtype="float32")

# llama-quantize Q4_K_M for this 1-layer model (src/llama-quant.cpp: output -> Q6_K, and with tied
# embeddings token_embd takes the output's type; attn_v and ffn_down -> Q6_K where use_more_bits(0, 1);
# everything else quantisable -> Q4_K; ffn_gate_inp and 1-D tensors stay F32), then
# tensor_type_fallback (llama-quant.cpp:390) when ne[0] % 256 != 0.
WIDE_RECIPE = {"token_embd.weight": "Q6_K", "output.weight": "Q6_K", "attn_q.weight": "Q4_K",
               "attn_k.weight": "Q4_K", "attn_v.weight": "Q6_K", "attn_output.weight": "Q4_K",
               "ffn_gate_exps.weight": "Q4_K", "ffn_up_exps.weight": "Q4_K", "ffn_down_exps.weight": "Q6_K"}
FALLBACK = {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}


def quantize(a: np.ndarray, t: str) -> np.ndarray:
    if t == "Q4_K":
        return gq.quantize_q4_k_ref(a)
    if t == "Q6_K":
        return gq.quantize_q6_k_ref(a)
    return gguf.quants.quantize(a, QT[t])


def seeded_model(config_cls, model_cls, config: dict, seed: int):
    """`model_cls` of `config` (less the keys its config class does not take) with transformers'
    initialisation under `seed`, and every RMSNorm's weight drawn around 1 (a trained model's
    norms are not all ones, and the fixtures must exercise them)."""
    cfg = config_cls(**{k: v for k, v in config.items()
                        if k not in ("architectures", "model_type", "dtype", "transformers_version")})
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = model_cls(cfg).float().eval()
    g = torch.Generator().manual_seed(seed + 7919)
    with torch.no_grad():
        for _, mod in model.named_modules():
            if type(mod).__name__.endswith("RMSNorm"):
                mod.weight.copy_(1.0 + 0.2 * torch.randn(mod.weight.shape, generator=g))
    return model


def wide_f32(seed: int, tmp: Path, llama_dir: Path) -> tuple[Path, list[str]]:
    """The wide model of `seed` (WIDE_CONFIG, seeded weights and norms), converted to an f32 GGUF."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
    model = seeded_model(Qwen3MoeConfig, Qwen3MoeForCausalLM, WIDE_CONFIG, seed)
    hfdir = tmp / f"seed-{seed}" / "wide-qwen3moe"      # the converter derives general.* from the name
    model.save_pretrained(str(hfdir))
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(FIX / "tiny-qwen3_moe" / f, hfdir / f)
    f32 = tmp / f"wide-{seed}-f32.gguf"
    ok, last, cmd = convert(llama_dir, hfdir, "f32", f32, ["--pre", "gpt-2"])
    assert ok, last
    return f32, cmd


def build_wide(tmp: Path, prompt_ids: list[int], llama_dir: Path, out: Path) -> dict:
    tried = []
    for seed in range(3000, 3050):
        f32, cmd = wide_f32(seed, tmp, llama_dir)
        r = GGUFReader(str(f32))
        w = GGUFWriter(str(out), "qwen3moe")
        for k, f in r.fields.items():
            if k.startswith("GGUF.") or k == "general.architecture":
                continue
            vt = gguf.GGUFValueType(int(f.types[0]))
            v = f.contents()
            if k == "general.file_type":
                v = int(gguf.LlamaFileType.MOSTLY_Q4_K_M)
            sub = gguf.GGUFValueType(int(f.types[1])) if vt == gguf.GGUFValueType.ARRAY else None
            w.add_key_value(k, v, vt, sub_type=sub)
        types = {}
        for t in r.tensors:
            a = np.ascontiguousarray(np.asarray(t.data), dtype=np.float32)
            suf = t.name.split(".", 2)[-1] if t.name.startswith("blk.") else t.name
            want = WIDE_RECIPE.get(suf, "F32")
            if want != "F32" and a.shape[-1] % 256 != 0:
                want = FALLBACK[want]
            types[t.name] = want
            if want == "F32":
                w.add_tensor(t.name, a)
            else:
                w.add_tensor(t.name, quantize(a, want), raw_dtype=QT[want])
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        _, G = read_gguf(out)
        hf, _ = gguf_to_hf("qwen3moe", G, WIDE_CONFIG)
        res = hf_logits(WIDE_CONFIG, hf, prompt_ids, tmp, f"wide-{seed}")
        good = res["min_router_gap"] > GAP_MIN and res["min_top1_gap"] > GAP_MIN and len(set(res["greedy"])) >= 3
        tried.append(dict(seed=seed, min_router_gap=res["min_router_gap"], min_top1_gap=res["min_top1_gap"], ok=good))
        if good:
            res.update(seed=seed, tried=tried, types=types, convert_cmd=cmd)
            return res
    raise AssertionError(f"no wide seed passed the gap test: {tried}")


# (fixture dir, GGUF arch, converter patches, config.json additions for the converter's input)
MORE_FAMILIES = [
    ("glm4_moe", "glm4moe", ["--pre", "gpt-2", "--glm-vocab-as-gpt2"], {}),
    ("deepseek_v3", "deepseek2", ["--pre", "gpt-2"], {"scoring_func": "sigmoid", "topk_method": "noaux_tc"}),
    ("gpt_oss-mxfp4", "gpt-oss", ["--pre", "gpt-2"], {}),
    ("minimax_m2", "minimax-m2", ["--pre", "gpt-2"], {}),
    ("deepseek_v32", "deepseek32", ["--pre", "gpt-2", "--dsv32-no-bos-check"],
     {"scoring_func": "sigmoid", "topk_method": "noaux_tc"}),
    ("glm_moe_dsa", "glm-dsa", ["--pre", "gpt-2", "--glm-vocab-as-gpt2"], {}),
    ("qwen3_next", "qwen3next", ["--pre", "gpt-2"], {}),
    # the vision-language release: the GGUF holds its text model (the tower goes to an mmproj file)
    ("qwen3_5_moe", "qwen35moe", ["--pre", "gpt-2"], {}),
    # the converter reads the release's config keys, which transformers 5's save_pretrained rewrites:
    # linear_attn_config (full_attn_layers 1-based), first_k_dense_replace, the router's activation
    ("kimi_linear", "kimi-linear", ["--pre", "gpt-2"],
     {"linear_attn_config": {"full_attn_layers": [3, 5], "kda_layers": [1, 2, 4], "num_heads": 2, "head_dim": 16,
                             "short_conv_kernel_size": 4},
      "first_k_dense_replace": 1, "moe_router_activation_func": "sigmoid"}),
]
# A vision-language release's text model, as transformers names it.
TEXT_ARCHITECTURE = {"qwen3_5_moe": "Qwen3_5MoeForCausalLM"}


def more_families(d: Path, llama_dir: Path, tmp: Path, rel, info: dict) -> list[dict]:
    """glm4moe, deepseek2, gpt-oss, minimax-m2, deepseek32, glm-dsa, qwen3next, qwen35moe and kimi-linear q8_0
    GGUFs of the tiny fixtures, with reference logits from
    transformers on their dequantised weights mapped back to HF (the fixture's own config.json)."""
    out_entries = []
    for fam, arch, patches, cfg_add in MORE_FAMILIES:
        src = FIX / f"tiny-{fam}"
        conv_src = src
        if cfg_add:
            conv_src = tmp / "patched" / src.name      # same directory name: same general.name
            if conv_src.exists():
                shutil.rmtree(conv_src)
            shutil.copytree(src, conv_src)
            c = json.loads((conv_src / "config.json").read_text())
            c.update(cfg_add)
            (conv_src / "config.json").write_text(json.dumps(c, indent=2))
        out = d / f"tiny-{fam}-q8_0.gguf"
        ok, last, cmd = convert(llama_dir, conv_src, "q8_0", out, patches)
        assert ok, (fam, last)
        cmd = [a.replace("<out>/" + src.name, f"<copy of tests/fixtures/{src.name}>") for a in cmd]
        cfg = json.loads((src / "config.json").read_text())
        cfg.pop("quantization_config", None)             # the GGUF's weights are dequantised to f32
        if "text_config" in cfg:                         # its text model, under the text model's names
            cfg = dict(cfg["text_config"], architectures=[TEXT_ARCHITECTURE[cfg["model_type"]]],
                       tie_word_embeddings=cfg.get("tie_word_embeddings", False))
        cfg["dtype"] = "float32"
        r, G = read_gguf(out)
        hf, rows = gguf_to_hf(arch, G, cfg)
        orig = {k: v for k, v in load_hf_dir(src).items() if v.dtype == np.float32}
        if (src / "dequantized.safetensors").exists():   # gpt-oss MXFP4: transformers' own dequantisation
            with safe_open(str(src / "dequantized.safetensors"), framework="pt") as so:
                orig.update({k: so.get_tensor(k).float().numpy() for k in so.keys()})
        L = cfg["num_hidden_layers"]
        orig = {k.replace("model.language_model.", "model.", 1): v for k, v in orig.items()
                if not k.startswith((f"model.layers.{L}.", "mtp.", "model.visual."))}   # MTP layer, vision tower
        # every float tensor of the source is there; gpt-oss-mxfp4's dequantized.safetensors has layer 0's
        # experts only, the other layers' are MXFP4 blocks (not compared)
        assert set(orig) <= set(hf), (fam, set(orig) - set(hf))
        assert all(k.endswith(("gate_up_proj", "down_proj")) for k in set(hf) - set(orig)), set(hf) - set(orig)
        maxdiff = max(float(np.abs(hf[k] - orig[k]).max()) for k in orig)
        fref = json.loads((src / "reference.json").read_text())
        ref_logits = np.fromfile(src / "reference_logits.f32", dtype="<f4").reshape(fref["logits_shape"])
        res = hf_logits(cfg, hf, fref["prompt_ids"], tmp, f"{fam}-q8_0")
        gap_min = GAP_MIN_FOR.get(fam, GAP_MIN)
        assert res["min_router_gap"] > gap_min and res["min_top1_gap"] > gap_min, (fam, res["min_router_gap"],
                                                                                 res["min_top1_gap"])
        lp = d / f"tiny-{fam}-q8_0.logits.f32"
        lp.write_bytes(res["logits"].astype("<f4").tobytes())
        entry = describe_model(out, rel)
        entry.update(source=f"tests/fixtures/tiny-{fam}", arch=arch, outtype="q8_0", command=" ".join(cmd),
                     converter=info, converter_input_config_additions=cfg_add,
                     max_abs_weight_diff_vs_safetensors=maxdiff, gguf_to_hf=rows, prompt_ids=fref["prompt_ids"],
                     greedy_ids=res["greedy"], min_router_gap=res["min_router_gap"],
                     min_router_gap_note="sigmoid routers: biased-score and kept-group margins; gpt-oss: "
                                         "router-logit margin (gen_gguf_fixtures_models.router_gap)",
                     min_top1_gap=res["min_top1_gap"],
                     max_abs_logit_diff_vs_safetensors_reference=float(np.abs(res["logits"] - ref_logits).max()),
                     reference_logits=rel(lp), logits_shape=[len(fref["prompt_ids"]), cfg["vocab_size"]],
                     reference_logits_note=(
                         f"transformers {cfg['architectures'][0]} (the source's config.json"
                         + (", quantization_config removed" if fam.endswith("mxfp4") else "")
                         + "; f32, eager, 1 thread) on the weights gguf.quants.dequantize gives for this file, "
                         "mapped back to HF names and layouts (gguf_to_hf); row-major [T, 512]"))
        out_entries.append(entry)
    return out_entries


def describe_model(path: Path, rel) -> dict:
    r = GGUFReader(str(path))
    b = path.read_bytes()
    return dict(file=rel(path), size=len(b), sha256=sha256(b), alignment=32,
                data_offset=int(r.data_offset), kv=kv_summary(r), tensors=tensor_table(r, b))


def write_models(OUT: Path, llama_dir: Path, sdist: Path, tmp: Path, rel) -> None:
    d = OUT / "models"
    d.mkdir(parents=True, exist_ok=True)
    ref = json.loads((FIX / "tiny-qwen3_moe" / "reference.json").read_text())
    prompt = ref["prompt_ids"]
    models = []
    info = sdist_info(sdist, llama_dir)

    # what happens without the patches
    attempts = []
    q3 = FIX / "tiny-qwen3_moe"
    for patches, raw in (([], True), (["--qwen3moe-dense-ffn"], False)):
        ok, last, cmd = convert(llama_dir, q3, "f32", tmp / "attempt.gguf", patches, raw=raw)
        attempts.append(dict(command=" ".join(cmd), ok=ok, result=last))

    for fam, arch, outtype in (("qwen3_moe", "qwen3moe", "f32"), ("qwen3_moe", "qwen3moe", "q8_0"),
                               ("mixtral", "llama", "q8_0")):
        src = FIX / f"tiny-{fam}"
        out = d / f"tiny-{fam}-{outtype}.gguf"
        patches = ["--pre", "gpt-2"] + (["--qwen3moe-dense-ffn"] if arch == "qwen3moe" else [])
        ok, last, cmd = convert(llama_dir, src, outtype, out, patches)
        assert ok, (fam, outtype, last)
        cfg = json.loads((src / "config.json").read_text())
        r, G = read_gguf(out)
        hf, rows = gguf_to_hf(arch, G, cfg)
        orig = load_hf_dir(src)
        assert set(hf) == set(orig), (set(hf) ^ set(orig))
        exact = all(np.array_equal(hf[k], orig[k]) for k in orig)
        maxdiff = max(float(np.abs(hf[k] - orig[k]).max()) for k in orig)
        fref = json.loads((src / "reference.json").read_text())
        ref_logits = np.fromfile(src / "reference_logits.f32", dtype="<f4").reshape(fref["logits_shape"])
        res = hf_logits(cfg, hf, fref["prompt_ids"], tmp, f"{fam}-{outtype}")
        entry = describe_model(out, rel)
        entry.update(source=f"tests/fixtures/tiny-{fam}", arch=arch, outtype=outtype,
                     command=" ".join(cmd), converter=info,
                     weights_equal_safetensors_exactly=exact, max_abs_weight_diff_vs_safetensors=maxdiff,
                     gguf_to_hf=rows, prompt_ids=fref["prompt_ids"],
                     greedy_ids=res["greedy"], min_router_gap=res["min_router_gap"],
                     min_top1_gap=res["min_top1_gap"],
                     max_abs_logit_diff_vs_safetensors_reference=float(np.abs(res["logits"] - ref_logits).max()))
        if outtype == "f32":
            assert exact and np.array_equal(res["logits"], ref_logits), "f32 GGUF does not reproduce the logits"
            entry["reference_logits"] = f"../tiny-{fam}/reference_logits.f32"
            entry["reference_logits_note"] = ("identical (torch.equal) to the safetensors route: the GGUF "
                                              "mapped back to HF names reproduces the fixture's logits")
        else:
            lp = d / f"tiny-{fam}-{outtype}.logits.f32"
            lp.write_bytes(res["logits"].astype("<f4").tobytes())
            entry["reference_logits"] = rel(lp)
            entry["reference_logits_note"] = (
                "transformers (f32, eager, 1 thread) on the weights gguf.quants.dequantize gives for this "
                "file, mapped back to HF names; row-major [T, 512]")
        entry["logits_shape"] = [len(fref["prompt_ids"]), cfg["vocab_size"]]
        if fam == "qwen3_moe" and outtype == "f32":
            entry["unpatched_attempts"] = attempts
            entry["tokenizer_rebuild_check"] = tokenizer_check(r, src)
        models.append(entry)

    models += more_families(d, llama_dir, tmp, rel, info)

    out = d / "wide-qwen3moe-q4_k_m.gguf"
    res = build_wide(tmp, prompt, llama_dir, out)
    lp = d / "wide-qwen3moe-q4_k_m.logits.f32"
    lp.write_bytes(res["logits"].astype("<f4").tobytes())
    r, G = read_gguf(out)
    _, rows = gguf_to_hf("qwen3moe", G, WIDE_CONFIG)
    entry = describe_model(out, rel)
    entry.update(source="random (seeded) Qwen3MoeForCausalLM built by the generator, see hf_config",
                 arch="qwen3moe", hf_config=WIDE_CONFIG, seed=res["seed"], seeds_tried=res["tried"],
                 metadata_by=" ".join(res["convert_cmd"]) + "  (f32; its KVs are copied, general.file_type "
                 "set to 15 = MOSTLY_Q4_K_M)",
                 tensor_types=res["types"],
                 quantisers=dict(Q4_K="numpy port of quantize_row_q4_K_ref", Q6_K="numpy port of "
                                 "quantize_row_q6_K_ref", Q5_0="gguf.quants.quantize", Q8_0="gguf.quants.quantize",
                                 note="the ports are byte-identical to ggml-quants.c (c_cross_check.json); "
                                      "llama-quantize without an imatrix calls these same _ref functions"),
                 gguf_to_hf=rows, prompt_ids=prompt, greedy_ids=res["greedy"],
                 min_router_gap=res["min_router_gap"], min_top1_gap=res["min_top1_gap"],
                 reference_logits=rel(lp), logits_shape=[len(prompt), 512],
                 reference_logits_note="transformers Qwen3MoeForCausalLM (hf_config; f32, eager, 1 thread) "
                                       "on the dequantised weights of this file")
    models.append(entry)

    doc = dict(generator="tests/gen_gguf_fixtures.py (gen_gguf_fixtures_models.py)", converter=info,
               versions=dict(torch=torch.__version__, transformers=transformers.__version__,
                             gguf=md.version("gguf"), sentencepiece=md.version("sentencepiece"),
                             numpy=np.__version__, python=sys.version.split()[0]),
               patches=("tests/gen_gguf_fixtures_convert.py: --pre gpt-2 (unknown pre-tokenizer hash), "
                        "--qwen3moe-dense-ffn (mlp_only_layers=[0] is not representable in llama.cpp's "
                        "qwen3moe tensor list), --glm-vocab-as-gpt2 (the tiny tokenizer has no [gMASK] / "
                        "<sop>); deepseek_v3 converted from a copy of its fixture with scoring_func / "
                        "topk_method added to config.json (see converter_input_config_additions)"),
               models=models)
    (OUT / "models.json").write_text(gq.dump_json(doc))
    import gen_gguf_fixtures_survey as gs
    survey = gs.survey(llama_dir, tmp, info)
    (OUT / "convert_survey.json").write_text(gq.dump_json(survey))
