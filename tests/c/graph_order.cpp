// The node order of one decode step's graph (llama's cb_eval sees every node in compute order) and the logits it
// gives, for tests/test_graph_order.py: the graph patch (turbo K, unless TURBO_FUSE_ROPE_Q=0) must put Q's RoPE right
// before the attention node and leave the logits as they are.
//   graph_order MODEL CACHE_TYPE  ->  lines "NODE <op> <name> | <src0 name>", then "LOGITS <first 16 logits>"
#include "llama.h"
#include "ggml.h"
#include <cstdio>
#include <cstring>

static bool print_node(struct ggml_tensor * t, bool ask, void *) {
    if (ask) {
        printf("NODE %s %s | %s\n", ggml_op_desc(t), t->name, t->src[0] ? t->src[0]->name : "-");
    }
    return true;
}

int main(int argc, char ** argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s MODEL CACHE_TYPE (f16|turbo3|turbo2)\n", argv[0]);
        return 2;
    }
    const ggml_type type = strcmp(argv[2], "turbo3") == 0 ? GGML_TYPE_TURBO3 :
                           strcmp(argv[2], "turbo2") == 0 ? GGML_TYPE_TURBO2 : GGML_TYPE_F16;
    llama_backend_init();
    llama_model * model = llama_model_load_from_file(argv[1], llama_model_default_params());
    if (!model) {
        fprintf(stderr, "cannot load %s\n", argv[1]);
        return 1;
    }
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 256; cp.n_batch = 8; cp.n_ubatch = 8; cp.n_threads = 2; cp.n_threads_batch = 2;
    cp.type_k = type; cp.type_v = type;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_ENABLED;
    cp.cb_eval = print_node;
    llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) {
        fprintf(stderr, "cannot make the context\n");
        return 1;
    }
    llama_token tok[2] = { 1, 2 };
    llama_decode(ctx, llama_batch_get_one(tok, 1));   // the first step also runs the turbo key-offset probe
    printf("=== step\n");
    if (llama_decode(ctx, llama_batch_get_one(tok + 1, 1)) != 0) {
        fprintf(stderr, "decode failed\n");
        return 1;
    }
    const float * logits = llama_get_logits_ith(ctx, -1);
    printf("LOGITS");
    for (int i = 0; i < 16; ++i) {
        printf(" %.9g", logits[i]);
    }
    printf("\n");
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}
