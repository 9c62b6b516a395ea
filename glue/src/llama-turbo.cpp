#include "llama-turbo.h"

#include "llama-context.h"
#include "llama-graph.h"
#include "llama-impl.h"
#include "llama-kv-cache.h"
#include "llama-kv-cache-iswa.h"
#include "llama-model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

// what the probe sets on a context of its own: its eval callback and graph reuse (a friend of llama_context)
struct llama_turbo {
    static void set_eval_cb(llama_context & ctx, ggml_backend_sched_eval_callback cb, void * user_data) {
        ctx.cparams.cb_eval           = cb;
        ctx.cparams.cb_eval_user_data = user_data;
    }
    static void disable_graph_reuse(llama_context & ctx) {
        ctx.graph_reuse_disable = true;
    }
};

//
// context: the switches
//

void llama_turbo_cparams_init(llama_turbo_cparams & tc, const llama_model & model, const llama_context_params & params) {
    const auto & hparams = model.hparams;

    // with a turbo K cache llm_graph_context::build_attn adds q to the graph with the attention instead
    // of before k and v, so that Q's RoPE sits right before the attention node, where ggml-cuda's turbo decode
    // attention does it as it loads q (one launch fewer per layer); TURBO_FUSE_ROPE_Q=0: upstream's order
    {
        const char * env = getenv("TURBO_FUSE_ROPE_Q");
        tc.q_late = !(env && strcmp(env, "0") == 0) &&
            ggml_is_turbo(params.type_k);
    }

    // rescale q/k norm gains per RoPE pair for a turbo K cache (llama_turbo_build_qk_gains)
    // TURBO_K_RESCALE: unset = on for turbo K, 0 = off, force = on for any K type (tests: q.k must not change)
    const char * turbo_k_env = getenv("TURBO_K_RESCALE");
    const bool   turbo_k_force = turbo_k_env && strcmp(turbo_k_env, "force") == 0;
    if (ggml_is_turbo(params.type_k) || turbo_k_force) {
        const char * env = turbo_k_env;
        bool usable = model.arch == LLM_ARCH_GEMMA3 && hparams.n_layer() > 0 &&
                      (hparams.rope_type == LLAMA_ROPE_TYPE_NEOX || hparams.rope_type == LLAMA_ROPE_TYPE_NORM);
        for (uint32_t il = 0; usable && il < hparams.n_layer(); ++il) {
            const ggml_tensor * q = model.layers[il].attn_q_norm;
            const ggml_tensor * k = model.layers[il].attn_k_norm;
            usable = q && k && q->type == GGML_TYPE_F32 && k->type == GGML_TYPE_F32 &&
                     ggml_nelements(q) == ggml_nelements(k) && k->ne[0] == (int64_t) hparams.n_embd_head_k(il) &&
                     hparams.n_rot(il) == hparams.n_embd_head_k(il) && k->ne[0] % 2 == 0;
        }
        if (env && strcmp(env, "0") == 0) {
            LLAMA_LOG_INFO("%s: turbo K: q/k gain rescale off (TURBO_K_RESCALE=0); keys are stored as the model makes them\n", __func__);
        } else if (usable) {
            tc.k_rescale = true;
            LLAMA_LOG_INFO("%s: turbo K: q/k norm gains rescaled per RoPE pair (q*D, k/D; q.k unchanged) to flatten the keys\n", __func__);
        } else {
            LLAMA_LOG_INFO("%s: turbo K: no q/k norm gains to rescale for this model\n", __func__);
        }
    }

    // models without q/k norm gains whose graph takes q and k from build_qkv to RoPE (Llama, Qwen2):
    // the rescale's D from the probe's q and k energies instead (llama_turbo_setup, llama_turbo_build_qk_scale)
    if ((ggml_is_turbo(params.type_k) || turbo_k_force) && !(turbo_k_env && strcmp(turbo_k_env, "0") == 0) &&
        (model.arch == LLM_ARCH_LLAMA || model.arch == LLM_ARCH_QWEN2) && hparams.n_layer() > 0 &&
        (hparams.rope_type == LLAMA_ROPE_TYPE_NEOX || hparams.rope_type == LLAMA_ROPE_TYPE_NORM)) {
        bool usable = true;
        for (uint32_t il = 0; usable && il < hparams.n_layer(); ++il) {
            usable = !model.layers[il].attn_q_norm && !model.layers[il].attn_k_norm &&
                     hparams.n_rot(il) == hparams.n_embd_head_k(il) && hparams.n_embd_head_k(il) % 2 == 0;
        }
        tc.k_scale = usable;
    }
}

//
// context: the cache types for the model's heads
//

bool llama_turbo_init_types(const llama_model & model, llama_context_params & params) {
    // turbo K/V are read only by the flash-attention kernels, in whole blocks per head: 128 values, or
    // 64 for a model whose heads are 64-multiples but not 128-multiples (head_dim 64: the _64 form of the asked type,
    // the same codes with a 64-point rotation, its own codebook and one FP16 norm per 64 values)
    for (const bool is_k : { true, false }) {
        ggml_type & type = is_k ? params.type_k : params.type_v;
        if (!ggml_is_turbo(type)) {
            continue;
        }
        {
            bool all_128 = true, all_64 = true;
            uint32_t head_64 = 0;
            for (uint32_t il = 0; il < model.hparams.n_layer(); ++il) {
                const uint32_t head = is_k ? model.hparams.n_embd_head_k(il) : model.hparams.n_embd_head_v(il);
                all_128 = all_128 && head % 128 == 0;
                all_64  = all_64  && head % 64  == 0;
                head_64 = head_64 ? head_64 : (head % 128 != 0 ? head : 0);
            }
            const ggml_type type_64 = type == GGML_TYPE_TURBO3 ? GGML_TYPE_TURBO3_64 :
                                      type == GGML_TYPE_TURBO2 ? GGML_TYPE_TURBO2_64 :
                                      type == GGML_TYPE_TURBO4 ? GGML_TYPE_TURBO4_64 : type;
            if (!all_128 && all_64 && type_64 != type) {
                LLAMA_LOG_INFO("%s: %s %s cache on head_dim %u: 64-value blocks (%s), %.2f bits/value\n", __func__,
                               ggml_type_name(type), is_k ? "K" : "V", head_64, ggml_type_name(type_64),
                               8.0 * ggml_type_size(type_64) / ggml_blck_size(type_64));
                type = type_64;
            }
        }
        if (params.flash_attn_type == LLAMA_FLASH_ATTN_TYPE_AUTO) {
            LLAMA_LOG_INFO("%s: enabling flash_attn since it is required for the %s KV cache\n", __func__, ggml_type_name(type));
            params.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_ENABLED;
        }
        if (params.flash_attn_type == LLAMA_FLASH_ATTN_TYPE_DISABLED) {
            LLAMA_LOG_ERROR("%s: the %s KV cache requires flash attention: use -fa on (or auto)\n", __func__, ggml_type_name(type));
            return false;
        }
        uint32_t head_padded = 0; // a head of 65..127 values stored padded to 128 (llama_kv_head_stored)
        for (uint32_t il = 0; il < model.hparams.n_layer(); ++il) {
            const uint32_t head = is_k ? model.hparams.n_embd_head_k(il) : model.hparams.n_embd_head_v(il);
            if (llama_kv_head_stored(type, head) != head) {
                head_padded = head_padded ? head_padded : head;
                continue;
            }
            if (head % ggml_blck_size(type) != 0) {
                LLAMA_LOG_ERROR("%s: the %s %s cache stores whole blocks of 128 values per head (64 when every head is a "
                                "multiple of 64; heads of 65 to 127 values padded to 128), but this model has head_dim %u "
                                "(layer %u); use f16, q8_0 or q4_0 for %s with this model\n",
                                __func__, ggml_type_name(type), is_k ? "K" : "V", head, il, is_k ? "-ctk" : "-ctv");
                return false;
            }
        }
        if (head_padded) {
            const uint32_t stored = llama_kv_head_stored(type, head_padded);
            LLAMA_LOG_INFO("%s: turbo caches: %s %s head_dim %u padded to %u per head (x%.2f bytes, %.2f bits per value)\n",
                           __func__, ggml_type_name(type), is_k ? "K" : "V", head_padded, stored,
                           (double) stored/head_padded, 8.0*ggml_type_size(type)/ggml_blck_size(type)*stored/head_padded);
        }
    }
    return true;
}

//
// context: state files
//

bool llama_turbo_state_too_old(const char * func, const char * what, uint32_t version, uint32_t turbo_version) {
    if (version >= turbo_version) {
        return false;
    }
    LLAMA_LOG_ERROR("%s: %s version %u is older than this build's %u (it lacks turbo-llama's cache data); make it again\n",
                    func, what, version, turbo_version);
    return true;
}

//
// context: key offsets for a turbo K cache
//

// Ordinary prose and a little code: the mean key of a few hundred varied tokens stands in for the
// mean key of any text well (measured on Gemma 3: see turbo-llama results/k-structure.md).
static const char * TURBO_K_PROBE_TEXT =
    "The old harbour town wakes slowly. Fishing boats come back before sunrise, and the market fills with "
    "crates of ice, nets and the smell of salt. A teacher walks her class along the pier and asks the children "
    "to count the gulls; one of them answers forty-two, another insists it was only thirty. In the library a "
    "student reads about the history of navigation, from star charts to radio beacons, and writes notes in the "
    "margin. Meanwhile a programmer at the cafe fixes a bug:\n\n"
    "def mean(values):\n    if not values:\n        raise ValueError(\"empty\")\n    return sum(values) / len(values)\n\n"
    "She runs the tests again, they pass, and she orders another coffee. Later that afternoon the weather turns; "
    "rain moves in from the west, the ferry to the island is cancelled, and the radio reports wind speeds of 60 "
    "kilometres per hour. \"We will try again tomorrow,\" the captain says, and everyone goes home early.";

// What the probe measures, per layer: the keys as the graph makes them ("Kcur-<il>", f32 [n_embd_k_gqa] per token:
// sum and sum of squares per channel) and the queries ("Qcur-<il>": sum of squares per channel, for the per-pair
// scale of models without q/k norms). The probe is one ubatch, so the last "Kcur-<il>" node of a graph is the key as
// stored. A RoPE pair's energy does not change under RoPE, so either side of it serves the scale.
struct turbo_k_probe_stats {
    std::map<int, std::vector<double>> k_sum;
    std::map<int, std::vector<double>> k_sq;
    std::map<int, std::vector<double>> q_sq;
    std::map<int, int64_t>             k_rows;
    std::map<int, int64_t>             q_rows;
    std::map<int, std::vector<float>>  gain;   // a second pass: the first pass's q/k gains, in place while it ran
    int64_t skip = 0;   // leading rows not counted (BOS)
};

static bool turbo_k_probe_cb(ggml_tensor * t, bool ask, void * user_data) {
    int il = -1;
    char extra = 0;
    const bool is_k = sscanf(t->name, "Kcur-%d%c", &il, &extra) == 1 && il >= 0;
    const bool is_q = !is_k && sscanf(t->name, "Qcur-%d%c", &il, &extra) == 1 && il >= 0;
    const bool match = t->type == GGML_TYPE_F32 && ggml_is_contiguous(t) && (is_k || is_q);
    if (ask) {
        return match;
    }
    if (!match) {
        return true;
    }
    auto * st = (turbo_k_probe_stats *) user_data;
    const int64_t row = t->ne[0]*t->ne[1];
    const int64_t n   = ggml_nelements(t)/row;
    std::vector<float> buf(ggml_nelements(t));
    ggml_backend_tensor_get(t, buf.data(), 0, ggml_nbytes(t));
    std::vector<double> sum(row, 0.0), sq(row, 0.0);
    for (int64_t r = st->skip; r < n; ++r) {
        for (int64_t i = 0; i < row; ++i) {
            const double x = buf[r*row + i];
            sum[i] += x;
            sq[i]  += x*x;
        }
    }
    const int64_t rows = std::max<int64_t>(n - st->skip, 0);
    if (is_k) {
        st->k_sum[il]  = std::move(sum);
        st->k_sq[il]   = std::move(sq);
        st->k_rows[il] = rows;
    } else {
        st->q_sq[il]   = std::move(sq);
        st->q_rows[il] = rows;
    }
    return true;
}

// llama's INFO and DEBUG lines of the probe's own context are not shown (they would read like the user's context)
static void turbo_k_probe_log(ggml_log_level level, const char * text, void * user_data) {
    if (level == GGML_LOG_LEVEL_INFO || level == GGML_LOG_LEVEL_DEBUG || level == GGML_LOG_LEVEL_CONT) {
        return;
    }
    const auto * prev = (const std::pair<ggml_log_callback, void *> *) user_data;
    if (prev->first) {
        prev->first(level, text, prev->second);
    }
}

// the KV caches of a context (one, or the two of an iSWA cache); empty for other memory
static std::vector<llama_kv_cache *> turbo_kv_caches(const llama_context & ctx) {
    if (auto * kv = dynamic_cast<llama_kv_cache *>(ctx.get_memory())) {
        return { kv };
    }
    if (auto * kv_iswa = dynamic_cast<llama_kv_cache_iswa *>(ctx.get_memory())) {
        return { kv_iswa->get_base(), kv_iswa->get_swa() };
    }
    return {};
}

// the q/k gain factors D of the rescale (cparams.turbo.k_rescale), computed once from the norm weights and stored in
// the KV cache, so that graphs do not recompute them. No-op otherwise.
static void turbo_qk_gains(llama_context & ctx) {
    const llama_model & model = ctx.get_model();
    if (!ctx.get_cparams().turbo.k_rescale || !ctx.get_memory()) {
        return;
    }
    // TURBO_K_GAIN_ONCE=0: every graph computes D and applies it (the same f32 steps; for comparisons and tests)
    if (const char * e = getenv("TURBO_K_GAIN_ONCE"); e && strcmp(e, "0") == 0) {
        LLAMA_LOG_INFO("%s: turbo K: gain factors computed in every graph (TURBO_K_GAIN_ONCE=0)\n", __func__);
        return;
    }
    const auto caches = turbo_kv_caches(ctx);
    const bool neox = model.hparams.rope_type == LLAMA_ROPE_TYPE_NEOX;
    int n_set = 0;
    for (uint32_t il = 0; il < model.hparams.n_layer(); ++il) {
        const ggml_tensor * qw = model.layers[il].attn_q_norm;
        const ggml_tensor * kw = model.layers[il].attn_k_norm;
        if (!qw || !kw || qw->type != GGML_TYPE_F32 || kw->type != GGML_TYPE_F32 || ggml_nelements(qw) != ggml_nelements(kw) ||
            !qw->buffer || !kw->buffer || !qw->data || !kw->data) {
            continue;   // (a memory-estimate model has no weights to read; its graphs compute D themselves)
        }
        const int64_t n = ggml_nelements(kw), h = n/2;
        std::vector<float> gq(n), gk(n), d(n), w(2*n);
        ggml_backend_tensor_get(qw, gq.data(), 0, ggml_nbytes(qw));
        ggml_backend_tensor_get(kw, gk.data(), 0, ggml_nbytes(kw));
        // the graph's formula (llama_turbo_build_qk_gains) in the same f32 steps:
        // D^4 = (gk_a^2 + gk_b^2 + eps) / (gq_a^2 + gq_b^2 + eps) per RoPE pair (a, b)
        for (int64_t i = 0; i < h; ++i) {
            const int64_t a = neox ? i : 2*i, b = neox ? i + h : 2*i + 1;
            volatile float ka = gk[a]*gk[a], kb = gk[b]*gk[b], qa = gq[a]*gq[a], qb = gq[b]*gq[b];   // no fused multiply-add
            volatile float ek = ka + kb, eq = qa + qb;
            ek = ek + 1e-20f;
            eq = eq + 1e-20f;
            volatile float r = ek/eq;
            const float di = sqrtf(sqrtf(r));
            d[a] = di;
            d[b] = di;
        }
        // the norm weights with D applied, as the graph's ggml_mul / ggml_div would give them (no graph ops left):
        // q's in w[0, n), k's in w[n, 2n)
        for (int64_t i = 0; i < n; ++i) {
            volatile float wq = gq[i]*d[i], wk = gk[i]/d[i];
            w[i]     = wq;
            w[n + i] = wk;
        }
        for (auto * c : caches) {
            if (c->set_qk_gain(il, w.data(), w.size())) {
                ++n_set;
                break;
            }
        }
    }
    if (n_set > 0) {
        LLAMA_LOG_INFO("%s: turbo K: gain factors of %d layers computed once, with the q/k norm weights they scale (not in every graph)\n", __func__, n_set);
    }
}

// zero key offsets (their tensors start cleared); false where the cache has no offsets (not turbo K)
static bool turbo_k_neutral(llama_context & ctx) {
    const llama_model & model = ctx.get_model();
    bool has_off = false;
    for (auto * c : turbo_kv_caches(ctx)) {
        for (uint32_t il = 0; il < model.hparams.n_layer(); ++il) {
            const size_t n = model.hparams.n_embd_k_gqa(il);
            const std::vector<float> zero(n, 0.0f);
            has_off = c->set_k_off(il, zero.data(), n) || has_off;
        }
    }
    return has_off;
}

// One layer's key data from the probe's statistics: the offset and, for models without q/k norms (scale), the
// q/k gains [D (q's), 1/D (k's)] per channel of a head (empty otherwise). false where the probe saw no keys of il.
// D^8 = E[(k - m)_pair^2] / E[q_pair^2] per RoPE pair, each side averaged over its heads: half the power of the
// Cauchy-Schwarz optimum for an isotropic key error (D^4, 0007's gain rescale), which measured best on Qwen2.5
// 1.5B (turbo3 KLD 0.057 against 0.061 for D^4 and 0.079 without). Where the statistics come from a second pass
// that ran with gains in place (st.gain), its keys are already k/D: the offset is their mean.
static bool turbo_k_layer_data(const turbo_k_probe_stats & st, int il, const llama_hparams & hp, bool scale,
                               std::vector<float> & off, std::vector<float> & gain, double & share, double & spread) {
    const auto ks = st.k_sum.find(il);
    const auto kr = st.k_rows.find(il);
    if (ks == st.k_sum.end() || kr == st.k_rows.end() || kr->second <= 0 || il < 0 || (uint32_t) il >= hp.n_layer() ||
        ks->second.size() != hp.n_embd_k_gqa(il)) {
        return false;
    }
    const int64_t rows = kr->second;
    const int64_t nk   = (int64_t) ks->second.size();
    const auto &  ksq  = st.k_sq.at(il);
    std::vector<double> m(nk);
    double m2 = 0.0, e2 = 0.0;
    for (int64_t i = 0; i < nk; ++i) {
        m[i] = ks->second[i]/rows;
        m2  += m[i]*m[i];
        e2  += ksq[i]/rows;
    }
    share = e2 > 0 ? m2/e2 : 0.0;
    gain.clear();
    const int64_t hd = hp.n_embd_head_k(il);
    const auto fixed = st.gain.find(il);
    const auto qit   = st.q_sq.find(il);
    bool scaled_keys = false;
    if (fixed != st.gain.end()) {
        gain = fixed->second;
        scaled_keys = true;
        const auto mm = std::minmax_element(gain.begin(), gain.begin() + hd);
        spread = std::log((double) *mm.second / *mm.first);
    } else if (scale && qit != st.q_sq.end() && st.q_rows.at(il) > 0 && hd > 0 && nk % hd == 0 &&
               (int64_t) qit->second.size() % hd == 0) {
        const int64_t n_kv = nk/hd, n_q = (int64_t) qit->second.size()/hd, h = hd/2;
        const bool neox = hp.rope_type == LLAMA_ROPE_TYPE_NEOX;
        gain.assign(2*hd, 1.0f);
        double lo = 1e30, hi = 0.0;
        for (int64_t j = 0; j < h; ++j) {
            const int64_t a = neox ? j : 2*j, b = neox ? j + h : 2*j + 1;
            double ek = 0.0, eq = 0.0;
            for (int64_t g = 0; g < n_kv; ++g) {
                for (const int64_t c : { g*hd + a, g*hd + b }) {
                    ek += ksq[c]/rows - m[c]*m[c];
                }
            }
            for (int64_t g = 0; g < n_q; ++g) {
                eq += (qit->second[g*hd + a] + qit->second[g*hd + b])/st.q_rows.at(il);
            }
            ek /= n_kv;
            eq /= n_q;
            const double d = ek > 1e-30 && eq > 1e-30 ? std::pow(ek/eq, 0.125) : 1.0;
            gain[a] = gain[b] = (float) d;
            gain[hd + a] = gain[hd + b] = (float) (1.0/d);
            lo = std::min(lo, d);
            hi = std::max(hi, d);
        }
        spread = std::log(hi/lo);
    }
    off.resize(nk);
    for (int64_t i = 0; i < nk; ++i) {
        off[i] = (float) (gain.empty() || scaled_keys ? m[i] : m[i]*gain[hd + i % hd]);
    }
    return true;
}

// each probed layer's key offset and (models without q/k norms) q/k weights of the rescale, set on the context's
// turbo K caches; returns the layers given an offset and adds to the counts (llama_turbo_setup's log)
static int turbo_k_apply(llama_context & ctx, const turbo_k_probe_stats & st, std::map<int, std::vector<float>> * gains_set,
                         int & n_scale, double & share, double & spread) {
    const llama_model & model = ctx.get_model();
    int n_off = 0;
    for (const auto & kv : st.k_sum) {
        const int il = kv.first;
        std::vector<float> off, gain;
        double sh = 0.0, sp = 0.0;
        if (!turbo_k_layer_data(st, il, model.hparams, ctx.get_cparams().turbo.k_scale, off, gain, sh, sp)) {
            continue;
        }
        for (auto * c : turbo_kv_caches(ctx)) {
            if (c->set_k_off(il, off.data(), off.size())) {
                ++n_off;
                share += sh;
                if (!gain.empty() && c->set_qk_gain(il, gain.data(), gain.size())) {
                    ++n_scale;
                    spread += sp;
                    if (gains_set) {
                        (*gains_set)[il] = gain;
                    }
                }
                break;
            }
        }
    }
    return n_off;
}

// Decode the probe text on a context of its own: 512 cells and one ubatch of at most 512 tokens, the same cache
// types, nothing else of the caller's sizes, so the result does not depend on -c, -b or -ub. false + why on failure.
static bool turbo_k_run_probe(llama_context & ctx, const llama_context_params & params, turbo_k_probe_stats & st,
                              std::string & why, int32_t & n_tok) {
    const llama_model & model = ctx.get_model();
    const int32_t n_max = 512;
    const llama_vocab * vocab = &model.vocab;
    const int32_t len = (int32_t) strlen(TURBO_K_PROBE_TEXT);
    std::vector<llama_token> tokens(len + 8);
    int32_t n = llama_tokenize(vocab, TURBO_K_PROBE_TEXT, len, tokens.data(), (int32_t) tokens.size(), true, false);
    if (n < 0) {
        // byte-level vocabularies can need more tokens than the text has characters: -n is the count they need
        tokens.resize(-n);
        n = llama_tokenize(vocab, TURBO_K_PROBE_TEXT, len, tokens.data(), (int32_t) tokens.size(), true, false);
    }
    if (n < 0) {
        why = "the probe text does not tokenize";
        return false;
    }
    n = std::min(n, n_max);
    if (n < 32) {
        why = "the probe text is only " + std::to_string(n) + " tokens";
        return false;
    }
    tokens.resize(n);
    n_tok = n;

    llama_context_params p = params;
    p.n_ctx     = n_max;
    p.n_batch   = n_max;
    p.n_ubatch  = n_max;
    p.n_seq_max = 1;
    p.n_rs_seq  = 0;
    p.n_outputs_max         = 0;
    p.n_outputs_max_per_seq = 0;
    p.ctx_type   = llama_context_default_params().ctx_type;
    p.cb_eval    = nullptr;
    p.cb_eval_user_data   = nullptr;
    p.abort_callback      = nullptr;
    p.abort_callback_data = nullptr;
    p.embeddings = false;
    p.no_perf    = true;
    p.swa_full   = params.swa_full;   // the same layers keep turbo keys as in the caller's cache (q8_0 in window layers)
    p.kv_unified = true;
    p.samplers   = nullptr;
    p.n_samplers = 0;
    p.ctx_other  = nullptr;

    std::pair<ggml_log_callback, void *> prev { nullptr, nullptr };
    llama_log_get(&prev.first, &prev.second);
    llama_log_set(turbo_k_probe_log, &prev);
    std::unique_ptr<llama_context> tmp;
    int ret = -1;
    try {
        tmp.reset(new llama_context(model, p));
        turbo_qk_gains(*tmp);
        turbo_k_neutral(*tmp);
        st.skip = llama_vocab_get_add_bos(vocab) ? 1 : 0;
        llama_turbo::set_eval_cb(*tmp, turbo_k_probe_cb, &st);
        ret = tmp->decode(llama_batch_get_one(tokens.data(), n));
        tmp->synchronize();
        // models without q/k norms: the first pass decoded through raw turbo keys, so from layer 1 on its queries
        // and keys come from a degraded forward pass; a second pass with the first pass's offsets and D in place
        // measures the offsets again (D stays the first pass's). Gemma keeps one pass: a second measured no better
        // (two passes vs one: turbo3 KLD 0.0412 vs 0.0413, turbo2 0.1884 vs 0.1842; 4 chunks, CPU)
        if (ret == 0 && tmp->get_cparams().turbo.k_scale) {
            turbo_k_probe_stats st2;
            st2.skip = st.skip;
            int n_scale = 0;
            double share = 0.0, spread = 0.0;
            turbo_k_apply(*tmp, st, &st2.gain, n_scale, share, spread);
            llama_memory_clear(tmp->get_memory(), true);
            llama_turbo::disable_graph_reuse(*tmp);   // a new graph: it has the q/k scale now, and the callback's new data
            llama_turbo::set_eval_cb(*tmp, turbo_k_probe_cb, &st2);
            ret = tmp->decode(llama_batch_get_one(tokens.data(), n));
            tmp->synchronize();
            st = std::move(st2);
        }
    } catch (...) {
        llama_log_set(prev.first, prev.second);
        throw;
    }
    llama_log_set(prev.first, prev.second);
    if (ret != 0) {
        why = "the probe's decode returned " + std::to_string(ret);
        return false;
    }
    return true;
}

void llama_turbo_setup(llama_context & ctx, const llama_context_params & params) {
    turbo_qk_gains(ctx);
    if (!(ctx.get_model().hparams.n_layer() > 0 && ctx.get_memory())) {
        return;
    }
    if (!turbo_k_neutral(ctx)) {
        return;   // no turbo K cache (or a memory-estimate context without buffers)
    }
    const char * off_env = getenv("TURBO_K_OFFSET");
    if (off_env && strcmp(off_env, "0") == 0) {
        LLAMA_LOG_INFO("%s: turbo K: key offsets off (TURBO_K_OFFSET=0)\n", __func__);
        return;
    }

    turbo_k_probe_stats st;
    std::string why;
    int32_t n_tok = 0;
    bool ok = false;
    try {
        ok = turbo_k_run_probe(ctx, params, st, why, n_tok);
    } catch (const std::exception & e) {
        why = std::string("the probe failed: ") + e.what();
    } catch (...) {
        why = "the probe failed";
    }
    if (ok && st.k_sum.empty()) {
        ok  = false;
        why = "the probe saw no keys";
    }
    if (!ok) {
        LLAMA_LOG_WARN("%s: turbo K: no key offsets (%s); keys are stored as the model makes them\n", __func__, why.c_str());
        return;
    }

    int n_scale = 0;
    double share = 0.0, spread = 0.0;
    const int n_off = turbo_k_apply(ctx, st, nullptr, n_scale, share, spread);
    LLAMA_LOG_INFO("%s: turbo K: key offsets from a %d-token probe on %d layers (the offset is %.0f%% of the key energy "
                   "on average; softmax ignores it), decoded on a context of its own (the same for any -c, -b, -ub)\n",
                   __func__, n_tok, n_off, n_off ? 100.0*share/n_off : 0.0);
    if (n_scale > 0) {
        LLAMA_LOG_INFO("%s: turbo K: q/k scaled per RoPE pair from the same probe on %d layers (q*D, k/D; q.k unchanged; "
                       "D^8 = key/query energy of the pair; max/min D %.1f on average; offsets from a second probe pass with D in place)\n",
                       __func__, n_scale, std::exp(spread/n_scale));
    }
}


//
// graph
//

// layer il's q/k weights of the key transform (kv_layer::qk_gain), null until the context sets them;
// *transformed: whether the layer's keys take the transform at all (not where a turbo K cache keeps q8_0 keys)
static ggml_tensor * turbo_qk_gain_of(const llama_memory_context_i * mctx, int il, bool * transformed) {
    ggml_tensor * dc = nullptr;
    *transformed = true;
    if (const auto * c = dynamic_cast<const llama_kv_cache_context *>(mctx)) {
        dc = c->get_qk_gain(il);
        *transformed = c->has_qk_gain(il);
    } else if (const auto * ci = dynamic_cast<const llama_kv_cache_iswa_context *>(mctx)) {
        dc = ci->get_base()->get_qk_gain(il);
        dc = dc ? dc : ci->get_swa()->get_qk_gain(il);
        *transformed = ci->get_base()->has_qk_gain(il) || ci->get_swa()->has_qk_gain(il);
    }
    return dc;
}

// The rescaled weights join the graph before the norms they multiply: else their view (or op) nodes land between
// each RMS_NORM and its MUL, and ggml-cuda's RMS_NORM+MUL+ROPE fusion, which wants the three in a row, leaves
// Gemma 3's q and k as six launches per layer instead of two (+140 us of kernel time per token)
static void turbo_expand_qk_gains(const llm_graph_context & g, ggml_tensor * q_norm_w, ggml_tensor * k_norm_w) {
    ggml_build_forward_expand(g.gf, q_norm_w);
    ggml_build_forward_expand(g.gf, k_norm_w);
}

void llama_turbo_build_qk_gains(const llm_graph_context & g, ggml_tensor *& q_norm_w, ggml_tensor *& k_norm_w, int il) {
    if (!g.cparams.turbo.k_rescale || !q_norm_w || !k_norm_w) {
        return;
    }
    ggml_context * ctx0 = g.ctx0;
    // the weights with D applied, computed once per context (turbo_qk_gains, stored beside the key offsets): views,
    // no graph ops (the two ops of D's multiply and divide cost ~5% of a Gemma 3 270M token on the GPU)
    bool transformed = true;   // whether this layer's keys take the transform (not where a turbo K cache keeps q8_0 keys)
    ggml_tensor * dc = turbo_qk_gain_of(g.mctx, il, &transformed);
    if (!transformed) {
        return;
    }
    if (dc && ggml_nelements(dc) == 2*k_norm_w->ne[0]) {
        const int64_t n = k_norm_w->ne[0];
        q_norm_w = ggml_view_1d(ctx0, dc, n, 0);
        k_norm_w = ggml_view_1d(ctx0, dc, n, n*ggml_element_size(dc));
        turbo_expand_qk_gains(g, q_norm_w, k_norm_w);
        return;
    }
    // otherwise (before the context has set them, e.g. while reserving) the same D from the weights, in the graph:
    // D^4 = (gk_a^2 + gk_b^2) / (gq_a^2 + gq_b^2) over each RoPE pair (a, b): D^2 is the ratio of the pair's
    // key gain to its query gain, which minimises |q*D| |k/D|, the scale of a norm-relative key error in q.k.
    // D is equal on both members of a pair, so it commutes with RoPE and with a later K-shift.
    const int64_t n   = k_norm_w->ne[0];
    const int64_t h   = n/2;
    const size_t  es  = ggml_element_size(k_norm_w);
    const float   eps = 1e-20f; // a dead pair (both gains 0) gets D = 1
    auto pair_energy = [&](ggml_tensor * w) {
        ggml_tensor * a;
        ggml_tensor * b;
        if (g.rope_type == LLAMA_ROPE_TYPE_NEOX) { // pairs (i, i + n/2)
            a = ggml_view_1d(ctx0, w, h, 0);
            b = ggml_view_1d(ctx0, w, h, h*es);
        } else {                                   // pairs (2i, 2i + 1)
            a = ggml_view_2d(ctx0, w, 1, h, 2*es, 0);
            b = ggml_view_2d(ctx0, w, 1, h, 2*es, es);
        }
        return ggml_scale_bias(ctx0, ggml_add(ctx0, ggml_sqr(ctx0, a), ggml_sqr(ctx0, b)), 1.0f, eps);
    };
    ggml_tensor * d = ggml_sqrt(ctx0, ggml_sqrt(ctx0, ggml_div(ctx0, pair_energy(k_norm_w), pair_energy(q_norm_w))));
    // back to one factor per channel: [h] -> [n] (NEOX halves) or [1, h] -> [2, h] -> [n] (interleaved)
    d = ggml_reshape_1d(ctx0, ggml_concat(ctx0, d, d, 0), n);
    g.cb(d, "turbo_k_gain", il);
    q_norm_w = ggml_mul(ctx0, q_norm_w, d);
    k_norm_w = ggml_div(ctx0, k_norm_w, d);
    turbo_expand_qk_gains(g, q_norm_w, k_norm_w);
}

// Exact for attention, and D is equal on both members of a pair, so it commutes with RoPE and a later K-shift.
// Until the probe has set D (reserve, the probe itself): nothing.
void llama_turbo_build_qk_scale(const llm_graph_context & g, ggml_tensor *& q, ggml_tensor *& k,
                                int64_t n_embd_head_q, int64_t n_embd_head_k, int il) {
    if (!g.cparams.turbo.k_scale) {
        return;
    }
    bool transformed = true;
    ggml_tensor * dc = turbo_qk_gain_of(g.mctx, il, &transformed);
    if (transformed && dc && n_embd_head_q == n_embd_head_k && ggml_nelements(dc) == 2*n_embd_head_k) {
        q = ggml_mul(g.ctx0, q, ggml_view_1d(g.ctx0, dc, n_embd_head_k, 0));
        k = ggml_mul(g.ctx0, k, ggml_view_1d(g.ctx0, dc, n_embd_head_k, n_embd_head_k*ggml_element_size(dc)));
    }
}

// q.k is unchanged by q's zero padding, and kq_scale stays the caller's 1/sqrt(real head_dim)
ggml_tensor * llama_turbo_attn_pad_q(ggml_context * ctx, ggml_tensor * q, const ggml_tensor * k) {
    if (ggml_is_turbo(k->type) && k->ne[0] > q->ne[0]) {
        q = ggml_pad(ctx, q, k->ne[0] - q->ne[0], 0, 0, 0);
    }
    return q;
}

ggml_tensor * llama_turbo_attn_unpad(ggml_context * ctx, ggml_tensor * cur, const ggml_tensor * v, const ggml_tensor * v_mla,
                                     int64_t n_embd_head_v) {
    if (ggml_is_turbo(v->type) && !v_mla && cur->ne[0] > n_embd_head_v &&
        cur->ne[0] == llama_kv_head_stored(v->type, n_embd_head_v)) {
        cur = ggml_cont(ctx, ggml_view_4d(ctx, cur, n_embd_head_v, cur->ne[1], cur->ne[2], cur->ne[3],
                                          cur->nb[1], cur->nb[2], cur->nb[3], 0));
    }
    return cur;
}

void llama_turbo_attn_rows_set(ggml_tensor * fa, const ggml_tensor * k, const ggml_tensor * v, const llama_turbo_attn_rows * rows) {
    if (!rows) {
        return;
    }
    if (rows->k0 || rows->v0) {
        ggml_flash_attn_ext_set_cell0(fa, ggml_is_turbo(k->type) ? rows->k0 : nullptr, ggml_is_turbo(v->type) ? rows->v0 : nullptr);
    }
    if (rows->kr && rows->vr && rows->mr) {
        ggml_flash_attn_ext_set_ring(fa, rows->kr, rows->vr, rows->mr);
    }
}

static thread_local uint32_t llama_turbo_window_scope_rows = 0;

llama_turbo_window_scope::llama_turbo_window_scope(uint32_t n_ubatch, uint32_t n_ctx_seq) {
    uint32_t window = 64; // measured: results/k-transforms.md, "The ring written by the cache's write"
    const char * env = getenv("TURBO_WINDOW");
    if (env) {
        window = (uint32_t) std::max(0, atoi(env));
    }
    // a larger ubatch would grow the window's bytes with it: beyond 512 its first queries find fewer cells exact
    uint32_t rows = window > 0 ? window + std::min(n_ubatch, 512u) : 0;
    if (!env) {
        // at most half of a sequence's context, in whole 32s: small slots (a server's 512 cells, say) would otherwise
        // keep every cell a second time in q8_0 and cost more than a q8_0 cache; with half, a turbo/turbo cache and
        // its window stay smaller than q8_0 at any size (turbo4: 4.125 + 8.5/2 < 8.5 bits per value). Per sequence,
        // not per cache: a sliding-window cache (n_swa + n_ubatch cells) keeps its full window (docs/window.md)
        rows = std::min(rows, n_ctx_seq / 2 / 32 * 32);
    }
    llama_turbo_window_scope_rows = rows;
}

llama_turbo_window_scope::~llama_turbo_window_scope() {
    llama_turbo_window_scope_rows = 0;
}

uint32_t llama_turbo_window_scope::rows() {
    return llama_turbo_window_scope_rows;
}
