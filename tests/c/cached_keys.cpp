// The keys a context stores for a text, decoded in ubatches of a given size (issue #34 item 2: the key transform
// must not depend on -b/-ub). Public llama.h / ggml.h API, linked against the built static libs
// (tests/test_turbo_keys.py).
//
//   cached_keys MODEL TEXT CTK N_TOKENS N_BATCH OUT [threads=2]
//
// Decodes the first N_TOKENS tokens of TEXT (BOS first) in batches of N_BATCH (n_ubatch = n_batch), flash
// attention on, V f16, one sequence, then reads the cached keys of every layer back through the sequence state
// (llama_test_util.h) and writes OUT: i32 n_layers, i32 n_cells, then per layer i32 n_embd and n_cells * n_embd f32.
#include "ggml.h"
#include "llama.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#define TEST_PROGRAM "cached_keys"
#include "llama_test_util.h"

int main(int argc, char ** argv) {
    if (argc < 7) {
        die("usage: cached_keys MODEL TEXT CTK N_TOKENS N_BATCH OUT [threads]");
    }
    const int n_tokens = atoi(argv[4]);
    const int n_batch  = atoi(argv[5]);
    const int threads  = argc > 7 ? atoi(argv[7]) : 2;
    if (n_tokens < 2 || n_batch < 1) {
        die("N_TOKENS must be at least 2 and N_BATCH at least 1");
    }

    llama_backend_init();
    llama_log_set(quiet_log, nullptr);
    llama_model * model = llama_model_load_from_file(argv[1], llama_model_default_params());
    if (!model) {
        die("cannot load the model");
    }
    auto cp = llama_context_default_params();
    cp.n_ctx           = std::max(256, n_tokens);
    cp.n_batch         = n_batch;
    cp.n_ubatch        = n_batch;
    cp.type_k          = type_by_name(argv[3]);
    cp.type_v          = GGML_TYPE_F16;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_ENABLED;
    cp.n_threads       = threads;
    cp.n_threads_batch = threads;
    cp.swa_full        = true;
    llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) {
        die("cannot create the context");
    }

    std::ifstream in(argv[2]);
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string text = ss.str().substr(0, 16 * (size_t) n_tokens);
    std::vector<llama_token> toks(text.size() + 2);
    const int n = llama_tokenize(llama_model_get_vocab(model), text.c_str(), (int) text.size(), toks.data(),
                                 (int) toks.size(), true, false);
    if (n < n_tokens) {
        die("the text is too short");
    }
    for (int i = 0; i < n_tokens; i += n_batch) {
        if (llama_decode(ctx, llama_batch_get_one(toks.data() + i, std::min(n_batch, n_tokens - i)))) {
            die("llama_decode failed");
        }
    }

    const k_dump d = read_keys(ctx, n_tokens);
    FILE * f = fopen(argv[6], "wb");
    if (!f) {
        die("cannot write OUT");
    }
    const int32_t nl = (int32_t) d.rows.size();
    fwrite(&nl, sizeof nl, 1, f);
    fwrite(&n_tokens, sizeof n_tokens, 1, f);
    for (int32_t l = 0; l < nl; ++l) {
        const int32_t ne = d.n_embd[l];
        fwrite(&ne, sizeof ne, 1, f);
        fwrite(d.rows[l].data(), sizeof(float), (size_t) n_tokens * ne, f);
    }
    fclose(f);
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}
