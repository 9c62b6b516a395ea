// turbo-llama: fused turbo flash-attention decode kernels with K type turbo3 (see fattn-turbo.cuh).
#include "fattn-turbo.cuh"

template void ggml_cuda_turbo_fattn_launch<GGML_TYPE_TURBO3>(cudaStream_t, int, ggml_type, int, const turbo_fa_params &, dim3);
