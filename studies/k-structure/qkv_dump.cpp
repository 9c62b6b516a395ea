// Dump post-RoPE Q, K (f32, before the cache's f16 rounding) and V per layer for a text via cb_eval.
// usage: qkv_dump MODEL TEXTFILE NTOK OUTDIR   -> OUTDIR/{Qcur,Kcur,Vcur}-IL.f32 (row-major [ntok][n_head*256])
#include "llama.h"
#include "ggml.h"
#include "ggml-backend.h"
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>
#include <fstream>
#include <sstream>

static std::string g_out;
static bool cb(struct ggml_tensor * t, bool ask, void *) {
    const char * n = t->name;
    bool want = (!strncmp(n, "Qcur-", 5) || !strncmp(n, "Kcur-", 5) || !strncmp(n, "Vcur-", 5)) && t->type == GGML_TYPE_F32;
    if (ask) return want;
    if (!want) return true;
    std::vector<float> buf(ggml_nelements(t));
    if (!ggml_is_contiguous(t)) { fprintf(stderr, "non-contiguous %s\n", n); return true; }
    ggml_backend_tensor_get(t, buf.data(), 0, ggml_nbytes(t));
    FILE * f = fopen((g_out + "/" + n + ".f32").c_str(), "ab");
    fwrite(buf.data(), sizeof(float), buf.size(), f); fclose(f);
    return true;
}

int main(int argc, char ** argv) {
    if (argc < 5) { fprintf(stderr, "usage\n"); return 1; }
    g_out = argv[4];
    int ntok = atoi(argv[3]);
    std::ifstream in(argv[2]); std::stringstream ss; ss << in.rdbuf(); std::string text = ss.str();
    llama_backend_init();
    auto mp = llama_model_default_params();
    llama_model * model = llama_model_load_from_file(argv[1], mp);
    const llama_vocab * vocab = llama_model_get_vocab(model);
    std::vector<llama_token> toks(text.size() + 16);
    int n = llama_tokenize(vocab, text.c_str(), text.size(), toks.data(), toks.size(), true, false);
    toks.resize(std::min(n, ntok));
    auto cp = llama_context_default_params();
    cp.n_ctx = 4096; cp.n_batch = toks.size(); cp.n_ubatch = toks.size(); cp.n_threads = 2; cp.n_threads_batch = 2;
    cp.cb_eval = cb; cp.cb_eval_user_data = nullptr;
    cp.type_k = GGML_TYPE_F16; cp.type_v = GGML_TYPE_F16;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_ENABLED;
    llama_context * ctx = llama_init_from_model(model, cp);
    llama_batch b = llama_batch_get_one(toks.data(), toks.size());
    if (llama_decode(ctx, b)) { fprintf(stderr, "decode failed\n"); return 1; }
    FILE * f = fopen((g_out + "/tokens.i32").c_str(), "wb"); fwrite(toks.data(), 4, toks.size(), f); fclose(f);
    fprintf(stderr, "dumped %zu tokens\n", toks.size());
    llama_free(ctx); llama_model_free(model);
    return 0;
}
