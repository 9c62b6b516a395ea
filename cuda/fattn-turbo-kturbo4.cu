// turbo-llama: fused turbo flash-attention decode kernels with K type turbo4 (see fattn-turbo-mma.cuh). turbo4 is read
// by the tensor-core kernel only: the scalar kernel of fattn-turbo.cuh has no turbo4 instance (pair_supported).
#include "fattn-turbo.cuh"
#include "fattn-turbo-mma.cuh"

template void ggml_cuda_turbo_fattn_mma_launch<GGML_TYPE_TURBO4>(cudaStream_t, int, ggml_type, turbo_mma_loop, const turbo_fa_params &, dim3);
template int ggml_cuda_turbo_fattn_mma_occupancy<GGML_TYPE_TURBO4>(int, ggml_type, turbo_mma_loop);
