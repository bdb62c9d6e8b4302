// Every position's logits of a prompt through llama.cpp's own library, and
// optionally its greedy continuation, for bench/peers/llama_logits.py:
//
//   llama-logits MODEL.gguf OUT.f32 [--kv-f32] [--greedy N] TOKEN...
//
// OUT.f32 gets tokens x n_vocab little-endian floats (one decode of the
// whole prompt, every position's logits kept); with --greedy N the N tokens
// after the prompt, each the argmax of the last logits, go to stdout.
// llama.cpp's defaults otherwise (f16 KV cache unless --kv-f32).
#include "llama.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

static int argmax(const float * v, int n) {
    int best = 0;
    for (int i = 1; i < n; i++) {
        if (v[i] > v[best]) best = i;
    }
    return best;
}

int main(int argc, char ** argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s MODEL.gguf OUT.f32 [--kv-f32] [--greedy N] TOKEN...\n", argv[0]);
        return 2;
    }
    bool kv_f32 = false;
    int greedy = 0;
    std::vector<llama_token> tokens;
    for (int i = 3; i < argc; i++) {
        if (strcmp(argv[i], "--kv-f32") == 0) {
            kv_f32 = true;
        } else if (strcmp(argv[i], "--greedy") == 0 && i + 1 < argc) {
            greedy = atoi(argv[++i]);
        } else {
            tokens.push_back(atoi(argv[i]));
        }
    }
    llama_backend_init();
    llama_model * model = llama_model_load_from_file(argv[1], llama_model_default_params());
    if (model == nullptr) {
        fprintf(stderr, "cannot load %s\n", argv[1]);
        return 1;
    }
    const int n = (int) tokens.size();
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = n + greedy + 16;
    cp.n_batch = cp.n_ubatch = n;
    cp.n_threads = cp.n_threads_batch = 2;
    if (kv_f32) {
        cp.type_k = GGML_TYPE_F32;
        cp.type_v = GGML_TYPE_F32;
    }
    llama_context * ctx = llama_init_from_model(model, cp);
    if (ctx == nullptr) {
        fprintf(stderr, "cannot make a context\n");
        return 1;
    }
    llama_batch batch = llama_batch_init(n, 0, 1);
    for (int i = 0; i < n; i++) {
        batch.token[i] = tokens[i];
        batch.pos[i] = i;
        batch.n_seq_id[i] = 1;
        batch.seq_id[i][0] = 0;
        batch.logits[i] = 1;
    }
    batch.n_tokens = n;
    if (llama_decode(ctx, batch) != 0) {
        fprintf(stderr, "decode failed\n");
        return 1;
    }
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    FILE * out = fopen(argv[2], "wb");
    if (out == nullptr) {
        fprintf(stderr, "cannot write %s\n", argv[2]);
        return 1;
    }
    for (int i = 0; i < n; i++) {
        fwrite(llama_get_logits_ith(ctx, i), sizeof(float), n_vocab, out);
    }
    fclose(out);
    llama_token next = argmax(llama_get_logits_ith(ctx, n - 1), n_vocab);
    for (int g = 0; g < greedy; g++) {
        printf("%d%s", next, g + 1 < greedy ? " " : "\n");
        llama_batch one = llama_batch_get_one(&next, 1);
        if (llama_decode(ctx, one) != 0) {
            fprintf(stderr, "decode failed\n");
            return 1;
        }
        next = argmax(llama_get_logits_ith(ctx, -1), n_vocab);
    }
    llama_batch_free(batch);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
