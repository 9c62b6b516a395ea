#pragma once

// turbo-llama: the turbo side of llama_kv_cache. A turbo cache keeps, beside its K/V tensors, per layer: the key
// offset and rescaled q/k norm weights of the key transform, the exact rows of each stream's cell 0 and the rows of
// its most recent cells (the recent window); heads of 65..127 values are stored padded to 128. llama-kv-cache.cpp calls the hooks below; llama_kv_cache holds one
// llama_kv_turbo (its friend, so that the hooks can read the cache's layers and cells).

#include "llama.h"
#include "llama-turbo.h"
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
class  llm_graph_input_turbo_shift;
struct llama_ubatch;

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
    static constexpr uint32_t n_layer_tensors = 6;

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

        // the recent window: the rows of each stream's n_ring most recently written cells ([n_embd_gqa, n_ring,
        // n_stream]; cell c in row c % n_ring), a turbo side's as q8_0 in the decoder's rotated domain, another side's
        // as the cache stores them. Written by the cache's SET_ROWS (ggml_set_rows_ring), read by flash attention in
        // place of those cells (ggml_flash_attn_ext_set_ring): the recent tokens take much of the attention, and
        // their keys' quantization error weighs most after cell 0's. Null where the cache has no window.
        ggml_tensor * kr = nullptr;
        ggml_tensor * vr = nullptr;
    };

    std::vector<layer> layers; // as llama_kv_cache::layers

    // the window's rows per stream (0: no window) and, per stream and row, the cell whose row it holds (-1: none).
    // The host keeps it from the cells each ubatch writes (the same rule as the SET_ROWS); it moves those cells' mask
    // to the window's mask. A state read brings the rows of the cells it reads (or drops those cells), a K-shift
    // turns the K rows with their cells (cell0_forget_shifted drops what it cannot turn).
    uint32_t n_ring = 0;
    mutable std::vector<std::vector<int32_t>> ring_cell;

    // the window of the caches that a context creates (llama_turbo_window_scope): TURBO_WINDOW (default 64) + n_ubatch
    // rows (by default at most half of a sequence's context), at most kv_size; 0 for a cache without a turbo side
    static uint32_t window_rows(ggml_type type_k, ggml_type type_v, uint32_t kv_size);

    // host copies of the key offsets and gain factors set by set_k_off/set_qk_gain (per model layer; restored after
    // clear(true)); a layer is listed once set
    std::map<int32_t, std::vector<float>> k_off_host;
    std::map<int32_t, std::vector<float>> qk_gain_host;

    // constructor: the side tensors of a new cache layer, or of one shared with another cache's layer ikv_other
    void add_layer(ggml_context * ctx, const llama_hparams & hparams, uint32_t il, ggml_type type_k, ggml_type type_v,
                   bool has_k, bool has_v, bool v_trans, uint32_t n_embd_k_gqa, uint32_t n_embd_v_gqa,
                   uint32_t n_stream, uint32_t kv_size, const char * name_tag);
    void share_layer(const llama_kv_turbo & other, int32_t ikv_other);

    // after the buffers were cleared: the key offsets and gains are fixed for the life of the context
    void restore(const llama_kv_cache & kv) const;
    // after the cells were cleared (data or not): the window holds no cell
    void ring_clear() const;

    // the cell-0 rows and the window of layer ikv go with a stream copy
    void copy_stream(int32_t ikv, uint32_t ssrc, uint32_t sdst) const;

    // apply_ubatch: the cells a ubatch writes (per stream of strm, the cells idxs) take their window rows; two cells of
    // one ubatch on one row leave it to neither
    void ring_written(const std::vector<int32_t> & strm, const std::vector<std::vector<uint32_t>> & idxs) const;

    // the window's mask of the attention mask kq_mask (F16 [R_pad, n_tokens/n_stream, 1, n_stream], an input),
    // null where the cache has no window; set_input_ring_mask fills it from kq_mask (just filled) and masks the cells
    // it holds out of kq_mask
    ggml_tensor * build_ring_mask(ggml_context * ctx, ggml_tensor * kq_mask) const;
    void set_input_ring_mask(const llama_kv_cache & kv, ggml_tensor * kq_mask, const llama_ubatch * ubatch) const;
    ggml_tensor * ring_mask_of(const ggml_tensor * kq_mask) const; // null: none built for kq_mask

    // mark the cell-0 rows of stream s (all streams: -1) as not known exactly (NaN)
    void cell0_forget(bool k, bool v, int32_t s = -1) const;
    // after a K-shift: the rows that the shift graph could not turn (MLA's split heads) and the window rows whose
    // cells the shift removed
    void cell0_forget_shifted(const llama_kv_cache & kv) const;

    // cpy_k: the key offset, then a padded head's zeros (the offset acts on the real values)
    ggml_tensor * k_to_store(ggml_context * ctx, ggml_tensor * k_cur, const ggml_tensor * k, int32_t ikv,
                             int64_t n_embd_head, int64_t n_head) const;
    // cpy_k/cpy_v: the SET_ROWS also writes the cell-0 rows and the window
    ggml_tensor * set_rows_side(ggml_tensor * set_rows, int32_t ikv, bool is_k) const;

    // the side tensors' bytes, counted in the size line (and the bits per value computed from it)
    size_t size_k_bytes() const;
    size_t size_v_bytes() const;

    // K-shift of a cache with key offsets: the stored key is k - m, RoPE turns k: the offset of the keys in tmp
    // (a view of n_rot head values, or all of a padded head) to add before RoPE and take off after; null if none
    ggml_tensor * rope_k_off(ggml_context * ctx, const ggml_tensor * tmp, int32_t ikv, uint32_t n_lora_kv) const;

    // K-shift: the exact cell-0 rows and the window's K rows turn with their cells. build_shift_input: the inputs of
    // the shift graph (the turbo block rotation, the window rows' shifts; null where there is nothing to turn);
    // build_shift_rows: layer il's rows (k_shift, k_rot: the shift graph's own inputs)
    llm_graph_input_turbo_shift * build_shift_input(const llama_kv_cache & kv, llm_graph_result * res,
                                                    ggml_context * ctx) const;
    void build_shift_rows(const llama_kv_cache & kv, const llama_cparams & cparams, ggml_context * ctx,
                          ggml_cgraph * gf, const llm_graph_input_turbo_shift * inp, ggml_tensor * k_shift,
                          ggml_tensor * k_rot, ggml_tensor * rope_factors, float freq_base, float freq_scale,
                          uint32_t il) const;
    // the shift of the cell each window row holds, per stream and row (I32 [n_ring*n_stream]; 0 for none)
    void set_input_ring_shift(const llama_kv_cache & kv, ggml_tensor * dst) const;

    // state files: the cell-0 rows and the window's rows of a stream travel with its cells (ranges: the stream's
    // cell ranges written; idxs: the cells the read put them in)
    void state_write_rows(const llama_kv_cache & kv, llama_io_write_i & io, uint32_t strm,
                          const std::vector<std::pair<uint32_t, uint32_t>> & ranges) const;
    bool state_read_rows(const llama_kv_cache & kv, llama_io_read_i & io, uint32_t strm, uint32_t cell_count,
                         const std::vector<std::vector<uint32_t>> & idxs) const;

    // state files: the key offsets and rescaled q/k norm weights, written after the cells and read back (adopted if
    // they differ and no other sequence's cells stay; else the cells just read are dropped and it throws)
    void state_write_keys(const llama_kv_cache & kv, llama_io_write_i & io) const;
    void state_read_keys(llama_kv_cache & kv, llama_io_read_i & io, llama_seq_id seq_id);

private:
    // build_shift_rows: rows x (F32, a turbo K's stored keys in the decoder's rotated domain) turned by pos, one each
    ggml_tensor * shift_rotated(const llama_kv_cache & kv, const llama_cparams & cparams, ggml_context * ctx,
                                const llm_graph_input_turbo_shift * inp, ggml_tensor * x, ggml_tensor * pos,
                                ggml_tensor * rope_factors, float freq_base, float freq_scale, uint32_t il,
                                int64_t n_head_kv) const;
    void state_read_turbo_keys(llama_kv_cache & kv, llama_io_read_i & io, llama_seq_id seq_id);
    void state_write_ring(llama_io_write_i & io, uint32_t strm, const std::vector<std::pair<uint32_t, uint32_t>> & ranges) const;
    bool state_read_ring(llama_io_read_i & io, uint32_t strm, uint32_t cell_count, const std::vector<uint32_t> & idxs) const;

    // the window masks of the last graphs built (their attention mask, the window's), newest last: found again at
    // set_input. A graph is reused only while it is the last one built, so a few entries suffice.
    mutable std::vector<std::pair<const ggml_tensor *, ggml_tensor *>> ring_masks;
};
