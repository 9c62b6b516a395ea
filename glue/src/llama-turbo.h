#pragma once

// turbo-llama: the context and graph side of a turbo K/V cache. The key transform of a turbo K cache: a fixed
// per-layer key offset (the mean key, measured by a probe on a context of its own) leaves before the keys are stored,
// and q and k are scaled per RoPE pair (q*D, k/D) so that the key's energy is spread evenly over its channels, which
// is what a norm-relative quantizer needs; q.k changes by a per-query constant only, which softmax ignores.
// Upstream's files only call these (llama-context.cpp, llama-graph.cpp, models/gemma3.cpp).

#include "llama.h"

#include <cstdint>

struct ggml_context;
struct ggml_tensor;
struct llama_context;
struct llama_model;
struct llm_graph_context;

// the context's switches of the key transform (llama_cparams::turbo), set once by llama_turbo_cparams_init
struct llama_turbo_cparams {
    bool k_rescale = false; // exact per-channel q/k rescale from the q/k norm gains (TURBO_K_RESCALE)
    bool k_scale   = false; // the same from the probe's q/k energies, for models without q/k norm gains
    bool q_late    = false; // q joins the graph with the attention (turbo K; TURBO_FUSE_ROPE_Q=0: off)
};

//
// context
//

// the switches for a context of this model and these parameters (logged)
void llama_turbo_cparams_init(llama_turbo_cparams & tc, const llama_model & model, const llama_context_params & params);

// the turbo cache types' block form for the model's heads (the 64-value form where every head is a 64-multiple but
// not a 128-multiple) and their need of flash attention (auto: on); false (logged) where the model's heads or the
// parameters cannot take them
bool llama_turbo_init_types(const llama_model & model, llama_context_params & params);

// the key transform of a new context's turbo K cache: the gain factors of the rescale, then the key offsets (and, for
// models without q/k norms, D) from the probe. A failure of the probe leaves a working cache without offsets (logged).
// No-op for other cache types.
void llama_turbo_setup(llama_context & ctx, const llama_context_params & params);

// session and sequence state files carry the turbo K key data (llama_kv_turbo::state_write_keys: per layer the key
// offset and the rescaled q/k norm weights) since upstream's LLAMA_SESSION_VERSION 10 / LLAMA_STATE_SEQ_VERSION 3
// + 1, and the recent window's rows (llama_kv_turbo::state_write_rows) since + 2; older files are refused
constexpr uint32_t LLAMA_TURBO_SESSION_VERSION   = 12;
constexpr uint32_t LLAMA_TURBO_STATE_SEQ_VERSION = 5;
static_assert(LLAMA_TURBO_SESSION_VERSION == LLAMA_SESSION_VERSION + 2 && LLAMA_TURBO_STATE_SEQ_VERSION == LLAMA_STATE_SEQ_VERSION + 2,
              "upstream moved its state versions: give turbo-llama's the next ones");

// a state file of the right magic but a version before this build's (turbo_version): true, logged as such
// (what: "session file", "sequence state file"; func: the caller, for the log)
bool llama_turbo_state_too_old(const char * func, const char * what, uint32_t version, uint32_t turbo_version);

//
// graph
//

// Gemma 3: the q/k norm weights with the rescale's D applied (q*D, k/D), in place; no-op unless cparams.turbo.k_rescale
void llama_turbo_build_qk_gains(const llm_graph_context & g, ggml_tensor *& q_norm_w, ggml_tensor *& k_norm_w, int il);

// models without q/k norms (build_qkv): q*D and k/D per RoPE pair, D from the probe; no-op unless cparams.turbo.k_scale
void llama_turbo_build_qk_scale(const llm_graph_context & g, ggml_tensor *& q, ggml_tensor *& k,
                                int64_t n_embd_head_q, int64_t n_embd_head_k, int il);

// flash attention on a padded turbo head (llama_kv_head_stored): q padded with zeros to k's head before it,
// the padded outputs of v sliced away after it
ggml_tensor * llama_turbo_attn_pad_q(ggml_context * ctx, ggml_tensor * q, const ggml_tensor * k);
ggml_tensor * llama_turbo_attn_unpad(ggml_context * ctx, ggml_tensor * cur, const ggml_tensor * v, const ggml_tensor * v_mla,
                                     int64_t n_embd_head_v);

// the side rows a flash attention on a turbo cache takes (llama_kv_cache_context::get_turbo_rows): cell 0's exact rows
// (ggml_flash_attn_ext_set_cell0) and the recent window with its mask (ggml_flash_attn_ext_set_ring); any may be null
struct llama_turbo_attn_rows {
    ggml_tensor * k0 = nullptr;
    ggml_tensor * v0 = nullptr;
    ggml_tensor * kr = nullptr;
    ggml_tensor * vr = nullptr;
    ggml_tensor * mr = nullptr;
};
void llama_turbo_attn_rows_set(ggml_tensor * fa, const ggml_tensor * k, const ggml_tensor * v, const llama_turbo_attn_rows * rows);

// the recent window's rows per stream of the caches that a context creates (llama_kv_turbo::window_rows):
// TURBO_WINDOW (default 64; 0: no window) + the context's n_ubatch (at most 512), so that every query of a ubatch
// finds the window's cells before it exact; by default (TURBO_WINDOW unset) at most half of a sequence's context
// n_ctx_seq. Set around the context's create_memory (thread-local); 0 outside.
struct llama_turbo_window_scope {
    llama_turbo_window_scope(uint32_t n_ubatch, uint32_t n_ctx_seq);
    ~llama_turbo_window_scope();
    llama_turbo_window_scope(const llama_turbo_window_scope &) = delete;
    llama_turbo_window_scope & operator=(const llama_turbo_window_scope &) = delete;
    static uint32_t rows();
};
