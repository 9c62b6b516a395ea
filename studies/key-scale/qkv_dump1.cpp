// Dump the final Qcur/Kcur/Vcur of every layer for the first N tokens of a text (one ubatch).
//   qkv_dump MODEL TEXT CTK N OUT
#include "ggml.h"
#include "ggml-backend.h"
#include "llama.h"
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>
#include <algorithm>
struct rec { std::vector<int64_t> ne; std::vector<float> d; };
static std::map<std::string, rec> g;
static bool cb(ggml_tensor * t, bool ask, void *) {
    const char * n = t->name;
    bool m = (!strncmp(n, "Qcur-", 5) || !strncmp(n, "Kcur-", 5) || !strncmp(n, "Vcur-", 5)) && t->type == GGML_TYPE_F32;
    if (ask) return m;
    if (!m) return true;
    rec r; r.ne = {t->ne[0], t->ne[1], t->ne[2], t->ne[3]};
    r.d.resize(ggml_nelements(t));
    if (!ggml_is_contiguous(t)) { return true; }
    ggml_backend_tensor_get(t, r.d.data(), 0, ggml_nbytes(t));
    g[n] = std::move(r);
    return true;
}
static void quiet(ggml_log_level, const char *, void *) {}
int main(int argc, char ** argv) {
    if (argc < 6) { fprintf(stderr, "usage\n"); return 1; }
    int N = atoi(argv[4]);
    llama_backend_init();
    llama_log_set(quiet, nullptr);
    llama_model * model = llama_model_load_from_file(argv[1], llama_model_default_params());
    auto cp = llama_context_default_params();
    cp.n_ctx = N; cp.n_batch = N; cp.n_ubatch = N;
    ggml_type tk = GGML_TYPE_F16;
    for (int t = 0; t < GGML_TYPE_COUNT; ++t) { const char * nm = ggml_type_name((ggml_type) t); if (nm && !strcmp(nm, argv[3])) tk = (ggml_type) t; }
    cp.type_k = tk; cp.type_v = GGML_TYPE_F16;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_ENABLED;
    cp.n_threads = 2; cp.n_threads_batch = 2; cp.swa_full = true;
    cp.cb_eval = cb; cp.cb_eval_user_data = nullptr;
    llama_context * ctx = llama_init_from_model(model, cp);
    g.clear();
    std::ifstream in(argv[2]); std::stringstream ss; ss << in.rdbuf();
    std::string text = ss.str().substr(0, 16 * (size_t) N);
    std::vector<llama_token> toks(text.size() + 2);
    int n = llama_tokenize(llama_model_get_vocab(model), text.c_str(), text.size(), toks.data(), toks.size(), true, false);
    if (n < N) { fprintf(stderr, "short\n"); return 1; }
    if (llama_decode(ctx, llama_batch_get_one(toks.data(), N))) { fprintf(stderr, "decode\n"); return 1; }
    llama_synchronize(ctx);
    FILE * f = fopen(argv[5], "wb");
    int32_t cnt = g.size(); fwrite(&cnt, 4, 1, f);
    for (auto & [name, r] : g) {
        int32_t L = name.size(); fwrite(&L, 4, 1, f); fwrite(name.data(), 1, L, f);
        fwrite(r.ne.data(), 8, 4, f); fwrite(r.d.data(), 4, r.d.size(), f);
    }
    fclose(f);
    fprintf(stderr, "%d tensors\n", cnt);
    return 0;
}
