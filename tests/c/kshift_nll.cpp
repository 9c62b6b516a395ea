// K-shift quality, measured as likelihood (issue #7): does re-roping a cached (quantized) K keep the
// model's predictions, and does it put the keys where a fresh prefill would? Public llama.h / ggml.h API;
// linked against the built static libs (tests/test_kv_features.py, test_kshift_keeps_likelihood).
//
//   kshift_nll MODEL TEXT CTK CTV [windows=8] [prefix=256] [cont=128] [start=96] [err=0] [threads=2]
//
// For each window of the text (BOS + prefix-1 tokens, then cont continuation tokens, + 1 target), on a
// context with the given K/V cache types (flash attention on, swa_full, one sequence):
//   ref      prefix at positions 0..P-1, continuation teacher-forced at P..P+C-1 (logits for all of it)
//   shifted  prefix at S..S+P-1; llama_memory_seq_add(seq 0, [S, S+P), -S + err) (the next decode runs the
//            K-shift: for a quantized K, dequantize -> RoPE -> quantize); continuation at P+err..
//   control  prefix at S..S+P-1, continuation at S+P.. with no shift: the same relative positions as ref, so
//            it separates the shift's own damage from the numeric effect of other absolute positions (and,
//            for a quantized K, from a different draw of the same quantization noise)
// err != 0 is a deliberately broken shift (sanity check): the cached keys end up roped err positions away
// from where the continuation sees them (the continuation starts at P+err, so the cells stay in order and
// nothing is masked; for q.k that is the same as a shift by the wrong amount).
// Unless CTK/CTV are f16/f16, a second context with an f16/f16 cache gives the f16 reference, so the cache
// type's own loss (KLD(f16 ref || ref)) can be set against the shift's.
//
// The keys: after ref and after shifted, the cached keys of the P prefix cells are read back (the sequence
// state, see read_keys) and dequantized; keys.rel_err = |K_shifted - K_ref| / |K_ref| over all layers, and
// keys.type_noise = the cache type's own relative round-trip error on Gaussian rows, for scale.
//
// Output: a line per window, then one JSON line (prefixed "RESULT ") with mean NLL of the continuation
// targets, mean KL divergences over all continuation positions (full-vocabulary softmax, nats/token),
// top-1 agreement rates and the key errors.
#include "ggml.h"
#include "llama.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#define TEST_PROGRAM "kshift_nll"
#include "llama_test_util.h"

struct window {
    std::vector<llama_token> tok;  // P + C + 1: BOS + prefix, continuation, the last target
};

// log-softmax rows for the C continuation positions
struct logprobs {
    int n_vocab = 0;
    std::vector<float> lp;
    const float * row(int j) const { return lp.data() + (size_t) j * n_vocab; }
};

struct pair_stats {
    double kld = 0.0;
    long   top1 = 0;
    long   n = 0;
    void add(const logprobs & p, const logprobs & q, int n_rows) {
        for (int j = 0; j < n_rows; ++j) {
            const float * a = p.row(j);
            const float * b = q.row(j);
            double s = 0.0;
            int    ia = 0, ib = 0;
            for (int v = 0; v < p.n_vocab; ++v) {
                if (a[v] > -80.0f) {  // exp(-80) adds nothing
                    s += std::exp((double) a[v]) * ((double) a[v] - (double) b[v]);
                }
                if (a[v] > a[ia]) ia = v;
                if (b[v] > b[ib]) ib = v;
            }
            kld += std::max(s, 0.0);
            top1 += ia == ib;
            n += 1;
        }
    }
    double mean_kld() const { return n ? kld / n : 0.0; }
    double top1_rate() const { return n ? (double) top1 / n : 0.0; }
};


// relative L2 error of the cached prefix keys a against b, over all layers (and the worst layer)
struct k_stats {
    double err2 = 0.0, ref2 = 0.0, worst = 0.0;
    bool   pos_ok = true;
    void add(const k_dump & a, const k_dump & b, int n_cells, int pos_a0, int pos_b0) {
        if (a.rows.size() != b.rows.size()) die("key dumps of different models?");
        for (size_t l = 0; l < a.rows.size(); ++l) {
            double e = 0.0, r = 0.0;
            const size_t n = (size_t) n_cells * a.n_embd[l];
            for (size_t i = 0; i < n; ++i) {
                const double d = (double) a.rows[l][i] - (double) b.rows[l][i];
                e += d * d;
                r += (double) b.rows[l][i] * b.rows[l][i];
            }
            for (int c = 0; c < n_cells; ++c) {
                pos_ok = pos_ok && a.pos[l][c] == pos_a0 + c && b.pos[l][c] == pos_b0 + c;
            }
            err2 += e;
            ref2 += r;
            worst = std::max(worst, std::sqrt(e / std::max(r, 1e-30)));
        }
    }
    double rel() const { return std::sqrt(err2 / std::max(ref2, 1e-30)); }
};

// the cache type's own round-trip error on unit Gaussian rows: its relative quantization noise
static double type_noise(ggml_type t, int ne) {
    const auto * tr = ggml_get_type_traits(t);
    if (!tr->from_float_ref || !tr->to_float) return 0.0;
    std::vector<float> x((size_t) 64 * ne), y(x.size());
    std::vector<uint8_t> q(ggml_row_size(t, ne) * 64);
    uint64_t st = 0x9E3779B97F4A7C15ull;
    for (size_t i = 0; i < x.size(); i += 2) {  // Box-Muller
        auto u = [&]() { st = st * 6364136223846793005ull + 1442695040888963407ull; return ((st >> 11) + 0.5) / 9007199254740992.0; };
        const double r = std::sqrt(-2.0 * std::log(u())), a = 6.283185307179586 * u();
        x[i] = (float) (r * std::cos(a));
        x[i + 1] = (float) (r * std::sin(a));
    }
    double e = 0.0, n = 0.0;
    for (int row = 0; row < 64; ++row) {
        uint8_t * qr = q.data() + row * ggml_row_size(t, ne);
        tr->from_float_ref(x.data() + (size_t) row * ne, qr, ne);
        tr->to_float(qr, y.data() + (size_t) row * ne, ne);
    }
    for (size_t i = 0; i < x.size(); ++i) {
        e += (double) (x[i] - y[i]) * (x[i] - y[i]);
        n += (double) x[i] * x[i];
    }
    return std::sqrt(e / n);
}

struct nll_stats {
    double sum = 0.0;
    long   n = 0;
    double mean() const { return n ? sum / n : 0.0; }
};

class runner {
  public:
    runner(llama_model * model, ggml_type tk, ggml_type tv, int n_ctx, int threads) : model(model) {
        llama_context_params cp = llama_context_default_params();
        cp.n_ctx           = n_ctx;
        cp.n_batch         = n_ctx;
        cp.n_ubatch        = n_ctx;
        cp.n_seq_max       = 1;
        cp.n_threads       = threads;
        cp.n_threads_batch = threads;
        cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_ENABLED;
        cp.type_k          = tk;
        cp.type_v          = tv;
        cp.swa_full        = true;  // Gemma 3: every cell stays in the SWA layers' cache too
        cp.no_perf         = true;
        ctx = llama_init_from_model(model, cp);
        if (!ctx) die("llama_init_from_model failed (cache types?)");
        n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
        batch = llama_batch_init(n_ctx, 0, 1);
    }
    ~runner() {
        llama_batch_free(batch);
        llama_free(ctx);
    }

    void clear() { llama_memory_clear(llama_get_memory(ctx), true); }

    void decode(const llama_token * t, int n, int pos0, bool logits) {
        batch.n_tokens = n;
        for (int i = 0; i < n; ++i) {
            batch.token[i]     = t[i];
            batch.pos[i]       = pos0 + i;
            batch.n_seq_id[i]  = 1;
            batch.seq_id[i][0] = 0;
            batch.logits[i]    = logits;
        }
        const int rc = llama_decode(ctx, batch);
        if (rc != 0) {
            fprintf(stderr, "kshift_nll: llama_decode returned %d\n", rc);
            exit(1);
        }
    }

    // the continuation's log-probs and NLL of its targets
    void collect(const window & w, int P, int C, logprobs & out, nll_stats & nll) {
        out.n_vocab = n_vocab;
        out.lp.resize((size_t) C * n_vocab);
        for (int j = 0; j < C; ++j) {
            const float * lg = llama_get_logits_ith(ctx, j);
            if (!lg) die("no logits");
            float * o = out.lp.data() + (size_t) j * n_vocab;
            float mx = lg[0];
            for (int v = 1; v < n_vocab; ++v) mx = std::max(mx, lg[v]);
            double s = 0.0;
            for (int v = 0; v < n_vocab; ++v) s += std::exp((double) (lg[v] - mx));
            const float lse = mx + (float) std::log(s);
            for (int v = 0; v < n_vocab; ++v) o[v] = lg[v] - lse;
            nll.sum -= o[w.tok[P + j + 1]];
            nll.n += 1;
        }
    }

    // mode: 0 ref, 1 shifted, 2 control
    void run(const window & w, int mode, int P, int C, int S, int err, logprobs & out, nll_stats & nll) {
        clear();
        const llama_token * t = w.tok.data();
        if (mode == 0) {
            decode(t, P, 0, false);
            decode(t + P, C, P, true);
        } else if (mode == 1) {
            decode(t, P, S, false);
            llama_memory_seq_add(llama_get_memory(ctx), 0, S, S + P, -S + err);
            decode(t + P, C, P + err, true);
        } else {
            decode(t, P, S, false);
            decode(t + P, C, S + P, true);
        }
        collect(w, P, C, out, nll);
    }

    llama_context * context() { return ctx; }

  private:
    llama_model *   model;
    llama_context * ctx = nullptr;
    llama_batch     batch;
    int             n_vocab = 0;
};

int main(int argc, char ** argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: %s MODEL TEXT CTK CTV [windows=8] [prefix=256] [cont=128] [start=96] [err=0] [threads=2]\n", argv[0]);
        return 2;
    }
    std::map<std::string, int> opt = {{"windows", 8}, {"prefix", 256}, {"cont", 128}, {"start", 96}, {"err", 0}, {"threads", 2}};
    for (int i = 5; i < argc; ++i) {
        const char * eq = strchr(argv[i], '=');
        if (!eq || !opt.count(std::string(argv[i], eq - argv[i]))) {
            fprintf(stderr, "kshift_nll: bad option '%s'\n", argv[i]);
            return 2;
        }
        opt[std::string(argv[i], eq - argv[i])] = atoi(eq + 1);
    }
    const int W = opt["windows"], P = opt["prefix"], C = opt["cont"], S = opt["start"], E = opt["err"];
    if (W < 1 || P < 2 || C < 1 || S < 1 || E < 0) die("bad sizes");
    const std::string ctk = argv[3], ctv = argv[4];
    const ggml_type tk = type_by_name(ctk), tv = type_by_name(ctv);
    const bool is_f16 = tk == GGML_TYPE_F16 && tv == GGML_TYPE_F16;
    // n_ctx is the number of cells, a multiple of 256 (turbo caches want multiples of 128). Gemma 3's
    // local layers mask by distance (n_swa = 512): P + C <= 512 keeps them from masking anything
    const int max_pos = std::max(S + P + C, P + E + C);
    const int n_ctx   = ((P + C + 255) / 256) * 256;

    llama_log_set(quiet_log, nullptr);
    llama_backend_init();

    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    llama_model * model = llama_model_load_from_file(argv[1], mp);
    if (!model) die("cannot load the model");
    const llama_vocab * vocab = llama_model_get_vocab(model);

    // the windows: W slices spread evenly over the middle of the text, each starting at a line
    std::ifstream f(argv[2], std::ios::binary);
    if (!f) die("cannot read the text");
    std::stringstream ss;
    ss << f.rdbuf();
    const std::string text = ss.str();
    std::vector<window> windows;
    const int need = P + C + 1;
    for (int k = 0; k < W; ++k) {
        size_t off = text.size() / 10 + (text.size() * 8 / 10) * k / W;
        off = text.find('\n', off);
        if (off == std::string::npos) die("text too short");
        off += 1;
        window w;
        for (size_t len = (size_t) need * 6; ; len *= 2) {
            const std::string piece = text.substr(off, len);
            std::vector<llama_token> t(piece.size() + 8);
            const int n = llama_tokenize(vocab, piece.data(), (int) piece.size(), t.data(), (int) t.size(), true, false);
            if (n < 0) die("tokenize failed");
            if (n > need || off + len >= text.size()) {  // n > need: the last token may be cut off
                if (n <= need) die("text too short");
                t.resize(need);
                w.tok = t;
                break;
            }
        }
        windows.push_back(std::move(w));
    }

    const auto t0 = std::chrono::steady_clock::now();
    runner * f16 = is_f16 ? nullptr : new runner(model, GGML_TYPE_F16, GGML_TYPE_F16, n_ctx, opt["threads"]);
    runner   tc(model, tk, tv, n_ctx, opt["threads"]);

    logprobs   lp_f16, lp_ref, lp_sh, lp_ctl;
    nll_stats  nll_f16, nll_ref, nll_sh, nll_ctl;
    pair_stats ref_f16, sh_f16, ctl_f16, sh_ref, ctl_ref;
    k_stats    kerr;  // the shifted prefix keys against the ones a fresh prefill at 0.. caches
    for (int k = 0; k < W; ++k) {
        const window & w = windows[k];
        const double before[5] = {ref_f16.kld, sh_f16.kld, ctl_f16.kld, sh_ref.kld, ctl_ref.kld};
        nll_stats wr, ws, wc;
        tc.run(w, 0, P, C, S, E, lp_ref, wr);
        const k_dump k_ref = read_keys(tc.context(), P);
        if (f16) {
            f16->run(w, 0, P, C, S, E, lp_f16, nll_f16);
            ref_f16.add(lp_f16, lp_ref, C);
        }
        tc.run(w, 1, P, C, S, E, lp_sh, ws);
        kerr.add(read_keys(tc.context(), P), k_ref, P, E, 0);
        sh_ref.add(lp_ref, lp_sh, C);
        if (f16) sh_f16.add(lp_f16, lp_sh, C);
        tc.run(w, 2, P, C, S, E, lp_ctl, wc);
        ctl_ref.add(lp_ref, lp_ctl, C);
        if (f16) ctl_f16.add(lp_f16, lp_ctl, C);
        for (auto * p : {&wr, &ws, &wc}) {
            nll_stats & tot = p == &wr ? nll_ref : p == &ws ? nll_sh : nll_ctl;
            tot.sum += p->sum;
            tot.n += p->n;
        }
        const double after[5] = {ref_f16.kld, sh_f16.kld, ctl_f16.kld, sh_ref.kld, ctl_ref.kld};
        double d[5];
        for (int i = 0; i < 5; ++i) d[i] = (after[i] - before[i]) / C;
        if (is_f16) d[1] = d[3], d[2] = d[4];
        printf("window %d: nll ref %.4f shifted %.4f control %.4f | kld vs f16: ref %.5f shifted %.5f control %.5f"
               " | kld vs ref: shifted %.5f control %.5f | shifted keys: rel err %.4f (so far)\n", k, wr.mean(), ws.mean(),
               wc.mean(), d[0], d[1], d[2], d[3], d[4], kerr.rel());
        fflush(stdout);
    }
    if (is_f16) {
        nll_f16 = nll_ref;
        sh_f16  = sh_ref;
        ctl_f16 = ctl_ref;
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    printf("RESULT {\"ctk\": \"%s\", \"ctv\": \"%s\", \"windows\": %d, \"prefix\": %d, \"cont\": %d, \"start\": %d, "
           "\"err\": %d, \"max_pos\": %d, \"tokens\": %ld, "
           "\"nll\": {\"f16\": %.6f, \"ref\": %.6f, \"shifted\": %.6f, \"control\": %.6f}, "
           "\"kld\": {\"ref_vs_f16\": %.7f, \"shifted_vs_f16\": %.7f, \"control_vs_f16\": %.7f, "
           "\"shifted_vs_ref\": %.7f, \"control_vs_ref\": %.7f}, "
           "\"top1\": {\"ref_vs_f16\": %.5f, \"shifted_vs_f16\": %.5f, \"control_vs_f16\": %.5f, "
           "\"shifted_vs_ref\": %.5f, \"control_vs_ref\": %.5f}, "
           "\"keys\": {\"rel_err\": %.5f, \"worst_layer\": %.5f, \"positions_ok\": %s, \"type_noise\": %.5f}, "
           "\"seconds\": %.1f}\n",
           ctk.c_str(), ctv.c_str(), W, P, C, S, E, max_pos, nll_ref.n,
           nll_f16.mean(), nll_ref.mean(), nll_sh.mean(), nll_ctl.mean(),
           ref_f16.mean_kld(), sh_f16.mean_kld(), ctl_f16.mean_kld(), sh_ref.mean_kld(), ctl_ref.mean_kld(),
           is_f16 ? 1.0 : ref_f16.top1_rate(), sh_f16.top1_rate(), ctl_f16.top1_rate(), sh_ref.top1_rate(),
           ctl_ref.top1_rate(), kerr.rel(), kerr.worst, kerr.pos_ok ? "true" : "false",
           type_noise(tk, 256), secs);
    delete f16;
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
