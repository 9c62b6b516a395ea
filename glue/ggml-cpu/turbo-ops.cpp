// The CPU backend's turbo code: flash attention on turbo caches (the GQA decode, the row and tiled paths' per-row
// steps), SET_ROWS' cell 0, the work size and the supports_op limits. ops.cpp, ggml-cpu.c and ggml-cpu.cpp call it.
// Flash attention runs in the rotated domain: q is rotated once per row, each key block is decoded once (no inverse
// FWHT), and V is accumulated rotated and rotated back once per output row (see ggml-turbo.h).

#include "turbo-ops.h"

#include "ggml-cpu.h"
#include "ggml-cpu-impl.h"
#include "ggml-impl.h"
#include "ggml-quants.h"
#include "ggml-turbo.h"
#include "ops.h"
#include "vec.h"

#include <algorithm>
#include <cmath>
#include <cstring>

// the code width of a turbo type, the `bits` of cpu_ref's turbo_*_rotated_gqa helpers
static inline int turbo_bits(ggml_type type) {
    GGML_ASSERT(ggml_is_turbo(type));
    switch (type) {
        case GGML_TYPE_TURBO4: case GGML_TYPE_TURBO4_64: return 4;
        case GGML_TYPE_TURBO3: case GGML_TYPE_TURBO3_64: return 3;
        default:                                         return 2;
    }
}

// values per block of a turbo type, the `qk` of cpu_ref's rotation and _qk helpers (128; 64 for _64)
static inline int turbo_qk(ggml_type type) {
    GGML_ASSERT(ggml_is_turbo(type));
    return (int) ggml_blck_size(type);
}

// one turbo row (whole blocks) decoded into the rotated domain (no inverse FWHT)
static inline void turbo_decode_rotated(ggml_type type, const void * row, float * out, int64_t n) {
    memset(out, 0, n*sizeof(float));
    const float one = 1.0f;
    turbo_mad_rotated_gqa_qk(turbo_bits(type), turbo_qk(type), row, out, 0, &one, 1, n);
}

// one row of the other side of a mixed pair (f32, f16, q8_0, ...) as f32; f16 and bf16 through the
// CPU backend's SIMD conversion (ggml-base's to_float is scalar)
static inline void turbo_other_row_to_f32(ggml_type type, const void * row, float * out, int64_t n) {
    switch (type) {
        case GGML_TYPE_F32:  memcpy(out, row, n*sizeof(float)); break;
        case GGML_TYPE_F16:  ggml_cpu_fp16_to_fp32((const ggml_fp16_t *) row, out, n); break;
        case GGML_TYPE_BF16: ggml_cpu_bf16_to_fp32((const ggml_bf16_t *) row, out, n); break;
        default:             ggml_get_type_traits(type)->to_float(row, out, n); break;
    }
}

// the exact row of KV cell 0 for kv head i2 and stream i3 (ggml_flash_attn_ext_set_cell0) where the
// cache `kv` is turbo and the row is known (not NaN); NULL: decode cell 0 like any other
const float * ggml_turbo_fa_cell0_row(const ggml_tensor * t0, const ggml_tensor * kv, int64_t i2, int64_t i3) {
    if (!t0 || !ggml_is_turbo(kv->type)) {
        return nullptr;
    }
    const float * r = (const float *) ((const char *) t0->data + i2*t0->nb[1] + i3*t0->nb[2]);
    return std::isnan(r[0]) ? nullptr : r;
}

// row `row` of cell0 := the n exact values x, rotated per turbo block like the decoder's output
static void turbo_set_cell0_row(const ggml_tensor * cell0, int64_t row, ggml_type type, const float * x, int64_t n) {
    float * out = (float *) ((char *) cell0->data + row*cell0->nb[1]);
    memcpy(out, x, n*sizeof(float));
    turbo_rotate_forward_qk(out, n, turbo_qk(type));
}

// SET_ROWS

bool ggml_turbo_set_rows_has_side(const ggml_tensor * dst) {
    const bool side = (ggml_is_turbo(dst->type) && dst->src[3]) || dst->src[4];
    GGML_ASSERT(!side || (dst->ne[2] == 1 && dst->ne[3] == 1));
    return side;
}

void ggml_turbo_set_rows_side(const ggml_tensor * dst, int64_t i1, const float * x, int64_t n) {
    const bool turbo = ggml_is_turbo(dst->type);
    const ggml_tensor * cell0 = turbo ? dst->src[3] : nullptr;
    const ggml_tensor * ring  = dst->src[4];
    if (cell0) {
        const int64_t cell0_every = dst->ne[1]/cell0->ne[1]; // kv_size: rows per stream
        if (i1 % cell0_every == 0) {
            turbo_set_cell0_row(cell0, i1/cell0_every, dst->type, x, n);
        }
    }
    if (ring) {
        // cell c of stream s goes to ring row c % R of the stream: the most recent R cells written, when the cells
        // are written in order (the host knows which cell each row holds)
        const int64_t kv_size = dst->ne[1]/ring->ne[2];
        const int64_t s = i1/kv_size, c = i1 % kv_size;
        char * out = (char *) ring->data + s*ring->nb[2] + (c % ring->ne[1])*ring->nb[1];
        if (turbo) {
            float r[GGML_TURBO_FA_MAX_D];
            GGML_ASSERT(n <= GGML_TURBO_FA_MAX_D && x);
            memcpy(r, x, n*sizeof(float));
            turbo_rotate_forward_qk(r, n, turbo_qk(dst->type));
            quantize_row_q8_0_ref(r, (block_q8_0 *) out, n);
        } else {
            memcpy(out, (const char *) dst->data + i1*dst->nb[1], ggml_row_size(dst->type, n));
        }
    }
}

// flash attention: the row path (one q row at a time) and the tiled path

int64_t ggml_turbo_fa_n_ring(const ggml_tensor * dst) {
    return dst->src[7] ? dst->src[7]->ne[1] : 0;
}

const ggml_fp16_t * ggml_turbo_fa_ring_mask(const ggml_tensor * dst, int64_t iq1, int64_t iq2, int64_t iq3) {
    const ggml_tensor * mr = dst->src[9];
    return (const ggml_fp16_t *) ((const char *) mr->data + iq1*mr->nb[1] + (iq2 % mr->ne[2])*mr->nb[2] + (iq3 % mr->ne[3])*mr->nb[3]);
}

const char * ggml_turbo_fa_ring_row(const ggml_tensor * r, int64_t ir, int64_t i2, int64_t i3) {
    return (const char *) r->data + ir*r->nb[1] + i2*r->nb[2] + i3*r->nb[3];
}

// a turbo side's ring row (Q8_0, rotated domain) as f32
static inline void turbo_ring_row_to_f32(const void * row, float * out, int64_t n) {
    dequantize_row_q8_0((const block_q8_0 *) row, out, n);
}

void ggml_turbo_fa_rotate_q(ggml_type k_type, float * q, int64_t n) {
    if (ggml_is_turbo(k_type)) {
        turbo_rotate_forward_qk(q, n, turbo_qk(k_type));
    }
}

void ggml_turbo_fa_unrotate_v(ggml_type v_type, float * acc, int64_t n) {
    if (ggml_is_turbo(v_type)) {
        turbo_rotate_inverse_qk(acc, n, turbo_qk(v_type));
    }
}

void ggml_turbo_fa_dot_k(ggml_type k_type, int64_t ic, const float * k0_row, const void * k_data, const float * q_rot, float * s, int64_t n) {
    if (ic == 0 && k0_row) {
        ggml_vec_dot_f32(n, s, 0, k0_row, 0, q_rot, 0, 1);
    } else if (ic == GGML_TURBO_FA_RING) {
        float r[GGML_TURBO_FA_MAX_D];
        GGML_ASSERT(n <= GGML_TURBO_FA_MAX_D);
        turbo_ring_row_to_f32(k_data, r, n);
        ggml_vec_dot_f32(n, s, 0, r, 0, q_rot, 0, 1);
    } else {
        turbo_dot_rotated_gqa_qk(turbo_bits(k_type), turbo_qk(k_type), k_data, q_rot, 0, 1, s, n);
    }
}

void ggml_turbo_fa_mad_v(ggml_type v_type, int64_t ic, const float * v0_row, const void * v_data, float * acc, float w, int64_t n) {
    if (ic == 0 && v0_row) {
        ggml_vec_mad_f32(n, acc, v0_row, w);
    } else if (ic == GGML_TURBO_FA_RING) {
        float r[GGML_TURBO_FA_MAX_D];
        GGML_ASSERT(n <= GGML_TURBO_FA_MAX_D);
        turbo_ring_row_to_f32(v_data, r, n);
        ggml_vec_mad_f32(n, acc, r, w);
    } else {
        turbo_mad_rotated_gqa_qk(turbo_bits(v_type), turbo_qk(v_type), v_data, acc, 0, &w, 1, n);
    }
}

void ggml_turbo_fa_row_to_f32(ggml_type type, int64_t ic, const float * row0, const void * data, float * out, int64_t n) {
    if (ic == 0 && row0) {
        memcpy(out, row0, n*sizeof(float));
    } else if (ic == GGML_TURBO_FA_RING && ggml_is_turbo(type)) {
        turbo_ring_row_to_f32(data, out, n);
    } else if (ggml_is_turbo(type)) {
        turbo_decode_rotated(type, data, out, n);
    } else {
        turbo_other_row_to_f32(type, data, out, n);   // f16, f32, a mixed pair's q8_0, ...
    }
}

bool ggml_flash_attn_ext_turbo_tiled_ok(ggml_type k_type, ggml_type v_type) {
    const auto is_turbo   = [](ggml_type t) { return ggml_is_turbo(t); };
    const auto tiled_side = [&](ggml_type t) { return t == GGML_TYPE_F32 || t == GGML_TYPE_F16 || is_turbo(t) ||
                                                      ggml_get_type_traits(t)->to_float != nullptr; };
    return (is_turbo(k_type) || is_turbo(v_type)) && tiled_side(k_type) && tiled_side(v_type);
}

// flash attention: the decode

// one decode step (one query row per head) with a turbo K and/or V. The keys are split across the
// threads, as in upstream's split-KV path for f16, and each thread serves all the query heads of a GQA group
// from one read of every key (turbo_*_rotated_gqa): at GQA 4 the codes are decoded once instead of 4 times.
// The other side of a mixed pair (f16, q8_0, ...) is read once per key too: K dotted with each head's q in the
// type's vec_dot_type, as the row path does; V converted to f32 once and added to each head's accumulator.
// The partials are merged by ggml_flash_attn_ext_reduce_partials. Scratch per thread: the group's q rows
// (rotated, or in K's vec_dot_type) and V accumulators, after the partials; the converted V row in the row
// path's per-thread V buffer (unused here).
static size_t ggml_flash_attn_ext_turbo_gqa_scratch(const ggml_tensor * dst, int nth) {
    const ggml_tensor * q = dst->src[0];
    const ggml_tensor * k = dst->src[1];
    const ggml_tensor * v = dst->src[2];
    const int64_t DK = k->ne[0], DV = v->ne[0], rk2 = q->ne[2]/k->ne[2];
    return sizeof(float)*(nth*(DK + 2*DV + CACHE_LINE_SIZE_F32) + q->ne[2]*nth*(2 + DV) + nth*(rk2*(DK + DV) + CACHE_LINE_SIZE_F32));
}

bool ggml_flash_attn_ext_turbo_gqa_ok(const ggml_compute_params * params, const ggml_tensor * dst) {
    const ggml_tensor * q    = dst->src[0];
    const ggml_tensor * k    = dst->src[1];
    const ggml_tensor * v    = dst->src[2];
    const ggml_tensor * mask = dst->src[3];
    const bool kt = ggml_is_turbo(k->type), vt = ggml_is_turbo(v->type);
    // the non-turbo side of a mixed pair: what the row path needs of it
    const bool k_ok = kt || (ggml_get_type_traits_cpu(k->type)->vec_dot &&
                             ggml_get_type_traits_cpu(ggml_get_type_traits_cpu(k->type)->vec_dot_type)->from_float);
    const bool v_ok = vt || v->type == GGML_TYPE_F32 || ggml_get_type_traits(v->type)->to_float;
    return !params->use_ref && (kt || vt) && k_ok && v_ok && q->type == GGML_TYPE_F32 &&
        q->ne[1] == 1 && q->ne[3] == 1 && k->ne[3] == 1 && v->ne[3] == 1 && k->ne[2] == v->ne[2] &&
        q->ne[2] % k->ne[2] == 0 && q->ne[2]/k->ne[2] <= TURBO_MAX_GQA && (!mask || mask->type == GGML_TYPE_F16) &&
        (!kt || k->ne[0] % turbo_qk(k->type) == 0) && (!vt || v->ne[0] % turbo_qk(v->type) == 0) &&
        ggml_flash_attn_ext_turbo_gqa_scratch(dst, params->nth) <= params->wsize;
}

void ggml_compute_forward_flash_attn_ext_turbo_gqa(
        const ggml_compute_params * params,
        ggml_tensor * dst) {
    const ggml_tensor * q     = dst->src[0];
    const ggml_tensor * k     = dst->src[1];
    const ggml_tensor * v     = dst->src[2];
    const ggml_tensor * mask  = dst->src[3];
    const ggml_tensor * sinks = dst->src[4];

    const int64_t DK   = k->ne[0];
    const int64_t DV   = v->ne[0];
    const int64_t nek1 = k->ne[1];
    const int64_t nek2 = k->ne[2];
    const int64_t neq2 = q->ne[2];
    const int     rk2  = (int) (neq2/nek2);
    const bool    k_turbo = ggml_is_turbo(k->type);
    const bool    v_turbo = ggml_is_turbo(v->type);
    const int     kbits = k_turbo ? turbo_bits(k->type) : 0;
    const int     vbits = v_turbo ? turbo_bits(v->type) : 0;

    // the non-turbo side (mixed pairs)
    const ggml_type         k_vec_dot_type = ggml_get_type_traits_cpu(k->type)->vec_dot_type;
    const ggml_from_float_t q_to_vec_dot   = k_turbo ? nullptr : ggml_get_type_traits_cpu(k_vec_dot_type)->from_float;
    const ggml_vec_dot_t    kq_vec_dot     = k_turbo ? nullptr : ggml_get_type_traits_cpu(k->type)->vec_dot;

    float scale = 1.0f, max_bias = 0.0f, logit_softcap = 0.0f;
    memcpy(&scale,         (float *) dst->op_params + 0, sizeof(float));
    memcpy(&max_bias,      (float *) dst->op_params + 1, sizeof(float));
    memcpy(&logit_softcap, (float *) dst->op_params + 2, sizeof(float));
    if (logit_softcap != 0) {
        scale /= logit_softcap;
    }
    const uint32_t n_head      = neq2;
    const uint32_t n_head_log2 = 1u << (uint32_t) floor(log2(n_head));
    const float m0 = powf(2.0f, -(max_bias       ) / n_head_log2);
    const float m1 = powf(2.0f, -(max_bias / 2.0f) / n_head_log2);

    const int ith = params->ith;
    const int nth = params->nth;
    const int64_t chunk_size = (nek1 + nth - 1) / nth;
    const int64_t ic_start   = std::min(ith * chunk_size, nek1);
    const int64_t ic_end     = std::min(ic_start + chunk_size, nek1);

    // the partials where ggml_flash_attn_ext_reduce_partials reads them: [q head][chunk][M, S, VKQ]
    const int64_t partial_size  = 2 + DV;
    float * partials_base = (float *) params->wdata + nth*(DK + 2*DV + CACHE_LINE_SIZE_F32);
    float * q_rot = partials_base + neq2*nth*partial_size + ith*(rk2*(DK + DV) + CACHE_LINE_SIZE_F32);
    float * acc   = q_rot + rk2*DK;   // rk2 rows of DV (rotated domain when V is turbo)
    float * v32   = (float *) params->wdata + ith*(DK + 2*DV + CACHE_LINE_SIZE_F32) + DV;   // a converted V row
    const size_t q_row = k_turbo ? DK*sizeof(float) : ggml_row_size(k_vec_dot_type, DK);   // <= DK floats

    float M[TURBO_MAX_GQA], S[TURBO_MAX_GQA], slope[TURBO_MAX_GQA], sc[TURBO_MAX_GQA], w[TURBO_MAX_GQA], mv[TURBO_MAX_GQA];
    const ggml_fp16_t * mp[TURBO_MAX_GQA];
    const ggml_fp16_t * mp_ring[TURBO_MAX_GQA];

    // the recent window's rows (ggml_flash_attn_ext_set_ring): keys nek1.. in the last chunk; a turbo side's ring
    // row is decoded (q8_0) into ring_row and taken like cell 0's exact row
    const int64_t n_ring = ic_start < nek1 && ic_end == nek1 ? ggml_turbo_fa_n_ring(dst) : 0;
    float ring_row[GGML_TURBO_FA_MAX_D];
    GGML_ASSERT(!n_ring || (DK <= GGML_TURBO_FA_MAX_D && DV <= GGML_TURBO_FA_MAX_D));

    for (int64_t ik2 = 0; ik2 < nek2; ++ik2) {
        const float * k0_row = ggml_turbo_fa_cell0_row(dst->src[5], k, ik2, 0);   // one stream here (see above)
        const float * v0_row = ggml_turbo_fa_cell0_row(dst->src[6], v, ik2, 0);
        for (int g = 0; g < rk2; ++g) {
            const int64_t iq2 = ik2*rk2 + g;
            const float * qg = (const float *) ((const char *) q->data + iq2*q->nb[2]);
            if (k_turbo) {
                memcpy(q_rot + g*DK, qg, DK*sizeof(float));
                turbo_rotate_forward_qk(q_rot + g*DK, DK, turbo_qk(k->type));
            } else {
                q_to_vec_dot(qg, (char *) q_rot + g*q_row, DK);   // rows packed at q_row bytes
            }
            memset(acc + g*DV, 0, DV*sizeof(float));
            M[g] = -INFINITY;
            S[g] = 0.0f;
            const uint32_t h = (uint32_t) iq2;
            slope[g] = (max_bias > 0.0f) ? h < n_head_log2 ? powf(m0, h + 1) : powf(m1, 2*(h - n_head_log2) + 1) : 1.0f;
            mp[g] = mask ? (const ggml_fp16_t *) ((const char *) mask->data + (iq2 % mask->ne[2])*mask->nb[2]) : nullptr;
            mp_ring[g] = n_ring ? ggml_turbo_fa_ring_mask(dst, 0, iq2, 0) : nullptr;
        }
        for (int64_t ic = ic_start; ic < ic_end + n_ring; ++ic) {
            const bool ring = ic >= nek1;
            bool live = false;
            for (int g = 0; g < rk2; ++g) {
                mv[g] = ring ? slope[g]*GGML_CPU_FP16_TO_FP32(mp_ring[g][ic - nek1]) :
                        mp[g] ? slope[g]*GGML_CPU_FP16_TO_FP32(mp[g][ic]) : 0.0f;
                live |= mv[g] != -INFINITY;
            }
            if (!live) {
                continue;
            }
            const char * k_data = ring ? ggml_turbo_fa_ring_row(dst->src[7], ic - nek1, ik2, 0) :
                                  (const char *) k->data + ic*k->nb[1] + ik2*k->nb[2];
            const float * k_exact = ic == 0 ? k0_row : nullptr;   // an exact (f32, rotated) row in place of the codes
            if (ring && k_turbo) {
                turbo_ring_row_to_f32(k_data, ring_row, DK);
                k_exact = ring_row;
            }
            if (k_exact) {
                for (int g = 0; g < rk2; ++g) {
                    ggml_vec_dot_f32(DK, &sc[g], 0, k_exact, 0, q_rot + g*DK, 0, 1);
                }
            } else if (k_turbo) {
                turbo_dot_rotated_gqa_qk(kbits, turbo_qk(k->type), k_data, q_rot, DK, rk2, sc, DK);
            } else {
                for (int g = 0; g < rk2; ++g) {
                    kq_vec_dot(DK, &sc[g], 0, k_data, 0, (const char *) q_rot + g*q_row, 0, 1);
                }
            }
            for (int g = 0; g < rk2; ++g) {
                w[g] = 0.0f;   // a masked head adds nothing
                if (mv[g] == -INFINITY) {
                    continue;
                }
                float s = sc[g]*scale;
                if (logit_softcap != 0.0f) {
                    s = logit_softcap*tanhf(s);
                }
                s += mv[g];
                float ms = 1.0f, vs = 1.0f;
                if (s > M[g]) {
                    const float Mold = M[g];
                    M[g] = s;
                    ms = expf(Mold - M[g]);
                    ggml_vec_scale_f32(DV, acc + g*DV, ms);
                } else {
                    vs = expf(s - M[g]);
                }
                S[g] = S[g]*ms + vs;
                w[g] = vs;
            }
            const char * v_data = ring ? ggml_turbo_fa_ring_row(dst->src[8], ic - nek1, ik2, 0) :
                                  (const char *) v->data + ic*v->nb[1] + ik2*v->nb[2];
            const float * v_exact = ic == 0 ? v0_row : nullptr;
            if (ring && v_turbo) {
                turbo_ring_row_to_f32(v_data, ring_row, DV);
                v_exact = ring_row;
            }
            if (v_exact) {
                for (int g = 0; g < rk2; ++g) {
                    if (w[g] != 0.0f) {
                        ggml_vec_mad_f32(DV, acc + g*DV, v_exact, w[g]);
                    }
                }
            } else if (v_turbo) {
                turbo_mad_rotated_gqa_qk(vbits, turbo_qk(v->type), v_data, acc, DV, w, rk2, DV);
            } else {
                const float * vr = (const float *) v_data;
                if (v->type != GGML_TYPE_F32) {
                    turbo_other_row_to_f32(v->type, v_data, v32, DV);
                    vr = v32;
                }
                for (int g = 0; g < rk2; ++g) {
                    if (w[g] != 0.0f) {
                        ggml_vec_mad_f32(DV, acc + g*DV, vr, w[g]);
                    }
                }
            }
        }
        for (int g = 0; g < rk2; ++g) {
            const int64_t iq2 = ik2*rk2 + g;
            float * a = acc + g*DV;
            if (v_turbo) {
                turbo_rotate_inverse_qk(a, DV, turbo_qk(v->type));
            }
            if (sinks && ic_start == 0) {   // the sink counts once: in the first chunk
                const float s = ((const float *) sinks->data)[iq2];
                float ms = 1.0f, vs = 1.0f;
                if (s > M[g]) {
                    ms = expf(M[g] - s);
                    M[g] = s;
                    ggml_vec_scale_f32(DV, a, ms);
                } else {
                    vs = expf(s - M[g]);
                }
                S[g] = S[g]*ms + vs;
            }
            float * partial = partials_base + (iq2*nth + ith)*partial_size;
            partial[0] = M[g];
            partial[1] = S[g];
            memcpy(partial + 2, a, DV*sizeof(float));
        }
    }
    ggml_barrier(params->threadpool);
    ggml_flash_attn_ext_reduce_partials(params, dst, nth, chunk_size);
}

// the graph plan: the turbo GQA decode also keeps a group's q rows and accumulators per thread
size_t ggml_flash_attn_ext_turbo_work_size(const ggml_tensor * node, int n_tasks) {
    if (!ggml_is_turbo(node->src[1]->type) && !ggml_is_turbo(node->src[2]->type)) {
        return 0;
    }
    const int64_t neq2 = node->src[0]->ne[2]; // number of query heads
    const int64_t DK   = node->src[1]->ne[0];
    const int64_t DV   = node->src[2]->ne[0];
    const int64_t rk2  = neq2/node->src[1]->ne[2];
    return sizeof(float)*n_tasks*(rk2*(DK + DV)) + 2*CACHE_LINE_SIZE*n_tasks;
}

// supports_op: turbo rows are whole blocks (128 values; 64 for the _64 types), and a turbo source is copied to f32
// only
bool ggml_cpu_turbo_supports_op(const ggml_tensor * op) {
    auto is_turbo = [](const ggml_tensor * t) { return ggml_is_turbo(t->type); };
    if (is_turbo(op) && op->ne[0] % ggml_blck_size(op->type) != 0) {
        return false;
    }
    for (int i = 0; i < GGML_MAX_SRC && op->src[i]; i++) {
        const ggml_tensor * t = op->src[i];
        if (is_turbo(t) && (t->ne[0] % ggml_blck_size(t->type) != 0 || (op->op == GGML_OP_CPY && i == 0 && op->type != GGML_TYPE_F32))) {
            return false;
        }
    }
    return true;
}
