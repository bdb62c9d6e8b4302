#!/usr/bin/env python3
"""Run llama.cpp's convert_hf_to_gguf.py (from an extracted llama-cpp-python sdist) with the
smallest patches the tiny WASTE fixtures need. Used by tests/gen_gguf_fixtures.py.

    python3 tests/gen_gguf_fixtures_convert.py LLAMA_CPP_DIR [--pre NAME] [--qwen3moe-dense-ffn]
        [--glm-vocab-as-gpt2] [--dsv32-no-bos-check] -- HF_DIR --outtype f32 --outfile OUT.gguf

Patches (each applied only when asked for, all in memory; the script files are not changed):

  --pre NAME            get_vocab_base_pre() returns NAME instead of raising "BPE pre-tokenizer
                        was not recognized": convert_hf_to_gguf.py identifies pre-tokenizers by
                        the sha256 of the token ids of a test string, and the fixtures' tokenizer
                        (512 tokens, trained here) has no known hash. "gpt-2" is what it is:
                        a ByteLevel pre-tokenizer with the GPT-2 regex.
  --qwen3moe-dense-ffn  add FFN_GATE / FFN_UP / FFN_DOWN to gguf's tensor list for qwen3moe, so
                        a dense layer (tiny-qwen3_moe has mlp_only_layers=[0]) is written as
                        blk.0.ffn_{gate,up,down}.weight instead of failing with
                        "Can not map tensor 'model.layers.0.mlp.down_proj.weight'".
  --glm-vocab-as-gpt2   Glm4MoeModel's vocab step looks up GLM's special tokens ([gMASK], <sop>,
                        ...) that the tiny tokenizer lacks; use the plain gpt2 vocab path
                        (the tensor survey and models/tiny-glm4_moe-q8_0.gguf).
  --dsv32-no-bos-check  DeepseekV32Model.set_vocab asserts that the tokenizer adds a BOS token (the
                        release's does; the tiny tokenizer has no BOS token, and transformers 5 then
                        reports add_bos_token false whatever tokenizer_config.json says). Skip the
                        assertion; the vocab is written by the same _set_vocab_gpt2 call, and only
                        tokenizer.ggml.add_bos_token (false) differs from a release's file.

Everything else (tensor names, layouts, dtypes, metadata) is convert_hf_to_gguf.py's own. It
runs with the sdist's vendored gguf-py (its default: NO_LOCAL_GGUF unset).
"""

import runpy
import sys


def main():
    argv = sys.argv[1:]
    split = argv.index("--")
    opts, conv_args = argv[:split], argv[split + 1:]
    llama_dir = opts[0]
    pre = None
    dense = glm = dsv32 = False
    i = 1
    while i < len(opts):
        if opts[i] == "--pre":
            pre = opts[i + 1]
            i += 2
        elif opts[i] == "--qwen3moe-dense-ffn":
            dense = True
            i += 1
        elif opts[i] == "--glm-vocab-as-gpt2":
            glm = True
            i += 1
        elif opts[i] == "--dsv32-no-bos-check":
            dsv32 = True
            i += 1
        else:
            raise SystemExit(f"unknown option {opts[i]}")

    sys.path.insert(0, llama_dir)
    sys.path.insert(1, llama_dir + "/gguf-py")
    import gguf  # the vendored copy

    if dense:
        T = gguf.MODEL_TENSOR
        gguf.MODEL_TENSORS[gguf.MODEL_ARCH.QWEN3MOE] += [T.FFN_GATE, T.FFN_DOWN, T.FFN_UP]
    import conversion.base

    if pre is not None:
        conversion.base.TextModel.get_vocab_base_pre = lambda self, tokenizer: pre
    if glm:
        conversion.base.TextModel._set_vocab_glm = conversion.base.TextModel._set_vocab_gpt2
    if dsv32:
        import conversion.deepseek
        conversion.deepseek.DeepseekV32Model.set_vocab = conversion.base.TextModel._set_vocab_gpt2
    script = llama_dir + "/convert_hf_to_gguf.py"
    sys.argv = [script] + conv_args
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
