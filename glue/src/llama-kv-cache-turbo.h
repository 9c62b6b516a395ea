#pragma once

// turbo-llama: the turbo side of llama_kv_cache. A turbo cache keeps, beside its K/V tensors, per layer: the key
// offset and rescaled q/k norm weights of the key transform, and the exact rows of each stream's cell 0; heads of
// 65..127 values are stored padded to 128. llama-kv-cache.cpp calls the hooks below; llama_kv_cache holds one
// llama_kv_turbo (its friend, so that the hooks can read the cache's layers and cells).

#include "llama.h"
#include "ggml.h"
#include "ggml-backend.h"

#include <cstdint>
#include <map>
#include <utility>
#include <vector>

struct llama_cparams;
struct llama_hparams;
class  llama_kv_cache;
class  llama_io_write_i;
class  llama_io_read_i;
class  llm_graph_result;
class  llm_graph_input_turbo_k0_shift;

// the values a cache row stores per head. A 128-value turbo type stores a head of 65..127 values (head_dim 80, 96)
// padded with zeros to 128: exact for attention (q.k ignores zero coordinates, V's padded outputs are sliced away),
// and the same blocks and kernels as head_dim 128; the price is bytes, x128/head_dim
uint32_t llama_kv_head_stored(ggml_type type, uint32_t n_embd_head);

// a turbo cache that the layer's device cannot write stays in host memory: may set buft and dev_name to the CPU's
void llama_kv_turbo_buft(ggml_backend_dev_t dev, ggml_type type_k, uint32_t n_embd_k_gqa, ggml_type type_v,
                         uint32_t n_embd_v_gqa, ggml_backend_buffer_type_t & buft, const char *& dev_name);

// the K type of an iSWA model's sliding-window cache (q8_0 where type_k is a turbo type, unless swa_full)
ggml_type llama_kv_turbo_type_k_swa(const llama_hparams & hparams, ggml_type type_k, bool swa_full,
                                    uint32_t size_swa, uint32_t size_base);

// rows of heads of n_embd_head values [n_embd_head*n_head, n_tokens] -> the row of `cache` (its heads of
// cache->ne[0]/n_head values), zeros after each head's real ones; cur itself where the sizes agree
ggml_tensor * llama_kv_turbo_pad_heads(ggml_context * ctx, ggml_tensor * cur, const ggml_tensor * cache,
                                       int64_t n_embd_head, int64_t n_head);

struct llama_kv_turbo {
    // side tensors per layer: the cache's ggml contexts make room for them
    static constexpr uint32_t n_layer_tensors = 4;

    struct layer {
        // fixed per-layer key offset (f32, n_embd_k_gqa), subtracted before a turbo K is stored. One constant for
        // every key of the context, so q.(k - m) differs from q.k by a per-query constant that softmax ignores.
        // Zero until set_k_off(); null for other K types.
        ggml_tensor * k_off = nullptr;

        // the q and k norm weights with the per-channel factor D of the q/k gain rescale applied (q*D, then k/D:
        // f32, 2 x n_embd_head_k), computed once from the model's norm weights (llama_context::turbo_qk_gains)
        // instead of in every graph. Null for other K types.
        ggml_tensor * qk_gain = nullptr;

        // the exact rows of each stream's cell 0 (f32 [n_embd_k_gqa, n_stream], in the turbo decoder's rotated
        // domain), written by the cache's SET_ROWS (ggml_set_rows_cell0) and read by flash attention in place of
        // decoding cell 0: the first token takes much of the attention, so its quantization error weighs most.
        // NaN rows: not known exactly (a restore that put another cell at cell 0, a K-shift of split MLA heads).
        ggml_tensor * k0 = nullptr;
        ggml_tensor * v0 = nullptr;
    };

    std::vector<layer> layers; // as llama_kv_cache::layers

    // host copies of the key offsets and gain factors set by set_k_off/set_qk_gain (per model layer; restored after
    // clear(true)); a layer is listed once set
    std::map<int32_t, std::vector<float>> k_off_host;
    std::map<int32_t, std::vector<float>> qk_gain_host;

    // constructor: the side tensors of a new cache layer, or of one shared with another cache's layer ikv_other
    void add_layer(ggml_context * ctx, const llama_hparams & hparams, uint32_t il, ggml_type type_k, ggml_type type_v,
                   bool has_k, bool has_v, bool v_trans, uint32_t n_embd_k_gqa, uint32_t n_embd_v_gqa,
                   uint32_t n_stream, const char * name_tag);
    void share_layer(const llama_kv_turbo & other, int32_t ikv_other);

    // after the buffers were cleared: the key offsets and gains are fixed for the life of the context
    void restore(const llama_kv_cache & kv) const;

    // the cell-0 rows of layer ikv go with a stream copy
    void copy_stream(int32_t ikv, uint32_t ssrc, uint32_t sdst) const;

    // mark the cell-0 rows of stream s (all streams: -1) as not known exactly (NaN)
    void cell0_forget(bool k, bool v, int32_t s = -1) const;
    // after a K-shift: the rows that the shift graph could not turn (MLA's split heads)
    void cell0_forget_shifted(const llama_kv_cache & kv) const;

    // cpy_k: the key offset, then a padded head's zeros (the offset acts on the real values)
    ggml_tensor * k_to_store(ggml_context * ctx, ggml_tensor * k_cur, const ggml_tensor * k, int32_t ikv,
                             int64_t n_embd_head, int64_t n_head) const;
    // cpy_k/cpy_v: the SET_ROWS also writes the cell-0 rows
    ggml_tensor * set_rows_cell0(ggml_tensor * set_rows, int32_t ikv, bool is_k) const;

    // the side tensors' bytes, counted in the size line (and the bits per value computed from it)
    size_t size_k_bytes() const;
    size_t size_v_bytes() const;

    // K-shift of a cache with key offsets: the stored key is k - m, RoPE turns k: the offset of the keys in tmp
    // (a view of n_rot head values, or all of a padded head) to add before RoPE and take off after; null if none
    ggml_tensor * rope_k_off(ggml_context * ctx, const ggml_tensor * tmp, int32_t ikv, uint32_t n_lora_kv) const;

    // K-shift: the exact cell-0 rows turn with their cell. build_shift_input: the turbo block rotation as inputs of
    // the shift graph (null where there is nothing to turn); build_shift_cell0: layer il's rows, by cell 0's shift
    llm_graph_input_turbo_k0_shift * build_shift_input(const llama_kv_cache & kv, llm_graph_result * res,
                                                       ggml_context * ctx) const;
    void build_shift_cell0(const llama_kv_cache & kv, const llama_cparams & cparams, ggml_context * ctx,
                           ggml_cgraph * gf, const llm_graph_input_turbo_k0_shift * inp, ggml_tensor * k_shift,
                           ggml_tensor * rope_factors, float freq_base, float freq_scale, uint32_t il) const;

    // state files: the cell-0 rows of a stream travel with its cells (ranges: the stream's cell ranges written)
    void state_write_cell0(const llama_kv_cache & kv, llama_io_write_i & io, uint32_t strm,
                           const std::vector<std::pair<uint32_t, uint32_t>> & ranges) const;
    bool state_read_cell0(const llama_kv_cache & kv, llama_io_read_i & io, uint32_t strm, uint32_t cell_count,
                          const std::vector<std::vector<uint32_t>> & idxs) const;

    // state files: the key offsets and rescaled q/k norm weights, written after the cells and read back (adopted if
    // they differ and no other sequence's cells stay; else the cells just read are dropped and it throws)
    void state_write_keys(const llama_kv_cache & kv, llama_io_write_i & io) const;
    void state_read_keys(llama_kv_cache & kv, llama_io_read_i & io, llama_seq_id seq_id);

private:
    void state_read_turbo_keys(llama_kv_cache & kv, llama_io_read_i & io, llama_seq_id seq_id);
};
