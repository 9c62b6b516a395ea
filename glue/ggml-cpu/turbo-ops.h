// The CPU backend's turbo hooks (turbo-ops.cpp): what ops.cpp, ggml-cpu.c and ggml-cpu.cpp call for the turbo types.
#pragma once

#include "ggml.h"

#ifdef __cplusplus
extern "C" {
#endif

// ggml_graph_plan: the extra work buffer of the turbo flash-attention decode (0 when neither K nor V is turbo)
size_t ggml_flash_attn_ext_turbo_work_size(const struct ggml_tensor * node, int n_tasks);

// supports_op: false where a turbo tensor's limits rule the op out (rows of whole blocks; a turbo source copies to
// f32 only); true leaves the decision to the op's own checks
bool ggml_cpu_turbo_supports_op(const struct ggml_tensor * op);

#ifdef __cplusplus
}

struct ggml_compute_params;

// SET_ROWS: whether dst also writes side rows (a turbo destination's cell 0, ggml_set_rows_cell0; the recent
// window, ggml_set_rows_ring); and those of dst row i1, just stored from the n values x (NULL: a non-turbo row copied
// as stored)
bool ggml_turbo_set_rows_has_side(const ggml_tensor * dst);
void ggml_turbo_set_rows_side(const ggml_tensor * dst, int64_t i1, const float * x, int64_t n);

// flash attention, the row and tiled paths. The exact row of KV cell 0 for kv head i2 and stream i3
// (ggml_flash_attn_ext_set_cell0) where the cache `kv` is turbo and the row is known (not NaN); NULL: decode cell 0
// like any other
const float * ggml_turbo_fa_cell0_row(const ggml_tensor * t0, const ggml_tensor * kv, int64_t i2, int64_t i3);
// the recent window (ggml_flash_attn_ext_set_ring): its R rows (0: none) are keys n_kv.. after the cells; the mask
// row of query (iq1, iq2, iq3) over them, and ring row ir of head i2, stream i3 of kr or vr (src[7], src[8])
int64_t ggml_turbo_fa_n_ring(const ggml_tensor * dst);
const ggml_fp16_t * ggml_turbo_fa_ring_mask(const ggml_tensor * dst, int64_t iq1, int64_t iq2, int64_t iq3);
const char * ggml_turbo_fa_ring_row(const ggml_tensor * r, int64_t ir, int64_t i2, int64_t i3);
// the longest row the helpers below take on the stack (a ring row, cell 0's)
#define GGML_TURBO_FA_MAX_D 1024
// the key index that the row helpers below take for a ring row (a turbo side's: Q8_0 in the rotated domain)
#define GGML_TURBO_FA_RING ((int64_t) -1)
// q rotated in place when K is turbo (scores in the rotated domain); the V accumulator rotated back when V is turbo
void ggml_turbo_fa_rotate_q(ggml_type k_type, float * q, int64_t n);
void ggml_turbo_fa_unrotate_v(ggml_type v_type, float * acc, int64_t n);
// row path, turbo K: *s = key ic (cell 0's exact row, a ring row) . q_rot; turbo V: acc += w * value ic, rotated domain
void ggml_turbo_fa_dot_k(ggml_type k_type, int64_t ic, const float * k0_row, const void * k_data, const float * q_rot, float * s, int64_t n);
void ggml_turbo_fa_mad_v(ggml_type v_type, int64_t ic, const float * v0_row, const void * v_data, float * acc, float w, int64_t n);
// tiled path: row ic of a K or V side as f32 (turbo: rotated domain; cell 0's exact row; a ring row; the other side
// of a mixed pair)
void ggml_turbo_fa_row_to_f32(ggml_type type, int64_t ic, const float * row0, const void * data, float * out, int64_t n);
// the tiled path takes turbo pairs and mixed pairs with a turbo side (the other side f16, f32 or any type with a
// to_float: decoded per tile)
bool ggml_flash_attn_ext_turbo_tiled_ok(ggml_type k_type, ggml_type v_type);

// flash attention, the decode (one q row per head): keys split across threads, one read per key for a GQA group
bool ggml_flash_attn_ext_turbo_gqa_ok(const ggml_compute_params * params, const ggml_tensor * dst);
void ggml_compute_forward_flash_attn_ext_turbo_gqa(const ggml_compute_params * params, ggml_tensor * dst);

// ops.cpp: merges the per-chunk partials of a split-KV decode (the turbo decode writes them in its layout)
void ggml_flash_attn_ext_reduce_partials(const ggml_compute_params * params, ggml_tensor * dst, const int64_t n_chunks, const int64_t chunk_size);

#endif
