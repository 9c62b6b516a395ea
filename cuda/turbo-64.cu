// turbo-llama: the 64-value block types on CUDA (turbo3_64 / turbo2_64 / turbo4_64: head_dim 64 models; the format is
// cpu_ref/ggml-turbo.h's "64-value blocks": a 64-point FWHT, the first 64 signs of D, the d = 64 codebooks of
// turbo-codebooks-64.h, 26 / 18 / 34 bytes per block).
//
// One warp per 64-value block everywhere here (lane l holds values l and l + 32):
//   - CPY to _64: the same float operations as quantize_row_turbo*_64_ref in the same order, explicitly rounded
//     (bit-exact with the CPU; the warp helpers in turbo-common.cuh). The KV write (SET_ROWS, fused or not) is turbo.cu's
//     warp kernel at either block size;
//   - the reads (GET_ROWS, CPY _64 -> f32/f16, the to_fp16/to_fp32 conversions): dequantize_row_turbo*_64's operations;
//   - flash attention (the prefill; the decode where the tensor-core kernel does not take it, ggml_cuda_turbo64_fattn_fused:
//     other head sizes, q8_0 / f16 partners, GPUs before Ampere) as fattn-turbo-prefill.cu does for the 128-value types:
//     a _64 K or V decoded to f16 in the rotated domain (norm x centroid, no inverse transform), cell 0's exact rows
//     over row 0, q rotated once (64-point), upstream's f16 kernels, the output rotated back once (64-point). A q8_0
//     partner is converted to f16 here too, so that upstream's kernel needs no f16 space of its own in dst.
#include "turbo-common.cuh"
#include "turbo.cuh"
#include "fattn.cuh"
#include "turbo-codebooks-64.h"

#include <cstring>

#define TURBO64_WARPS_PER_BLOCK 8

void ggml_cuda_turbo64_check_tables(void) {
    ggml_cuda_turbo_check_tables();   // the sign words (a 64-value block takes the first two)
    static bool checked = false;
    if (checked) {
        return;
    }
    const float c3[8] = TURBO64_CUDA_C3, b3[7] = TURBO64_CUDA_B3, c2[4] = TURBO64_CUDA_C2, b2[3] = TURBO64_CUDA_B2;
    const float c4[16] = TURBO64_CUDA_C4, b4[15] = TURBO64_CUDA_B4;
    if (memcmp(c3, turbo3_64_centroids, sizeof(c3)) != 0 || memcmp(b3, turbo3_64_boundaries, sizeof(b3)) != 0 ||
        memcmp(c2, turbo2_64_centroids, sizeof(c2)) != 0 || memcmp(b2, turbo2_64_boundaries, sizeof(b2)) != 0 ||
        memcmp(c4, turbo4_64_centroids, sizeof(c4)) != 0 || memcmp(b4, turbo4_64_boundaries, sizeof(b4)) != 0) {
        GGML_ABORT("turbo-llama: the CUDA copies of the 64-value turbo codebooks differ from turbo-codebooks-64.h");
    }
    checked = true;
}


static inline int turbo64_bits(const ggml_type t) {
    return t == GGML_TYPE_TURBO4_64 ? 4 : t == GGML_TYPE_TURBO3_64 ? 3 : 2;
}

static inline dim3 turbo64_grid(const int64_t nblk) {
    return dim3((unsigned) ((nblk + TURBO64_WARPS_PER_BLOCK - 1) / TURBO64_WARPS_PER_BLOCK));
}

template <typename T> static __device__ __forceinline__ float turbo64_to_f32(T x) { return (float) x; }
template <> __device__ __forceinline__ float turbo64_to_f32<half>(half x) { return __half2float(x); }
template <typename T> static __device__ __forceinline__ T turbo64_from_f32(float x) { return (T) x; }
template <> __device__ __forceinline__ half turbo64_from_f32<half>(float x) { return __float2half_rn(x); }


// ---- CPY --------------------------------------------------------------------------------------------------------------

// f32/f16 -> _64: 64 consecutive elements in logical order are one block of the destination
template <typename src_t, int bits>
static __global__ void k_turbo64_cpy_to(const char * __restrict__ src0, char * __restrict__ dst, const int64_t nblk,
        const int64_t ne00, const int64_t ne01, const int64_t ne02, const size_t nb00, const size_t nb01, const size_t nb02,
        const size_t nb03, const int64_t ne10, const int64_t ne11, const int64_t ne12, const size_t nb11, const size_t nb12,
        const size_t nb13, const int bs) {
    const int64_t wid = ((int64_t) blockIdx.x*blockDim.x + threadIdx.x) / WARP_SIZE;
    const int lane = threadIdx.x % WARP_SIZE;
    if (wid >= nblk) {
        return;
    }
    float v[2];
#pragma unroll
    for (int k = 0; k < 2; ++k) {
        int64_t r = wid*QK_TURBO_64 + lane + 32*k;   // element by element: the source may be any permuted view
        const int64_t i00 = r % ne00; r /= ne00;
        const int64_t i01 = r % ne01; r /= ne01;
        const int64_t i02 = r % ne02;
        const int64_t i03 = r / ne02;
        v[k] = turbo64_to_f32(*(const src_t *) (src0 + i03*nb03 + i02*nb02 + i01*nb01 + i00*nb00));
    }
    int64_t r = wid*QK_TURBO_64;
    const int64_t i10 = r % ne10; r /= ne10;
    const int64_t i11 = r % ne11; r /= ne11;
    const int64_t i12 = r % ne12;
    const int64_t i13 = r / ne12;
    int codes[2];
    const uint16_t h = turbo64_warp_encode<bits>(v, codes, lane);
    turbo64_warp_store<bits>((uint8_t *) (dst + i13*nb13 + i12*nb12 + i11*nb11 + (i10/QK_TURBO_64)*bs), h, codes, lane);
}

// _64 -> f32/f16
template <typename dst_t, int bits>
static __global__ void k_turbo64_cpy_from(const char * __restrict__ src0, char * __restrict__ dst, const int64_t nblk,
        const int64_t ne00, const int64_t ne01, const int64_t ne02, const size_t nb01, const size_t nb02, const size_t nb03,
        const int64_t ne10, const int64_t ne11, const int64_t ne12, const size_t nb10, const size_t nb11, const size_t nb12,
        const size_t nb13, const int bs) {
    const int64_t wid = ((int64_t) blockIdx.x*blockDim.x + threadIdx.x) / WARP_SIZE;
    const int lane = threadIdx.x % WARP_SIZE;
    if (wid >= nblk) {
        return;
    }
    int64_t r = wid*QK_TURBO_64;
    const int64_t i00 = r % ne00; r /= ne00;
    const int64_t i01 = r % ne01; r /= ne01;
    const int64_t i02 = r % ne02;
    const int64_t i03 = r / ne02;
    float v[2];
    turbo64_warp_decode<bits>((const uint8_t *) (src0 + i03*nb03 + i02*nb02 + i01*nb01 + (i00/QK_TURBO_64)*bs), v, lane);
#pragma unroll
    for (int k = 0; k < 2; ++k) {
        int64_t q = wid*QK_TURBO_64 + lane + 32*k;
        const int64_t i10 = q % ne10; q /= ne10;
        const int64_t i11 = q % ne11; q /= ne11;
        const int64_t i12 = q % ne12;
        const int64_t i13 = q / ne12;
        *(dst_t *) (dst + i13*nb13 + i12*nb12 + i11*nb11 + i10*nb10) = turbo64_from_f32<dst_t>(v[k]);
    }
}

bool ggml_cuda_turbo64_cpy_supported(const ggml_tensor * src0, const ggml_tensor * src1) {
    const bool to   = ggml_cuda_is_turbo64_type(src1->type) && (src0->type == GGML_TYPE_F32 || src0->type == GGML_TYPE_F16);
    const bool from = ggml_cuda_is_turbo64_type(src0->type) && (src1->type == GGML_TYPE_F32 || src1->type == GGML_TYPE_F16);
    // the quantized side's rows are whole blocks, addressed block by block
    const ggml_tensor * q = to ? src1 : src0;
    return (to || from) && src0->ne[0] % QK_TURBO_64 == 0 && src1->ne[0] % QK_TURBO_64 == 0 &&
        q->nb[0] == ggml_type_size(q->type);
}

void ggml_cuda_turbo64_cpy(ggml_backend_cuda_context & ctx, const ggml_tensor * src0, ggml_tensor * src1) {
    ggml_cuda_turbo64_check_tables();
    GGML_ASSERT(ggml_cuda_turbo64_cpy_supported(src0, src1));
    GGML_ASSERT(ggml_nelements(src0) == ggml_nelements(src1));
    const int64_t nblk = ggml_nelements(src0) / QK_TURBO_64;
    if (nblk == 0) {
        return;
    }
    cudaStream_t stream = ctx.stream();
    const dim3 grid = turbo64_grid(nblk);
    const dim3 block(TURBO64_WARPS_PER_BLOCK*WARP_SIZE);
    const char * s = (const char *) src0->data;
    char * d = (char *) src1->data;
#define TURBO64_CPY_TO_ARGS  s, d, nblk, src0->ne[0], src0->ne[1], src0->ne[2], src0->nb[0], src0->nb[1], src0->nb[2], src0->nb[3], \
        src1->ne[0], src1->ne[1], src1->ne[2], src1->nb[1], src1->nb[2], src1->nb[3], (int) ggml_type_size(src1->type)
#define TURBO64_CPY_FROM_ARGS s, d, nblk, src0->ne[0], src0->ne[1], src0->ne[2], src0->nb[1], src0->nb[2], src0->nb[3], \
        src1->ne[0], src1->ne[1], src1->ne[2], src1->nb[0], src1->nb[1], src1->nb[2], src1->nb[3], (int) ggml_type_size(src0->type)
    if (ggml_cuda_is_turbo64_type(src1->type)) {
        const int bits = turbo64_bits(src1->type);
        if (src0->type == GGML_TYPE_F32) {
            if (bits == 4)      k_turbo64_cpy_to<float, 4><<<grid, block, 0, stream>>>(TURBO64_CPY_TO_ARGS);
            else if (bits == 3) k_turbo64_cpy_to<float, 3><<<grid, block, 0, stream>>>(TURBO64_CPY_TO_ARGS);
            else                k_turbo64_cpy_to<float, 2><<<grid, block, 0, stream>>>(TURBO64_CPY_TO_ARGS);
        } else {
            if (bits == 4)      k_turbo64_cpy_to<half, 4><<<grid, block, 0, stream>>>(TURBO64_CPY_TO_ARGS);
            else if (bits == 3) k_turbo64_cpy_to<half, 3><<<grid, block, 0, stream>>>(TURBO64_CPY_TO_ARGS);
            else                k_turbo64_cpy_to<half, 2><<<grid, block, 0, stream>>>(TURBO64_CPY_TO_ARGS);
        }
    } else {
        const int bits = turbo64_bits(src0->type);
        if (src1->type == GGML_TYPE_F32) {
            if (bits == 4)      k_turbo64_cpy_from<float, 4><<<grid, block, 0, stream>>>(TURBO64_CPY_FROM_ARGS);
            else if (bits == 3) k_turbo64_cpy_from<float, 3><<<grid, block, 0, stream>>>(TURBO64_CPY_FROM_ARGS);
            else                k_turbo64_cpy_from<float, 2><<<grid, block, 0, stream>>>(TURBO64_CPY_FROM_ARGS);
        } else {
            if (bits == 4)      k_turbo64_cpy_from<half, 4><<<grid, block, 0, stream>>>(TURBO64_CPY_FROM_ARGS);
            else if (bits == 3) k_turbo64_cpy_from<half, 3><<<grid, block, 0, stream>>>(TURBO64_CPY_FROM_ARGS);
            else                k_turbo64_cpy_from<half, 2><<<grid, block, 0, stream>>>(TURBO64_CPY_FROM_ARGS);
        }
    }
#undef TURBO64_CPY_TO_ARGS
#undef TURBO64_CPY_FROM_ARGS
    CUDA_CHECK(cudaGetLastError());
}

// ---- GET_ROWS ---------------------------------------------------------------------------------------------------------

template <typename dst_t, int bits>
static __global__ void k_turbo64_get_rows(const char * __restrict__ src0, const int32_t * __restrict__ src1, char * __restrict__ dst,
        const int64_t nblk, const int64_t nbr, const int64_t ne10, const int64_t ne11, const size_t nb01, const size_t nb02,
        const size_t nb03, const int64_t s10, const int64_t s11, const int64_t s12, const size_t nb1, const size_t nb2,
        const size_t nb3, const int bs) {
    const int64_t wid = ((int64_t) blockIdx.x*blockDim.x + threadIdx.x) / WARP_SIZE;
    const int lane = threadIdx.x % WARP_SIZE;
    if (wid >= nblk) {
        return;
    }
    int64_t r = wid / nbr;
    const int64_t ib  = wid - r*nbr;
    const int64_t i10 = r % ne10; r /= ne10;
    const int64_t i11 = r % ne11;
    const int64_t i12 = r / ne11;
    const int64_t row = src1[i10*s10 + i11*s11 + i12*s12];
    float v[2];
    turbo64_warp_decode<bits>((const uint8_t *) (src0 + row*nb01 + i11*nb02 + i12*nb03 + ib*bs), v, lane);
    dst_t * y = (dst_t *) (dst + i10*nb1 + i11*nb2 + i12*nb3) + ib*QK_TURBO_64;
    y[lane]      = turbo64_from_f32<dst_t>(v[0]);
    y[lane + 32] = turbo64_from_f32<dst_t>(v[1]);
}

void ggml_cuda_turbo64_get_rows(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    ggml_cuda_turbo64_check_tables();
    const ggml_tensor * src0 = dst->src[0];
    const ggml_tensor * src1 = dst->src[1];
    GGML_TENSOR_BINARY_OP_LOCALS
    GGML_ASSERT(src1->type == GGML_TYPE_I32);
    GGML_ASSERT(dst->type == GGML_TYPE_F32 || dst->type == GGML_TYPE_F16);
    GGML_ASSERT(ne00 % QK_TURBO_64 == 0);
    const int64_t nbr  = ne00 / QK_TURBO_64;
    const int64_t nblk = nbr*ne10*ne11*ne12;
    if (nblk == 0) {
        return;
    }
    cudaStream_t stream = ctx.stream();
    const dim3 grid = turbo64_grid(nblk);
    const dim3 block(TURBO64_WARPS_PER_BLOCK*WARP_SIZE);
    const int bs = (int) ggml_type_size(src0->type);
    const int bits = turbo64_bits(src0->type);
#define TURBO64_GR_ARGS (const char *) src0->data, (const int32_t *) src1->data, (char *) dst->data, nblk, nbr, ne10, ne11, \
        nb01, nb02, nb03, (int64_t) (nb10/4), (int64_t) (nb11/4), (int64_t) (nb12/4), nb1, nb2, nb3, bs
    if (dst->type == GGML_TYPE_F32) {
        if (bits == 4)      k_turbo64_get_rows<float, 4><<<grid, block, 0, stream>>>(TURBO64_GR_ARGS);
        else if (bits == 3) k_turbo64_get_rows<float, 3><<<grid, block, 0, stream>>>(TURBO64_GR_ARGS);
        else                k_turbo64_get_rows<float, 2><<<grid, block, 0, stream>>>(TURBO64_GR_ARGS);
    } else {
        if (bits == 4)      k_turbo64_get_rows<half, 4><<<grid, block, 0, stream>>>(TURBO64_GR_ARGS);
        else if (bits == 3) k_turbo64_get_rows<half, 3><<<grid, block, 0, stream>>>(TURBO64_GR_ARGS);
        else                k_turbo64_get_rows<half, 2><<<grid, block, 0, stream>>>(TURBO64_GR_ARGS);
    }
#undef TURBO64_GR_ARGS
    CUDA_CHECK(cudaGetLastError());
}

// ---- to_fp16 / to_fp32 (contiguous and non-contiguous; strides in blocks) --------------------------------------------

// ROTATED: the rotated domain (norm x centroid, fattn below) instead of the values
template <typename dst_t, int bits, bool ROTATED>
static __global__ void k_turbo64_dequant(const char * __restrict__ x, dst_t * __restrict__ y, const int64_t nblk,
        const int64_t nbr, const int64_t ne01, const int64_t ne02, const int64_t s01, const int64_t s02, const int64_t s03,
        const int bs) {
    const int64_t wid = ((int64_t) blockIdx.x*blockDim.x + threadIdx.x) / WARP_SIZE;
    const int lane = threadIdx.x % WARP_SIZE;
    if (wid >= nblk) {
        return;
    }
    int64_t r = wid / nbr;
    const int64_t ib = wid - r*nbr;
    const int64_t i1 = r % ne01; r /= ne01;
    const int64_t i2 = r % ne02;
    const int64_t i3 = r / ne02;
    const uint8_t * blk = (const uint8_t *) x + (i1*s01 + i2*s02 + i3*s03 + ib)*bs;
    float v[2];
    if (ROTATED) {
        turbo64_warp_decode_rotated<bits>(blk, v, lane);
    } else {
        turbo64_warp_decode<bits>(blk, v, lane);
    }
    dst_t * yb = y + wid*QK_TURBO_64;
    yb[lane]      = turbo64_from_f32<dst_t>(v[0]);
    yb[lane + 32] = turbo64_from_f32<dst_t>(v[1]);
}

template <typename dst_t, int bits, bool ROTATED = false>
static void turbo64_dequant_nc_cuda(const void * x, dst_t * y, int64_t ne00, int64_t ne01, int64_t ne02, int64_t ne03,
        int64_t s01, int64_t s02, int64_t s03, cudaStream_t stream) {
    GGML_ASSERT(ne00 % QK_TURBO_64 == 0);
    const int64_t nbr  = ne00 / QK_TURBO_64;
    const int64_t nblk = nbr*ne01*ne02*ne03;
    if (nblk == 0) {
        return;
    }
    const int bs = bits == 4 ? (int) sizeof(block_turbo4_64) : bits == 3 ? (int) sizeof(block_turbo3_64) : (int) sizeof(block_turbo2_64);
    k_turbo64_dequant<dst_t, bits, ROTATED><<<turbo64_grid(nblk), TURBO64_WARPS_PER_BLOCK*WARP_SIZE, 0, stream>>>(
        (const char *) x, y, nblk, nbr, ne01, ne02, s01, s02, s03, bs);
}

template <typename dst_t, int bits>
static void turbo64_dequant_cuda(const void * x, dst_t * y, int64_t k, cudaStream_t stream) {
    GGML_ASSERT(k % QK_TURBO_64 == 0);
    const int64_t nb = k / QK_TURBO_64;
    turbo64_dequant_nc_cuda<dst_t, bits>(x, y, k, 1, 1, 1, nb, nb, nb, stream);
}

to_fp16_cuda_t ggml_cuda_turbo64_get_to_fp16(ggml_type type) {
    switch (type) {
        case GGML_TYPE_TURBO4_64: return turbo64_dequant_cuda<half, 4>;
        case GGML_TYPE_TURBO3_64: return turbo64_dequant_cuda<half, 3>;
        case GGML_TYPE_TURBO2_64: return turbo64_dequant_cuda<half, 2>;
        default: return nullptr;
    }
}
to_fp32_cuda_t ggml_cuda_turbo64_get_to_fp32(ggml_type type) {
    switch (type) {
        case GGML_TYPE_TURBO4_64: return turbo64_dequant_cuda<float, 4>;
        case GGML_TYPE_TURBO3_64: return turbo64_dequant_cuda<float, 3>;
        case GGML_TYPE_TURBO2_64: return turbo64_dequant_cuda<float, 2>;
        default: return nullptr;
    }
}
to_fp16_nc_cuda_t ggml_cuda_turbo64_get_to_fp16_nc(ggml_type type) {
    switch (type) {
        case GGML_TYPE_TURBO4_64: return turbo64_dequant_nc_cuda<half, 4>;
        case GGML_TYPE_TURBO3_64: return turbo64_dequant_nc_cuda<half, 3>;
        case GGML_TYPE_TURBO2_64: return turbo64_dequant_nc_cuda<half, 2>;
        default: return nullptr;
    }
}
to_fp32_nc_cuda_t ggml_cuda_turbo64_get_to_fp32_nc(ggml_type type) {
    switch (type) {
        case GGML_TYPE_TURBO4_64: return turbo64_dequant_nc_cuda<float, 4>;
        case GGML_TYPE_TURBO3_64: return turbo64_dequant_nc_cuda<float, 3>;
        case GGML_TYPE_TURBO2_64: return turbo64_dequant_nc_cuda<float, 2>;
        default: return nullptr;
    }
}

// ---- flash attention --------------------------------------------------------------------------------------------------

// q rows (strided f32, ne0 a multiple of 64) -> contiguous rows of R q, one warp per 64-block
static __global__ void k_turbo64_rotate_rows(const char * __restrict__ src, float * __restrict__ dst, const int64_t ne0,
        const int64_t ne1, const int64_t ne2, const size_t nb1, const size_t nb2, const size_t nb3, const int64_t nblk) {
    const int64_t wid = ((int64_t) blockIdx.x*blockDim.x + threadIdx.x) / WARP_SIZE;
    const int lane = threadIdx.x % WARP_SIZE;
    if (wid >= nblk) {
        return;
    }
    const int64_t row = wid / (ne0/QK_TURBO_64);
    const int64_t b   = wid % (ne0/QK_TURBO_64);
    const int64_t i1 = row % ne1, i2 = (row / ne1) % ne2, i3 = row / (ne1*ne2);
    const float * s = (const float *) (src + i1*nb1 + i2*nb2 + i3*nb3) + b*QK_TURBO_64;
    float v[2] = { s[lane], s[lane + 32] };
    turbo64_warp_rotate(v, lane);
    float * d = dst + wid*QK_TURBO_64;
    d[lane]      = v[0];
    d[lane + 32] = v[1];
}

// contiguous f32 rows in place: R^-1
static __global__ void k_turbo64_unrotate_rows(float * __restrict__ x, const int64_t nblk) {
    const int64_t wid = ((int64_t) blockIdx.x*blockDim.x + threadIdx.x) / WARP_SIZE;
    const int lane = threadIdx.x % WARP_SIZE;
    if (wid >= nblk) {
        return;
    }
    float * r = x + wid*QK_TURBO_64;
    float v[2] = { r[lane], r[lane + 32] };
    turbo64_warp_unrotate(v, lane);
    r[lane]      = v[0];
    r[lane + 32] = v[1];
}

// the K or V side as upstream's kernel gets it: _64 decoded rotated (cell 0's rows over row 0), q8_0 (or another type
// with a to_fp16 conversion) converted, f16 as it is
static ggml_tensor turbo64_side_f16(cudaStream_t stream, const ggml_tensor * t, const ggml_tensor * cell0,
        ggml_cuda_pool_alloc<half> & buf) {
    if (t->type == GGML_TYPE_F16) {
        return *t;
    }
    buf.alloc(ggml_nelements(t));
    const size_t ts = ggml_type_size(t->type);
    GGML_ASSERT(t->nb[0] == ts);
    const int64_t s01 = t->nb[1]/ts, s02 = t->nb[2]/ts, s03 = t->nb[3]/ts;
    if (ggml_cuda_is_turbo64_type(t->type)) {
        const int bits = turbo64_bits(t->type);
        const auto dec = bits == 4 ? turbo64_dequant_nc_cuda<half, 4, true> : bits == 3 ? turbo64_dequant_nc_cuda<half, 3, true> :
                                     turbo64_dequant_nc_cuda<half, 2, true>;
        dec(t->data, buf.ptr, t->ne[0], t->ne[1], t->ne[2], t->ne[3], s01, s02, s03, stream);
        if (cell0) {
            ggml_cuda_turbo_cell0_f16(stream, cell0, t, buf.ptr);   // fattn-turbo-prefill.cu's, shared
        }
    } else {
        const to_fp16_nc_cuda_t conv = ggml_get_to_fp16_nc_cuda(t->type);
        GGML_ASSERT(conv);
        conv(t->data, buf.ptr, t->ne[0], t->ne[1], t->ne[2], t->ne[3], s01, s02, s03, stream);
    }
    CUDA_CHECK(cudaGetLastError());
    return ggml_cuda_turbo_contiguous_like(t, GGML_TYPE_F16, buf.ptr);
}

static bool turbo64_fattn_side_ok(const ggml_tensor * t) {
    return (ggml_cuda_is_turbo64_type(t->type) || t->type == GGML_TYPE_F16 || t->type == GGML_TYPE_Q8_0) &&
        t->nb[0] == ggml_type_size(t->type);
}

bool ggml_cuda_turbo64_fattn_supported(const ggml_tensor * dst) {
    const ggml_tensor * Q = dst->src[0];
    const ggml_tensor * K = dst->src[1];
    const ggml_tensor * V = dst->src[2];
    if (!ggml_cuda_is_turbo64_type(K->type) && !ggml_cuda_is_turbo64_type(V->type)) {
        return false;
    }
    if (!turbo64_fattn_side_ok(K) || !turbo64_fattn_side_ok(V) || Q->type != GGML_TYPE_F32 || dst->type != GGML_TYPE_F32 ||
        !ggml_is_contiguous(dst)) {
        return false;
    }
    if (Q->ne[0] % QK_TURBO_64 != 0 || K->ne[0] != Q->ne[0] || V->ne[0] % QK_TURBO_64 != 0) {
        return false;
    }
    // upstream's f16 kernels must take the op as it will be run: f16 K/V of the same shapes, no cell-0 rows
    ggml_tensor Kf = ggml_cuda_turbo_contiguous_like(K, GGML_TYPE_F16, K->data);
    ggml_tensor Vf = ggml_cuda_turbo_contiguous_like(V, GGML_TYPE_F16, V->data);
    ggml_tensor d = *dst;
    d.src[1] = &Kf;
    d.src[2] = &Vf;
    d.src[5] = nullptr;
    d.src[6] = nullptr;
    return ggml_cuda_flash_attn_ext_supported(ggml_cuda_get_device(), &d);
}

void ggml_cuda_turbo64_fattn(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    ggml_cuda_turbo64_check_tables();
    const ggml_tensor * Q = dst->src[0];
    const ggml_tensor * K = dst->src[1];
    const ggml_tensor * V = dst->src[2];
    GGML_ASSERT(ggml_cuda_turbo64_fattn_supported(dst));
    const bool K64 = ggml_cuda_is_turbo64_type(K->type), V64 = ggml_cuda_is_turbo64_type(V->type);
    cudaStream_t stream = ctx.stream();
    ggml_cuda_pool & pool = ctx.pool();
    const dim3 block(TURBO64_WARPS_PER_BLOCK*WARP_SIZE);

    ggml_cuda_pool_alloc<float> q_rot(pool);
    ggml_cuda_pool_alloc<half>  k_f16(pool), v_f16(pool);
    ggml_tensor Qr = *Q;
    if (K64) {
        q_rot.alloc(ggml_nelements(Q));
        const int64_t nblk = ggml_nelements(Q)/QK_TURBO_64;
        k_turbo64_rotate_rows<<<turbo64_grid(nblk), block, 0, stream>>>((const char *) Q->data, q_rot.ptr, Q->ne[0], Q->ne[1],
            Q->ne[2], Q->nb[1], Q->nb[2], Q->nb[3], nblk);
        CUDA_CHECK(cudaGetLastError());
        Qr = ggml_cuda_turbo_contiguous_like(Q, GGML_TYPE_F32, q_rot.ptr);
    }
    ggml_tensor Kr = turbo64_side_f16(stream, K, K64 ? dst->src[5] : nullptr, k_f16);
    ggml_tensor Vr = turbo64_side_f16(stream, V, V64 ? dst->src[6] : nullptr, v_f16);

    ggml_tensor dst_r = *dst;   // writes dst's data; K and V are f16 now: upstream's dispatch
    dst_r.src[0] = &Qr;
    dst_r.src[1] = &Kr;
    dst_r.src[2] = &Vr;
    dst_r.src[5] = nullptr;
    dst_r.src[6] = nullptr;
    ggml_cuda_flash_attn_ext(ctx, &dst_r);

    if (V64) {
        const int64_t nblk = ggml_nelements(dst)/QK_TURBO_64;
        k_turbo64_unrotate_rows<<<turbo64_grid(nblk), block, 0, stream>>>((float *) dst->data, nblk);
        CUDA_CHECK(cudaGetLastError());
    }
}
