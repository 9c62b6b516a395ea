// turbo-llama: the turbo fusions of ggml-cuda.cu's graph walk (ggml_cuda_try_fuse calls ggml_cuda_turbo_try_fuse first).
// Included by ggml-cuda.cu just before ggml_cuda_try_fuse: the checks use its static helpers
// (ggml_cuda_is_view_or_noop, ggml_cuda_check_fusion_memory_ranges); the kernels are turbo.cu's and fattn-turbo.cu's.
#pragma once

#include "turbo.cuh"

// llama's RoPE of K (node i: ROPE -> VIEW), the turbo key offset (SUB) and the turbo K write (SET_ROWS),
// with the V write after them when it follows (only views between), as one kernel; when first < i, node first is the
// MUL before the ROPE (ggml_cuda_turbo_rope_mul_fusable), done by the same kernel. Returns how many nodes after i the
// fused kernel took, or 0 (nothing launched)
static int ggml_cuda_turbo_try_rope_set_rows(ggml_backend_cuda_context * cuda_ctx, ggml_cgraph * cgraph, const int i,
                                             const int first) {
    ggml_tensor * node = cgraph->nodes[i];
    if (node->op == GGML_OP_ROPE && i + 3 < cgraph->n_nodes &&
            ggml_cuda_turbo_rope_set_rows_fusable(node, cgraph->nodes[i + 1], cgraph->nodes[i + 2]) &&
            ggml_cuda_turbo_set_rows_sub_fusable(cgraph->nodes[i + 2], cgraph->nodes[i + 3]) &&
            ggml_can_fuse_subgraph(cgraph, i, { GGML_OP_ROPE, GGML_OP_VIEW, GGML_OP_SUB, GGML_OP_SET_ROWS }, { i + 3 })) {
        int j = i + 4;
        while (j < cgraph->n_nodes && j <= i + 6 && ggml_cuda_is_view_or_noop(cgraph->nodes[j])) {
            ++j;
        }
        const bool with_v = j < cgraph->n_nodes && j <= i + 6 && (cgraph->nodes[j]->flags & GGML_TENSOR_FLAG_COMPUTE) &&
            ggml_cuda_turbo_set_rows_pair_fusable(cgraph->nodes[i + 3], cgraph->nodes[j]);
        const int out_nodes[] = { i + 3, j };
        if (ggml_cuda_check_fusion_memory_ranges(cgraph, first, (with_v ? j + 1 : i + 4) - first, out_nodes, with_v ? 2 : 1)) {
            ggml_cuda_turbo_set_rows_sub_pair(*cuda_ctx, cgraph->nodes[i + 2], cgraph->nodes[i + 3],
                                              with_v ? cgraph->nodes[j] : nullptr, node,
                                              first < i ? cgraph->nodes[first] : nullptr);
            return with_v ? j - i : 3;
        }
    }
    return 0;
}

// the turbo fusions that start at node i: how many nodes after i they took, or 0 (nothing launched; upstream's
// fusions are tried next)
static int ggml_cuda_turbo_try_fuse(ggml_backend_cuda_context * cuda_ctx, ggml_cgraph * cgraph, const int i) {
    ggml_tensor * node = cgraph->nodes[i];

    // llama's q*D and k/D (a MUL by one f32 row of the head's width, patch 0041) before a RoPE that
    // one of the two fusions below does on load: the fused kernel multiplies too (the MUL's launch gone; the same
    // f32 products). Started from the MUL, whose fusion then takes every node up to the last the ROPE's takes
    if (node->op == GGML_OP_MUL) {
        const int r = ggml_cuda_turbo_rope_mul_fusable(cgraph, i);
        if (r > 0) {
            const int nk = ggml_cuda_turbo_try_rope_set_rows(cuda_ctx, cgraph, i + r, i);
            if (nk > 0) {
                return r + nk;
            }
            const int nq = ggml_cuda_turbo_rope_fa_fusable(cgraph, i + r);
            if (nq > 0) {
                ggml_cuda_turbo_rope_fa(*cuda_ctx, cgraph->nodes[i + r], cgraph->nodes[i + r + nq], node);
                return r + nq;
            }
        }
    }

    // llama's RoPE of K (ROPE -> VIEW), the turbo key offset (SUB) and the turbo K write (SET_ROWS),
    // with the V write after them when it follows (only views between), as one kernel
    if (node->op == GGML_OP_ROPE) {
        const int n = ggml_cuda_turbo_try_rope_set_rows(cuda_ctx, cgraph, i, i);
        if (n > 0) {
            return n;
        }
    }

    // llama's RoPE of Q done by the turbo decode attention as it loads q (ROPE -> PERMUTE -> views ->
    // FLASH_ATTN_EXT): one launch fewer per layer
    if (node->op == GGML_OP_ROPE) {
        const int n = ggml_cuda_turbo_rope_fa_fusable(cgraph, i);
        if (n > 0) {
            ggml_cuda_turbo_rope_fa(*cuda_ctx, node, cgraph->nodes[i + n]);
            return n;
        }
    }

    // llama's turbo key offset (SUB of one row) and the turbo K write (SET_ROWS) as one kernel
    // (the subgraph check: SET_ROWS has the cache's shape, not the SUB's, so ggml_can_fuse would refuse it)
    if (node->op == GGML_OP_SUB && i + 1 < cgraph->n_nodes &&
            ggml_cuda_turbo_set_rows_sub_fusable(node, cgraph->nodes[i + 1]) &&
            ggml_can_fuse_subgraph(cgraph, i, { GGML_OP_SUB, GGML_OP_SET_ROWS }, { i + 1 })) {
        // llama's V write follows the K write with only views between them: both in one launch
        int j = i + 2;
        while (j < cgraph->n_nodes && j <= i + 4 && ggml_cuda_is_view_or_noop(cgraph->nodes[j])) {
            ++j;
        }
        if (j < cgraph->n_nodes && j <= i + 4 && (cgraph->nodes[j]->flags & GGML_TENSOR_FLAG_COMPUTE) &&
                ggml_cuda_turbo_set_rows_pair_fusable(cgraph->nodes[i + 1], cgraph->nodes[j])) {
            const int out_pair[] = { i + 1, j };
            if (ggml_cuda_check_fusion_memory_ranges(cgraph, i, j - i + 1, out_pair, 2)) {
                ggml_cuda_turbo_set_rows_sub_pair(*cuda_ctx, node, cgraph->nodes[i + 1], cgraph->nodes[j]);
                return j - i;
            }
        }
        const int out_nodes[] = { i + 1 };
        if (ggml_cuda_check_fusion_memory_ranges(cgraph, i, 2, out_nodes, 1)) {
            ggml_cuda_turbo_set_rows_sub(*cuda_ctx, node, cgraph->nodes[i + 1]);
            return 1;
        }
    }

    return 0;
}
