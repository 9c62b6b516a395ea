// turbo-llama: host side of the fused turbo flash-attention decode (kernels in fattn-turbo.cuh).
#include "fattn-turbo.cuh"
#include "fattn-turbo-mma.cuh"

#include <cmath>

bool ggml_cuda_turbo_fattn_has_cell0(const ggml_tensor * dst) {
    return (dst->src[5] && ggml_cuda_is_turbo_type(dst->src[1]->type)) || (dst->src[6] && ggml_cuda_is_turbo_type(dst->src[2]->type));
}

bool ggml_cuda_turbo_fattn_has_ring(const ggml_tensor * dst) {
    return dst->src[7] && dst->src[8] && dst->src[9] && dst->src[7]->ne[1] > 0;
}

// the ring's tensors as the kernels read them (ggml_flash_attn_ext_set_ring): kr, vr rows of whole blocks, q8_0 for a
// turbo side (of whole q8_0 blocks) and the side's type otherwise, broadcast over heads and streams as K and V; an F16
// mr whose rows hold R columns at least
bool ggml_cuda_turbo_fattn_ring_ok(const ggml_tensor * dst) {
    if (!ggml_cuda_turbo_fattn_has_ring(dst)) {
        return !dst->src[7];
    }
    const ggml_tensor * K  = dst->src[1];
    const ggml_tensor * V  = dst->src[2];
    const ggml_tensor * mask = dst->src[3];
    const ggml_tensor * kr = dst->src[7];
    const ggml_tensor * vr = dst->src[8];
    const ggml_tensor * mr = dst->src[9];
    const auto side_ok = [](const ggml_tensor * x, const ggml_tensor * r) {
        const ggml_type t = ggml_cuda_is_turbo_type(x->type) ? GGML_TYPE_Q8_0 : x->type;
        return r->type == t && r->nb[0] == ggml_type_size(t) && r->ne[0] == x->ne[0] && r->ne[2] == x->ne[2] &&
            r->ne[3] == x->ne[3] && r->ne[0] % ggml_blck_size(t) == 0;
    };
    return mask && side_ok(K, kr) && side_ok(V, vr) && vr->ne[1] == kr->ne[1] && kr->ne[1] < INT32_MAX &&
        mr->type == GGML_TYPE_F16 && mr->nb[0] == sizeof(half) && mr->ne[0] >= kr->ne[1] && mr->ne[1] >= mask->ne[1] &&
        mr->ne[2] == mask->ne[2] && mr->ne[3] == mask->ne[3];
}

// the layouts every turbo decode reads: f32 Q and output, K / V rows of whole blocks, an f16 mask broadcast over the
// heads, f32 sinks, whole GQA groups
static bool turbo_fattn_layout_ok(const ggml_tensor * dst) {
    const ggml_tensor * Q     = dst->src[0];
    const ggml_tensor * K     = dst->src[1];
    const ggml_tensor * V     = dst->src[2];
    const ggml_tensor * mask  = dst->src[3];
    const ggml_tensor * sinks = dst->src[4];
    return Q->type == GGML_TYPE_F32 && dst->type == GGML_TYPE_F32 &&
        K->nb[0] == ggml_type_size(K->type) && V->nb[0] == ggml_type_size(V->type) &&
        (!mask || (mask->type == GGML_TYPE_F16 && mask->ne[2] == 1)) && (!sinks || sinks->type == GGML_TYPE_F32) &&
        Q->ne[2] % K->ne[2] == 0 && K->ne[2] == V->ne[2];
}

bool ggml_cuda_turbo_fattn_pair_supported(const ggml_tensor * dst) {
    const ggml_tensor * Q    = dst->src[0];
    const ggml_tensor * K    = dst->src[1];
    const ggml_tensor * V    = dst->src[2];
    if (ggml_cuda_turbo_qk(K->type) == QK_TURBO_64 || ggml_cuda_turbo_qk(V->type) == QK_TURBO_64) {
        return ggml_cuda_turbo64_fattn_supported(dst);   // the 64-value types: fattn-turbo-prefill.cu, every batch size
    }
    const bool K_turbo = ggml_cuda_turbo_qk(K->type) == QK_TURBO;
    const bool V_turbo = ggml_cuda_turbo_qk(V->type) == QK_TURBO;
    if (!K_turbo && !V_turbo) {
        return false;
    }
    if (!ggml_cuda_turbo_fattn_k_type(K->type) || !ggml_cuda_turbo_fattn_k_type(V->type)) {
        return false;
    }
    if (K->ne[0] != V->ne[0] || Q->ne[0] != K->ne[0] || (K->ne[0] != 128 && K->ne[0] != 256)) {
        return false;
    }
    if (!turbo_fattn_layout_ok(dst) || !ggml_cuda_turbo_fattn_ring_ok(dst)) {
        return false;
    }
    // cell 0's exact rows (ggml_flash_attn_ext_set_cell0): the decode kernels and the prefill take them; a prefill that
    // ggml_cuda_turbo_fattn_prefill would not serve (upstream's conversion of the cache) would ignore them
    if ((ggml_cuda_turbo_fattn_has_cell0(dst) || dst->src[7]) && Q->ne[1] > GGML_CUDA_TURBO_FA_MAX_BATCH && !ggml_is_contiguous(dst)) {
        return false;   // (the ring likewise)
    }
    // turbo4 with a turbo partner runs on the tensor-core kernel only (Ampere and newer; the scalar kernel has no such
    // instance): refused elsewhere, so it runs on the CPU. With a q8_0 / f16 partner the scalar kernel serves it there
    // (and unaligned f16 rows; the tensor-core kernel every other such pair)
    if (K->type == GGML_TYPE_TURBO4 || V->type == GGML_TYPE_TURBO4) {
        const bool ok = !(K_turbo && V_turbo) || ampere_mma_available(ggml_cuda_info().devices[ggml_cuda_get_device()].cc);
        if (!ok) {
            static bool said = false;   // said once: the op then runs on the CPU backend
            if (!said) {
                said = true;
                GGML_LOG_WARN("ggml-cuda: turbo flash attention has no CUDA kernel for K %s / V %s at head size %d; it runs on "
                              "the CPU\n", ggml_type_name(K->type), ggml_type_name(V->type), (int) K->ne[0]);
            }
            return false;
        }
    }
    return true;
}

int ggml_cuda_turbo_fattn_route(const ggml_tensor * dst) {
    if (!ggml_cuda_is_turbo_type(dst->src[1]->type) && !ggml_cuda_is_turbo_type(dst->src[2]->type)) {
        return 0;
    }
    if (!ggml_cuda_turbo_fattn_pair_supported(dst)) {
        return -1;
    }
    return dst->src[0]->ne[1] <= GGML_CUDA_TURBO_FA_MAX_BATCH ? 1 : 0;
}

template <int D, int QKB, bool V_turbo, int NCOLS>
static void turbo_fattn_combine_launch(cudaStream_t stream, const float * part_acc, const float2 * part_meta, const float * sinks,
        float * dst, int n_split, int nrg, int gqa, int n_q, int n_head, int n_head_kv, int ne3) {
    const dim3 grid(NCOLS, n_head_kv*nrg, ne3);
    // The merge with the splits spread over 8 warps (k_turbo_fattn_combine_par) from 8 splits up, where its parallel
    // loads win; below, the one-warp merge is the quicker, having less to set up (cuda/host-check/combine_bench)
    if (n_split >= 8) {
        ggml_cuda_turbo_launch(k_turbo_fattn_combine_par<D, QKB, V_turbo, NCOLS>, grid, dim3(TURBO_COMBINE_WARPS*WARP_SIZE), stream,
            part_acc, part_meta, sinks, dst, n_split, nrg, gqa, n_q, n_head);
    } else {
        ggml_cuda_turbo_launch(k_turbo_fattn_combine_warp<D, QKB, V_turbo, NCOLS>, grid, dim3(D/QKB*WARP_SIZE), stream, part_acc, part_meta, sinks, dst,
            n_split, nrg, gqa, n_q, n_head);
    }
}

// an f16 K or V whose rows are 16-byte aligned: the tensor-core kernel's staging copies whole 16-byte chunks of them
static bool turbo_fattn_f16_aligned(const ggml_tensor * X) {
    return X->type == GGML_TYPE_F16 && (uintptr_t) X->data % 16 == 0 && X->nb[1] % 16 == 0 && X->nb[2] % 16 == 0 &&
        X->nb[3] % 16 == 0;
}

// the tensor-core kernel serves on Ampere and newer every pair at D = 128 and 256 (issue #29): a turbo K with a turbo V,
// a q8_0 V or an aligned f16 V, and a q8_0 K or an aligned f16 K with a turbo V (those past 48 KB of shared memory
// with dynamic shared memory, turbo_mma_smem); the scalar kernel (fattn-turbo.cuh) serves unaligned f16 rows and older
// GPUs. A turbo K with a plain V there (H200, llama8b tg128 @32K, ratio to f16 of the same call, results/gpu.md; the
// scalar kernel: 0.77x): turbo3/q8_0 1.09x, turbo3/f16 1.19x, turbo2/q8_0 1.11x, turbo2/f16 1.18x
static bool turbo_fattn_uses_mma(const ggml_tensor * K, const ggml_tensor * V) {
    if (ggml_cuda_turbo_qk(V->type) == QK_TURBO_64) {
        return ggml_cuda_turbo_qk(K->type) == QK_TURBO_64 && ampere_mma_available(ggml_cuda_info().devices[ggml_cuda_get_device()].cc);
    }
    if (!ampere_mma_available(ggml_cuda_info().devices[ggml_cuda_get_device()].cc)) {
        return false;
    }
    if (ggml_cuda_turbo_qk(K->type) == QK_TURBO && ggml_cuda_turbo_qk(V->type) != QK_TURBO) {
        return V->type == GGML_TYPE_Q8_0 || turbo_fattn_f16_aligned(V);
    }
    if (ggml_cuda_turbo_qk(V->type) != QK_TURBO) {
        return false;
    }
    return ggml_cuda_turbo_qk(K->type) == QK_TURBO || K->type == GGML_TYPE_Q8_0 || turbo_fattn_f16_aligned(K);
}

// the tensor-core kernel's loop (fattn-turbo-mma.cuh). At D = 128 from 16K keys: two 16-key tiles per warp step
// for turbo3 V (two independent mma chains hide each other's latency once the splits are long), and for turbo2 K and
// V the same with the bare ex2.approx (its softmax is a larger share of the step); below 16K keys, and for turbo3 K
// with turbo2 V, one tile per step (the two-tile loop did not pay there). At D = 256 (Gemma 3) a warp pair per tile,
// which halves each warp's chain and registers
static turbo_mma_loop turbo_fattn_mma_loop(const int D, const ggml_type type_K, const ggml_type type_V, const int n_kv) {
    if (D == 256) {
        return TURBO_MMA_WARP_PAIR;   // (every pair)
    }
    // q8_0 / f16 K, a q8_0 / f16 V at D = 128 and the 64-value types (D = 64): one tile per step, the only loop compiled.
    // At D = 64 the two-tile loop was no faster (a step is short) and half the splits slower
    if (ggml_cuda_turbo_qk(type_K) != QK_TURBO || ggml_cuda_turbo_qk(type_V) != QK_TURBO) {
        return TURBO_MMA_ONE_TILE;
    }
    if (n_kv >= 16384 && (type_V == GGML_TYPE_TURBO3 || (type_K == GGML_TYPE_TURBO4 && type_V == GGML_TYPE_TURBO4))) {
        return TURBO_MMA_TWO_TILES;
    }
    if (n_kv >= 16384 && type_K == GGML_TYPE_TURBO2 && type_V == GGML_TYPE_TURBO2) {
        return TURBO_MMA_TWO_TILES_EX2;
    }
    return TURBO_MMA_ONE_TILE;
}

// rope: Q's ROPE node when its RoPE is done on q's load (then Q is read from the ROPE's input), else nullptr; mul: the
// MUL that makes the ROPE's input when it is done on load too (ggml_cuda_turbo_rope_mul_fusable: Q read from its input)
static void turbo_fattn_decode(ggml_backend_cuda_context & ctx, ggml_tensor * dst, const ggml_tensor * rope,
        const ggml_tensor * mul = nullptr) {
    ggml_cuda_turbo_check_tables();
    const ggml_tensor * Q     = dst->src[0];
    const ggml_tensor * K     = dst->src[1];
    const ggml_tensor * V     = dst->src[2];
    const ggml_tensor * mask  = dst->src[3];
    const ggml_tensor * sinks = dst->src[4];
    GGML_ASSERT(ggml_cuda_turbo_fattn_pair_supported(dst));

    float scale = 1.0f, max_bias = 0.0f, logit_softcap = 0.0f;
    memcpy(&scale,         (const float *) dst->op_params + 0, sizeof(float));
    memcpy(&max_bias,      (const float *) dst->op_params + 1, sizeof(float));
    memcpy(&logit_softcap, (const float *) dst->op_params + 2, sizeof(float));

    const int D         = (int) Q->ne[0];
    const int n_q       = (int) Q->ne[1];
    const int n_head    = (int) Q->ne[2];
    const int ne3       = (int) Q->ne[3];
    const int n_head_kv = (int) K->ne[2];
    const int gqa       = n_head / n_head_kv;
    const int n_kv      = (int) K->ne[1];
    // cell 0's exact rows: the split blocks walk keys 1.. and one more block per row group does key 0; the ring's R keys:
    // more blocks per row group, TURBO_FA_RING_KEYS each (turbo_fa_cell0, turbo_fa_extra_block)
    const bool c0_on    = ggml_cuda_turbo_fattn_has_cell0(dst) && n_kv > 0;
    const int n_kv_main = n_kv - (c0_on ? 1 : 0);
    const int r_n       = ggml_cuda_turbo_fattn_has_ring(dst) ? (int) dst->src[7]->ne[1] : 0;
    const int n_extra   = r_n > 0 ? (r_n + TURBO_FA_RING_KEYS - 1) / TURBO_FA_RING_KEYS : c0_on ? 1 : 0;

    const int id  = ggml_cuda_get_device();
    const int nsm = ggml_cuda_info().devices[id].nsm;

    // tensor-core kernel (v4 and its successors) on Ampere and newer for the pairs of turbo_fattn_uses_mma
    const bool use_mma = turbo_fattn_uses_mma(K, V);
    GGML_ASSERT(!rope || use_mma);   // ggml_cuda_turbo_rope_fa_fusable checked it
    GGML_ASSERT(use_mma || ggml_cuda_turbo_qk(V->type) != QK_TURBO_64);   // ggml_cuda_turbo64_fattn_fused checked it
    if (!use_mma && ggml_cuda_turbo_qk(K->type) == QK_TURBO && ggml_cuda_turbo_qk(V->type) == QK_TURBO && (K->type == GGML_TYPE_TURBO4 || V->type == GGML_TYPE_TURBO4)) {
        GGML_ABORT("turbo flash attention: turbo4 with a turbo partner needs the tensor-core kernel");
    }
    const turbo_mma_loop loop = turbo_fattn_mma_loop(D, K->type, V->type, n_kv);

    const int R     = gqa*n_q;
    const int ncols = use_mma ? TURBO_MMA_ROWS : (R <= 4 ? 4 : 8);
    const int nrg   = (R + ncols - 1) / ncols;

    // splits of the KV sequence: enough blocks in flight to hide the load latency
    const int tile  = use_mma ? TURBO_MMA_KEYS : TURBO_FA_TILE;
    const int n_tiles = (n_kv_main + tile - 1) / tile;
    const int blocks_base = nrg*n_head_kv*ne3;
    int target = 8*nsm;
    if (use_mma) {
        const int occ = K->type == GGML_TYPE_TURBO4_64 ? ggml_cuda_turbo_fattn_mma_occupancy<GGML_TYPE_TURBO4_64>(D, V->type, loop)
                      : K->type == GGML_TYPE_TURBO3_64 ? ggml_cuda_turbo_fattn_mma_occupancy<GGML_TYPE_TURBO3_64>(D, V->type, loop)
                      : K->type == GGML_TYPE_TURBO2_64 ? ggml_cuda_turbo_fattn_mma_occupancy<GGML_TYPE_TURBO2_64>(D, V->type, loop)
                      : K->type == GGML_TYPE_TURBO4 ? ggml_cuda_turbo_fattn_mma_occupancy<GGML_TYPE_TURBO4>(D, V->type, loop)
                      : K->type == GGML_TYPE_TURBO3 ? ggml_cuda_turbo_fattn_mma_occupancy<GGML_TYPE_TURBO3>(D, V->type, loop)
                      : K->type == GGML_TYPE_TURBO2 ? ggml_cuda_turbo_fattn_mma_occupancy<GGML_TYPE_TURBO2>(D, V->type, loop)
                      : K->type == GGML_TYPE_Q8_0   ? ggml_cuda_turbo_fattn_mma_occupancy<GGML_TYPE_Q8_0>  (D, V->type, loop)
                                                    : ggml_cuda_turbo_fattn_mma_occupancy<GGML_TYPE_F16>   (D, V->type, loop);
        target = occ*nsm;   // one wave: more waves cost a tail each
    }
    // every warp of a v4 block gets a tile, and from 512 tiles (8192 keys) up at least 4: fewer splits (32 instead of
    // 64 per KV head at 8K), so that the prologue/epilogue and the merge are paid over more keys (at depth 0 one tile
    // per warp stays ahead). From ~17K keys up the one-wave cap below gives 4 or more anyway. That rule suits many KV
    // heads; with few (Gemma 3: one, at 8K 32 blocks for 132 SMs) the steps are halved while the blocks would not
    // cover every SM once, as idle SMs cost more than the extra merge work.
    const int walkers = loop == TURBO_MMA_WARP_PAIR ? TURBO_MMA_WARPS/2 : TURBO_MMA_WARPS;   // warps (pairs) that walk tiles
    int min_steps = n_tiles >= 512 ? 4 : 1;
    if (use_mma) {
        while (min_steps > 1 && (n_tiles/(walkers*min_steps))*blocks_base < nsm) {
            min_steps /= 2;
        }
    }
    const int min_tiles = use_mma ? walkers*min_steps : 1;
    // v4/v5: at most one wave (floor), v3: at least its target (ceil). With the extra blocks per row group (cell 0's, the
    // ring's: turbo_fa_cell0) the wave holds as many splits fewer: a block past it starts only when another ends (run
    // H17, llama8b at 32K keys: one wave and 8 blocks, the op 0.9-1.8 us slower)
    const int want = use_mma ? std::max(1, target / blocks_base - n_extra) : (target + blocks_base - 1) / blocks_base;
    int n_split = std::max(1, std::min(std::max(n_tiles / min_tiles, 1), want));
    const int tps = std::max(1, (n_tiles + n_split - 1) / n_split);
    n_split = std::max(1, (n_tiles + tps - 1) / tps);

    ggml_cuda_pool & pool = ctx.pool();
    cudaStream_t stream = ctx.stream();
    const int  n_part = n_split + n_extra;   // partials per row group (the last n_extra the extra blocks')
    const size_t n_slots = (size_t) ne3*n_head_kv*nrg*n_part*ncols;
    ggml_cuda_pool_alloc<float>  part_acc(pool, n_slots*D);
    ggml_cuda_pool_alloc<float2> part_meta(pool, n_slots);

    const uint32_t n_head_log2 = 1u << (uint32_t) floorf(log2f((float) n_head));
    turbo_fa_params p;
    p.Q = (const char *) Q->data; p.K = (const char *) K->data; p.V = (const char *) V->data;
    p.rope = turbo_rope{};
    // the RoPE's cos/sin once per lane for a decode step's rows (one token: every row has the same position; the
    // pad rows skipped): the cos/sin (powf, cosf, sinf per pair) are a visible share of a short decode kernel, so
    // each lane computes them once instead of once per row
    p.rope_once = rope && n_q == 1 && D == (ggml_cuda_turbo_qk(V->type) == QK_TURBO_64 ? QK_TURBO_64 : QK_TURBO) ? 1 : 0;
    GGML_ASSERT(!mul || rope);
    if (rope) {   // Q views the ROPE's output; its input has the same layout (ggml_cuda_turbo_rope_fa_fusable), and so
                  // has the MUL's input (ggml_cuda_turbo_rope_mul_fusable)
        const ggml_tensor * x = ggml_cuda_turbo_rope_params(rope, mul, p.rope);
        p.Q = (const char *) x->data + ((const char *) Q->data - (const char *) rope->data);
    }
    p.mask = mask ? (const char *) mask->data : nullptr;
    p.part_acc = part_acc.ptr; p.part_meta = part_meta.ptr;
    p.scale = scale; p.logit_softcap = logit_softcap; p.max_bias = max_bias;
    p.m0 = powf(2.0f, -(max_bias       ) / n_head_log2);
    p.m1 = powf(2.0f, -(max_bias / 2.0f) / n_head_log2);
    p.n_head_log2 = n_head_log2;
    p.n_q = n_q; p.n_head = n_head; p.gqa = gqa; p.n_kv = n_kv_main;
    p.ne13 = (int) K->ne[3]; p.ne23 = (int) V->ne[3]; p.ne33 = mask ? (int) mask->ne[3] : 1;
    p.nb01 = Q->nb[1]; p.nb02 = Q->nb[2]; p.nb03 = Q->nb[3];
    p.nb11 = K->nb[1]; p.nb12 = K->nb[2]; p.nb13 = K->nb[3];
    p.nb21 = V->nb[1]; p.nb22 = V->nb[2]; p.nb23 = V->nb[3];
    p.nb31 = mask ? mask->nb[1] : 0; p.nb33 = mask ? mask->nb[3] : 0;
    p.nrg = nrg; p.n_split = n_part; p.tiles_per_split = tps;
    p.c0 = turbo_fa_cell0{};
    p.c0.on = n_extra > 0;
    p.c0.n_extra = n_extra;
    if (r_n > 0) {
        const ggml_tensor * kr = dst->src[7];
        const ggml_tensor * vr = dst->src[8];
        const ggml_tensor * mr = dst->src[9];
        p.c0.kr = (const char *) kr->data; p.c0.vr = (const char *) vr->data; p.c0.mr = (const char *) mr->data;
        p.c0.r_n = r_n; p.c0.r_keys = TURBO_FA_RING_KEYS;
        p.c0.kr_nb1 = kr->nb[1]; p.c0.kr_nb2 = kr->nb[2]; p.c0.kr_nb3 = kr->nb[3];
        p.c0.vr_nb1 = vr->nb[1]; p.c0.vr_nb2 = vr->nb[2]; p.c0.vr_nb3 = vr->nb[3];
        p.c0.mr_nb1 = mr->nb[1]; p.c0.mr_nb3 = mr->nb[3];
    }
    if (c0_on) {
        const ggml_tensor * k0 = ggml_cuda_is_turbo_type(K->type) ? dst->src[5] : nullptr;
        const ggml_tensor * v0 = ggml_cuda_is_turbo_type(V->type) ? dst->src[6] : nullptr;
        GGML_ASSERT(!k0 || (k0->type == GGML_TYPE_F32 && k0->nb[0] == sizeof(float) && k0->ne[0] == D));
        GGML_ASSERT(!v0 || (v0->type == GGML_TYPE_F32 && v0->nb[0] == sizeof(float) && v0->ne[0] == D));
        p.c0.c0 = 1;
        p.c0.K = p.K; p.c0.V = p.V; p.c0.mask = p.mask;
        p.c0.k0 = k0 ? (const float *) k0->data : nullptr;
        p.c0.v0 = v0 ? (const float *) v0->data : nullptr;
        p.c0.k0_nb1 = k0 ? k0->nb[1] : 0; p.c0.k0_nb2 = k0 ? k0->nb[2] : 0;
        p.c0.v0_nb1 = v0 ? v0->nb[1] : 0; p.c0.v0_nb2 = v0 ? v0->nb[2] : 0;
        // the split blocks start one key in (their loops unchanged: every row, tile and offset is relative to these)
        p.K += K->nb[1];
        p.V += V->nb[1];
        if (p.mask) {
            p.mask += sizeof(half);
        }
    }

    const dim3 grid(n_part, n_head_kv*nrg, ne3);
    if (use_mma) {
        switch (K->type) {
            case GGML_TYPE_TURBO4: ggml_cuda_turbo_fattn_mma_launch<GGML_TYPE_TURBO4>(stream, D, V->type, loop, p, grid); break;
            case GGML_TYPE_TURBO3_64: ggml_cuda_turbo_fattn_mma_launch<GGML_TYPE_TURBO3_64>(stream, D, V->type, loop, p, grid); break;
            case GGML_TYPE_TURBO2_64: ggml_cuda_turbo_fattn_mma_launch<GGML_TYPE_TURBO2_64>(stream, D, V->type, loop, p, grid); break;
            case GGML_TYPE_TURBO4_64: ggml_cuda_turbo_fattn_mma_launch<GGML_TYPE_TURBO4_64>(stream, D, V->type, loop, p, grid); break;
            case GGML_TYPE_TURBO3: ggml_cuda_turbo_fattn_mma_launch<GGML_TYPE_TURBO3>(stream, D, V->type, loop, p, grid); break;
            case GGML_TYPE_TURBO2: ggml_cuda_turbo_fattn_mma_launch<GGML_TYPE_TURBO2>(stream, D, V->type, loop, p, grid); break;
            case GGML_TYPE_Q8_0:   ggml_cuda_turbo_fattn_mma_launch<GGML_TYPE_Q8_0>  (stream, D, V->type, loop, p, grid); break;
            case GGML_TYPE_F16:    ggml_cuda_turbo_fattn_mma_launch<GGML_TYPE_F16>   (stream, D, V->type, loop, p, grid); break;
            default: GGML_ABORT("turbo flash attention (mma): unsupported K type %s", ggml_type_name(K->type));
        }
    } else switch (K->type) {
        case GGML_TYPE_F16:    ggml_cuda_turbo_fattn_launch<GGML_TYPE_F16>   (stream, D, V->type, ncols, p, grid); break;
        case GGML_TYPE_Q8_0:   ggml_cuda_turbo_fattn_launch<GGML_TYPE_Q8_0>  (stream, D, V->type, ncols, p, grid); break;
        case GGML_TYPE_TURBO3: ggml_cuda_turbo_fattn_launch<GGML_TYPE_TURBO3>(stream, D, V->type, ncols, p, grid); break;
        case GGML_TYPE_TURBO2: ggml_cuda_turbo_fattn_launch<GGML_TYPE_TURBO2>(stream, D, V->type, ncols, p, grid); break;
        case GGML_TYPE_TURBO4: ggml_cuda_turbo_fattn_launch<GGML_TYPE_TURBO4>(stream, D, V->type, ncols, p, grid); break;
        default: GGML_ABORT("turbo flash attention: unsupported K type %s", ggml_type_name(K->type));
    }
    CUDA_CHECK(cudaGetLastError());

    const bool V_turbo = ggml_cuda_is_turbo_type(V->type);
    const int  V_qk    = ggml_cuda_turbo_qk(V->type) == QK_TURBO_64 ? QK_TURBO_64 : QK_TURBO;   // the inverse rotation's block
    const float * sinks_d = sinks ? (const float *) sinks->data : nullptr;
    float * dst_d = (float *) dst->data;
#define TURBO_COMBINE(DD, QKB, VT, NC) \
    if (D == DD && V_qk == QKB && V_turbo == VT && ncols == NC) { \
        turbo_fattn_combine_launch<DD, QKB, VT, NC>(stream, part_acc.ptr, part_meta.ptr, sinks_d, dst_d, n_part, nrg, gqa, n_q, n_head, n_head_kv, ne3); \
    }
    TURBO_COMBINE(128, 128, true, 4) TURBO_COMBINE(128, 128, true, 8) TURBO_COMBINE(128, 128, false, 4) TURBO_COMBINE(128, 128, false, 8)
    TURBO_COMBINE(256, 128, true, 4) TURBO_COMBINE(256, 128, true, 8) TURBO_COMBINE(256, 128, false, 4) TURBO_COMBINE(256, 128, false, 8)
    TURBO_COMBINE(64, 64, true, 8)
#undef TURBO_COMBINE
    CUDA_CHECK(cudaGetLastError());
}

// the 64-value types' decode on the tensor-core kernel at D = 64 (K and V both of them, any widths; Ampere and newer),
// reading the codes as the 128-value decode does, instead of decoding the whole cache to f16 for upstream's kernel
// every step (fattn-turbo-prefill.cu keeps the prefill, other head sizes and q8_0 / f16 partners): the conversion's cost
// grows with the cache, this kernel reads fewer bytes than an f16 cache
bool ggml_cuda_turbo64_fattn_fused(const ggml_tensor * dst) {
    const ggml_tensor * Q     = dst->src[0];
    const ggml_tensor * K     = dst->src[1];
    const ggml_tensor * V     = dst->src[2];
    if (ggml_cuda_turbo_qk(K->type) != QK_TURBO_64 || ggml_cuda_turbo_qk(V->type) != QK_TURBO_64 || !turbo_fattn_uses_mma(K, V)) {
        return false;
    }
    if (Q->ne[1] > GGML_CUDA_TURBO_FA_MAX_BATCH || Q->ne[0] != 64 || K->ne[0] != 64 || V->ne[0] != 64) {
        return false;
    }
    return ggml_is_contiguous(dst) && turbo_fattn_layout_ok(dst);
}

void ggml_cuda_flash_attn_ext_turbo(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    if ((ggml_cuda_turbo_qk(dst->src[1]->type) == QK_TURBO_64 || ggml_cuda_turbo_qk(dst->src[2]->type) == QK_TURBO_64) &&
        !ggml_cuda_turbo64_fattn_fused(dst)) {
        ggml_cuda_turbo64_fattn(ctx, dst);
        return;
    }
    turbo_fattn_decode(ctx, dst, nullptr);
}

// llama's RoPE of Q, when only the decode attention reads it (ROPE -> PERMUTE -> views -> FLASH_ATTN_EXT, patch 0020
// puts them next to each other), is done by the attention kernel as it loads q: one launch fewer per layer and token
// (a RoPE launch per layer costs more than the kernel's extra work on a few rows). Returns how many
// nodes after the ROPE (node i) the fused attention takes, or 0. The RoPEs that 0018's K write does
// (ggml_cuda_turbo_rope_on_load_ok); the tensor-core kernel only (128-value K, or the 64-value types at D = 64); the
// ROPE's input read in place of its output (same layout).
int ggml_cuda_turbo_rope_fa_fusable(const ggml_cgraph * cgraph, const int i) {
    const ggml_tensor * rope = cgraph->nodes[i];
    if (rope->op != GGML_OP_ROPE || ggml_node_get_use_count(cgraph, i) != 1) {
        return 0;
    }
    const ggml_tensor * x = rope->src[0];
    const int64_t D = x->ne[0];
    if (!ggml_cuda_turbo_rope_on_load_ok(rope) || !ggml_are_same_layout(x, rope)) {
        return 0;
    }
    // the ROPE's one consumer is a chain of views (one use each) whose end is Q of the attention, with views between
    // (llama: q's view and permute, K's and V's, the views of cell 0's rows: the attention is node i + 9)
    const ggml_tensor * q = rope;
    for (int j = i + 1; j < cgraph->n_nodes && j <= i + 12; ++j) {
        const ggml_tensor * n = cgraph->nodes[j];
        if (n->op == GGML_OP_FLASH_ATTN_EXT) {
            // the output may share memory with the ROPE's input (ggml-alloc frees that after the ROPE, so requiring
            // otherwise would refuse every fusion): harmless, as the attention kernel writes only partials and the
            // merge kernel writes the output after every block has read its q
            // one KV stream only (Q's ne[3] == 1): the kernel takes a row's position by its token index within a
            // stream, so with llama's non-unified cache (streams in ne[3], e.g. llama-server -np 2) every stream would
            // get stream 0's positions; those graphs keep upstream's ROPE kernel
            return q != rope && n->src[0] == q && q->view_src == rope && ggml_cuda_turbo_fattn_pair_supported(n) &&
                n->src[0]->ne[1] <= GGML_CUDA_TURBO_FA_MAX_BATCH && n->src[0]->ne[0] == D && n->src[0]->ne[3] == 1 &&
                ((ggml_cuda_turbo_qk(n->src[1]->type) == QK_TURBO && turbo_fattn_uses_mma(n->src[1], n->src[2])) ||
                 ggml_cuda_turbo64_fattn_fused(n)) ? j - i : 0;
        }
        if (!ggml_op_is_empty(n->op)) {
            return 0;   // another computed node in between
        }
        if (n->src[0] == q) {
            if (ggml_node_get_use_count(cgraph, j) != 1) {
                return 0;
            }
            q = n;
        }
    }
    return 0;
}

void ggml_cuda_turbo_rope_fa(ggml_backend_cuda_context & ctx, const ggml_tensor * rope, ggml_tensor * fa,
        const ggml_tensor * mul) {
    // said once, so that a log shows the fusion happened (a check on the graph can refuse it unseen)
    static bool said = false;
    if (!said) {
        said = true;
        GGML_LOG_INFO("turbo: Q's RoPE done by the decode attention kernel (%s)\n", rope->name);
    }
    static bool said_mul = false;
    if (mul && !said_mul) {
        said_mul = true;
        GGML_LOG_INFO("turbo: the MUL before Q's RoPE done by the decode attention kernel too (%s)\n", mul->name);
    }
    turbo_fattn_decode(ctx, fa, rope, mul);
}
