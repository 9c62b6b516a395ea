// turbo-llama: tensor-core flash-attention decode for turbo K and turbo V (kernel v4 and its successors up to
// v11, DESIGN.md §2; the history is in results/cuda-fa-notes.md).
//
// Why: the scalar kernel (fattn-turbo.cuh) spends ~830 shared-memory instructions per key and runs at
// 0.23 TB/s on the cache. Here every warp walks its own keys, 16 at a time, with all query rows of the
// GQA group (up to 8) in one mma.m16n8k16 column set, and nothing but two 64-entry tables in shared memory:
//   S^T (16 keys x 8 rows)  = K (16 x 128) . Q^T        A = centroids decoded from the codes in registers
//   O^T (128 x 8 rows)     += V^T (128 x 16) . P^T      B = P^T, transposed in registers by movmatrix
// Both products are in the rotated domain: q is rotated once per block, the combine kernel rotates the
// output back once per row (k_turbo_fattn_combine). A dot product is a sum over dimensions, so each
// thread takes the dimensions that sit together in the packed codes (see the index helpers) and q's
// fragments use the same order. Codes become f16 pairs through a table: 6 bits (two 2-bit low planes,
// two high bits) -> half2 of two centroids. The per-block norms scale S (K) and P (V) in f32/f16.
// Scores are kept in base 2 (q carries log2 e), the partial maxima are handed back in base e.
#pragma once

#include "fattn-turbo.cuh"

#include <cooperative_groups.h>

#define TURBO_MMA_WARPS 4
#define TURBO_MMA_ROWS  8    // query rows per block: the N of the mma
#define TURBO_MMA_KEYS  16   // keys per warp step: the M of S^T
#define TURBO_MMA_MIN_BLOCKS 4   // variant 6, D = 128: registers capped for 4 blocks (16 warps) per SM

// VOL: volatile asm keeps every mma in program order (v4-v11 were tuned so). v14 (two tiles per step) needs the
// compiler free to interleave its two tiles' independent mma chains: mma has no side effects, so plain asm is correct
template <bool VOL = true>
static __device__ __forceinline__ void turbo_mma_16816(float c[4], const uint32_t a[4], const uint32_t b0, const uint32_t b1) {
#ifdef AMPERE_MMA_AVAILABLE
    if (VOL) {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    } else {
        asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
#else
    GGML_UNUSED(c); GGML_UNUSED(a); GGML_UNUSED(b0); GGML_UNUSED(b1);
    NO_DEVICE_CODE;
#endif
}

// 8x8 f16 transpose across the warp: lane (r = lane/4, c = 2*(lane%4)) holds (r, c..c+1) before and after
static __device__ __forceinline__ uint32_t turbo_movmatrix_trans(const uint32_t x) {
#ifdef AMPERE_MMA_AVAILABLE
    uint32_t y;
    asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(y) : "r"(x));
    return y;
#else
    GGML_UNUSED(x);
    NO_DEVICE_CODE;
    return 0;
#endif
}

static __device__ __forceinline__ uint32_t turbo_h2_bits(const float a, const float b) {
    const half2 h = __floats2half2_rn(a, b);   // a in the low 16 bits: the lower k index of a fragment
    return *(const uint32_t *) &h;
}

// pair table entry i: (centroid of code 1, centroid of code 2), i = lo1 | lo2 << 2 | hi1 << 4 | hi2 << 5
template <int bits> static __device__ __forceinline__ uint32_t turbo_mma_pair(const int i) {
    if (bits == 3) {
        return turbo_h2_bits(turbo_d_c3[(i & 3) | ((i >> 4) & 1) << 2], turbo_d_c3[((i >> 2) & 3) | ((i >> 5) & 1) << 2]);
    }
    return turbo_h2_bits(turbo_d_c2[i & 3], turbo_d_c2[(i >> 2) & 3]);
}

// ---- staging: each warp copies its tile's bytes with 16-byte cp.async (L2 only) into a per-warp ring of
// shared-memory stages, so that its loads are a few coalesced requests instead of 16-bit loads spread over 16 rows
// (v5, v8); each lane then reads its words from shared memory. A key's NB blocks are contiguous and 2-byte aligned:
// its bytes start at an even offset 0..14 of their first chunk, so KC chunks cover them.
// v11 (VAR 9): staged rows of an odd number of chunks. A turbo3 row at D = 128 is 4 chunks (16 words), so rows g
// and g + 2 start in the same bank and the lanes of one t (8 rows) read 4-way conflicting words; 5 chunks (20 words)
// spread the 8 rows over 8 bank offsets (ncu of v10: 61% of the shared wavefronts were conflicts; a model of one
// step's staged reads, llama8b layout: 112 -> 36 wavefronts). turbo2 at D = 128 is already 3 chunks.
template <int NB, int KBITS, int VBITS, int VAR>
struct turbo_mma_stage_cfg {
    static constexpr int RC = VAR >= 9 ? 1 : 0;                // v11: rows rounded up to an odd number of chunks
    static constexpr int KBYTES = NB*(KBITS == 3 ? 50 : 34);   // one key's bytes of this head
    static constexpr int VBYTES = NB*(VBITS == 3 ? 50 : 34);
    static constexpr int KC = (KBYTES + 14 + 15)/16;           // 16-byte chunks per key
    static constexpr int VC = (VBYTES + 14 + 15)/16;
    static constexpr int KW = 4*(KC | RC);                     // words per staged key row
    static constexpr int VW = 4*(VC | RC);
    static constexpr int ALIGN = 15;                           // a row's start offset in its staged copy: address & ALIGN
    static constexpr int WORDS = TURBO_MMA_KEYS*(KW + VW);     // one stage
    static constexpr int TPS = VAR == 11 || VAR == 13 ? 2 : 1;  // v14: tiles per warp step
    static constexpr int NSTAGE = TPS == 2 ? 4 : NB == 1 ? 3 : 2;  // stages of the ring (shared memory: 48 KB static)
    static constexpr int GROUPS = NSTAGE/TPS;                  // a step's TPS stages are one cp.async group
    static_assert(TPS == 1 || NB == 1, "v14 is compiled for D = 128 only (shared memory)");
};

// asynchronous copy of 16 bytes to shared memory, L2 only; src_bytes < 16 zero-fills the rest
static __device__ __forceinline__ void turbo_cp_async16(const uint32_t dst, const void * src, const int src_bytes) {
#ifdef AMPERE_MMA_AVAILABLE
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(dst), "l"(src), "r"(src_bytes));
#else
    GGML_UNUSED(dst); GGML_UNUSED(src); GGML_UNUSED(src_bytes);
#endif
}
static __device__ __forceinline__ void turbo_cp_async_commit() {
#ifdef AMPERE_MMA_AVAILABLE
    asm volatile("cp.async.commit_group;");
#endif
}
template <int N> static __device__ __forceinline__ void turbo_cp_async_wait() {
#ifdef AMPERE_MMA_AVAILABLE
    asm volatile("cp.async.wait_group %0;" :: "n"(N));
#endif
}

// a named barrier of n threads (v21's warp pairs: 64); shared memory written before it is visible to the others
// after it. Barrier 0 is __syncthreads'
static __device__ __forceinline__ void turbo_bar_sync(const int id, const int n) {
    asm volatile("bar.sync %0, %1;" :: "r"(id), "r"(n) : "memory");
}

// v10: the copies of one stage without a 64-bit multiply per chunk. A lane's chunks sit at fixed keys kk and
// chunk numbers c of every tile, and a tile starts at a multiple of 16 keys, so (row & 15) does not depend on the
// tile: each chunk's byte offset from the tile's first row is computed once, and a tile adds t1*16*nb1.
template <int NC, int RW>
struct turbo_mma_chunk_src {
    static constexpr int SLOTS = (TURBO_MMA_KEYS*NC + WARP_SIZE - 1)/WARP_SIZE;
    int off[SLOTS];

    __device__ __forceinline__ void init(const char * base, const int64_t nb1, const int lane) {
#pragma unroll
        for (int s = 0; s < SLOTS; ++s) {
            const int i = lane + WARP_SIZE*s, kk = i / NC, c = i % NC;
            const int64_t rel = (int64_t) kk*nb1;
            off[s] = (int) (rel - (int64_t) (((uintptr_t) base + rel) & 15) + 16*c);
        }
    }
    // the 16 rows of tile t1 into words[16][RW] (RW >= 4*NC); rows past n_kv are zero-filled (from an aligned address)
    __device__ __forceinline__ void copy(uint32_t * words, const char * base, const int64_t nb1, const int t1,
            const int n_kv, const int lane) const {
        const uint32_t dst0 = (uint32_t) __cvta_generic_to_shared(words);
        const char * tile = base + (int64_t) t1*TURBO_MMA_KEYS*nb1;
        const char * safe = (const char *) ((uintptr_t) base & ~(uintptr_t) 15);
#pragma unroll
        for (int s = 0; s < SLOTS; ++s) {
            const int i = lane + WARP_SIZE*s;
            if (i < TURBO_MMA_KEYS*NC) {
                const bool ok = t1*TURBO_MMA_KEYS + i / NC < n_kv;
                turbo_cp_async16(dst0 + 4*((i / NC)*RW + 4*(i % NC)), ok ? tile + off[s] : safe, ok ? 16 : 0);
            }
        }
    }
};

// v8: four table indexes at once. Byte k of the result is 4x the table index (a byte offset into the 64-entry
// pair table) of nibble n = 2k + odd of lo: its two low-plane codes, with their two high bits from bits 2n, 2n+1
// of the half of hi that sel picks (0x1100: hi's low 16 bits, 0x3322: its high 16 bits). A lookup is then one
// byte extraction and one shared load, instead of cutting 6 bits out of two words per lookup.
template <int bits, int odd>
static __device__ __forceinline__ uint32_t turbo_mma_idx4(const uint32_t lo, const uint32_t hi, const uint32_t sel) {
    uint32_t r = (odd ? (lo >> 2) : (lo << 2)) & 0x3C3C3C3Cu;
    if (bits == 3) {
        const uint32_t x = __byte_perm(hi, 0, sel);   // bytes: the half's low byte twice, its high byte twice
        r |= odd ? (((x << 4) & 0x00C000C0u) | (x & 0xC000C000u))
                 : (((x << 6) & 0x00C000C0u) | ((x << 2) & 0xC000C000u));
    }
    return r;
}
// the pair of nibble n (the word of its parity), read from the table at shared address table_sh (256-byte
// aligned: one byte permute gives the whole address, no add). The asm has no memory operand, so the compiler
// may schedule it freely; it cannot rise above the barrier that publishes the table, because its address comes
// from this step's staged codes.
static __device__ __forceinline__ uint32_t turbo_mma_pick(const uint32_t table_sh, const uint32_t w, const int n) {
    uint32_t v;
    asm("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(__byte_perm(w, table_sh, 0x7650 | (n >> 1))));
    return v;
}

// a 32-bit value at an even byte offset of a staged row
static __device__ __forceinline__ uint32_t turbo_sh_u32(const uint32_t * row, const int off) {
    const uint32_t a = row[off >> 2];
    return (off & 2) ? __funnelshift_r(a, row[(off >> 2) + 1], 16) : a;
}
static __device__ __forceinline__ uint32_t turbo_sh_u16(const uint32_t * row, const int off) {
    return (row[off >> 2] >> ((off & 2)*8)) & 0xFFFFu;
}

// V: the codes of two keys a, b at the lane's 16 dims, interleaved so that nibble jj of lo_e/lo_o holds
// (a, b) at dim 2jj / 2jj+1, and bits 2jj, 2jj+1 of hi_e/hi_o their high bits
struct turbo_mma_vpair {
    uint32_t lo_e, lo_o, hi_e, hi_o;
    __device__ __forceinline__ void make(const uint32_t wa, const uint32_t wb, const uint32_t ha, const uint32_t hb) {
        lo_e = (wa & 0x33333333u) | ((wb & 0x33333333u) << 2);
        lo_o = ((wa >> 2) & 0x33333333u) | (wb & 0xCCCCCCCCu);
        hi_e = (ha & 0x5555u) | ((hb & 0x5555u) << 1);
        hi_o = ((ha >> 1) & 0x5555u) | (hb & 0xAAAAu);
    }
};

// TURBO_FA_CLUSTER=1 (run 12: no gain measured): the splits of a row group as one thread-block cluster (sm_90). Each block has left its
// warps' merged output in its shared memory (om: rows x D, unnormalised; mc/lc: row maxima in base e and sums);
// the cluster's warps then take the (row, 128-block) pieces in turn, merge them over the blocks through distributed
// shared memory exactly as the combine kernel merges the global partials, rotate back and write dst.
template <int D, int NR>
static __device__ __forceinline__ void turbo_mma_cluster_merge(const turbo_fa_params & p, float * om, float * mc, float * lc,
        const int hk, const int rg, const int iq3, const int nr_real, const int warp, const int lane) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    namespace cg = cooperative_groups;
    cg::cluster_group cl = cg::this_cluster();
    cl.sync();   // every block's merged rows are in its shared memory
    constexpr int NB = D / QK_TURBO;
    const int n_split = (int) cl.num_blocks();
    for (int task = (int) cl.block_rank()*TURBO_MMA_WARPS + warp; task < nr_real*NB; task += n_split*TURBO_MMA_WARPS) {
        const int r = task / NB, blk = task % NB;
        const int rho = rg*NR + r;
        const int j = rho / p.gqa, h = hk*p.gqa + rho % p.gqa;
        auto meta = [&](const int s) { return make_float2(cl.map_shared_rank(mc, s)[r], cl.map_shared_rank(lc, s)[r]); };
        auto acc  = [&](const int s) { return cl.map_shared_rank(om, s) + r*D + blk*QK_TURBO + lane; };
        float v[4];
        turbo_fattn_merge_splits<4>(meta, acc, n_split, 32, p.sinks, h, v);
        turbo_fattn_store_block<true>(p.dst + (((int64_t) iq3*p.n_q + j)*p.n_head + h)*D + blk*QK_TURBO, v, lane);
    }
    cl.sync();   // no block leaves while the others may still read its shared memory
#else
    GGML_UNUSED(p); GGML_UNUSED(om); GGML_UNUSED(mc); GGML_UNUSED(lc); GGML_UNUSED(hk); GGML_UNUSED(rg);
    GGML_UNUSED(iq3); GGML_UNUSED(nr_real); GGML_UNUSED(warp); GGML_UNUSED(lane);
    NO_DEVICE_CODE;
#endif
}

// VAR (TURBO_FA_MMA): 8 = v8/v10, 16-byte chunk staging and index bytes (turbo_mma_idx4): ncu on v5 had shown the
// loop bound by instruction issue (~1140 warp instructions per 16-key step, a quarter of them computing 4-byte
// copies' addresses, half cutting table indexes); 9 = v11, staged rows of an odd number of chunks (the default);
// 12 = v11 merging its splits in a thread-block cluster; 13 = v14, v11 with two 16-key tiles per warp step (both
// tiles' scores as independent chains, one softmax update for their 32 keys, then both P.V) and registers for 3
// blocks per SM, D = 128 only (the default for turbo3 V from 16K keys up, fattn-turbo.cu); 11 = v18, v14 at 4 blocks
// per SM with q's fragments in shared memory (the default for turbo2 from 16K keys); 24 = v21, D = 256 only: the two
// 128-blocks of a row split over a warp pair (see PAIR below; the default for D = 256 since run 20). Earlier
// variants (v4-v7, v12, v14 at 4 blocks per SM with q in registers, v15-v17, v19, v20) and their measurements are in
// results/cuda-fa-notes.md.
// VAR 30..41, 44 (TURBO_FA_MMA=30..41, 44; D = 128, turbo3 K and V): v14 (13) with one stage of the loop left out, to time
// what each stage costs (run 21). Their results are wrong by design; the control flow, the staging and the loads of
// the codes are v14's. ABL = VAR - 30: 0 nothing left out (v14 itself, the control); 1 no K decode (each tile's
// staged code words, masked to small finite f16, are the A fragments of all 8 S products: no index bytes, no table
// loads); 2 no V decode (the same for V); 3 neither decode; 4 no tensor-core products (the decoded fragments are
// folded into one word by XOR instead); 5 neither decodes nor products (the scores come from the folded words; the
// staging, the code and mask loads, the online softmax and the epilogue stay). 36..41: the stages of the rest, left
// out of 30 (36 the mask loads, 37 the waits for the copies, 38 the online softmax: P = S) and of 35 (39, 40, 41);
// 44: 30 without q's prologue (no q loads, RoPE, scaling, FWHT or fragment loads: q is zeros, its fragments 1.0).
// VAR 42 / 43 (prepared after run 21, not measured yet): v14 (13) / v11 (9) with the softmax's exponentials as the bare
// ex2.approx.ftz (results below 2^-126 flush to 0, as they do anyway once P is rounded to f16). v17 (run 14) measured
// no gain from it, but on loops whose steps then started by waiting for the mask loads (v22 removed that wait)
template <bool FAST> static __device__ __forceinline__ float turbo_mma_exp2(const float x) {
    if (!FAST) {
        return exp2f(x);
    }
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// what a variant number switches on or off (the timing variants and 42/43 on top of another variant's loop)
template <int VAR> struct turbo_mma_variant {
    static constexpr bool TIMING = (VAR >= 30 && VAR <= 41) || VAR == 44;
    static constexpr int ABL = TIMING ? VAR - 30 : 0;                  // the stage left out, see above
    static constexpr bool SKEL = ABL == 5 || (ABL >= 9 && ABL <= 11);  // neither decodes nor products
    static constexpr bool DEC_K = ABL != 1 && ABL != 3 && !SKEL;       // the K decode runs
    static constexpr bool DEC_V = ABL != 2 && ABL != 3 && !SKEL;       // the V decode runs
    static constexpr bool MMA = ABL != 4 && !SKEL;                     // the tensor-core products run
    static constexpr bool NO_MASK = ABL == 6 || ABL == 9;              // no mask loads
    static constexpr bool NO_WAIT = ABL == 7 || ABL == 10;             // no waits for the copies (reads race them)
    static constexpr bool NO_SOFTMAX = ABL == 8 || ABL == 11;          // P = S, no maxima, exponentials or rescale
    static constexpr bool NO_QPRO = ABL == 14;                         // no q prologue
    static constexpr bool FAST_EXP = VAR == 42 || VAR == 43;           // bare ex2.approx in the softmax
    static constexpr int BASE = TIMING || VAR == 42 ? 13 : VAR == 43 ? 9 : VAR;   // the variant whose loop it is
};

template <int D, ggml_type type_K, ggml_type type_V, int VAR>
__launch_bounds__(TURBO_MMA_WARPS*WARP_SIZE, D == 128 ? (turbo_mma_variant<VAR>::BASE == 13 ? 3 : TURBO_MMA_MIN_BLOCKS) : VAR == 24 ? 3 : 1)
static __global__ void k_turbo_fattn_mma(const turbo_fa_params p) {
#ifndef AMPERE_MMA_AVAILABLE
    GGML_UNUSED(p);
    NO_DEVICE_CODE;
#else
    constexpr int NB = D / QK_TURBO;
    constexpr int NW = TURBO_MMA_WARPS;
    constexpr int NR = TURBO_MMA_ROWS;
    constexpr int KBITS = turbo_fa_stage<type_K>::bits, VBITS = turbo_fa_stage<type_V>::bits;
    constexpr int QS = D + 4;
    constexpr float LOG2E = 1.4426950408889634f, LN2 = 0.6931471805599453f;

    // v21 (24, D = 256): the warps of a pair walk the same tiles, each with one of the two 128-blocks of every K and V
    // row (its own staging, q fragments, decode and mma: the D = 128 loop), and they add their halves of each tile's
    // scores through shared memory (one pair barrier per tile) before both run the same softmax. The other D = 256
    // variants keep both blocks in every warp: 246 registers, one block (4 warps) per SM, and at depth 0 one warp's
    // chain of both blocks per tile; here registers for 3 blocks per SM (at 4, 128 registers, the loop spilled), and
    // half the chain
    constexpr bool PAIR = VAR == 24;
    static_assert(!PAIR || NB == 2, "v21 is compiled for D = 256 only");
    constexpr int NBL = PAIR ? 1 : NB;                                // 128-blocks of a row in each warp's loop
    constexpr int NL  = PAIR ? NW/2 : NW;                             // warps (pairs) that walk tiles
    typedef turbo_mma_variant<VAR> vt;
    typedef turbo_mma_stage_cfg<NBL, KBITS, VBITS, vt::BASE> cfg;
    constexpr int TPS = cfg::TPS;
    static_assert(!vt::TIMING || (D == 128 && KBITS == 3 && VBITS == 3), "the timing variants are compiled for turbo3/turbo3, D = 128");
    constexpr uint32_t SMALL = 0x3bff3bffu;   // clears the top exponent bit of both halves: finite, below 1
    uint32_t sink = 0;                         // what the timing variants fold their left-out stage's inputs into
    // v18 (11): v14 at 4 blocks per SM without spills: q's B fragments are read from shared memory at each use
    // instead of held in 16 registers (v14 with them in registers spilled 36-40 bytes at 4 blocks, run 14)
    constexpr bool QSH = VAR == 11;
    // VAR 12 = v11 with the splits merged in a thread-block cluster (see turbo_mma_cluster_merge). A variant of its
    // own: the merge code in every kernel costs the loop ~125 more instructions per step (registers), static count
    constexpr bool CLUSTER = VAR == 12;
    constexpr int RING = NW*cfg::NSTAGE*cfg::WORDS;                   // staging ring, words
    constexpr int OSZ  = NL*NR*D;                                     // the warps' outputs (epilogue), floats
    __shared__ float    q_sh[NR*QS];
    __shared__ __align__(256) uint32_t pairK[64];
    __shared__ __align__(256) uint32_t pairV[64];
    __shared__ float    Ms[NL*NR], Ls[NL*NR];
    __shared__ float4   xs_s[PAIR ? NL*2*2*WARP_SIZE : 1];           // v21: each warp's half of a tile's scores,
    __shared__ float2   xs_n[PAIR ? NL*2*2*WARP_SIZE : 1];           // and its K norms, two slots per pair
    __shared__ float    Mc[NR], Lc[NR];                           // cluster merge: this block's row maxima and sums
    __shared__ uint32_t ring_os[RING > OSZ ? RING : OSZ];             // the ring is dead when the outputs are written
    float * Os = (float *) ring_os;

    const int tid  = threadIdx.x;
    const int lane = tid % WARP_SIZE;
    const int warp = tid / WARP_SIZE;
    const int g = lane >> 2, t = lane & 3;

    // grid: (split, KV head x row group) or, with heads_first, (KV head x row group, split): then the blocks
    // that read the same cache rows for different heads are launched together
    const int split = p.heads_first ? blockIdx.y : blockIdx.x;
    const int hy    = p.heads_first ? blockIdx.x : blockIdx.y;
    const int n_hy  = p.heads_first ? gridDim.x : gridDim.y;
    const int hk    = hy / p.nrg;
    const int rg    = hy % p.nrg;
    const int iq3   = blockIdx.z;
    const int R     = p.gqa*p.n_q;

    if (tid < 64) {
        pairK[tid] = turbo_mma_pair<KBITS>(tid);
        pairV[tid] = turbo_mma_pair<VBITS>(tid);
    }
    const uint32_t pairK_sh = (uint32_t) __cvta_generic_to_shared(pairK);
    const uint32_t pairV_sh = (uint32_t) __cvta_generic_to_shared(pairV);
    // v21: a warp's pair and its 128-block (bw) of every row; its rows start bw blocks in
    const int pair = PAIR ? warp / 2 : warp;
    const int bw   = PAIR ? warp % 2 : 0;
    constexpr int KBS = KBITS == 3 ? 50 : 34, VBS = VBITS == 3 ? 50 : 34;
    const char * Kb = p.K + (int64_t) hk*p.nb12 + (int64_t) (iq3 % p.ne13)*p.nb13 + bw*KBS;
    const char * Vb = p.V + (int64_t) hk*p.nb22 + (int64_t) (iq3 % p.ne23)*p.nb23 + bw*VBS;
    const int n_tiles = (p.n_kv + TURBO_MMA_KEYS - 1) / TURBO_MMA_KEYS;
    const int t_begin = split*p.tiles_per_split;
    const int t_end   = min(n_tiles, t_begin + p.tiles_per_split);
    uint32_t * ring = ring_os + warp*cfg::NSTAGE*cfg::WORDS;
    // one stage's copies: K rows then V rows of the 16 keys of tile t1
    turbo_mma_chunk_src<cfg::KC, cfg::KW> ksrc;
    turbo_mma_chunk_src<cfg::VC, cfg::VW> vsrc;
    ksrc.init(Kb, p.nb11, lane);
    vsrc.init(Vb, p.nb21, lane);
    auto stage = [&](uint32_t * st, const int t1) {
        ksrc.copy(st, Kb, p.nb11, t1, p.n_kv, lane);
        vsrc.copy(st + TURBO_MMA_KEYS*cfg::KW, Vb, p.nb21, t1, p.n_kv, lane);
    };
    // TURBO_PDL: everything above reads no memory that the kernels before write; the K/V write of this step is one.
    // The merge kernel may launch now, as upstream's kernels let theirs (its blocks wait in ggml_cuda_pdl_sync, which
    // returns once this whole grid has finished and its writes are visible): its launch then overlaps this kernel
    // instead of following it (before run 18 the trigger came after the key loop)
    ggml_cuda_pdl_lc();
    ggml_cuda_pdl_sync();
    // the first stages' K/V copies go out before the Q prologue, so that their latency overlaps it (short
    // contexts are latency: a warp there has one or two steps)
    int tt = t_begin + pair;
#pragma unroll
    for (int st = 0; st < (cfg::GROUPS - 1)*TPS; ++st) {
        const int t1 = tt + st*NL;
        if (t1 < t_end) {
            stage(ring + st*cfg::WORDS, t1);
        }
        if (st % TPS == TPS - 1) {
            turbo_cp_async_commit();
        }
    }

    // q rows, scaled (softmax scale and log2 e), signs applied, then the FWHT of each 128-block: one warp per
    // 128-block of a row, in registers (the same butterflies and float operations as the C code)
    // v9b: all of a warp's q loads are issued before the first FWHT (one global latency, not NR*NB/NW)
    const float qscale = p.scale*LOG2E;
    constexpr int QT = NR*NB/NW;   // q blocks per warp
    float qv[QT][4];
    // a fused neox RoPE of a 256-wide head (TURBO_ROPE_NEOX_WIDE=1) pairs each value with the one 128 further on or
    // back, in the row's other block: those are loaded too (the same lane and slot)
    const bool neox_wide = NB == 2 && p.rope.pos && p.rope.neox;
    float qn[QT][4];
#pragma unroll
    for (int i = 0; i < QT; ++i) {
        const int task = warp + i*NW;
        const int r = task / NB, blk = task % NB;
        const int rho = rg*NR + r;
        const bool ok = rho < R;   // warp-uniform
        const int j = ok ? rho / p.gqa : 0, h = hk*p.gqa + (ok ? rho % p.gqa : 0);
        const float * qrow = (const float *) (p.Q + iq3*p.nb03 + h*p.nb02 + j*p.nb01) + blk*QK_TURBO;
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            qv[i][k] = ok && !vt::NO_QPRO ? qrow[lane + 32*k] : 0.0f;
        }
        if (neox_wide) {
            const float * qo = qrow + (blk == 0 ? QK_TURBO : -QK_TURBO);
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                qn[i][k] = ok ? qo[lane + 32*k] : 0.0f;
            }
        }
    }
    // Q's RoPE deferred into this kernel (patch 0021): q comes from the ROPE's input. rope_once (one token, NB = 1):
    // every row has the same position, so the lane's cos and sin are computed once, while the q loads are in flight
    float rc[4], rs[4];
    if (NB == 1 && p.rope_once && !vt::NO_QPRO) {
        turbo_rope_block_cs(p.rope, 0, p.rope.pos[0], lane, rc, rs);
    }
#pragma unroll
    for (int i = 0; i < QT; ++i) {
        const int task = warp + i*NW;
        const int r = task / NB, blk = task % NB;
        const int rho = rg*NR + r;
        // a pad row (a GQA group of 4 fills half of the 8) is zeros, loaded as such: no RoPE, no FWHT (warp-uniform)
        if (rho < R && !vt::NO_QPRO) {
            if (NB == 1 && p.rope_once) {
                turbo_rope_apply(p.rope, qv[i], 0, rc, rs, lane);
            } else if (p.rope.pos) {
                turbo_rope_block(p.rope, qv[i], blk*QK_TURBO, p.rope.pos[rho / p.gqa], lane,
                                 neox_wide ? qn[i] : nullptr);
            }
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                qv[i][k] *= turbo_sign_neg(lane + 32*k) ? -qscale : qscale;
            }
            turbo_warp_fwht(qv[i], lane);
        }
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            q_sh[r*QS + blk*QK_TURBO + lane + 32*k] = qv[i][k];
        }
    }
    __syncthreads();
    // B fragments of Q^T: chunk c = 8*blk + cc holds dims 128 blk + 32t + 4cc + {0,1} (b0), {2,3} (b1) of row g
    // (v21: the chunks of the warp's block bw only)
    uint32_t qb[NBL*8][2];
#pragma unroll
    for (int c = 0; c < NBL*8; ++c) {
        const float * qr = q_sh + g*QS + (PAIR ? bw : c >> 3)*QK_TURBO + 32*t + 4*(c & 7);
        if (vt::NO_QPRO) {
            qb[c][0] = qb[c][1] = 0x3c003c00u;   // timing variant 44: 1.0 halves, no loads
            continue;
        }
        qb[c][0] = turbo_h2_bits(qr[0]*TURBO_CUDA_INV_SQRT_QK, qr[1]*TURBO_CUDA_INV_SQRT_QK);
        qb[c][1] = turbo_h2_bits(qr[2]*TURBO_CUDA_INV_SQRT_QK, qr[3]*TURBO_CUDA_INV_SQRT_QK);
    }
    // v18: the fragments (the same in every warp) replace q in q_sh: chunk c of lane l at uint2 c*32 + l
    const uint32_t qfrag_sh = (uint32_t) __cvta_generic_to_shared(q_sh) + 8*lane;
    if (QSH) {
        static_assert(!QSH || NBL*8*WARP_SIZE*2 <= NR*QS, "q fragments do not fit in q_sh");
        __syncthreads();   // every warp has read q_sh
        if (warp == 0) {
#pragma unroll
            for (int c = 0; c < NBL*8; ++c) {
                ((uint2 *) q_sh)[c*WARP_SIZE + lane] = make_uint2(qb[c][0], qb[c][1]);
            }
        }
        __syncthreads();
    }
    // B fragment pair of chunk c: from registers, or (v18) a shared load at this point of the loop (volatile: not
    // hoisted out of it, which would bring the 16 registers back)
    auto qfrag = [&](const int c, uint32_t & b0, uint32_t & b1) {
        if (QSH) {
            asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];" : "=r"(b0), "=r"(b1) : "r"(qfrag_sh + c*WARP_SIZE*8));
        } else {
            b0 = qb[c][0];
            b1 = qb[c][1];
        }
    };

    // rows of this lane in S^T and O^T: 2t, 2t+1
    float slope[2];
    const half * mrow[2];
    const half * maskb = p.mask ? (const half *) (p.mask + (int64_t) (iq3 % p.ne33)*p.nb33) : nullptr;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int rho = rg*NR + 2*t + i;
        const bool ok = rho < R;
        const int j = ok ? rho / p.gqa : 0;
        const int h = hk*p.gqa + (ok ? rho % p.gqa : 0);
        slope[i] = turbo_alibi_slope(p.max_bias, h, p.n_head_log2, p.m0, p.m1)*LOG2E;
        mrow[i] = maskb ? maskb + (int64_t) j*(p.nb31/sizeof(half)) : nullptr;
    }
    const float cap  = p.logit_softcap*LOG2E;
    const float icap = p.logit_softcap != 0.0f ? 1.0f/cap : 0.0f;

    float o[NBL*8][4];
#pragma unroll
    for (int j = 0; j < NBL*8; ++j) {
        o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
    }
    float M[2] = {-INFINITY, -INFINITY}, L[2] = {0.0f, 0.0f};

    // v10: where each of the lane's keys starts in its staged row (0..14).
    // k0 is a multiple of 16, so ((k0 + j)*nb) & ALIGN depends on j only (keys past n_kv are staged as zeros
    // and read as zeros at any offset). At D = 128 they are computed once (the loop body: 808 -> 722 SASS
    // instructions, the same 128 registers); at D = 256 every step, as before (kept live, they spill).
    int ksh[2], vsh[2], vsh4[4];
    auto staged_offsets = [&](const int k0) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            ksh[i] = (int) (((uintptr_t) Kb + (int64_t) (k0 + g + 8*i)*p.nb11) & cfg::ALIGN);
            vsh[i] = (int) (((uintptr_t) Vb + (int64_t) (k0 + g + 8*i)*p.nb21) & cfg::ALIGN);
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            vsh4[i] = (int) (((uintptr_t) Vb + (int64_t) (k0 + 2*t + (i & 1) + 8*(i >> 1))*p.nb21) & cfg::ALIGN);
        }
    };
    if (NBL == 1) {
        staged_offsets(0);
    }

    // one tile's mask values (v9b: read before the K decode, so that their latency overlaps it)
    // v22 (run 21): the raw halves only; tile_scores converts them after the products. Converted here, next to the
    // loads, every step waited for the loads' latency at its top (the loads sat in a branch with their conversion):
    // leaving the mask loads out (timing variant 36) took 2.5 us off the op at 32K and 11.2 us at 128K. A key past
    // n_kv reads the last key's value, which its -inf score then ignores
    auto tile_mask = [&](const int k0, uint32_t (&mv)[4]) {
        mv[0] = mv[1] = mv[2] = mv[3] = 0u;
        if (maskb && !vt::NO_MASK) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int key = min(k0 + g + 8*(e >> 1), p.n_kv - 1);
                mv[e] = __half_as_ushort(mrow[e & 1][key]);
            }
        }
    };

    // ---- one tile's S^T = K . Q^T, one 128-block at a time (each has its own norm), then softcap and mask;
    // s[e]: key k0 + g + 8*(e/2), row 2t + e%2
    // (v21: xslot is the exchange slot of the step, see below)
    auto tile_scores = [&](const uint32_t * kst, const int k0, const uint32_t (&mv)[4], float (&s)[4], const int xslot) {
        s[0] = s[1] = s[2] = s[3] = 0.0f;
#pragma unroll
        for (int b = 0; b < NBL; ++b) {
            uint32_t lo0[2], lo1[2], hi[2];
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                const uint32_t * kr = kst + (g + 8*i)*cfg::KW;
                lo0[i] = turbo_sh_u32(kr, ksh[i] + b*KBS + 2 + 8*t);
                lo1[i] = turbo_sh_u32(kr, ksh[i] + b*KBS + 6 + 8*t);
                hi[i]  = KBITS == 3 ? turbo_sh_u32(kr, ksh[i] + b*KBS + 34 + 4*t) : 0u;
            }
            float sb[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            if (!vt::DEC_K) {
                // timing variants: the staged words as the A fragments, no index bytes and no table loads
                uint32_t a[4] = {(lo0[0] ^ hi[0]) & SMALL, (lo0[1] ^ hi[1]) & SMALL, lo1[0] & SMALL, lo1[1] & SMALL};
                if (vt::SKEL) {
                    sink ^= a[0] ^ a[1] ^ a[2] ^ a[3];
                } else {
#pragma unroll
                    for (int cc = 0; cc < 8; ++cc) {
                        uint32_t b0, b1;
                        qfrag(8*b + cc, b0, b1);
                        turbo_mma_16816<TPS == 1>(sb, a, b0, b1);
                    }
                }
            } else {
                // per key: index words of pairs 0,2,4,6 | 1,3,5,7 (lo0) and 8,10,12,14 | 9,11,13,15 (lo1)
                uint32_t ix[2][4];
#pragma unroll
                for (int i = 0; i < 2; ++i) {
                    ix[i][0] = turbo_mma_idx4<KBITS, 0>(lo0[i], hi[i], 0x1100);
                    ix[i][1] = turbo_mma_idx4<KBITS, 1>(lo0[i], hi[i], 0x1100);
                    ix[i][2] = turbo_mma_idx4<KBITS, 0>(lo1[i], hi[i], 0x3322);
                    ix[i][3] = turbo_mma_idx4<KBITS, 1>(lo1[i], hi[i], 0x3322);
                }
#pragma unroll
                for (int cc = 0; cc < 8; ++cc) {
                    const int w = (cc >> 2)*2, n = 2*(cc & 3);   // pair 2cc is nibble n of lo0/lo1
                    uint32_t a[4];
                    a[0] = turbo_mma_pick(pairK_sh, ix[0][w],     n);
                    a[1] = turbo_mma_pick(pairK_sh, ix[1][w],     n);
                    a[2] = turbo_mma_pick(pairK_sh, ix[0][w + 1], n + 1);
                    a[3] = turbo_mma_pick(pairK_sh, ix[1][w + 1], n + 1);
                    uint32_t b0, b1;
                    qfrag(8*b + cc, b0, b1);
                    if (vt::MMA) {
                        turbo_mma_16816<TPS == 1>(sb, a, b0, b1);
                    } else {
                        sink ^= a[0] ^ a[1] ^ a[2] ^ a[3];
                    }
                }
            }
            if (!vt::MMA) {
                sb[0] = sb[1] = sb[2] = sb[3] = __uint_as_float(sink & SMALL);
            }
            const float n0 = __half2float(__ushort_as_half((uint16_t) turbo_sh_u16(kst + g*cfg::KW, ksh[0] + b*KBS)));
            const float n1 = __half2float(__ushort_as_half((uint16_t) turbo_sh_u16(kst + (g + 8)*cfg::KW, ksh[1] + b*KBS)));
            if (PAIR) {
                // v21 (one block per warp): the pair's two halves of the scores, added in the order of the other
                // variants' loop over the blocks (block 0's product, then block 1's by one fma), so that both warps
                // hold the same bits
                const int x0 = ((pair*2 + xslot)*2)*WARP_SIZE + lane;
                xs_s[x0 + bw*WARP_SIZE] = make_float4(sb[0], sb[1], sb[2], sb[3]);
                xs_n[x0 + bw*WARP_SIZE] = make_float2(n0, n1);
                turbo_bar_sync(1 + pair, 2*WARP_SIZE);
                const float4 a = xs_s[x0], c = xs_s[x0 + WARP_SIZE];
                const float2 na = xs_n[x0], nc = xs_n[x0 + WARP_SIZE];
                s[0] = fmaf(c.x, nc.x, a.x*na.x); s[1] = fmaf(c.y, nc.x, a.y*na.x);
                s[2] = fmaf(c.z, nc.y, a.z*na.y); s[3] = fmaf(c.w, nc.y, a.w*na.y);
            } else {
                s[0] += sb[0]*n0; s[1] += sb[1]*n0;
                s[2] += sb[2]*n1; s[3] += sb[3]*n1;
            }
        }
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int key = k0 + g + 8*(e >> 1);
            float v = s[e];
            if (p.logit_softcap != 0.0f) {
                v = cap*tanhf(v*icap);
            }
            if (key >= p.n_kv) {
                v = -INFINITY;
            } else if (maskb) {
                v += slope[e & 1]*__half2float(__ushort_as_half((uint16_t) mv[e]));
            }
            s[e] = v;
        }
    };

    // ---- one tile's O^T += V^T . P^T, P scaled per key by the V norm of each 128-block
    auto tile_pv = [&](const uint32_t * vst, const float (&pr)[4]) {
#pragma unroll
        for (int b = 0; b < NBL; ++b) {
            const float vn0 = __half2float(__ushort_as_half((uint16_t) turbo_sh_u16(vst + g*cfg::VW, vsh[0] + b*VBS)));
            const float vn1 = __half2float(__ushort_as_half((uint16_t) turbo_sh_u16(vst + (g + 8)*cfg::VW, vsh[1] + b*VBS)));
            const uint32_t pb0 = turbo_movmatrix_trans(turbo_h2_bits(pr[0]*vn0, pr[1]*vn0));  // keys 2t, 2t+1; row g
            const uint32_t pb1 = turbo_movmatrix_trans(turbo_h2_bits(pr[2]*vn1, pr[3]*vn1));  // keys 2t+8, 2t+9
            turbo_mma_vpair v01, v89;
            {
                uint32_t w[4], h[4];
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const uint32_t * vr = vst + (2*t + (i & 1) + 8*(i >> 1))*cfg::VW;
                    w[i] = turbo_sh_u32(vr, vsh4[i] + b*VBS + 2 + 4*g);
                    h[i] = VBITS == 3 ? turbo_sh_u16(vr, vsh4[i] + b*VBS + 34 + 2*g) : 0u;
                }
                if (!vt::DEC_V) {
                    // timing variants: the staged words as the A fragments of all 8 O products
                    uint32_t a[4];
#pragma unroll
                    for (int r = 0; r < 4; ++r) {
                        a[r] = (w[r] ^ h[r]) & SMALL;
                    }
                    if (vt::SKEL) {
                        sink ^= a[0] ^ a[1] ^ a[2] ^ a[3] ^ pb0 ^ pb1;
                    } else {
#pragma unroll
                        for (int jj = 0; jj < 8; ++jj) {
                            turbo_mma_16816<TPS == 1>(o[8*b + jj], a, pb0, pb1);
                        }
                    }
                    continue;
                }
                v01.make(w[0], w[1], h[0], h[1]);
                v89.make(w[2], w[3], h[2], h[3]);
            }
            // index words [fragment register][parity of jj]: the same nibble layout as K's lo0 with hi's low half.
            // Fragment register r of pair jj: dim 16g + 2jj (r = 0, 2) or 16g + 2jj + 1 (r = 1, 3), keys 2t, 2t+1
            // (r = 0, 1) or 2t+8, 2t+9 (r = 2, 3)
            uint32_t vx[4][2];
            vx[0][0] = turbo_mma_idx4<VBITS, 0>(v01.lo_e, v01.hi_e, 0x1100); vx[0][1] = turbo_mma_idx4<VBITS, 1>(v01.lo_e, v01.hi_e, 0x1100);
            vx[1][0] = turbo_mma_idx4<VBITS, 0>(v01.lo_o, v01.hi_o, 0x1100); vx[1][1] = turbo_mma_idx4<VBITS, 1>(v01.lo_o, v01.hi_o, 0x1100);
            vx[2][0] = turbo_mma_idx4<VBITS, 0>(v89.lo_e, v89.hi_e, 0x1100); vx[2][1] = turbo_mma_idx4<VBITS, 1>(v89.lo_e, v89.hi_e, 0x1100);
            vx[3][0] = turbo_mma_idx4<VBITS, 0>(v89.lo_o, v89.hi_o, 0x1100); vx[3][1] = turbo_mma_idx4<VBITS, 1>(v89.lo_o, v89.hi_o, 0x1100);
#pragma unroll
            for (int jj = 0; jj < 8; ++jj) {
                uint32_t a[4];
#pragma unroll
                for (int r = 0; r < 4; ++r) {
                    a[r] = turbo_mma_pick(pairV_sh, vx[r][jj & 1], jj);
                }
                if (vt::MMA) {
                    turbo_mma_16816<TPS == 1>(o[8*b + jj], a, pb0, pb1);
                } else {
                    sink ^= a[0] ^ a[1] ^ a[2] ^ a[3];
                }
            }
        }
    };

    // a step: TPS tiles (tt, tt + NL, ...), staged as one group of the ring; GROUPS - 1 groups are in flight
    for (int it = 0; tt < t_end; tt += TPS*NL, ++it) {
        const uint32_t * gst = ring + (it % cfg::GROUPS)*TPS*cfg::WORDS;   // this step's stages
        __syncwarp();   // every lane is done with the group refilled below (read in the step before)
        uint32_t * nst = ring + ((it + cfg::GROUPS - 1) % cfg::GROUPS)*TPS*cfg::WORDS;
#pragma unroll
        for (int u = 0; u < TPS; ++u) {
            const int t1 = tt + ((cfg::GROUPS - 1)*TPS + u)*NL;
            if (t1 < t_end) {
                stage(nst + u*cfg::WORDS, t1);
            }
        }
        turbo_cp_async_commit();
        if (!vt::NO_WAIT) {
            turbo_cp_async_wait<cfg::GROUPS - 1>();
        }
        __syncwarp();   // the other lanes' copies of this step's stages are visible
        if (NBL != 1) {
            staged_offsets(tt*TURBO_MMA_KEYS);   // NBL != 1 only with TPS = 1
        }

        // a tile past the split's end (only the second of a v14 step, warp-uniform) was not staged: it is
        // never read, its scores are -inf and its P.V is skipped
        auto staged = [&](const int u) { return u == 0 || tt + u*NL < t_end; };
        uint32_t mv[TPS][4];
        float s[TPS][4];
#pragma unroll
        for (int u = 0; u < TPS; ++u) {
            tile_mask((tt + u*NL)*TURBO_MMA_KEYS, mv[u]);
        }
#pragma unroll
        for (int u = 0; u < TPS; ++u) {
            if (staged(u)) {
                tile_scores(gst + u*cfg::WORDS, (tt + u*NL)*TURBO_MMA_KEYS, mv[u], s[u], it & 1);
            } else {
                s[u][0] = s[u][1] = s[u][2] = s[u][3] = -INFINITY;
            }
        }

        // ---- online softmax over the step's keys (lanes of equal t share a row)
        float alpha[2] = {1.0f, 1.0f};
#pragma unroll
        for (int i = 0; i < 2 && !vt::NO_SOFTMAX; ++i) {
            float mx = fmaxf(s[0][i], s[0][i + 2]);
#pragma unroll
            for (int u = 1; u < TPS; ++u) {
                mx = fmaxf(mx, fmaxf(s[u][i], s[u][i + 2]));
            }
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 4));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 8));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 16));
            const float M_new = fmaxf(M[i], mx);
            alpha[i] = M_new == -INFINITY ? 1.0f : turbo_mma_exp2<vt::FAST_EXP>(M[i] - M_new);
            M[i] = M_new;
        }
        float pr[TPS][4];
#pragma unroll
        for (int u = 0; u < TPS; ++u) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                pr[u][e] = vt::NO_SOFTMAX ? s[u][e] : M[e & 1] == -INFINITY ? 0.0f : turbo_mma_exp2<vt::FAST_EXP>(s[u][e] - M[e & 1]);
            }
        }
        L[0] = L[0]*alpha[0] + pr[0][0] + pr[0][2];
        L[1] = L[1]*alpha[1] + pr[0][1] + pr[0][3];
#pragma unroll
        for (int u = 1; u < TPS; ++u) {
            L[0] += pr[u][0] + pr[u][2];
            L[1] += pr[u][1] + pr[u][3];
        }
        if (alpha[0] != 1.0f || alpha[1] != 1.0f) {
#pragma unroll
            for (int j = 0; j < NBL*8; ++j) {
                o[j][0] *= alpha[0]; o[j][1] *= alpha[1];
                o[j][2] *= alpha[0]; o[j][3] *= alpha[1];
            }
        }

#pragma unroll
        for (int u = 0; u < TPS; ++u) {
            if (staged(u)) {
                tile_pv(gst + u*cfg::WORDS + TURBO_MMA_KEYS*cfg::KW, pr[u]);
            }
        }
    }
    turbo_cp_async_wait<0>();
    if (vt::ABL != 0) {
        o[0][0] += __uint_as_float(sink & SMALL);   // keeps the timing variants' folded stages alive
    }
    if (!CLUSTER && !PAIR && p.warp_partials) {
        // TURBO_FA_WARP_PARTIALS=1 (prepared after run 15; run 16: no gain at depth 0): no block barrier and no merge
        // of the warps through shared memory on the way out (at depth 0 the epilogue is part of every decode step's
        // chain); each warp stores its rows as a split of its own, the combine kernel merges 4x as many splits
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            L[i] += __shfl_xor_sync(0xffffffff, L[i], 4);
            L[i] += __shfl_xor_sync(0xffffffff, L[i], 8);
            L[i] += __shfl_xor_sync(0xffffffff, L[i], 16);
        }
        const int64_t wslot = ((((int64_t) (iq3*n_hy + hy))*p.n_split + split)*NW + warp)*NR;
        const int nr_real = min(NR, R - rg*NR);
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const int r = 2*t + i;   // lanes of equal t hold row r's values at dims 16g + 2jj, +1
            if (r >= nr_real) {
                continue;
            }
            if (g == 0) {
                p.part_meta[wslot + r] = make_float2(M[i] == -INFINITY ? -INFINITY : M[i]*LN2, L[i]);
            }
            float * orow = p.part_acc + (wslot + r)*D;
#pragma unroll
            for (int j = 0; j < NBL*8; ++j) {
                const int d = (j >> 3)*QK_TURBO + 16*g + 2*(j & 7);
                *(float2 *) (orow + d) = i == 0 ? make_float2(o[j][0], o[j][2]) : make_float2(o[j][1], o[j][3]);
            }
        }
        return;
    }
    __syncthreads();   // the ring becomes the output buffer

    // ---- merge the warps of the block, write this split's partial result (max in base e)
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        L[i] += __shfl_xor_sync(0xffffffff, L[i], 4);
        L[i] += __shfl_xor_sync(0xffffffff, L[i], 8);
        L[i] += __shfl_xor_sync(0xffffffff, L[i], 16);
        if (g == 0 && bw == 0) {   // (v21: both warps of a pair hold the same maxima and sums)
            Ms[pair*NR + 2*t + i] = M[i];
            Ls[pair*NR + 2*t + i] = L[i];
        }
    }
#pragma unroll
    for (int j = 0; j < NBL*8; ++j) {
        const int d = (PAIR ? bw : j >> 3)*QK_TURBO + 16*g + 2*(j & 7);
        float * ob = Os + (pair*NR + 2*t)*D;
        ob[d]         = o[j][0];   // dim d,   row 2t
        ob[D + d]     = o[j][1];   // dim d,   row 2t+1
        ob[d + 1]     = o[j][2];   // dim d+1, row 2t
        ob[D + d + 1] = o[j][3];
    }
    __syncthreads();
    const int64_t slot = ((int64_t) (iq3*n_hy + hy))*p.n_split + split;
    // only the group's real rows (a GQA group of 4 fills half of the 8): the others are never read
    const int nr_real = min(NR, R - rg*NR);
    for (int it = tid; it < nr_real*D; it += NW*WARP_SIZE) {
        const int r = it / D, d = it % D;
        float mx = -INFINITY;
#pragma unroll
        for (int w = 0; w < NL; ++w) {
            mx = fmaxf(mx, Ms[w*NR + r]);
        }
        float acc = 0.0f, sum = 0.0f;
        if (mx != -INFINITY) {
#pragma unroll
            for (int w = 0; w < NL; ++w) {
                const float f = exp2f(Ms[w*NR + r] - mx);
                acc += Os[(w*NR + r)*D + d]*f;
                sum += Ls[w*NR + r]*f;
            }
        }
        if (CLUSTER) {
            Os[r*D + d] = acc;   // warp 0's slot of (r, d), read above by this thread only
            if (d == 0) {
                Mc[r] = mx == -INFINITY ? -INFINITY : mx*LN2;
                Lc[r] = sum;
            }
        } else {
            p.part_acc[(slot*NR + r)*D + d] = acc;
            if (d == 0) {
                p.part_meta[slot*NR + r] = make_float2(mx == -INFINITY ? -INFINITY : mx*LN2, sum);
            }
        }
    }
    if (CLUSTER) {
        turbo_mma_cluster_merge<D, NR>(p, Os, Mc, Lc, hk, rg, iq3, nr_real, warp, lane);
    }
#endif // AMPERE_MMA_AVAILABLE
}

// launches k_turbo_fattn_mma (variant var, see the kernel) for one K type (instances in fattn-turbo-kturbo3.cu / -kturbo2.cu)
#define TURBO_MMA_FOR_EACH(X) \
    X(128, GGML_TYPE_TURBO3, 8) X(128, GGML_TYPE_TURBO2, 8) X(256, GGML_TYPE_TURBO3, 8) X(256, GGML_TYPE_TURBO2, 8) \
    X(128, GGML_TYPE_TURBO3, 9) X(128, GGML_TYPE_TURBO2, 9) X(256, GGML_TYPE_TURBO3, 9) X(256, GGML_TYPE_TURBO2, 9) \
    X(128, GGML_TYPE_TURBO3, 12) X(128, GGML_TYPE_TURBO2, 12) X(256, GGML_TYPE_TURBO3, 12) X(256, GGML_TYPE_TURBO2, 12) \
    X(128, GGML_TYPE_TURBO3, 13) X(128, GGML_TYPE_TURBO2, 13) X(128, GGML_TYPE_TURBO3, 11) X(128, GGML_TYPE_TURBO2, 11) \
    X(256, GGML_TYPE_TURBO3, 24) X(256, GGML_TYPE_TURBO2, 24) \
    X(128, GGML_TYPE_TURBO3, 42) X(128, GGML_TYPE_TURBO2, 42) X(128, GGML_TYPE_TURBO3, 43) X(128, GGML_TYPE_TURBO2, 43)
// the timing variants (turbo3 K and V only; the callers' `if constexpr` drops them for turbo2 K)
#define TURBO_MMA_FOR_EACH_ABLATE(X) \
    X(128, GGML_TYPE_TURBO3, 30) X(128, GGML_TYPE_TURBO3, 31) X(128, GGML_TYPE_TURBO3, 32) \
    X(128, GGML_TYPE_TURBO3, 33) X(128, GGML_TYPE_TURBO3, 34) X(128, GGML_TYPE_TURBO3, 35) \
    X(128, GGML_TYPE_TURBO3, 36) X(128, GGML_TYPE_TURBO3, 37) X(128, GGML_TYPE_TURBO3, 38) \
    X(128, GGML_TYPE_TURBO3, 39) X(128, GGML_TYPE_TURBO3, 40) X(128, GGML_TYPE_TURBO3, 41) X(128, GGML_TYPE_TURBO3, 44)

// a plain launch, or (p.cluster) one cluster of p.n_split blocks per row group (grid.x = n_split)
static void turbo_mma_launch_one(void (*kernel)(const turbo_fa_params), cudaStream_t stream, const turbo_fa_params & p,
        const dim3 grid) {
    if (!p.cluster) {
        ggml_cuda_turbo_launch(kernel, grid, dim3(TURBO_MMA_WARPS*WARP_SIZE), stream, p);
        return;
    }
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim  = grid;
    cfg.blockDim = dim3(TURBO_MMA_WARPS*WARP_SIZE);
    cfg.stream   = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = (unsigned) p.n_split;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.attrs    = attr;
    cfg.numAttrs = 1;
    CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, p));
}

template <ggml_type type_K>
void ggml_cuda_turbo_fattn_mma_launch(cudaStream_t stream, const int D, const ggml_type type_V, const int var,
        const turbo_fa_params & p, const dim3 grid) {
#define TURBO_MMA_CASE(DD, TYPE_V, VV)                                                                     \
    if (D == DD && type_V == TYPE_V && var == VV) {                                                        \
        turbo_mma_launch_one(k_turbo_fattn_mma<DD, type_K, TYPE_V, VV>, stream, p, grid);                 \
        return;                                                                                            \
    }
    TURBO_MMA_FOR_EACH(TURBO_MMA_CASE)
    if constexpr (type_K == GGML_TYPE_TURBO3) {
        TURBO_MMA_FOR_EACH_ABLATE(TURBO_MMA_CASE)
    }
#undef TURBO_MMA_CASE
    GGML_ABORT("turbo flash attention (mma): K/V pair, head size or variant not compiled");
}

// resident blocks per SM of the kernel, asked once from the runtime (the split count aims at whole waves)
template <ggml_type type_K>
int ggml_cuda_turbo_fattn_mma_occupancy(const int D, const ggml_type type_V, const int var) {
    static int cache[2][2][37] = {};   // var 8 .. 44
    int & n = cache[D == 256][type_V == GGML_TYPE_TURBO2][var - 8];
    if (n == 0) {
        const void * fn = nullptr;
#define TURBO_MMA_FN(DD, TYPE_V, VV) if (D == DD && type_V == TYPE_V && var == VV) fn = (const void *) k_turbo_fattn_mma<DD, type_K, TYPE_V, VV>;
        TURBO_MMA_FOR_EACH(TURBO_MMA_FN)
        if constexpr (type_K == GGML_TYPE_TURBO3) {
            TURBO_MMA_FOR_EACH_ABLATE(TURBO_MMA_FN)
        }
#undef TURBO_MMA_FN
        GGML_ASSERT(fn);
        CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, fn, TURBO_MMA_WARPS*WARP_SIZE, 0));
        n = std::max(n, 1);
    }
    return n;
}

extern template void ggml_cuda_turbo_fattn_mma_launch<GGML_TYPE_TURBO3>(cudaStream_t, int, ggml_type, int, const turbo_fa_params &, dim3);
extern template void ggml_cuda_turbo_fattn_mma_launch<GGML_TYPE_TURBO2>(cudaStream_t, int, ggml_type, int, const turbo_fa_params &, dim3);
extern template int ggml_cuda_turbo_fattn_mma_occupancy<GGML_TYPE_TURBO3>(int, ggml_type, int);
extern template int ggml_cuda_turbo_fattn_mma_occupancy<GGML_TYPE_TURBO2>(int, ggml_type, int);
