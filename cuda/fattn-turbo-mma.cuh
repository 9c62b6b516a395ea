// turbo-llama: tensor-core flash-attention decode for turbo K and turbo V (kernel v4 and its successors, DESIGN.md
// §2). Only the loops that are a default somewhere are compiled (turbo_mma_loop); the versions that lost, and what
// each measured, are in results/cuda-fa-notes.md.
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
// two high bits) -> half2 of two centroids; turbo4: a byte of two nibble codes -> half2, a 256-entry table
// (turbo_mma_pick4). The per-block norms scale S (K) and P (V) in f32/f16.
// Scores are kept in base 2 (q carries log2 e), the partial maxima are handed back in base e.
// A q8_0 or f16 K with a turbo V takes K's values as f16 (tile_scores_plain; q not rotated), and a turbo K with a q8_0
// or f16 V takes V's (tile_pv_plain; the output then needs no rotation back), at D = 128 and (the warp pair) D = 256.
// The 64-value types (head_dim 64 models) run the same loop at D = 64 with 64-value blocks (QKB): a 64-point FWHT of
// q, a lane's 16 K dims / 8 V dims per block, 4 mma chunks per block instead of 8, the d = 64 codebooks' pair tables.
#pragma once

#include "fattn-turbo.cuh"

#define TURBO_MMA_WARPS 4
#define TURBO_MMA_ROWS  8    // query rows per block: the N of the mma
#define TURBO_MMA_KEYS  16   // keys per warp step: the M of S^T
#define TURBO_MMA_MIN_BLOCKS 4   // the one-tile loop at D = 128: registers for 4 blocks (16 warps) per SM

// the decode loops of k_turbo_fattn_mma; the host picks one by head size, V type and length (fattn-turbo.cu)
enum turbo_mma_loop {
    TURBO_MMA_ONE_TILE,       // v11: one 16-key tile per warp step (D = 128 below 16K keys)
    TURBO_MMA_TWO_TILES,      // v14: two tiles per warp step, 3 blocks per SM (D = 128 from 16K keys, turbo3 V)
    TURBO_MMA_TWO_TILES_EX2,  // v14 with the softmax's bare ex2.approx (D = 128 from 16K keys, turbo2 K and V)
    TURBO_MMA_WARP_PAIR,      // v21: a warp pair per tile, one 128-block each (D = 256)
};

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

// four 8x8 f16 matrices from shared memory, transposed: lanes 8i .. 8i + 7 give the 16-byte row addresses of matrix i,
// and lane (r = lane/4, c = 2*(lane%4)) receives in a[i] elements (c, r), (c + 1, r) of it (an f16 V's A fragments)
static __device__ __forceinline__ void turbo_ldmatrix_x4_trans(uint32_t (&a)[4], const uint32_t addr) {
#ifdef AMPERE_MMA_AVAILABLE
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
        : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3]) : "r"(addr));
#else
    GGML_UNUSED(a); GGML_UNUSED(addr);
    NO_DEVICE_CODE;
#endif
}

static __device__ __forceinline__ uint32_t turbo_h2_bits(const float a, const float b) {
    const half2 h = __floats2half2_rn(a, b);   // a in the low 16 bits: the lower k index of a fragment
    return *(const uint32_t *) &h;
}

// pair table entry i: (centroid of code 1, centroid of code 2), i = lo1 | lo2 << 2 | hi1 << 4 | hi2 << 5
// turbo4 (256 entries): entry i = (centroid of nibble i & 15, centroid of nibble i >> 4): a qs byte is its own index
// (QKB: the block size, whose codebook it is)
template <int bits, int QKB> static __device__ __forceinline__ uint32_t turbo_mma_pair(const int i) {
    if (bits == 4) {
        return turbo_h2_bits(turbo_centroid_qk<QKB>(4, i & 15), turbo_centroid_qk<QKB>(4, (i >> 4) & 15));
    }
    if (bits == 3) {
        return turbo_h2_bits(turbo_centroid_qk<QKB>(3, (i & 3) | ((i >> 4) & 1) << 2),
                             turbo_centroid_qk<QKB>(3, ((i >> 2) & 3) | ((i >> 5) & 1) << 2));
    }
    return turbo_h2_bits(turbo_centroid_qk<QKB>(2, i & 3), turbo_centroid_qk<QKB>(2, (i >> 2) & 3));
}

// ---- staging: each warp copies its tile's bytes with 16-byte cp.async (L2 only) into a per-warp ring of
// shared-memory stages, so that its loads are a few coalesced requests instead of 16-bit loads spread over 16 rows
// (v5, v8); each lane then reads its words from shared memory. A key's NB blocks are contiguous and 2-byte aligned:
// its bytes start at an even offset 0..14 of their first chunk, so KC chunks cover them.
// v11: staged rows of an odd number of chunks. A turbo3 row at D = 128 is 4 chunks (16 words), so rows g
// and g + 2 start in the same bank and the lanes of one t (8 rows) read 4-way conflicting words; 5 chunks (20 words)
// spread the 8 rows over 8 bank offsets (ncu of v10: 61% of the shared wavefronts were conflicts; a model of one
// step's staged reads, llama8b layout: 112 -> 36 wavefronts). turbo2 at D = 128 is already 3 chunks.
// KBS, VBS: the bytes of one 128-block of a K or V row (turbo_traits<type>::row_bytes). KSWZ (f16 K, rows 16-byte aligned):
// a K row is its 16 chunks exactly, chunk c of key kk staged at chunk c ^ (kk & 7) of its row, so that the lanes of
// one 16-byte read (keys g, chunks 4t + j) fall on 8 different bank groups. VSWZ: the same for an f16 V, whose 8 rows
// of one ldmatrix phase (keys kk, one chunk each) then fall on 8 different bank groups
template <int NB, int KBS, int VBS, int TILES, bool KSWZ = false, bool VSWZ = false>
struct turbo_mma_stage_cfg {
    static constexpr int RC = 1;                               // v11: rows rounded up to an odd number of chunks
    static constexpr int KBYTES = NB*KBS;                      // one key's bytes of this head
    static constexpr int VBYTES = NB*VBS;
    static constexpr int KC = KSWZ ? KBYTES/16 : (KBYTES + 14 + 15)/16;   // 16-byte chunks per key
    static constexpr int VC = VSWZ ? VBYTES/16 : (VBYTES + 14 + 15)/16;
    static constexpr int KW = 4*(KSWZ ? KC : KC | RC);         // words per staged key row
    static constexpr int VW = 4*(VSWZ ? VC : VC | RC);
    static constexpr int ALIGN = 15;                           // a row's start offset in its staged copy: address & ALIGN
    static constexpr int WORDS = TURBO_MMA_KEYS*(KW + VW);     // one stage
    static constexpr int TPS = TILES;                          // tiles per warp step (v14: 2)
    // stages of the ring (sized for the 48 KB of static shared memory; the pairs past it, turbo_mma_smem, keep these
    // counts: a q8_0 or f16 K row is 3-5x a turbo one)
    // (turbo4's 66-byte rows stage as 5 chunks, as turbo3's 50-byte rows do: its one-tile loop gets 3 stages too;
    // a q8_0 or f16 V row, as a K one, gets 2)
    static constexpr int NSTAGE = TPS == 2 ? 4 : NB == 1 && VBS <= 66 && (KBS <= 50 || KBS == 66) ? 3 : 2;
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
template <int NC, int RW, bool SWZ = false>
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
                const int c = SWZ ? (i % NC) ^ ((i / NC) & 7) : i % NC;   // SWZ: see turbo_mma_stage_cfg
                turbo_cp_async16(dst0 + 4*((i / NC)*RW + 4*c), ok ? tile + off[s] : safe, ok ? 16 : 0);
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

// turbo4: the pair of byte n (0..3) of w, from the 256-entry table at shared address table_sh (1024-byte aligned: the
// byte, times 4, ORed into the address): a shift and one LOP3 per pick
static __device__ __forceinline__ uint32_t turbo_mma_pick4(const uint32_t table_sh, const uint32_t w, const int n) {
    const uint32_t x = n == 0 ? w << 2 : w >> (8*n - 2);
    uint32_t v;
    asm("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"((x & 0x3FCu) | table_sh));
    return v;
}

// N consecutive 32-bit values from an even byte offset of a staged row (turbo4's codes): N + 1 word loads at most
template <int N>
static __device__ __forceinline__ void turbo_sh_words(const uint32_t * row, const int off, uint32_t (&w)[N]) {
    const uint32_t * r = row + (off >> 2);
    const int sh = (off & 2)*8;
    uint32_t x[N + 1];
#pragma unroll
    for (int i = 0; i < N; ++i) {
        x[i] = r[i];
    }
    x[N] = sh ? r[N] : 0u;   // only when needed: past the row's last word otherwise
#pragma unroll
    for (int i = 0; i < N; ++i) {
        w[i] = __funnelshift_r(x[i], x[i + 1], sh);
    }
}

// a byte of a staged row (the 64-value turbo3 V's high bits)
static __device__ __forceinline__ uint32_t turbo_sh_u8(const uint32_t * row, const int off) {
    return (row[off >> 2] >> ((off & 3)*8)) & 0xFFu;
}

// a 32-bit value at an even byte offset of a staged row
static __device__ __forceinline__ uint32_t turbo_sh_u32(const uint32_t * row, const int off) {
    const uint32_t a = row[off >> 2];
    return (off & 2) ? __funnelshift_r(a, row[(off >> 2) + 1], 16) : a;
}
static __device__ __forceinline__ uint32_t turbo_sh_u16(const uint32_t * row, const int off) {
    return (row[off >> 2] >> ((off & 2)*8)) & 0xFFFFu;
}

// q8_0 -> f16 pairs, one code for a q8_0 K (tile_scores_plain) and V (tile_pv_plain): both keep upstream's rounding;
// the scale d of the block at byte offset off of a staged row, as a pair
static __device__ __forceinline__ half2 turbo_q8_d2(const uint32_t * row, const int off) {
    const half d = __ushort_as_half((uint16_t) turbo_sh_u16(row, off));
    return __halves2half2(d, d);
}
// 1152 = 1024 + 128 as a pair; the caller makes it once (the conversion is an asm that nvcc does not merge across loads)
static __device__ __forceinline__ half2 turbo_q8_bias() {
    return __floats2half2_rn(1152.0f, 1152.0f);
}
// one word q of the block's int8 (4 dims) as lo (dims 0, 1) and hi (2, 3): exact by the bytes of 1024 + 128 + q (offset
// binary under 0x64 exponent bytes), minus bias, then times d: the one rounding of upstream's f16 conversion
static __device__ __forceinline__ void turbo_q8_h2(const uint32_t q, const half2 d2, const half2 bias,
                                                   uint32_t & lo, uint32_t & hi) {
    const uint32_t w = q ^ 0x80808080u;
    const uint32_t l = __byte_perm(w, 0x64646464u, 0x4140), h = __byte_perm(w, 0x64646464u, 0x4342);
    const half2 vlo = __hmul2(__hsub2(*(const half2 *) &l, bias), d2);
    const half2 vhi = __hmul2(__hsub2(*(const half2 *) &h, bias), d2);
    lo = *(const uint32_t *) &vlo;
    hi = *(const uint32_t *) &vhi;
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

// the softmax's exponentials: exp2f, or (TURBO_MMA_TWO_TILES_EX2) the bare ex2.approx.ftz (results below 2^-126 flush
// to 0, as they do anyway once P is rounded to f16): exp2f's range handling is a share of the turbo2 step worth saving
template <bool FAST> static __device__ __forceinline__ float turbo_mma_exp2(const float x) {
    if (!FAST) {
        return exp2f(x);
    }
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// what a loop is made of
template <int LOOP> struct turbo_mma_loop_traits {
    static constexpr bool PAIR = LOOP == TURBO_MMA_WARP_PAIR;
    static constexpr int TPS = LOOP == TURBO_MMA_TWO_TILES || LOOP == TURBO_MMA_TWO_TILES_EX2 ? 2 : 1;   // tiles per step
    static constexpr bool FAST_EXP = LOOP == TURBO_MMA_TWO_TILES_EX2;
    // resident blocks per SM the registers are fitted for (v14 at 4 spilled; v21 at 4 spilled in the loop); a q8_0 or
    // f16 K or V: turbo_mma_min_blocks
    static constexpr int MIN_BLOCKS = TPS == 2 || PAIR ? 3 : TURBO_MMA_MIN_BLOCKS;
};

// the kernel's resident blocks per SM (__launch_bounds__): the loop's with a turbo K and V; a q8_0 or f16 K takes 3 (at 4
// the q8_0 decode spilled 40-100 bytes in the loop, nvcc 13.0, sm_90), and a turbo K with an f16 V or turbo4 K with a
// q8_0 V too (at 4 they spilled 24-72 bytes, the f16 V's in the loop); turbo3 / turbo2 K with a q8_0 V fit 128
// registers
template <ggml_type type_K, ggml_type type_V, int LOOP>
static constexpr int turbo_mma_min_blocks() {
    constexpr bool K_TURBO = ggml_cuda_is_turbo_type(type_K);
    constexpr bool V_TURBO = ggml_cuda_is_turbo_type(type_V);
    return K_TURBO && (V_TURBO || (type_V == GGML_TYPE_Q8_0 && type_K != GGML_TYPE_TURBO4)) ? turbo_mma_loop_traits<LOOP>::MIN_BLOCKS : 3;
}

// the kernel's shared arrays: the staging ring (its outputs in the epilogue), q, the pair tables, the warps' maxima and
// sums, v21's score exchange. Static where they fit in the 48 KB of static shared memory with 1 KB to spare (padding
// that the compiler's placement of the aligned tables may add): every instance that was compiled before (their SASS
// unchanged) and q8_0 K with a turbo V at D = 256. Past that (an f16 row staged twice per warp beside a turbo4 table at
// D = 128; at D = 256 an f16 K or V, or turbo4 K with q8_0 V, beside q's and the exchange's 14 KB) they are carved at
// these byte offsets from dynamic shared memory (DYN; the launch raises the instance's limit: turbo_mma_dyn_bytes).
// The tables first: the kernel aligns the buffer's start to 1024 bytes, as turbo_mma_pick4 needs (turbo_mma_pick: 256)
template <int D, ggml_type type_K, ggml_type type_V, int LOOP>
struct turbo_mma_smem {
    static constexpr bool K_TURBO = ggml_cuda_is_turbo_type(type_K);
    static constexpr bool V_TURBO = ggml_cuda_is_turbo_type(type_V);
    static constexpr int QKB  = ggml_cuda_turbo_qk(type_V) == QK_TURBO_64 ? QK_TURBO_64 : QK_TURBO;
    static constexpr bool PAIR = turbo_mma_loop_traits<LOOP>::PAIR;
    static constexpr int NL   = PAIR ? TURBO_MMA_WARPS/2 : TURBO_MMA_WARPS;   // warps (pairs) that walk tiles
    typedef turbo_mma_stage_cfg<PAIR ? 1 : D/QKB, turbo_traits<type_K>::row_bytes, turbo_traits<type_V>::row_bytes,
                                turbo_mma_loop_traits<LOOP>::TPS, type_K == GGML_TYPE_F16, type_V == GGML_TYPE_F16> cfg;
    static constexpr int RING = TURBO_MMA_WARPS*cfg::NSTAGE*cfg::WORDS;   // staging ring, words
    // the warps' outputs (epilogue): row stride OS, and a pad word after every OG floats of a row, so that the 32
    // lanes of one store of O^T fragments (dims OG g + .., rows 2t, 2t + 1) fall on 32 banks; unpadded they fell on 2
    // (many-way bank conflicts on the epilogue's stores)
    static constexpr int OG   = QKB/8;
    static constexpr int OS   = D + D/OG + 4;
    static __host__ __device__ constexpr int os_at(const int row, const int d) { return row*OS + d + d/OG; }
    static constexpr int OSZ  = NL*TURBO_MMA_ROWS*OS;                     // floats
    static constexpr int RO_N = RING > OSZ ? RING : OSZ;
    static constexpr int Q_N  = TURBO_MMA_ROWS*(D + 4);                   // q rows (stride QS)
    // pair tables: 64 entries (turbo3, turbo2), 256 (turbo4); the static arrays keep one for a plain K or V
    static constexpr int KTAB = turbo_traits<type_K>::bits == 4 ? 256 : 64;
    static constexpr int VTAB = turbo_traits<type_V>::bits == 4 ? 256 : V_TURBO ? 64 : 1;
    static constexpr int XS_N = PAIR ? NL*2*2*WARP_SIZE : 1;               // v21's exchange slots (float4, float2)
    static constexpr int XN_N = PAIR && K_TURBO ? XS_N : 1;                // (a plain K has no norms)

    static constexpr int up(const int x, const int a) { return (x + a - 1)/a*a; }
    static constexpr int O_PK = 0;
    static constexpr int O_PV = up(O_PK + (K_TURBO ? 4*KTAB : 0), turbo_traits<type_V>::bits == 4 ? 1024 : 256);
    static constexpr int O_Q  = up(O_PV + (V_TURBO ? 4*VTAB : 0), 16);
    static constexpr int O_M  = O_Q + 4*Q_N;                               // Ms, then Ls
    static constexpr int O_XS = up(O_M + 2*4*NL*TURBO_MMA_ROWS, 16);
    static constexpr int O_XN = O_XS + (PAIR ? 16*XS_N : 0);
    static constexpr int O_RO = up(O_XN + (PAIR && K_TURBO ? 8*XN_N : 0), 16);   // 16-byte aligned: cp.async, ldmatrix
    static constexpr int BYTES = O_RO + 4*RO_N;
    static constexpr bool DYN = BYTES > 47*1024;
    static constexpr int DYN_BYTES = BYTES + 1024 - 16;   // and the start's alignment (the buffer's own: 16 bytes)
};

template <int D, ggml_type type_K, ggml_type type_V, int LOOP>
__launch_bounds__(TURBO_MMA_WARPS*WARP_SIZE, turbo_mma_min_blocks<type_K, type_V, LOOP>())
static __global__ void k_turbo_fattn_mma(const turbo_fa_params p) {
#ifndef AMPERE_MMA_AVAILABLE
    GGML_UNUSED(p);
    NO_DEVICE_CODE;
#else
    // QKB: the values of one turbo block (128; 64 for the 64-value types of head_dim 64 models, K and V both). A lane
    // takes QKB/4 dims of each K block (the scores' k) and QKB/8 dims of each V block (the output's m): CPB mma
    // chunks of 16 dims per block in either product
    constexpr int QKB = ggml_cuda_turbo_qk(type_V) == QK_TURBO_64 ? QK_TURBO_64 : QK_TURBO;
    constexpr int CPB = QKB/16;
    constexpr int QV  = QKB/WARP_SIZE;   // q values per lane and block in the prologue
    constexpr float ISQ = QKB == QK_TURBO_64 ? TURBO64_INV_SQRT : TURBO_CUDA_INV_SQRT_QK;   // the FWHT's normalisation
    constexpr int NB = D / QKB;
    constexpr int NW = TURBO_MMA_WARPS;
    constexpr int NR = TURBO_MMA_ROWS;
    constexpr int KBITS = turbo_traits<type_K>::bits, VBITS = turbo_traits<type_V>::bits;
    // K: turbo, or q8_0 / f16 (the products take K's values as f16; q is not rotated for them, V's output still is)
    constexpr bool K_TURBO = ggml_cuda_is_turbo_type(type_K);
    constexpr bool K_F16   = type_K == GGML_TYPE_F16;
    static_assert(K_TURBO || (QKB == QK_TURBO && ((D == 128 && LOOP == TURBO_MMA_ONE_TILE) || (D == 256 && LOOP == TURBO_MMA_WARP_PAIR))),
        "q8_0 and f16 K: D = 128 one tile per step or D = 256 the warp pair");
    // V: turbo, or q8_0 / f16 with a turbo K (V's values as f16 in the product; the output is then in the plain domain,
    // and the merge does not rotate it back)
    constexpr bool V_TURBO = ggml_cuda_is_turbo_type(type_V);
    constexpr bool V_F16   = type_V == GGML_TYPE_F16;
    static_assert(V_TURBO || (K_TURBO && QKB == QK_TURBO && ((D == 128 && LOOP == TURBO_MMA_ONE_TILE) || (D == 256 && LOOP == TURBO_MMA_WARP_PAIR))),
        "q8_0 and f16 V: turbo K, D = 128 one tile per step or D = 256 the warp pair");
    static_assert(!K_TURBO || (ggml_cuda_turbo_qk(type_K) == QK_TURBO_64) == (QKB == QK_TURBO_64), "K and V turbo blocks of one size");
    constexpr int KBS = turbo_traits<type_K>::row_bytes, VBS = turbo_traits<type_V>::row_bytes;
    constexpr int QS = D + 4;
    constexpr float LOG2E = 1.4426950408889634f, LN2 = 0.6931471805599453f;

    // v21 (TURBO_MMA_WARP_PAIR, D = 256): the warps of a pair walk the same tiles, each with one of the two 128-blocks
    // of every K and V row (its own staging, q fragments, decode and mma: the D = 128 loop), and add their halves of
    // each tile's scores through shared memory (one pair barrier per tile) before both run the same softmax. With both
    // blocks in every warp (v11 at D = 256, removed) a warp took 246 registers, one block (4 warps) per SM, and at depth
    // 0 one warp's chain of both blocks per tile; here registers for 3 blocks per SM (at 4, 128 registers, the loop
    // spilled), and half the chain
    typedef turbo_mma_loop_traits<LOOP> lt;
    constexpr bool PAIR = lt::PAIR;
    static_assert(!PAIR || (NB == 2 && QKB == QK_TURBO), "v21 is compiled for D = 256 only");
    constexpr int NBL = PAIR ? 1 : NB;                                // blocks of a row in each warp's loop
    constexpr int NL  = PAIR ? NW/2 : NW;                             // warps (pairs) that walk tiles
    typedef turbo_mma_stage_cfg<NBL, KBS, VBS, lt::TPS, K_F16, V_F16> cfg;
    constexpr int TPS = cfg::TPS;
    typedef turbo_mma_smem<D, type_K, type_V, LOOP> sm;
    static_assert(sm::RING == NW*cfg::NSTAGE*cfg::WORDS && sm::Q_N == NR*QS, "turbo_mma_smem: the kernel's layout");
    constexpr int KTAB = sm::KTAB, VTAB = sm::VTAB;
    // the pair tables: 64 entries (turbo3, turbo2; 256-byte aligned for turbo_mma_pick), 256 for turbo4 (1024-byte
    // aligned for turbo_mma_pick4); pairV unused for a plain V, pairK for a plain K
    float * q_sh;
    uint32_t * pairK, * pairV, * ring_os;
    float * Ms, * Ls;
    float4 * xs_s;   // v21: each warp's half of a tile's scores,
    float2 * xs_n;   // and its K norms, two slots per pair
    if constexpr (!sm::DYN) {
        __shared__ float    q_sh_s[NR*QS];
        __shared__ __align__(KBITS == 4 ? 1024 : 256) uint32_t pairK_s[KTAB];
        __shared__ __align__(VBITS == 4 ? 1024 : V_TURBO ? 256 : 4) uint32_t pairV_s[VTAB];
        __shared__ float    Ms_s[NL*NR], Ls_s[NL*NR];
        __shared__ float4   xs_s_s[sm::XS_N];
        __shared__ float2   xs_n_s[sm::XN_N];
        __shared__ uint32_t ring_os_s[sm::RO_N];
        q_sh = q_sh_s; pairK = pairK_s; pairV = pairV_s; Ms = Ms_s; Ls = Ls_s; xs_s = xs_s_s; xs_n = xs_n_s; ring_os = ring_os_s;
    } else {
        // aligned here (sm::DYN_BYTES has room for it): declared 1024-byte aligned, the buffer would make ptxas round
        // every kernel's static shared memory in the file up to a multiple of 1 KB
        extern __shared__ __align__(16) uint32_t turbo_mma_dyn[];
        char * b = (char *) turbo_mma_dyn + (-(uint32_t) __cvta_generic_to_shared(turbo_mma_dyn) & 1023u);
        pairK = (uint32_t *) (b + sm::O_PK); pairV = (uint32_t *) (b + sm::O_PV); q_sh = (float *) (b + sm::O_Q);
        Ms = (float *) (b + sm::O_M); Ls = Ms + NL*NR; xs_s = (float4 *) (b + sm::O_XS); xs_n = (float2 *) (b + sm::O_XN);
        ring_os = (uint32_t *) (b + sm::O_RO);
    }
    float * Os = (float *) ring_os;   // the ring is dead when the outputs are written

    const int tid  = threadIdx.x;
    const int lane = tid % WARP_SIZE;
    const int warp = tid / WARP_SIZE;
    const int g = lane >> 2, t = lane & 3;

    // grid: (split, KV head x row group, dim 3)
    const int split = blockIdx.x;
    const int hy    = blockIdx.y;
    const int n_hy  = gridDim.y;
    const int hk    = hy / p.nrg;
    const int rg    = hy % p.nrg;
    const int iq3   = blockIdx.z;
    const int R     = p.gqa*p.n_q;

    if (tid < 64) {
        if (K_TURBO && KBITS != 4) {
            pairK[tid] = turbo_mma_pair<KBITS, QKB>(tid);
        }
        if (V_TURBO && VBITS != 4) {
            pairV[tid] = turbo_mma_pair<VBITS, QKB>(tid);
        }
    }
#pragma unroll
    for (int i = tid; i < 256; i += NW*WARP_SIZE) {
        if (KBITS == 4) {
            pairK[i] = turbo_mma_pair<4, QKB>(i);
        }
        if (VBITS == 4) {
            pairV[i] = turbo_mma_pair<4, QKB>(i);
        }
    }
    const uint32_t pairK_sh = (uint32_t) __cvta_generic_to_shared(pairK);
    const uint32_t pairV_sh = (uint32_t) __cvta_generic_to_shared(pairV);
    // v21: a warp's pair and its 128-block (bw) of every row; its rows start bw blocks in
    const int pair = PAIR ? warp / 2 : warp;
    const int bw   = PAIR ? warp % 2 : 0;
    const char * Kb = p.K + (int64_t) hk*p.nb12 + (int64_t) (iq3 % p.ne13)*p.nb13 + bw*KBS;
    const char * Vb = p.V + (int64_t) hk*p.nb22 + (int64_t) (iq3 % p.ne23)*p.nb23 + bw*VBS;
    const int n_tiles = (p.n_kv + TURBO_MMA_KEYS - 1) / TURBO_MMA_KEYS;
    const int t_begin = split*p.tiles_per_split;
    const int t_end   = min(n_tiles, t_begin + p.tiles_per_split);
    uint32_t * ring = ring_os + warp*cfg::NSTAGE*cfg::WORDS;
    // one stage's copies: K rows then V rows of the 16 keys of tile t1
    turbo_mma_chunk_src<cfg::KC, cfg::KW, K_F16> ksrc;
    turbo_mma_chunk_src<cfg::VC, cfg::VW, V_F16> vsrc;
    ksrc.init(Kb, p.nb11, lane);
    vsrc.init(Vb, p.nb21, lane);
    auto stage = [&](uint32_t * st, const int t1) {
        ksrc.copy(st, Kb, p.nb11, t1, p.n_kv, lane);
        vsrc.copy(st + TURBO_MMA_KEYS*cfg::KW, Vb, p.nb21, t1, p.n_kv, lane);
    };
    // under PDL: everything above reads no memory that the kernels before write; the K/V write of this step is one.
    // A kernel launched with PDL after this one may start now, as upstream's kernels let theirs (it waits in
    // ggml_cuda_pdl_sync, which returns once this whole grid has finished and its writes are visible)
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

    // q rows, scaled (softmax scale and log2 e), signs applied, then the FWHT of each QKB-block: one warp per
    // block of a row, in registers (the same butterflies and float operations as the C code)
    // v9b: all of a warp's q loads are issued before the first FWHT (one global latency, not NR*NB/NW)
    const float qscale = p.scale*LOG2E;
    constexpr int QT = NR*NB/NW;   // q blocks per warp
    float qv[QT][QV];
#pragma unroll
    for (int i = 0; i < QT; ++i) {
        const int task = warp + i*NW;
        const int r = task / NB, blk = task % NB;
        const int rho = rg*NR + r;
        const bool ok = rho < R;   // warp-uniform
        const int j = ok ? rho / p.gqa : 0, h = hk*p.gqa + (ok ? rho % p.gqa : 0);
        const float * qrow = (const float *) (p.Q + iq3*p.nb03 + h*p.nb02 + j*p.nb01) + blk*QKB;
#pragma unroll
        for (int k = 0; k < QV; ++k) {
            qv[i][k] = ok ? qrow[lane + 32*k] : 0.0f;
        }
    }
    // Q's RoPE deferred into this kernel (patch 0021): q comes from the ROPE's input. rope_once (one token, NB = 1):
    // every row has the same position, so the lane's cos and sin are computed once, while the q loads are in flight.
    // The MUL's row and the frequency factors are loaded with q (a warp's rows all sit at block warp % NB of their head)
    static_assert(NW % NB == 0, "a warp's q blocks: one block index");
    turbo_rope_pre<QV> rpre;
    if (p.rope.pos) {
        turbo_rope_preload<QV>(p.rope, (warp % NB)*QKB, lane, rpre);
    }
    float rc[QV], rs[QV];
    if (NB == 1 && p.rope_once) {
        turbo_rope_block_cs<QV>(p.rope, 0, p.rope.pos[0], rpre, lane, rc, rs);
    }
#pragma unroll
    for (int i = 0; i < QT; ++i) {
        const int task = warp + i*NW;
        const int r = task / NB, blk = task % NB;
        const int rho = rg*NR + r;
        // a pad row (a GQA group of 4 fills half of the 8) is zeros, loaded as such: no RoPE, no FWHT (warp-uniform)
        if (rho < R) {
            if (NB == 1 && p.rope_once) {
                turbo_rope_apply<QV>(p.rope, qv[i], 0, rc, rs, rpre, lane);
            } else if (p.rope.pos) {
                turbo_rope_block<QV>(p.rope, qv[i], blk*QKB, p.rope.pos[rho / p.gqa], rpre, lane);
            }
            if (K_TURBO) {
#pragma unroll
                for (int k = 0; k < QV; ++k) {
                    qv[i][k] *= turbo_sign_neg(lane + 32*k) ? -qscale : qscale;
                }
                if constexpr (QKB == QK_TURBO_64) {
                    turbo64_warp_fwht(qv[i], lane);
                } else {
                    turbo_warp_fwht(qv[i], lane);
                }
            } else {
#pragma unroll
                for (int k = 0; k < QV; ++k) {
                    qv[i][k] *= qscale;
                }
            }
        }
#pragma unroll
        for (int k = 0; k < QV; ++k) {
            q_sh[r*QS + blk*QKB + lane + 32*k] = qv[i][k];
        }
    }
    __syncthreads();
    // the extra blocks (turbo_fa_cell0: cell 0, the ring): q as the products take it, base e. (Blocks of their own, so that
    // the loops' code stays as it was: the same work in the last split's block, after its walk or before it, changed the
    // registers of the turbo2 and turbo4 loops; after it, run H17, their ops at 32K took 1.2-1.4 us more, with or without
    // cell 0; and a call, see turbo_fa_extra_block)
    if (p.c0.on && split >= (int) gridDim.x - p.c0.n_extra) {
        constexpr float QF0 = (K_TURBO ? ISQ : 1.0f)*LN2;
        turbo_fa_extra_block_call<D, type_K, type_V, NR, NW*WARP_SIZE>(p, hk, rg, iq3,
            [&](const int r, const int d) { return q_sh[r*QS + d]*QF0; });
        return;
    }
    // B fragments of Q^T: chunk c = CPB*blk + cc holds dims QKB blk + (QKB/4)t + 4cc + {0,1} (b0), {2,3} (b1) of row g
    // (v21: the chunks of the warp's block bw only)
    uint32_t qb[NBL*CPB][2];
#pragma unroll
    for (int c = 0; c < NBL*CPB; ++c) {
        const float * qr = q_sh + g*QS + (PAIR ? bw : c / CPB)*QKB + (QKB/4)*t + 4*(c % CPB);
        constexpr float QF = K_TURBO ? ISQ : 1.0f;   // the FWHT's normalisation (turbo K)
        qb[c][0] = turbo_h2_bits(qr[0]*QF, qr[1]*QF);
        qb[c][1] = turbo_h2_bits(qr[2]*QF, qr[3]*QF);
    }
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
        slope[i] = get_alibi_slope(p.max_bias, h, p.n_head_log2, p.m0, p.m1)*LOG2E;
        mrow[i] = maskb ? maskb + (int64_t) j*(p.nb31/sizeof(half)) : nullptr;
    }
    const float cap  = p.logit_softcap*LOG2E;
    const float icap = p.logit_softcap != 0.0f ? 1.0f/cap : 0.0f;

    float o[NBL*CPB][4];
#pragma unroll
    for (int j = 0; j < NBL*CPB; ++j) {
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
    // the raw halves only; tile_scores converts them after the products. Converted here, next to the loads, every
    // step would wait for the loads' latency at its top (the loads sat in a branch with their conversion). A key past
    // n_kv reads the last key's value, which its -inf score then ignores
    auto tile_mask = [&](const int k0, uint32_t (&mv)[4]) {
        mv[0] = mv[1] = mv[2] = mv[3] = 0u;
        if (maskb) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int key = min(k0 + g + 8*(e >> 1), p.n_kv - 1);
                mv[e] = __half_as_ushort(mrow[e & 1][key]);
            }
        }
    };

    // ---- a q8_0 or f16 K tile's S^T = K . Q^T (D = 128; D = 256: the warp's 128-block, v21): the A fragments are K's
    // values as f16 pairs. Lane (g, t) takes dims 32t .. 32t + 31 of keys g and g + 8, the dims of q's fragments: for
    // q8_0 exactly block t of the row (its scale d, then 32 int8), for f16 the row's chunks 4t .. 4t + 3 (swizzled, see
    // turbo_mma_stage_cfg)
    auto tile_scores_plain = [&](const uint32_t * kst, float (&s)[4]) {
        float sb[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        if constexpr (K_F16) {
#pragma unroll
            for (int j = 0; j < 4; ++j) {   // dims 32t + 8j .. + 7: the fragments of chunks c = 2j, 2j + 1
                const uint4 k0 = *(const uint4 *) (kst + g*cfg::KW + 4*((4*t + j) ^ g));
                const uint4 k1 = *(const uint4 *) (kst + (g + 8)*cfg::KW + 4*((4*t + j) ^ g));   // (g + 8) & 7 == g
                const uint32_t a0[4] = {k0.x, k1.x, k0.y, k1.y};
                const uint32_t a1[4] = {k0.z, k1.z, k0.w, k1.w};
                turbo_mma_16816<TPS == 1>(sb, a0, qb[2*j][0], qb[2*j][1]);
                turbo_mma_16816<TPS == 1>(sb, a1, qb[2*j + 1][0], qb[2*j + 1][1]);
            }
        } else {
            // int8 -> f16 by turbo_q8_h2: exact, then times d (upstream's one rounding)
            const half2 bias = turbo_q8_bias();
            half2 d2[2];
            const uint32_t * kr[2];
            int o[2];
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                kr[i] = kst + (g + 8*i)*cfg::KW;
                o[i]  = ksh[i] + 34*t;
                d2[i] = turbo_q8_d2(kr[i], o[i]);
            }
#pragma unroll
            for (int cc = 0; cc < 8; ++cc) {
                uint32_t a[4];
#pragma unroll
                for (int i = 0; i < 2; ++i) {
                    // a[i]: dims 32t + 4cc + {0, 1}, a[2 + i]: + {2, 3}
                    turbo_q8_h2(turbo_sh_u32(kr[i], o[i] + 2 + 4*cc), d2[i], bias, a[i], a[2 + i]);
                }
                turbo_mma_16816<TPS == 1>(sb, a, qb[cc][0], qb[cc][1]);
            }
        }
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            s[e] = sb[e];
        }
    };

    // ---- one tile's S^T = K . Q^T, one 128-block at a time (each has its own norm), then softcap and mask;
    // s[e]: key k0 + g + 8*(e/2), row 2t + e%2
    // (v21: xslot is the exchange slot of the step, see below)
    auto tile_scores = [&](const uint32_t * kst, const int k0, const uint32_t (&mv)[4], float (&s)[4], const int xslot) {
        if constexpr (!K_TURBO) {
            tile_scores_plain(kst, s);
            if constexpr (PAIR) {
                // v21 with a plain K (D = 256): the pair adds its two halves, block 0's first, so that both warps hold
                // the same bits (no norms)
                const int x0 = ((pair*2 + xslot)*2)*WARP_SIZE + lane;
                xs_s[x0 + bw*WARP_SIZE] = make_float4(s[0], s[1], s[2], s[3]);
                turbo_bar_sync(1 + pair, 2*WARP_SIZE);
                const float4 a = xs_s[x0], c = xs_s[x0 + WARP_SIZE];
                s[0] = a.x + c.x; s[1] = a.y + c.y;
                s[2] = a.z + c.z; s[3] = a.w + c.w;
            }
        } else {
            s[0] = s[1] = s[2] = s[3] = 0.0f;
#pragma unroll
            for (int b = 0; b < NBL; ++b) {
                float sb[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                if constexpr (KBITS == 4) {
                    // turbo4: the lane's dims 32t .. 32t + 31 are qs bytes 16t .. 16t + 15, one byte per pair of dims:
                    // chunk cc's pairs 2cc, 2cc + 1 are bytes 2(cc & 1), 2(cc & 1) + 1 of word cc/2 (QKB = 64: dims
                    // 16t .. 16t + 15, bytes 8t .. 8t + 7)
                    uint32_t kw[2][QKB/32];
#pragma unroll
                    for (int i = 0; i < 2; ++i) {
                        turbo_sh_words<QKB/32>(kst + (g + 8*i)*cfg::KW, ksh[i] + b*KBS + 2 + (QKB/8)*t, kw[i]);
                    }
#pragma unroll
                    for (int cc = 0; cc < CPB; ++cc) {
                        const int n = 2*(cc & 1);
                        uint32_t a[4];
                        a[0] = turbo_mma_pick4(pairK_sh, kw[0][cc >> 1], n);
                        a[1] = turbo_mma_pick4(pairK_sh, kw[1][cc >> 1], n);
                        a[2] = turbo_mma_pick4(pairK_sh, kw[0][cc >> 1], n + 1);
                        a[3] = turbo_mma_pick4(pairK_sh, kw[1][cc >> 1], n + 1);
                        turbo_mma_16816<TPS == 1>(sb, a, qb[CPB*b + cc][0], qb[CPB*b + cc][1]);
                    }
                } else {
                    // the lane's QKB/4 dims: codes at low-plane bytes (QKB/16)t.., high bits at (QKB/32)t.. of the high
                    // plane (after the QKB/4 low-plane bytes); QKB = 64: one low word (lo0), 16 high bits
                    uint32_t lo0[2], lo1[2], hi[2];
#pragma unroll
                    for (int i = 0; i < 2; ++i) {
                        const uint32_t * kr = kst + (g + 8*i)*cfg::KW;
                        lo0[i] = turbo_sh_u32(kr, ksh[i] + b*KBS + 2 + (QKB/16)*t);
                        lo1[i] = QKB == QK_TURBO ? turbo_sh_u32(kr, ksh[i] + b*KBS + 6 + 8*t) : 0u;
                        const int hoff = ksh[i] + b*KBS + 2 + QKB/4 + (QKB/32)*t;
                        hi[i]  = KBITS != 3 ? 0u : QKB == QK_TURBO ? turbo_sh_u32(kr, hoff) : turbo_sh_u16(kr, hoff);
                    }
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
                    for (int cc = 0; cc < CPB; ++cc) {
                        const int w = (cc >> 2)*2, n = 2*(cc & 3);   // pair 2cc is nibble n of lo0/lo1
                        uint32_t a[4];
                        a[0] = turbo_mma_pick(pairK_sh, ix[0][w],     n);
                        a[1] = turbo_mma_pick(pairK_sh, ix[1][w],     n);
                        a[2] = turbo_mma_pick(pairK_sh, ix[0][w + 1], n + 1);
                        a[3] = turbo_mma_pick(pairK_sh, ix[1][w + 1], n + 1);
                        turbo_mma_16816<TPS == 1>(sb, a, qb[CPB*b + cc][0], qb[CPB*b + cc][1]);
                    }
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
            if constexpr (VBITS == 4) {
                // turbo4: the lane's dims 16g .. 16g + 15 are qs bytes 8g .. 8g + 7 of each of its keys. ev / od [keys 2t,
                // 2t+1 | 2t+8, 2t+9][word]: byte m of word w = the two keys' codes (first key in the low nibble, the pair
                // table's index) at dim 16g + 8w + 2m (ev) or + 1 (od), i.e. fragment register 0/2 (ev) or 1/3 (od) of
                // pair jj = 4w + m (QKB = 64: dims 8g .. 8g + 7, bytes 4g .. 4g + 3, one word)
                constexpr int NVW = QKB/64;
                uint32_t ev[2][NVW], od[2][NVW];
#pragma unroll
                for (int kp = 0; kp < 2; ++kp) {
                    uint32_t wa[NVW], wb[NVW];
                    turbo_sh_words<NVW>(vst + (2*t + 8*kp)*cfg::VW, vsh4[2*kp] + b*VBS + 2 + (QKB/16)*g, wa);
                    turbo_sh_words<NVW>(vst + (2*t + 1 + 8*kp)*cfg::VW, vsh4[2*kp + 1] + b*VBS + 2 + (QKB/16)*g, wb);
#pragma unroll
                    for (int w = 0; w < NVW; ++w) {
                        ev[kp][w] = (wa[w] & 0x0F0F0F0Fu) | ((wb[w] & 0x0F0F0F0Fu) << 4);
                        od[kp][w] = ((wa[w] >> 4) & 0x0F0F0F0Fu) | (wb[w] & 0xF0F0F0F0u);
                    }
                }
#pragma unroll
                for (int jj = 0; jj < CPB; ++jj) {
                    const int w = jj >> 2, m = jj & 3;
                    uint32_t a[4];
                    a[0] = turbo_mma_pick4(pairV_sh, ev[0][w], m);
                    a[1] = turbo_mma_pick4(pairV_sh, od[0][w], m);
                    a[2] = turbo_mma_pick4(pairV_sh, ev[1][w], m);
                    a[3] = turbo_mma_pick4(pairV_sh, od[1][w], m);
                    turbo_mma_16816<TPS == 1>(o[CPB*b + jj], a, pb0, pb1);
                }
            } else {
                // the lane's QKB/8 dims of a key: codes at low-plane bytes (QKB/32)g.., high bits at byte (QKB/64)g..
                // of the high plane (QKB = 64: 16 bits of codes, 8 high bits; the make() below uses their low halves)
                turbo_mma_vpair v01, v89;
                {
                    uint32_t w[4], h[4];
#pragma unroll
                    for (int i = 0; i < 4; ++i) {
                        const uint32_t * vr = vst + (2*t + (i & 1) + 8*(i >> 1))*cfg::VW;
                        const int off = vsh4[i] + b*VBS + 2;
                        if constexpr (QKB == QK_TURBO) {
                            w[i] = turbo_sh_u32(vr, off + 4*g);
                            h[i] = VBITS == 3 ? turbo_sh_u16(vr, off + 32 + 2*g) : 0u;
                        } else {
                            w[i] = turbo_sh_u16(vr, off + 2*g);
                            h[i] = VBITS == 3 ? turbo_sh_u8(vr, off + 16 + g) : 0u;
                        }
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
                for (int jj = 0; jj < CPB; ++jj) {
                    uint32_t a[4];
#pragma unroll
                    for (int r = 0; r < 4; ++r) {
                        a[r] = turbo_mma_pick(pairV_sh, vx[r][jj & 1], jj);
                    }
                    turbo_mma_16816<TPS == 1>(o[CPB*b + jj], a, pb0, pb1);
                }
            }
        }
    };

    // ---- a q8_0 or f16 V tile's O^T += V^T . P^T (turbo K; D = 256: the warp's 128-block; P as it is). V^T's A fragments hold two keys of
    // one dim per register, so V's rows are transposed on their way in. f16: ldmatrix.trans of the staged rows, chunk
    // jj's M rows m = dims 16jj + m. q8_0: lane (g, t) turns block t of keys g and g + 8 into f16 pairs as
    // tile_scores_plain does (word jj: dims 32t + 4jj .. + 3, scaled by d: upstream's f16 conversion) and movmatrix
    // transposes each pair's 8x8 matrix, so that chunk jj's M row m is dim 32(m/2 % 4) + 4jj + 2(m/8) + m % 2. The
    // epilogue writes the outputs by these maps
    auto tile_pv_plain = [&](const uint32_t * vst, const float (&pr)[4]) {
        const uint32_t pb0 = turbo_movmatrix_trans(turbo_h2_bits(pr[0], pr[1]));  // keys 2t, 2t+1; row g
        const uint32_t pb1 = turbo_movmatrix_trans(turbo_h2_bits(pr[2], pr[3]));  // keys 2t+8, 2t+9
        if constexpr (V_F16) {
            // lane L gives the row of key (L & 7) + 8(L >> 4) at chunk 2jj + (L >> 3 & 1), staged at (2jj + (L >> 3 & 1))
            // ^ (L & 7) = 2jj ^ x (VSWZ): matrices 0..3 are a[0..3] (keys 0-7 | 8-15, dims 16jj + 0-7 | 8-15)
            const uint32_t row = (uint32_t) __cvta_generic_to_shared(vst + ((lane & 7) + 8*(lane >> 4))*cfg::VW);
            const int x = ((lane >> 3) & 1) ^ (lane & 7);
#pragma unroll
            for (int jj = 0; jj < CPB; ++jj) {
                uint32_t a[4];
                turbo_ldmatrix_x4_trans(a, row + 16*((2*jj) ^ x));
                turbo_mma_16816<TPS == 1>(o[jj], a, pb0, pb1);
            }
        } else {
            const half2 bias = turbo_q8_bias();
            half2 d2[2];
            const uint32_t * vr[2];
            int off[2];
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                vr[i]  = vst + (g + 8*i)*cfg::VW;
                off[i] = vsh[i] + 34*t;
                d2[i]  = turbo_q8_d2(vr[i], off[i]);
            }
#pragma unroll
            for (int jj = 0; jj < CPB; ++jj) {
                uint32_t a[4];   // a[2i]: dims 32t + 4jj + {0, 1} of key g + 8i, a[2i + 1]: + {2, 3}, then transposed
#pragma unroll
                for (int i = 0; i < 2; ++i) {
                    uint32_t lo, hi;
                    turbo_q8_h2(turbo_sh_u32(vr[i], off[i] + 2 + 4*jj), d2[i], bias, lo, hi);
                    a[2*i]     = turbo_movmatrix_trans(lo);
                    a[2*i + 1] = turbo_movmatrix_trans(hi);
                }
                turbo_mma_16816<TPS == 1>(o[jj], a, pb0, pb1);
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
        turbo_cp_async_wait<cfg::GROUPS - 1>();
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
        for (int i = 0; i < 2; ++i) {
            float mx = fmaxf(s[0][i], s[0][i + 2]);
#pragma unroll
            for (int u = 1; u < TPS; ++u) {
                mx = fmaxf(mx, fmaxf(s[u][i], s[u][i + 2]));
            }
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 4));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 8));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 16));
            const float M_new = fmaxf(M[i], mx);
            alpha[i] = M_new == -INFINITY ? 1.0f : turbo_mma_exp2<lt::FAST_EXP>(M[i] - M_new);
            M[i] = M_new;
        }
        float pr[TPS][4];
#pragma unroll
        for (int u = 0; u < TPS; ++u) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                pr[u][e] = M[e & 1] == -INFINITY ? 0.0f : turbo_mma_exp2<lt::FAST_EXP>(s[u][e] - M[e & 1]);
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
            for (int j = 0; j < NBL*CPB; ++j) {
                o[j][0] *= alpha[0]; o[j][1] *= alpha[1];
                o[j][2] *= alpha[0]; o[j][3] *= alpha[1];
            }
        }

#pragma unroll
        for (int u = 0; u < TPS; ++u) {
            if (staged(u)) {
                if constexpr (V_TURBO) {
                    tile_pv(gst + u*cfg::WORDS + TURBO_MMA_KEYS*cfg::KW, pr[u]);
                } else {
                    tile_pv_plain(gst + u*cfg::WORDS + TURBO_MMA_KEYS*cfg::KW, pr[u]);
                }
            }
        }
    }
    turbo_cp_async_wait<0>();
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
    // the dims of chunk j's M rows g and g + DD (tile_pv; tile_pv_plain: f16, q8_0)
    constexpr int DD = V_TURBO ? 1 : V_F16 ? 8 : 2;
#pragma unroll
    for (int j = 0; j < NBL*CPB; ++j) {
        const int d = V_TURBO ? (PAIR ? bw : j / CPB)*QKB + (QKB/8)*g + 2*(j % CPB) :
                      (PAIR ? bw*QKB : 0) + (V_F16 ? 16*j + g : 32*(g >> 1) + 4*j + (g & 1));
        const int row = pair*NR + 2*t;
        Os[sm::os_at(row,     d)]      = o[j][0];   // dim d,      row 2t
        Os[sm::os_at(row + 1, d)]      = o[j][1];   // dim d,      row 2t+1
        Os[sm::os_at(row,     d + DD)] = o[j][2];   // dim d + DD, row 2t
        Os[sm::os_at(row + 1, d + DD)] = o[j][3];
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
                acc += Os[sm::os_at(w*NR + r, d)]*f;
                sum += Ls[w*NR + r]*f;
            }
        }
        p.part_acc[(slot*NR + r)*D + d] = acc;
        if (d == 0) {
            p.part_meta[slot*NR + r] = make_float2(mx == -INFINITY ? -INFINITY : mx*LN2, sum);
        }
    }
#endif // AMPERE_MMA_AVAILABLE
}

// the kernels compiled for each K type (instances in fattn-turbo-kturbo3.cu / -kturbo2.cu), as turbo_fattn_mma_loop
// (fattn-turbo.cu) picks them: at D = 128 the one-tile loop for every turbo V, from 16K keys the two-tile loop for
// turbo3 V and (turbo2 K only) its ex2 form for turbo2 V; at D = 256 the warp pair
#define TURBO_MMA_FOR_EACH(X) \
    X(128, GGML_TYPE_TURBO3, TURBO_MMA_ONE_TILE) X(128, GGML_TYPE_TURBO2, TURBO_MMA_ONE_TILE) \
    X(128, GGML_TYPE_TURBO4, TURBO_MMA_ONE_TILE) \
    X(128, GGML_TYPE_TURBO3, TURBO_MMA_TWO_TILES) \
    X(256, GGML_TYPE_TURBO3, TURBO_MMA_WARP_PAIR) X(256, GGML_TYPE_TURBO2, TURBO_MMA_WARP_PAIR) \
    X(256, GGML_TYPE_TURBO4, TURBO_MMA_WARP_PAIR)
// turbo K with a q8_0 or f16 V (issue #29): D = 128 one tile per step, D = 256 the warp pair (each warp one 128-block
// of V's rows)
#define TURBO_MMA_FOR_EACH_V_PLAIN(X) \
    X(128, GGML_TYPE_Q8_0, TURBO_MMA_ONE_TILE) X(128, GGML_TYPE_F16, TURBO_MMA_ONE_TILE) \
    X(256, GGML_TYPE_Q8_0, TURBO_MMA_WARP_PAIR) X(256, GGML_TYPE_F16, TURBO_MMA_WARP_PAIR)
#define TURBO_MMA_FOR_EACH_K_TURBO2(X) X(128, GGML_TYPE_TURBO2, TURBO_MMA_TWO_TILES_EX2)
// turbo4 K with turbo4 V from 16K keys: two tiles per step, as turbo3
#define TURBO_MMA_FOR_EACH_K_TURBO4(X) X(128, GGML_TYPE_TURBO4, TURBO_MMA_TWO_TILES)
// q8_0 and f16 K with a turbo V (fattn-turbo-kq8_0.cu / -kf16.cu): D = 128 one tile per step, D = 256 the warp pair
// (each warp one 128-block of K's rows)
#define TURBO_MMA_FOR_EACH_K_PLAIN(X) \
    X(128, GGML_TYPE_TURBO3, TURBO_MMA_ONE_TILE) X(128, GGML_TYPE_TURBO2, TURBO_MMA_ONE_TILE) \
    X(128, GGML_TYPE_TURBO4, TURBO_MMA_ONE_TILE) \
    X(256, GGML_TYPE_TURBO3, TURBO_MMA_WARP_PAIR) X(256, GGML_TYPE_TURBO2, TURBO_MMA_WARP_PAIR) \
    X(256, GGML_TYPE_TURBO4, TURBO_MMA_WARP_PAIR)
// the 64-value types (instances beside their 128-value forms' in fattn-turbo-kturbo*.cu): D = 64, every pair of them,
// one tile per step
#define TURBO_MMA_FOR_EACH_64(X) \
    X(64, GGML_TYPE_TURBO3_64, TURBO_MMA_ONE_TILE) X(64, GGML_TYPE_TURBO2_64, TURBO_MMA_ONE_TILE) \
    X(64, GGML_TYPE_TURBO4_64, TURBO_MMA_ONE_TILE)
// every instance of a K type
#define TURBO_MMA_FOR_EACH_K(type_K, X)                               \
    if constexpr (ggml_cuda_turbo_qk(type_K) == QK_TURBO_64) {                \
        TURBO_MMA_FOR_EACH_64(X)                                      \
    } else if constexpr (ggml_cuda_turbo_qk(type_K) == QK_TURBO) {           \
        TURBO_MMA_FOR_EACH(X)                                         \
        TURBO_MMA_FOR_EACH_V_PLAIN(X)                                 \
    } else {                                                          \
        TURBO_MMA_FOR_EACH_K_PLAIN(X)                                 \
    }                                                                 \
    if constexpr (type_K == GGML_TYPE_TURBO2) {                       \
        TURBO_MMA_FOR_EACH_K_TURBO2(X)                                \
    }                                                                 \
    if constexpr (type_K == GGML_TYPE_TURBO4) {                       \
        TURBO_MMA_FOR_EACH_K_TURBO4(X)                                \
    }

// an instance's dynamic shared memory (turbo_mma_smem; 0: its arrays are static), its limit raised once per device
// before the instance's first launch or occupancy query
template <int D, ggml_type type_K, ggml_type type_V, int LOOP>
static int turbo_mma_dyn_bytes() {
    typedef turbo_mma_smem<D, type_K, type_V, LOOP> sm;
    if constexpr (sm::DYN) {
        CUDA_SET_SHARED_MEMORY_LIMIT((k_turbo_fattn_mma<D, type_K, type_V, LOOP>), sm::DYN_BYTES);
        return sm::DYN_BYTES;
    }
    return 0;
}

template <ggml_type type_K>
void ggml_cuda_turbo_fattn_mma_launch(cudaStream_t stream, const int D, const ggml_type type_V, const turbo_mma_loop loop,
        const turbo_fa_params & p, const dim3 grid) {
    // (a static instance: dynamic bytes 0, the plain launch of ggml_cuda_turbo_launch)
#define TURBO_MMA_CASE(DD, TYPE_V, LL)                                                                                  \
    if (D == DD && type_V == TYPE_V && loop == LL) {                                                                   \
        const int dyn = turbo_mma_dyn_bytes<DD, type_K, TYPE_V, LL>();                                                 \
        k_turbo_fattn_mma<DD, type_K, TYPE_V, LL><<<grid, dim3(TURBO_MMA_WARPS*WARP_SIZE), dyn, stream>>>(p);          \
        return;                                                                                                         \
    }
    TURBO_MMA_FOR_EACH_K(type_K, TURBO_MMA_CASE)
#undef TURBO_MMA_CASE
    GGML_ABORT("turbo flash attention (mma): K/V pair, head size or loop not compiled");
}

// resident blocks per SM of the kernel, asked once from the runtime (the split count aims at one whole wave)
template <ggml_type type_K>
int ggml_cuda_turbo_fattn_mma_occupancy(const int D, const ggml_type type_V, const turbo_mma_loop loop) {
    // [D 64, 128, 256][V turbo3, turbo2, turbo4, turbo3_64, turbo2_64, turbo4_64, q8_0, f16][loop]
    static int cache[3][8][4] = {};
    const int iv = type_V == GGML_TYPE_TURBO2 ? 1 : type_V == GGML_TYPE_TURBO4 ? 2 : type_V == GGML_TYPE_TURBO3_64 ? 3 :
                   type_V == GGML_TYPE_TURBO2_64 ? 4 : type_V == GGML_TYPE_TURBO4_64 ? 5 : type_V == GGML_TYPE_Q8_0 ? 6 :
                   type_V == GGML_TYPE_F16 ? 7 : 0;
    int & n = cache[D == 64 ? 0 : D == 128 ? 1 : 2][iv][loop];
    if (n == 0) {
        const void * fn = nullptr;
        int dyn = 0;
#define TURBO_MMA_FN(DD, TYPE_V, LL)                                                   \
        if (D == DD && type_V == TYPE_V && loop == LL) {                              \
            fn  = (const void *) k_turbo_fattn_mma<DD, type_K, TYPE_V, LL>;           \
            dyn = turbo_mma_dyn_bytes<DD, type_K, TYPE_V, LL>();                      \
        }
        TURBO_MMA_FOR_EACH_K(type_K, TURBO_MMA_FN)
#undef TURBO_MMA_FN
        GGML_ASSERT(fn);
        CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, fn, TURBO_MMA_WARPS*WARP_SIZE, dyn));
        n = std::max(n, 1);
    }
    return n;
}

extern template void ggml_cuda_turbo_fattn_mma_launch<GGML_TYPE_TURBO3>(cudaStream_t, int, ggml_type, turbo_mma_loop, const turbo_fa_params &, dim3);
extern template void ggml_cuda_turbo_fattn_mma_launch<GGML_TYPE_TURBO2>(cudaStream_t, int, ggml_type, turbo_mma_loop, const turbo_fa_params &, dim3);
extern template void ggml_cuda_turbo_fattn_mma_launch<GGML_TYPE_TURBO4>(cudaStream_t, int, ggml_type, turbo_mma_loop, const turbo_fa_params &, dim3);
extern template int ggml_cuda_turbo_fattn_mma_occupancy<GGML_TYPE_TURBO4>(int, ggml_type, turbo_mma_loop);
extern template int ggml_cuda_turbo_fattn_mma_occupancy<GGML_TYPE_TURBO3>(int, ggml_type, turbo_mma_loop);
extern template int ggml_cuda_turbo_fattn_mma_occupancy<GGML_TYPE_TURBO2>(int, ggml_type, turbo_mma_loop);
extern template void ggml_cuda_turbo_fattn_mma_launch<GGML_TYPE_Q8_0>(cudaStream_t, int, ggml_type, turbo_mma_loop, const turbo_fa_params &, dim3);
extern template void ggml_cuda_turbo_fattn_mma_launch<GGML_TYPE_F16>(cudaStream_t, int, ggml_type, turbo_mma_loop, const turbo_fa_params &, dim3);
extern template int ggml_cuda_turbo_fattn_mma_occupancy<GGML_TYPE_Q8_0>(int, ggml_type, turbo_mma_loop);
extern template int ggml_cuda_turbo_fattn_mma_occupancy<GGML_TYPE_F16>(int, ggml_type, turbo_mma_loop);
extern template void ggml_cuda_turbo_fattn_mma_launch<GGML_TYPE_TURBO3_64>(cudaStream_t, int, ggml_type, turbo_mma_loop, const turbo_fa_params &, dim3);
extern template void ggml_cuda_turbo_fattn_mma_launch<GGML_TYPE_TURBO2_64>(cudaStream_t, int, ggml_type, turbo_mma_loop, const turbo_fa_params &, dim3);
extern template void ggml_cuda_turbo_fattn_mma_launch<GGML_TYPE_TURBO4_64>(cudaStream_t, int, ggml_type, turbo_mma_loop, const turbo_fa_params &, dim3);
extern template int ggml_cuda_turbo_fattn_mma_occupancy<GGML_TYPE_TURBO3_64>(int, ggml_type, turbo_mma_loop);
extern template int ggml_cuda_turbo_fattn_mma_occupancy<GGML_TYPE_TURBO2_64>(int, ggml_type, turbo_mma_loop);
extern template int ggml_cuda_turbo_fattn_mma_occupancy<GGML_TYPE_TURBO4_64>(int, ggml_type, turbo_mma_loop);
