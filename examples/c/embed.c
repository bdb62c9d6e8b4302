/* Embedding WASTE from C: plan memory, open a model, stream a generation
 * with cache and I/O progress from the callback, save and reload the state,
 * then one chat turn through the model's template with top log-probabilities.
 * Build: cc embed.c -I../../ffi/include -L../../target/release -lwaste -o embed
 * Run:   LD_LIBRARY_PATH=../../target/release ./embed MODEL.waste STATE_FILE */
#include <stdio.h>
#include <string.h>
#include "waste.h"

static waste_ctx *ctx;

static int fail(const char *what, waste_result r) {
    char detail[512];
    waste_ctx_last_error(ctx, detail, sizeof detail);
    fprintf(stderr, "%s: %s: %s\n", what, waste_strerror(r), detail);
    return 1;
}

struct progress { unsigned tokens, reused, prefetched, missed; unsigned long long bytes; double ms_io, ms_total; };

static bool on_token(void *user, const waste_token_event *ev) {
    struct progress *p = user;
    p->tokens++;
    p->reused += ev->experts_reused;
    p->prefetched += ev->experts_prefetched;
    p->missed += ev->experts_missed;
    p->bytes += ev->bytes_read;
    p->ms_io += ev->ms_io;
    p->ms_total += ev->ms_total;
    fwrite(ev->text, 1, ev->text_len, stdout);
    fprintf(stderr, "\r[%u tokens, experts reused %u, prefetched %u, read %u, %llu bytes read, %.1f of %.1f ms in I/O]",
            p->tokens, p->reused, p->prefetched, p->missed, p->bytes, p->ms_io, p->ms_total);
    return true;
}

struct alternatives { unsigned count; uint32_t first; waste_top_logprob top[3]; size_t n; };

/* Keeps the first reply token and its alternatives (the event's array
 * lives only during the call). */
static bool on_reply_token(void *user, const waste_token_event *ev) {
    struct alternatives *a = user;
    if (a->count++ == 0) {
        a->first = ev->token;
        a->n = ev->n_top < 3 ? ev->n_top : 3;
        memcpy(a->top, ev->top, a->n * sizeof *ev->top);
    }
    return true;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s MODEL.waste STATE_FILE\n", argv[0]);
        return 2;
    }
    const char *path = argv[1], *state = argv[2];
    waste_result r = waste_ctx_open(&ctx);
    if (r != WASTE_OK) return fail("waste_ctx_open", r);
    printf("waste %s\n", waste_version());

    waste_memory_plan plan;
    if ((r = waste_plan(ctx, path, strlen(path), 0, 0, &plan)) != WASTE_OK) return fail("waste_plan", r);
    printf("plan: floor %llu, recommended %llu bytes\n", (unsigned long long)plan.floor,
           (unsigned long long)plan.recommended);

    waste_open_options opts;
    waste_open_options_default(&opts);
    opts.budget = plan.recommended;
    waste_model *model;
    if ((r = waste_model_open(ctx, path, strlen(path), &opts, &model)) != WASTE_OK) return fail("waste_model_open", r);
    waste_model_info info;
    waste_model_get_info(model, &info);
    printf("model: %s, %zu layers, %zu experts (top %zu)\n", info.family, info.num_layers, info.num_experts, info.top_k);

    waste_session *session;
    if ((r = waste_session_open(ctx, model, &session)) != WASTE_OK) return fail("waste_session_open", r);
    const char *text = "And God said";
    uint32_t prompt[64];
    size_t n_prompt;
    r = waste_session_tokenize(session, text, strlen(text), prompt, 64, &n_prompt);
    if (r != WASTE_OK) return fail("waste_session_tokenize", r);

    waste_generate_params params;
    waste_generate_params_default(&params);
    params.temperature = 0; /* greedy: the reload below must continue identically */
    params.max_tokens = 16;
    struct progress p = {0};
    waste_completion done;
    if ((r = waste_session_generate(session, prompt, n_prompt, &params, on_token, &p, &done)) != WASTE_OK)
        return fail("waste_session_generate", r);
    fprintf(stderr, "\n");
    printf("\ngenerated %zu tokens\n", done.n_tokens);

    if ((r = waste_session_save_state(session, state, strlen(state))) != WASTE_OK) return fail("save_state", r);
    size_t pos_saved, pos_loaded;
    waste_session_position(session, &pos_saved);
    waste_session_reset(session);
    if ((r = waste_session_load_state(session, state, strlen(state))) != WASTE_OK) return fail("load_state", r);
    waste_session_position(session, &pos_loaded);
    printf("state: saved at %zu, loaded at %zu\n", pos_saved, pos_loaded);

    /* A chat turn: the model's own template (text and tokens), a greedy
     * reply with the three most likely alternatives of each token. */
    waste_session_reset(session);
    waste_chat_message msg = {{"user", 4}, {"And God said", 12}, {NULL, 0}};
    waste_str no_tools = {NULL, 0};
    char rendered[512];
    size_t n_rendered;
    r = waste_session_render_chat_template(session, &msg, 1, no_tools, true, rendered, sizeof rendered, &n_rendered);
    if (r != WASTE_OK) return fail("waste_session_render_chat_template", r);
    uint32_t chat[256];
    size_t n_chat;
    r = waste_session_apply_chat_template(session, &msg, 1, no_tools, true, chat, 256, &n_chat);
    if (r != WASTE_OK) return fail("waste_session_apply_chat_template", r);
    printf("chat prompt: %zu bytes, %zu tokens\n", n_rendered, n_chat);
    params.max_tokens = 4;
    params.top_logprobs = 3;
    struct alternatives alt = {0};
    waste_completion reply;
    if ((r = waste_session_generate(session, chat, n_chat, &params, on_reply_token, &alt, &reply)) != WASTE_OK)
        return fail("waste_session_generate (chat)", r);
    printf("first reply token %u; alternatives:", alt.first);
    for (size_t i = 0; i < alt.n; i++) printf(" %u (%.4f)", alt.top[i].token, alt.top[i].logprob);
    printf("\n");

    waste_store_stats stats;
    waste_model_store_stats(model, &stats);
    printf("store: %llu reused, %llu prefetched, %llu read, %llu bytes read\n", (unsigned long long)stats.reused,
           (unsigned long long)stats.prefetched, (unsigned long long)stats.missed,
           (unsigned long long)stats.bytes_read);
    waste_session_close(session);
    waste_model_close(model);
    waste_ctx_close(ctx);
    return pos_saved == pos_loaded && p.tokens == done.n_tokens && alt.count == reply.n_tokens ? 0 : 1;
}
