// turbo-llama: fused turbo flash-attention decode kernels with K type turbo4 (see fattn-turbo.cuh, fattn-turbo-mma.cuh):
// the tensor-core kernel (every V at D = 128 and 256), the scalar kernel (a q8_0 or f16 V) where it does not serve.
#include "fattn-turbo.cuh"
#include "fattn-turbo-mma.cuh"

template void ggml_cuda_turbo_fattn_launch<GGML_TYPE_TURBO4>(cudaStream_t, int, ggml_type, int, const turbo_fa_params &, dim3);
template void ggml_cuda_turbo_fattn_mma_launch<GGML_TYPE_TURBO4>(cudaStream_t, int, ggml_type, turbo_mma_loop, const turbo_fa_params &, dim3);
template int ggml_cuda_turbo_fattn_mma_occupancy<GGML_TYPE_TURBO4>(int, ggml_type, turbo_mma_loop);
// the 64-value form (head_dim 64 models): the tensor-core kernel at D = 64 with a 64-value turbo V
template void ggml_cuda_turbo_fattn_mma_launch<GGML_TYPE_TURBO4_64>(cudaStream_t, int, ggml_type, turbo_mma_loop, const turbo_fa_params &, dim3);
template int ggml_cuda_turbo_fattn_mma_occupancy<GGML_TYPE_TURBO4_64>(int, ggml_type, turbo_mma_loop);
