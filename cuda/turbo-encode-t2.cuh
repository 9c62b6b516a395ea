// turbo-llama: the turbo3/turbo2 encoder with two threads per 128-value block (the KV write of large SET_ROWS,
// k_turbo_set_rows_t2 in turbo.cu; the format is cpu_ref/ggml-turbo.h).
//
// Why: the warp and 4-thread writes spend most of their instructions moving values between lanes (shuffles for
// the FWHT and the tree sums) and selecting a code and a centroid per boundary (7 per value): ~63 warp-instruction
// slots per value for a 4-thread kernel, well below a device copy's bandwidth. This one takes about half as many,
// and is then latency-bound in a one-wave grid (results/gpu.md).
// Here the two threads of a pair split the block by parity: thread par holds t[2k + par], k = 0..63. The first
// butterflies (span 1) pair an even with an odd value, so each thread reads all 128 inputs and keeps its side of
// them (a + b or a - b); every later span (2..64) pairs values of one parity, i.e. the thread's own 64-point FWHT
// with spans 1..32, and the pairwise tree sums meet across the pair only at their last level. A code comes from
// |y|'s bits with one integer compare per positive boundary (the codebooks are symmetric). Every float operation
// is the C reference's, in the same order, so the bytes are the same. (One thread per block, 128 values in
// registers, needed 255 registers and spilled.)
//
// The fast path assumes a block that needs none of the reference's special cases: no NaN or Inf and no value above
// 2^32 (the pre-scaled path). It needs no per-value checks to know: a NaN or Inf makes |t| NaN or Inf, and a value
// above 2^32 makes |t| = sqrt(128)|x| > 2^35.5, so |t| <= 2^35 (finite) proves the block ordinary; anything else is
// encoded again by turbo_t2_encode_slow, which runs the reference's checks (rare: never for a real KV cache).
// cuda/host-check/set_rows_t2_check.sh compiles this file as host code, a pair of threads emulated, against the C
// reference.
#pragma once

#define TURBO_T2_LEN_FAST 34359738368.0f   // 2^35: |t| at or below it (and finite) proves max|x| <= 2^32

// the sign diagonal D as a compile-time function (unrolled loops fold it into the first butterflies' operands)
static constexpr __host__ __device__ bool turbo_t2_sign(const int i) {
    constexpr unsigned int w[4] = TURBO_CUDA_SIGN_WORDS;
    return (w[i >> 5] >> (i & 31)) & 1u;
}

// what the code search needs of a codebook: the bits of its positive boundaries (turbo3: b[4..6], turbo2: b[2]).
// ggml_cuda_turbo_check_tables checks that the tables are symmetric (b[n-1-k] = -b[k], c[n-1-k] = -c[k], the
// middle boundary 0), so a code is a sign class and a magnitude index m, and the centroid's square depends on m only
template <int bits> struct turbo_t2_book {
    uint32_t ib[bits == 3 ? 3 : 1];
};
template <int bits> static __device__ __forceinline__ turbo_t2_book<bits> turbo_t2_book_load() {
    turbo_t2_book<bits> bk;
    if (bits == 3) {
        for (int k = 0; k < 3; ++k) { bk.ib[k] = __float_as_uint(turbo_d_b3[4 + k]); }
    } else {
        bk.ib[0] = __float_as_uint(turbo_d_b2[2]);
    }
    return bk;
}
// the squares of the centroids by m (turbo3: c[4 + m]^2, m = 0..3; turbo2: c[2 + m]^2, m = 0..1), as the reference
// computes them, for a table in shared memory
template <int bits> static __device__ __forceinline__ float turbo_t2_c2(const int m) {
    const float c = bits == 3 ? turbo_d_c3[4 + m] : turbo_d_c2[2 + m];
    return __fmul_rn(c, c);
}

// The reference's code of y is the number of boundaries below it (y > b). For y > 0 that is half + m with
// m = #{positive b : |y| > b}; for y <= 0 (-0 and +0 included) it is half - 1 - m' with m' = #{positive b : |y| >= b}.
// Non-negative floats order as their bits, and |y| >= b is bits(|y|) + 1 > bits(b): so m or m' is a count of
// unsigned compares on a = bits(|y|) + sign bit (+0 then compares as -0 would: both give 0), each compare a
// subtraction's sign. The code's low bits are m, or m ^ 3 (turbo3) and (m | 2) ^ 3 (turbo2) for y <= 0; turbo3's
// third bit is y > 0.
template <int bits>
static __device__ __forceinline__ uint32_t turbo_t2_mag(const uint32_t yb, const turbo_t2_book<bits> & bk) {
    const uint32_t a = (yb & 0x7fffffffu) + (yb >> 31);
    uint32_t m = (bk.ib[0] - a) >> 31;
    if (bits == 3) {
        m += (bk.ib[1] - a) >> 31;
        m += (bk.ib[2] - a) >> 31;
    }
    return m;
}
static __device__ __forceinline__ bool turbo_t2_nonpos(const uint32_t yb) {
    return (int32_t) yb < 1;
}

// a block's encoding: the FP16 norm and the packed planes (lo: qs[0..31] as 8 words, hi: qs[32..47] as 4 words)
struct turbo_t2_out {
    uint32_t lo[8], hi[4];
    uint16_t norm;
};

static __device__ __forceinline__ void turbo_t2_zero(turbo_t2_out & o) {
    for (int w = 0; w < 8; ++w) { o.lo[w] = 0u; }
    for (int w = 0; w < 4; ++w) { o.hi[w] = 0u; }
    o.norm = 0;
}

// the pair primitive: the partner's value (lane ^ 1); the host check defines it for its emulated pair
#ifndef TURBO_T2_HOST_CHECK
static __device__ __forceinline__ float turbo_t2_partner(const float v) { return __shfl_xor_sync(0xffffffff, v, 1); }
static __device__ __forceinline__ uint32_t turbo_t2_partner(const uint32_t v) { return __shfl_xor_sync(0xffffffff, v, 1); }
#endif

// The pairwise tree sum (s[i] += s[i + h], h = 64..1) of 128 values, the thread's half of it: its leaves are level
// 64, leaf(k) for k < 32 the sum of values 2k + par and 2k + 64 + par (value 2k + par is the thread's k-th). Levels
// 32..2 pair values of one parity (the thread's own tree: node(h, i) = node(2h, i) + node(2h, i + h), spans 16..1),
// level 1 adds the even and the odd sum, on both threads in the same order. Evaluated depth first, so that a few
// partial sums are live at a time instead of 32 (registers, and so warps per SM)
template <int H, int I, typename F>
static __device__ __forceinline__ float turbo_t2_node(F & leaf) {
    if constexpr (H == QK_TURBO/4) {
        return leaf(I);
    } else {
        const float a = turbo_t2_node<2*H, I>(leaf);
        return __fadd_rn(a, turbo_t2_node<2*H, I + H>(leaf));
    }
}
template <typename F>
static __device__ __forceinline__ float turbo_t2_tree_sum(F & leaf, const int par) {
    const float s = turbo_t2_node<1, 0>(leaf);
    const float o = turbo_t2_partner(s);
    return par ? __fadd_rn(o, s) : __fadd_rn(s, o);
}

// Encodes the block whose 128 values (16-byte aligned) are x, on both threads of a pair (par = lane & 1; both get
// the whole result); c2tab: turbo_t2_c2<bits>(m) by m (shared memory); OFF: off (the key offset of the block's 128
// columns, the fused SUB) is subtracted first. false: the block needs the reference's checks
// (turbo_t2_encode_slow), and o is garbage. Every lane of the warp must call it (shuffles), with any finite values
// where it has no block.
template <int bits, bool OFF>
static __device__ __forceinline__ bool turbo_t2_encode_fast(const float * x, const float * off, const float * c2tab, const int par,
        turbo_t2_out & o) {
    // span 1 with the signs: t[2k] = a + b, t[2k+1] = a - b, a = D x[2k], b = D x[2k+1]; thread par keeps its side,
    // as a + sb*b with sb = +-1 (one rounding: the same bits as the add or the subtraction)
    const float sb = par ? -1.0f : 1.0f;
    float v[QK_TURBO/2];
#pragma unroll
    for (int i = 0; i < QK_TURBO; i += 4) {
        float4 f = *(const float4 *) (x + i);
        if (OFF) {
            const float4 g = *(const float4 *) (off + i);
            f.x = __fsub_rn(f.x, g.x); f.y = __fsub_rn(f.y, g.y); f.z = __fsub_rn(f.z, g.z); f.w = __fsub_rn(f.w, g.w);
        }
        const float a0 = turbo_t2_sign(i)     ? -f.x : f.x, b0 = turbo_t2_sign(i + 1) ? -f.y : f.y;
        const float a1 = turbo_t2_sign(i + 2) ? -f.z : f.z, b1 = turbo_t2_sign(i + 3) ? -f.w : f.w;
        v[i/2]     = __fmaf_rn(b0, sb, a0);
        v[i/2 + 1] = __fmaf_rn(b1, sb, a1);
    }
    // spans 2..64 of the 128 values = spans 1..32 of the thread's 64 (one flat loop per span: fully unrolled, v stays
    // in registers)
#pragma unroll
    for (int h = 1; h < QK_TURBO/2; h *= 2) {
#pragma unroll
        for (int q = 0; q < QK_TURBO/4; ++q) {
            const int j = (q / h)*2*h + q % h;
            const float a = v[j], b = v[j + h];
            v[j] = __fadd_rn(a, b); v[j + h] = __fsub_rn(a, b);
        }
    }
    auto square_leaf = [&](const int k) { return __fadd_rn(__fmul_rn(v[k], v[k]), __fmul_rn(v[k + 32], v[k + 32])); };
    const float len = __fsqrt_rn(turbo_t2_tree_sum(square_leaf, par));
    const bool fast = len <= TURBO_T2_LEN_FAST;   // false for NaN, Inf, or a value above 2^32 in the block
    const bool live = fast && len > 0.0f;        // else all zero, or the squares underflowed: the zero block

    const turbo_t2_book<bits> bk = turbo_t2_book_load<bits>();
    const float inv = __fdiv_rn(1.0f, len);
    // the planes from the codes' parts: lm holds m, ln 3 where y <= 0, hp turbo3's high bit (y > 0)
    uint32_t lm[8], ln[8], hp[4];
#pragma unroll
    for (int w = 0; w < 8; ++w) { lm[w] = ln[w] = 0u; }
#pragma unroll
    for (int w = 0; w < 4; ++w) { hp[w] = 0u; }
    // a leaf of the tree of the centroids' squares: the codes of values k and k + 32 of the thread, packed on the way
    auto code_leaf = [&](const int k) {
        float c[2];
#pragma unroll
        for (int u = 0; u < 2; ++u) {
            const int i = 2*(k + 32*u);   // the even code of this pair of codes: the partner's is i + 1
            const uint32_t yb = __float_as_uint(__fmul_rn(v[k + 32*u], inv));
            const uint32_t m = turbo_t2_mag<bits>(yb, bk);
            c[u] = c2tab[m];
            lm[i >> 4] |= m << (2*(i & 15));
            if (turbo_t2_nonpos(yb)) {
                ln[i >> 4] |= 3u << (2*(i & 15));
            } else if (bits == 3) {
                hp[i >> 5] |= 1u << (i & 31);
            }
        }
        return __fadd_rn(c[0], c[1]);
    };
    const float clen = __fsqrt_rn(turbo_t2_tree_sum(code_leaf, par));
    // turbo3: low bits m or 3 - m, high bit y > 0; turbo2: 2 + m or 1 - m (= (m | 2) ^ 3); 0x22222222: bit 1 of
    // the thread's own codes (every other one)
    uint32_t lo[8];
#pragma unroll
    for (int w = 0; w < 8; ++w) { lo[w] = (bits == 3 ? lm[w] : lm[w] | 0x22222222u) ^ ln[w]; }
    // the odd thread's codes sit one code further on: shifted into place, then the pair's words merged
#pragma unroll
    for (int w = 0; w < 8; ++w) {
        const uint32_t mine = par ? lo[w] << 2 : lo[w];
        lo[w] = mine | turbo_t2_partner(mine);
    }
    if (bits == 3) {
#pragma unroll
        for (int w = 0; w < 4; ++w) {
            const uint32_t mine = par ? hp[w] << 1 : hp[w];
            hp[w] = mine | turbo_t2_partner(mine);
        }
    }
    o.norm = live ? turbo_norm_half(len, clen, 0) : 0;
    const bool codes = o.norm != 0;   // a norm below FP16's range: the zero block, as the reference
#pragma unroll
    for (int w = 0; w < 8; ++w) { o.lo[w] = codes ? lo[w] : 0u; }
#pragma unroll
    for (int w = 0; w < 4; ++w) { o.hi[w] = codes && bits == 3 ? hp[w] : 0u; }
    return fast;
}

// the pair's half of the block at dst (2-byte aligned: a block is 50 or 34 bytes): the norm, the low plane, then
// turbo3's high plane, as 16-bit halves; thread par stores the halves h with h % 2 == par (rows of a warp's pairs
// then meet in 4-byte words of two threads, when the block starts at a 4-byte boundary)
template <int bits>
static __device__ __forceinline__ void turbo_t2_store(uint8_t * dst, const turbo_t2_out & o, const int par) {
    constexpr int NW = bits == 3 ? 12 : 8;   // 32-bit words of qs
    uint32_t q[NW];
#pragma unroll
    for (int w = 0; w < NW; ++w) {
        q[w] = w < 8 ? o.lo[w] : o.hi[w & 3];
    }
    if (((uintptr_t) dst & 3) == 0) {
        // words at dst: norm | q0 << 16, then q[k-1] >> 16 | q[k] << 16, then q[NW-1] >> 16 alone
        uint32_t * d = (uint32_t *) dst;
        if (par == 0) {
            d[0] = o.norm | (q[0] << 16);
        }
#pragma unroll
        for (int k = 1; k < NW; ++k) {
            if ((k & 1) == par) {
                d[k] = __funnelshift_r(q[k - 1], q[k], 16);
            }
        }
        if (par == (NW & 1)) {
            *(uint16_t *) (dst + 4*NW) = (uint16_t) (q[NW - 1] >> 16);
        }
    } else {
        uint32_t * d = (uint32_t *) (dst + 2);
        if (par == 1) {
            *(uint16_t *) dst = o.norm;
        }
#pragma unroll
        for (int k = 0; k < NW; ++k) {
            if ((k & 1) == par) {
                d[k] = q[k];
            }
        }
    }
}

// every case of the reference (turbo_encode_block), then the store, on one thread: non-finite values, the zero
// block, huge blocks scaled by 2^-e first (as turbo_warp_encode does it: two exact power-of-two factors). Not
// inlined, loops not unrolled: it is rare, and so it stays small.
// (x0: the block as loaded; off: the key offset subtracted on load (the fused SUB), or nullptr)
template <int bits>
static __device__ __noinline__ void turbo_t2_encode_slow(const float * x0, const float * off, uint8_t * dst) {
    turbo_t2_out o;
    float x[QK_TURBO], t[QK_TURBO];
    bool bad = false;
    float amax = 0.0f;
#pragma unroll 1
    for (int i = 0; i < QK_TURBO; ++i) {
        x[i] = off ? __fsub_rn(x0[i], off[i]) : x0[i];
        bad |= !turbo_is_finite(x[i]);
        const float a = fabsf(x[i]);
        amax = a > amax ? a : amax;
    }
    turbo_t2_zero(o);
    float len = 0.0f;
    int e = 0;
    if (!bad && amax != 0.0f) {
        float p1 = 1.0f, p2 = 1.0f;
        if (amax > TURBO_CUDA_BIG_AMAX) {
            e = turbo_prescale(amax, p1, p2);
        }
#pragma unroll 1
        for (int i = 0; i < QK_TURBO; ++i) {
            const float v = e != 0 ? __fmul_rn(__fmul_rn(x[i], p1), p2) : x[i];
            t[i] = turbo_t2_sign(i) ? -v : v;
        }
#pragma unroll 1
        for (int h = 1; h < QK_TURBO; h *= 2) {
#pragma unroll 1
            for (int i = 0; i < QK_TURBO; i += 2*h) {
#pragma unroll 1
                for (int j = i; j < i + h; ++j) {
                    const float a = t[j], b = t[j + h];
                    t[j] = __fadd_rn(a, b); t[j + h] = __fsub_rn(a, b);
                }
            }
        }
#pragma unroll 1
        for (int i = 0; i < QK_TURBO; ++i) {
            x[i] = __fmul_rn(t[i], t[i]);
        }
#pragma unroll 1
        for (int h = QK_TURBO/2; h >= 1; h /= 2) {
#pragma unroll 1
            for (int i = 0; i < h; ++i) {
                x[i] = __fadd_rn(x[i], x[i + h]);
            }
        }
        len = __fsqrt_rn(x[0]);
    }
    if (len > 0.0f) {
        const turbo_t2_book<bits> bk = turbo_t2_book_load<bits>();
        const float inv = __fdiv_rn(1.0f, len);
#pragma unroll 1
        for (int i = 0; i < QK_TURBO; ++i) {
            const uint32_t yb = __float_as_uint(__fmul_rn(t[i], inv));
            const uint32_t m = turbo_t2_mag<bits>(yb, bk);
            const bool nonpos = turbo_t2_nonpos(yb);
            x[i] = turbo_t2_c2<bits>((int) m);
            o.lo[i >> 4] |= ((bits == 3 ? m : m | 2u) ^ (nonpos ? 3u : 0u)) << (2*(i & 15));
            o.hi[i >> 5] |= (bits == 3 && !nonpos ? 1u : 0u) << (i & 31);
        }
#pragma unroll 1
        for (int h = QK_TURBO/2; h >= 1; h /= 2) {
#pragma unroll 1
            for (int i = 0; i < h; ++i) {
                x[i] = __fadd_rn(x[i], x[i + h]);
            }
        }
        o.norm = turbo_norm_half(len, __fsqrt_rn(x[0]), e);
        if (o.norm == 0) {
            turbo_t2_zero(o);
        }
    }
    turbo_t2_store<bits>(dst, o, 0);
    turbo_t2_store<bits>(dst, o, 1);
}
