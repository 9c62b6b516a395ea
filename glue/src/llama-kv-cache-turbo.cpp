#include "llama-kv-cache-turbo.h"

#include "llama-kv-cache.h"

#include "llama-cparams.h"
#include "llama-hparams.h"
#include "llama-impl.h"
#include "llama-io.h"
#include "llama-batch.h"
#include "llama-turbo.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

// the turbo block rotation (ggml-turbo.h in ggml-base, which also exports it to ggml-cpu)
extern "C" void turbo_rotate_forward_qk(float * x, int64_t k, int qk);

uint32_t llama_kv_head_stored(ggml_type type, uint32_t n_embd_head) {
    // below 65 the padding would cost x2 or more: turbo3 at 6+ bits/value is no smaller than q8_0
    const bool pad = ggml_is_turbo(type) && ggml_blck_size(type) == 128 && n_embd_head > 64 && n_embd_head < 128;
    return pad ? 128 : n_embd_head;
}

//
// the cache's memory
//

// whether a device's backend can write a cache of this type (SET_ROWS from f32). A turbo type that a backend has no
// kernels for (turbo4 on CUDA for now) must not live in that device's memory: the scheduler could neither write it
// there nor move the write to the CPU.
static bool llama_kv_dev_can_write(ggml_backend_dev_t dev, ggml_type type, int64_t n_embd) {
    ggml_init_params params = { 4*ggml_tensor_overhead(), nullptr, /*no_alloc =*/ true };
    ggml_context * ctx = ggml_init(params);
    ggml_tensor * dst  = ggml_new_tensor_2d(ctx, type, n_embd, 1);
    ggml_tensor * src  = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, n_embd, 1);
    ggml_tensor * rows = ggml_new_tensor_1d(ctx, GGML_TYPE_I64, 1);
    const bool ok = ggml_backend_dev_supports_op(dev, ggml_set_rows(ctx, dst, src, rows));
    ggml_free(ctx);
    return ok;
}

void llama_kv_turbo_buft(ggml_backend_dev_t dev, ggml_type type_k, uint32_t n_embd_k_gqa, ggml_type type_v,
                         uint32_t n_embd_v_gqa, ggml_backend_buffer_type_t & buft, const char *& dev_name) {
    // the CPU backend runs the ops of a cache in host memory; the line is the cache constructor's, as the lines around it
    for (const auto & [type, n_embd] : { std::make_pair(type_k, n_embd_k_gqa), std::make_pair(type_v, n_embd_v_gqa) }) {
        if (ggml_is_turbo(type) && buft != ggml_backend_cpu_buffer_type() &&
            !llama_kv_dev_can_write(dev, type, n_embd)) {
            static bool logged = false;
            if (!logged) {
                LLAMA_LOG_WARN("%s: %s has no %s kernels yet: this cache stays in host memory and its "
                               "attention runs on the CPU\n", "llama_kv_cache", dev_name, ggml_type_name(type));
                logged = true;
            }
            buft     = ggml_backend_cpu_buffer_type();
            dev_name = "CPU";
        }
    }
}

ggml_type llama_kv_turbo_type_k_swa(const llama_hparams & hparams, ggml_type type_k, bool swa_full,
                                    uint32_t size_swa, uint32_t size_base) {
    // a turbo K cache keeps the keys of the sliding-window layers in q8_0. Their cache holds only the window (n_swa +
    // n_ubatch cells at any context), and on Gemma 3 these layers carry most of turbo K's loss
    // (results/k-transforms.md). A full-size SWA cache (--swa-full) keeps turbo keys everywhere.
    // Head sizes that q8_0's 32-value blocks do not divide (a padded head of 80, say) keep turbo keys there too.
    // (the log line is the iSWA constructor's, as the lines around it)
    bool q8_0_fits = true;
    for (uint32_t il = 0; il < hparams.n_layer(); ++il) {
        q8_0_fits = q8_0_fits && (!hparams.is_swa(il) || hparams.n_embd_head_k(il) % ggml_blck_size(GGML_TYPE_Q8_0) == 0);
    }
    const ggml_type type_k_swa = ggml_is_turbo(type_k) && !swa_full && q8_0_fits ? GGML_TYPE_Q8_0 : type_k;
    if (type_k_swa != type_k) {
        LLAMA_LOG_INFO("%s: turbo K: the sliding-window layers' keys are stored as %s (their cache holds %u cells, "
                       "not %u; turbo keys lose most there)\n", "llama_kv_cache_iswa", ggml_type_name(type_k_swa), size_swa, size_base);
    }
    return type_k_swa;
}

void llama_kv_turbo::add_layer(ggml_context * ctx, const llama_hparams & hparams, uint32_t il, ggml_type type_k,
                               ggml_type type_v, bool has_k, bool has_v, bool v_trans, uint32_t n_embd_k_gqa,
                               uint32_t n_embd_v_gqa, uint32_t n_stream, uint32_t kv_size, const char * name_tag) {
    ggml_tensor * k_off = nullptr;
    // TURBO_K_OFFSET=force: offsets for any K type (tests: an offset must not change f16 results)
    const char * off_env = getenv("TURBO_K_OFFSET");
    if (has_k && (ggml_is_turbo(type_k) ||
                  (off_env && strcmp(off_env, "force") == 0))) {
        k_off = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, hparams.n_embd_k_gqa(il)); // real heads: subtracted before padding
        ggml_format_name(k_off, "cache_%sk_off_l%d", name_tag, il);
    }
    ggml_tensor * qk_gain = nullptr;
    if (k_off) {
        qk_gain = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 2*hparams.n_embd_head_k(il));   // q's and k's weights
        ggml_format_name(qk_gain, "cache_%sqk_gain_l%d", name_tag, il);
    }

    ggml_tensor * k0 = nullptr;
    ggml_tensor * v0 = nullptr;
    if (has_k && ggml_is_turbo(type_k)) {
        k0 = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, n_embd_k_gqa, n_stream);
        ggml_format_name(k0, "cache_%sk0_l%d", name_tag, il);
    }
    if (has_v && !v_trans && ggml_is_turbo(type_v)) {
        v0 = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, n_embd_v_gqa, n_stream);
        ggml_format_name(v0, "cache_%sv0_l%d", name_tag, il);
    }

    // the recent window, on both sides of a cache with a turbo side (a mixed pair's other side too: the mask moves
    // the window's cells of both sides at once)
    ggml_tensor * kr = nullptr;
    ggml_tensor * vr = nullptr;
    const uint32_t n_rows = window_rows(type_k, type_v, kv_size);
    if (n_rows > 0 && !v_trans && (ggml_is_turbo(type_k) || ggml_is_turbo(type_v))) {
        GGML_ASSERT(n_ring == 0 || n_ring == n_rows);
        const ggml_type type_kr = ggml_is_turbo(type_k) ? GGML_TYPE_Q8_0 : type_k;
        const ggml_type type_vr = ggml_is_turbo(type_v) ? GGML_TYPE_Q8_0 : type_v;
        if (n_ring == 0) {   // once per cache (the line is the cache constructor's, as the lines around it)
            LLAMA_LOG_INFO("%s: turbo window: the last %u cells of each stream also kept as K %s, V %s rows "
                           "(TURBO_WINDOW=0: none)\n", "llama_kv_cache", n_rows, ggml_type_name(type_kr), ggml_type_name(type_vr));
        }
        n_ring = n_rows;
        ring_cell.assign(n_stream, std::vector<int32_t>(n_ring, -1));
        if (has_k) {
            kr = ggml_new_tensor_3d(ctx, type_kr, n_embd_k_gqa, n_ring, n_stream);
            ggml_format_name(kr, "cache_%skr_l%d", name_tag, il);
        }
        if (has_v) {
            vr = ggml_new_tensor_3d(ctx, type_vr, n_embd_v_gqa, n_ring, n_stream);
            ggml_format_name(vr, "cache_%svr_l%d", name_tag, il);
        }
    }

    layers.push_back({ k_off, qk_gain, k0, v0, kr, vr });
}

uint32_t llama_kv_turbo::window_rows(ggml_type type_k, ggml_type type_v, uint32_t kv_size) {
    const uint32_t rows = llama_turbo_window_scope::rows();
    if (rows == 0 || !(ggml_is_turbo(type_k) || ggml_is_turbo(type_v))) {
        return 0;
    }
    return std::min(rows, kv_size);
}

void llama_kv_turbo::share_layer(const llama_kv_turbo & other, int32_t ikv_other) {
    layers.push_back(other.layers[ikv_other]);
    if (other.n_ring > 0) {
        n_ring    = other.n_ring;
        ring_cell = other.ring_cell;
    }
}

void llama_kv_turbo::ring_clear() const {
    for (auto & cells : ring_cell) {
        std::fill(cells.begin(), cells.end(), -1);
    }
}

void llama_kv_turbo::ring_written(const std::vector<int32_t> & strm, const std::vector<std::vector<uint32_t>> & idxs) const {
    if (n_ring == 0) {
        return;
    }
    for (size_t s = 0; s < strm.size(); ++s) {
        auto & cells = ring_cell[strm[s]];
        std::vector<uint8_t> hits(n_ring, 0);
        for (uint32_t c : idxs[s]) {
            const uint32_t r = c % n_ring;
            cells[r] = hits[r]++ ? -1 : (int32_t) c;   // the SET_ROWS may land either of two rows: use neither
        }
        for (uint32_t c : idxs[s]) {
            if (hits[c % n_ring] > 1) {
                cells[c % n_ring] = -1;
            }
        }
    }
}

ggml_tensor * llama_kv_turbo::build_ring_mask(ggml_context * ctx, ggml_tensor * kq_mask) const {
    if (n_ring == 0 || kq_mask->type != GGML_TYPE_F16) {
        return nullptr;
    }
    // R_pad: the CUDA prefill puts the window after the cells as keys of whole 256-key tiles
    ggml_tensor * mr = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, GGML_PAD(n_ring, 256), kq_mask->ne[1], kq_mask->ne[2], kq_mask->ne[3]);
    ggml_set_input(mr);
    ggml_set_name(mr, "attn_inp_kq_mask_ring");
    ring_masks.erase(std::remove_if(ring_masks.begin(), ring_masks.end(), [&](const auto & e) { return e.first == kq_mask; }), ring_masks.end());
    if (ring_masks.size() >= 16) {
        ring_masks.erase(ring_masks.begin());
    }
    ring_masks.emplace_back(kq_mask, mr);
    return mr;
}

ggml_tensor * llama_kv_turbo::ring_mask_of(const ggml_tensor * kq_mask) const {
    for (auto it = ring_masks.rbegin(); it != ring_masks.rend(); ++it) {
        if (it->first == kq_mask) {
            return it->second;
        }
    }
    return nullptr;
}

void llama_kv_turbo::set_input_ring_mask(const llama_kv_cache & kv, ggml_tensor * kq_mask, const llama_ubatch * ubatch) const {
    // a graph whose attention does not take the window (none allocated) leaves the mask as it is
    ggml_tensor * mr = ring_mask_of(kq_mask);
    if (!mr || !mr->buffer) {
        return;
    }
    GGML_ASSERT(ggml_backend_buffer_is_host(mr->buffer) && ggml_is_contiguous(kq_mask) && ggml_is_contiguous(mr));
    const int64_t n_kv  = kq_mask->ne[0];
    const int64_t n_tps = kq_mask->ne[1];
    const int64_t R_pad = mr->ne[0];
    const ggml_fp16_t drop = ggml_fp32_to_fp16(-INFINITY);
    ggml_fp16_t * main = (ggml_fp16_t *) kq_mask->data;
    ggml_fp16_t * ring = (ggml_fp16_t *) mr->data;
    for (int64_t s = 0; s < kq_mask->ne[3]; ++s) {
        // the stream of this slice of the mask: its tokens' (as llama_kv_cache::set_input_kq_mask)
        const auto & cells = ring_cell[kv.seq_to_stream[ubatch->seq_id[s*n_tps][0]]];
        for (int64_t i = 0; i < n_tps*kq_mask->ne[2]; ++i) {
            ggml_fp16_t * m  = main + (s*n_tps*kq_mask->ne[2] + i)*n_kv;
            ggml_fp16_t * mw = ring + (s*n_tps*kq_mask->ne[2] + i)*R_pad;
            for (int64_t r = 0; r < R_pad; ++r) {
                const int32_t c = r < (int64_t) n_ring ? cells[r] : -1;
                // cell 0 keeps its exact f32 rows (cell0): the window leaves it
                if (c > 0 && c < n_kv) {
                    mw[r] = m[c];
                    m[c]  = drop;
                } else {
                    mw[r] = drop;
                }
            }
        }
    }
}

void llama_kv_turbo::restore(const llama_kv_cache & kv) const {
    for (size_t ikv = 0; ikv < layers.size(); ++ikv) {
        const auto & layer = layers[ikv];
        const int32_t il = kv.layers[ikv].il;
        const auto it = k_off_host.find(il);
        if (layer.k_off && it != k_off_host.end()) {
            ggml_backend_tensor_set(layer.k_off, it->second.data(), 0, ggml_nbytes(layer.k_off));
        }
        const auto ig = qk_gain_host.find(il);
        if (layer.qk_gain && ig != qk_gain_host.end()) {
            ggml_backend_tensor_set(layer.qk_gain, ig->second.data(), 0, ggml_nbytes(layer.qk_gain));
        }
    }
}

size_t llama_kv_turbo::size_k_bytes() const {
    size_t size = 0;
    for (const auto & layer : layers) {
        for (const ggml_tensor * t : { layer.k_off, layer.qk_gain, layer.k0, layer.kr }) {
            size += t ? ggml_nbytes(t) : 0;
        }
    }
    return size;
}

size_t llama_kv_turbo::size_v_bytes() const {
    size_t size = 0;
    for (const auto & layer : layers) {
        size += layer.v0 ? ggml_nbytes(layer.v0) : 0;
        size += layer.vr ? ggml_nbytes(layer.vr) : 0;
    }
    return size;
}

//
// the key transform's per-layer data (set by the context: llama_context::turbo_qk_gains, the probe)
//

bool llama_kv_cache::set_k_off(int32_t il, const float * data, size_t n) {
    const auto it = map_layer_ids.find(il);
    if (it == map_layer_ids.end()) {
        return false;
    }
    ggml_tensor * off = turbo.layers[it->second].k_off;
    if (!off || !off->buffer || !off->data || (size_t) ggml_nelements(off) != n) {
        return false; // no turbo K here, or a memory-estimate context without buffers
    }
    ggml_backend_tensor_set(off, data, 0, ggml_nbytes(off));
    turbo.k_off_host[il].assign(data, data + n); // restored after clear(true)
    return true;
}

bool llama_kv_cache::set_qk_gain(int32_t il, const float * data, size_t n) {
    const auto it = map_layer_ids.find(il);
    if (it == map_layer_ids.end()) {
        return false;
    }
    ggml_tensor * d = turbo.layers[it->second].qk_gain;
    if (!d || !d->buffer || !d->data || (size_t) ggml_nelements(d) != n) {
        return false;
    }
    ggml_backend_tensor_set(d, data, 0, ggml_nbytes(d));
    turbo.qk_gain_host[il].assign(data, data + n);
    return true;
}

ggml_tensor * llama_kv_cache::get_qk_gain(int32_t il) const {
    const auto it = map_layer_ids.find(il);
    if (it == map_layer_ids.end() || turbo.qk_gain_host.find(il) == turbo.qk_gain_host.end()) {
        return nullptr;
    }
    return turbo.layers[it->second].qk_gain;
}

bool llama_kv_cache::has_qk_gain(int32_t il) const {
    const auto it = map_layer_ids.find(il);
    return it != map_layer_ids.end() && turbo.layers[it->second].qk_gain != nullptr;
}

ggml_tensor * llama_kv_cache_context::get_qk_gain(int32_t il) const {
    return kv->get_qk_gain(il);
}

bool llama_kv_cache_context::has_qk_gain(int32_t il) const {
    return kv->has_qk_gain(il);
}

//
// cell 0's exact rows and padded heads in the graph
//

// [n_embd_head, n_head_kv, ns] views of the cell-0 rows, matching get_k/get_v's heads and streams
static ggml_tensor * llama_kv_cell0_view(ggml_context * ctx, ggml_tensor * t0, uint32_t n_head_kv, const llama_kv_cache::slot_info & sinfo) {
    if (!t0) {
        return nullptr;
    }
    const uint32_t ns = sinfo.s1 - sinfo.s0 + 1;
    return ggml_view_3d(ctx, t0, t0->ne[0]/n_head_kv, n_head_kv, ns, t0->nb[0]*(t0->ne[0]/n_head_kv), t0->nb[1], t0->nb[1]*sinfo.s0);
}

// [n_embd_head, n_ring, n_head_kv, ns] views of the window's rows, matching get_k/get_v's heads and streams
static ggml_tensor * llama_kv_ring_view(ggml_context * ctx, ggml_tensor * tr, uint32_t n_head_kv, const llama_kv_cache::slot_info & sinfo) {
    const uint32_t ns = sinfo.s1 - sinfo.s0 + 1;
    const int64_t  hs = tr->ne[0]/n_head_kv;
    return ggml_view_4d(ctx, tr, hs, tr->ne[1], n_head_kv, ns, tr->nb[1], ggml_row_size(tr->type, hs), tr->nb[2], tr->nb[2]*sinfo.s0);
}

llama_turbo_attn_rows llama_kv_cache::get_turbo_rows(ggml_context * ctx, int32_t il, const slot_info & sinfo, ggml_tensor * kq_mask) const {
    const auto & layer = turbo.layers[map_layer_ids.at(il)];
    const uint32_t n_head_kv = hparams.n_head_kv(il);
    llama_turbo_attn_rows rows;
    rows.k0 = llama_kv_cell0_view(ctx, layer.k0, n_head_kv, sinfo);
    rows.v0 = llama_kv_cell0_view(ctx, layer.v0, n_head_kv, sinfo);
    ggml_tensor * mr = turbo.ring_mask_of(kq_mask);
    if (layer.kr && layer.vr && mr) {
        rows.kr = llama_kv_ring_view(ctx, layer.kr, n_head_kv, sinfo);
        rows.vr = llama_kv_ring_view(ctx, layer.vr, n_head_kv, sinfo);
        rows.mr = mr;
    }
    return rows;
}

llama_turbo_attn_rows llama_kv_cache_context::get_turbo_rows(ggml_context * ctx, int32_t il, ggml_tensor * kq_mask) const {
    return kv->get_turbo_rows(ctx, il, sinfos[i_cur], kq_mask);
}

ggml_tensor * llama_kv_cache::build_input_ring_mask(ggml_context * ctx, ggml_tensor * kq_mask) const {
    return turbo.build_ring_mask(ctx, kq_mask);
}

ggml_tensor * llama_kv_cache_context::build_input_ring_mask(ggml_context * ctx, ggml_tensor * kq_mask) const {
    return kv->build_input_ring_mask(ctx, kq_mask);
}

void llama_kv_turbo::cell0_forget(bool k, bool v, int32_t s) const {
    for (const auto & layer : layers) {
        for (ggml_tensor * t0 : { k ? layer.k0 : nullptr, v ? layer.v0 : nullptr }) {
            if (!t0 || !t0->buffer) {
                continue;
            }
            const std::vector<float> nan_row(t0->ne[0], NAN);
            for (int64_t i = 0; i < t0->ne[1]; ++i) {
                if (s < 0 || i == s) {
                    ggml_backend_tensor_set(t0, nan_row.data(), i*t0->nb[1], t0->nb[1]);
                }
            }
        }
    }
}

void llama_kv_turbo::copy_stream(int32_t ikv, uint32_t ssrc, uint32_t sdst) const {
    for (ggml_tensor * t0 : { layers[ikv].k0, layers[ikv].v0 }) {
        if (t0) {
            std::vector<uint8_t> row(t0->nb[1]);
            ggml_backend_tensor_get(t0, row.data(), ssrc*t0->nb[1], t0->nb[1]);
            ggml_backend_tensor_set(t0, row.data(), sdst*t0->nb[1], t0->nb[1]);
        }
    }
    for (ggml_tensor * tr : { layers[ikv].kr, layers[ikv].vr }) {
        if (tr) {
            std::vector<uint8_t> rows(tr->nb[2]);
            ggml_backend_tensor_get(tr, rows.data(), ssrc*tr->nb[2], tr->nb[2]);
            ggml_backend_tensor_set(tr, rows.data(), sdst*tr->nb[2], tr->nb[2]);
        }
    }
    if (n_ring > 0) {
        ring_cell[sdst] = ring_cell[ssrc];
    }
}

void llama_kv_turbo::cell0_forget_shifted(const llama_kv_cache & kv) const {
    // the shift graph turns the exact cell-0 rows and the window's K rows with their cells, except with MLA's split
    // heads (not built there): a cell 0 that moved is decoded from then on, a window row that moved is dropped; and a
    // row whose cell the shift emptied (a position below 0) holds no cell any more
    const bool turned = kv.hparams.n_lora_kv == 0;
    for (uint32_t s = 0; !turned && s < kv.n_stream; ++s) {
        if (!kv.v_cells[s].is_empty(0) && kv.v_cells[s].get_shift(0) != 0) {
            cell0_forget(true, false, s);
        }
    }
    for (uint32_t s = 0; s < (uint32_t) ring_cell.size(); ++s) {
        for (int32_t & c : ring_cell[s]) {
            if (c >= 0 && (kv.v_cells[s].is_empty(c) || (!turned && kv.v_cells[s].get_shift(c) != 0))) {
                c = -1;
            }
        }
    }
}

ggml_tensor * llama_kv_turbo_pad_heads(ggml_context * ctx, ggml_tensor * cur, const ggml_tensor * cache,
                                       int64_t n_embd_head, int64_t n_head) {
    if (cache->ne[0] == n_embd_head*n_head) {
        return cur;
    }
    const int64_t n_embd_head_stored = cache->ne[0]/n_head;
    const int64_t n_tokens = cur->ne[1];
    if (!ggml_is_contiguous(cur)) {
        cur = ggml_cont(ctx, cur);
    }
    cur = ggml_reshape_3d(ctx, cur, n_embd_head, n_head, n_tokens);
    cur = ggml_pad(ctx, cur, n_embd_head_stored - n_embd_head, 0, 0, 0);
    return ggml_reshape_2d(ctx, cur, n_embd_head_stored*n_head, n_tokens);
}

ggml_tensor * llama_kv_turbo::k_to_store(ggml_context * ctx, ggml_tensor * k_cur, const ggml_tensor * k, int32_t ikv,
                                         int64_t n_embd_head, int64_t n_head) const {
    if (layers[ikv].k_off) {
        k_cur = ggml_sub(ctx, k_cur, layers[ikv].k_off);
    }
    return llama_kv_turbo_pad_heads(ctx, k_cur, k, n_embd_head, n_head);
}

ggml_tensor * llama_kv_turbo::set_rows_side(ggml_tensor * set_rows, int32_t ikv, bool is_k) const {
    ggml_tensor * t0 = is_k ? layers[ikv].k0 : layers[ikv].v0;
    if (t0) {
        ggml_set_rows_cell0(set_rows, t0);
    }
    ggml_tensor * tr = is_k ? layers[ikv].kr : layers[ikv].vr;
    if (tr) {
        ggml_set_rows_ring(set_rows, tr);
    }
    return set_rows;
}

//
// K-shift
//

ggml_tensor * llama_kv_turbo::rope_k_off(ggml_context * ctx, const ggml_tensor * tmp, int32_t ikv, uint32_t n_lora_kv) const {
    ggml_tensor * k_off = layers[ikv].k_off;
    if (k_off) {
        const int64_t head = ggml_nelements(k_off)/tmp->ne[1];      // the view covers n_rot of head values
        const int64_t n    = std::min(head, tmp->ne[0]);            // or all of a padded turbo head
        const int64_t skip = n_lora_kv > 0 ? head - n : 0;
        k_off = ggml_view_2d(ctx, k_off, n, tmp->ne[1], head*sizeof(float), skip*sizeof(float));
        if (n < tmp->ne[0]) {
            k_off = ggml_pad(ctx, k_off, tmp->ne[0] - n, 0, 0, 0); // the padding's zeros have no offset
        }
    }
    return k_off;
}

// fwd[m*qk + k] = R[m][k] and inv[m*qk + k] = R[k][m], R the rotation of one block of qk values: ggml_mul_mat(a, x)
// takes a's rows as its output's weights, so mul_mat(fwd, x) = R x and mul_mat(inv, y) = R^T y = R^-1 y
static void llama_kv_turbo_rotation_matrices(ggml_tensor * fwd, ggml_tensor * inv) {
    const int qk = (int) fwd->ne[0];
    std::vector<float> f((size_t) qk*qk), r((size_t) qk*qk), e(qk);
    for (int k = 0; k < qk; ++k) {
        std::fill(e.begin(), e.end(), 0.0f);
        e[k] = 1.0f;
        turbo_rotate_forward_qk(e.data(), qk, qk);   // column k of R
        for (int m = 0; m < qk; ++m) {
            f[(size_t) m*qk + k] = e[m];
            r[(size_t) k*qk + m] = e[m];
        }
    }
    ggml_backend_tensor_set(fwd, f.data(), 0, ggml_nbytes(fwd));
    ggml_backend_tensor_set(inv, r.data(), 0, ggml_nbytes(inv));
}

// the shift graph's own inputs: the turbo rotation of one block as matrices, to turn the exact cell-0 rows and a
// turbo K's window rows back to stored keys and forward again around their RoPE (F32 [qk, qk], y = mul_mat(fwd, x),
// x = mul_mat(inv, y)), and the shift of the cell each window row holds (I32 [n_ring*n_stream], 0 for none)
class llm_graph_input_turbo_shift : public llm_graph_input_i {
public:
    void set_input(const llama_ubatch * ubatch) override {
        GGML_UNUSED(ubatch);
        if (k0_fwd && k0_fwd->buffer) {
            llama_kv_turbo_rotation_matrices(k0_fwd, k0_inv);
        }
        if (ring_shift && ring_shift->buffer) {
            turbo->set_input_ring_shift(*kv, ring_shift);
        }
    }

    ggml_tensor * k0_fwd     = nullptr;
    ggml_tensor * k0_inv     = nullptr;
    ggml_tensor * ring_shift = nullptr;

    const llama_kv_cache * kv    = nullptr;
    const llama_kv_turbo * turbo = nullptr;
};

void llama_kv_turbo::set_input_ring_shift(const llama_kv_cache & kv, ggml_tensor * dst) const {
    GGML_ASSERT(ggml_backend_buffer_is_host(dst->buffer) && ggml_nelements(dst) == (int64_t) (n_ring*ring_cell.size()));
    int32_t * data = (int32_t *) dst->data;
    for (uint32_t s = 0; s < (uint32_t) ring_cell.size(); ++s) {
        for (uint32_t r = 0; r < n_ring; ++r) {
            const int32_t c = ring_cell[s][r];
            data[s*n_ring + r] = c >= 0 && !kv.v_cells[s].is_empty(c) ? kv.v_cells[s].get_shift(c) : 0;
        }
    }
}

llm_graph_input_turbo_shift * llama_kv_turbo::build_shift_input(const llama_kv_cache & kv, llm_graph_result * res,
                                                                ggml_context * ctx) const {
    // (not with MLA's split heads: cell0_forget_shifted drops what moved). A turbo K's cell-0 and window rows sit in
    // the rotated domain: they need the rotation's matrices
    const bool turbo_k_rows = !layers.empty() && ggml_is_turbo(kv.layers[0].k->type) && (layers[0].k0 || layers[0].kr);
    const bool ring         = n_ring > 0;
    if (kv.hparams.n_lora_kv > 0 || !(turbo_k_rows || ring)) {
        return nullptr;
    }
    auto inp = std::make_unique<llm_graph_input_turbo_shift>();
    inp->kv    = &kv;
    inp->turbo = this;
    if (turbo_k_rows) {
        const int64_t qk = ggml_blck_size(kv.layers[0].k->type);   // a turbo block: 128 or 64 values
        inp->k0_fwd = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, qk, qk);
        inp->k0_inv = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, qk, qk);
        ggml_set_input(inp->k0_fwd);
        ggml_set_input(inp->k0_inv);
    }
    if (ring) {
        inp->ring_shift = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, (int64_t) n_ring*kv.n_stream);
        ggml_set_input(inp->ring_shift);
    }
    return static_cast<llm_graph_input_turbo_shift *>(res->add_input(std::move(inp)));
}

// rows x (F32, stored keys of a turbo K in the decoder's rotated domain, [n_embd_k_gqa, ...]) turned by pos (one per
// row): back to stored keys, RoPE by build_rope_shift's rule for stored keys (the key offset), forward again
ggml_tensor * llama_kv_turbo::shift_rotated(const llama_kv_cache & kv, const llama_cparams & cparams, ggml_context * ctx,
                                            const llm_graph_input_turbo_shift * inp, ggml_tensor * x, ggml_tensor * pos,
                                            ggml_tensor * rope_factors, float freq_base, float freq_scale, uint32_t il,
                                            int64_t n_head_kv) const {
    const int64_t qk = inp->k0_fwd->ne[0];
    const int64_t n_embd_head_k = x->ne[0]/n_head_kv;   // the stored row (padded heads)
    GGML_ASSERT(n_embd_head_k % qk == 0);
    x = ggml_mul_mat(ctx, inp->k0_inv, ggml_reshape_2d(ctx, x, qk, ggml_nelements(x)/qk));
    x = ggml_reshape_3d(ctx, x, n_embd_head_k, n_head_kv, ggml_nelements(pos));
    x = kv.build_rope_shift(cparams, ctx, x, pos, nullptr, rope_factors, freq_base, freq_scale, il, true);
    return ggml_mul_mat(ctx, inp->k0_fwd, ggml_reshape_2d(ctx, x, qk, ggml_nelements(x)/qk));
}

void llama_kv_turbo::build_shift_rows(const llama_kv_cache & kv, const llama_cparams & cparams, ggml_context * ctx,
                                      ggml_cgraph * gf, const llm_graph_input_turbo_shift * inp,
                                      ggml_tensor * k_shift, ggml_tensor * k_rot, ggml_tensor * rope_factors,
                                      float freq_base, float freq_scale, uint32_t il) const {
    if (!inp) {
        return;
    }
    const int32_t ikv = kv.map_layer_ids.at(il);
    const int64_t n_head_kv = kv.hparams.n_head_kv(il);

    // cell 0's exact row of each stream, by cell 0's shift (an empty cell 0 shifts by 0)
    ggml_tensor * k0 = layers[ikv].k0;
    if (k0) {
        ggml_tensor * pos = ggml_cont(ctx, ggml_view_2d(ctx, k_shift, 1, kv.n_stream, kv.get_size()*sizeof(int32_t), 0));
        pos = ggml_reshape_1d(ctx, pos, kv.n_stream);
        ggml_tensor * x = shift_rotated(kv, cparams, ctx, inp, k0, pos, rope_factors, freq_base, freq_scale, il, n_head_kv);
        ggml_build_forward_expand(gf, ggml_cpy(ctx, x, k0));
    }

    // the window's K rows, each by the shift of the cell it holds: a turbo K's (q8_0, rotated) as cell 0's, another
    // K's as the cache's own cells (build_graph_shift's view and rule)
    ggml_tensor * kr = layers[ikv].kr;
    if (kr && inp->ring_shift) {
        const int64_t n_rows = kr->ne[1]*kr->ne[2];
        if (ggml_is_turbo(kv.layers[ikv].k->type)) {
            GGML_ASSERT(inp->k0_fwd);
            ggml_tensor * x = shift_rotated(kv, cparams, ctx, inp, ggml_cast(ctx, kr, GGML_TYPE_F32),
                                                           inp->ring_shift, rope_factors, freq_base, freq_scale, il, n_head_kv);
            ggml_build_forward_expand(gf, ggml_cpy(ctx, x, kr));
        } else {
            const int64_t n_embd_head_k = kr->ne[0]/n_head_kv;
            ggml_tensor * k = ggml_view_3d(ctx, kr, kv.hparams.n_rot(il), n_head_kv, n_rows,
                                           ggml_row_size(kr->type, n_embd_head_k), ggml_row_size(kr->type, kr->ne[0]), 0);
            ggml_build_forward_expand(gf, kv.build_rope_shift(cparams, ctx, k, inp->ring_shift, k_rot, rope_factors,
                                                              freq_base, freq_scale, il));
        }
    }
}

//
// state files
//

// the exact cell-0 rows (layer::k0/v0) of the stream. Layout, only for a cache that has them: u32 1 if the state
// holds the stream's cell 0 (its first cell), then each layer's k0 row and v0 row (f32) where it has one; else u32 0.
static bool llama_kv_turbo_has_cell0(const std::vector<llama_kv_turbo::layer> & layers) {
    return std::any_of(layers.begin(), layers.end(), [](const llama_kv_turbo::layer & l) { return l.k0 || l.v0; });
}

void llama_kv_turbo::state_write_rows(const llama_kv_cache & kv, llama_io_write_i & io, uint32_t strm,
                                      const std::vector<std::pair<uint32_t, uint32_t>> & ranges) const {
    GGML_UNUSED(kv);
    if (!llama_kv_turbo_has_cell0(layers)) {
        return;
    }
    const uint32_t has = !ranges.empty() && ranges[0].first == 0;
    io.write(&has, sizeof(has));
    for (const auto & layer : layers) {
        for (ggml_tensor * t0 : { layer.k0, layer.v0 }) {
            if (t0 && has) {
                io.write_tensor(t0, strm*t0->nb[1], t0->nb[1]);
            }
        }
    }
    state_write_ring(io, strm, ranges);
}

// the bytes of one cell's window rows over the layers (0: no window)
static size_t llama_kv_ring_entry_bytes(const std::vector<llama_kv_turbo::layer> & layers) {
    size_t n = 0;
    for (const auto & layer : layers) {
        for (const ggml_tensor * tr : { layer.kr, layer.vr }) {
            n += tr ? tr->nb[1] : 0;
        }
    }
    return n;
}

// the window's rows of the cells written: u32 count, u64 bytes per entry, then per entry: u32 the cell's place in the
// state's cells, its rows (per layer: K's, V's). A reader with another window skips them (its cells read from codes).
void llama_kv_turbo::state_write_ring(llama_io_write_i & io, uint32_t strm, const std::vector<std::pair<uint32_t, uint32_t>> & ranges) const {
    std::vector<std::pair<uint32_t, uint32_t>> entries; // (place, cell)
    uint32_t place = 0;
    for (const auto & [c0, c1] : ranges) {
        for (uint32_t c = c0; c < c1; ++c, ++place) {
            if (n_ring > 0 && ring_cell[strm][c % n_ring] == (int32_t) c) {
                entries.emplace_back(place, c);
            }
        }
    }
    const uint32_t n = entries.size();
    const uint64_t entry_bytes = llama_kv_ring_entry_bytes(layers);
    io.write(&n, sizeof(n));
    io.write(&entry_bytes, sizeof(entry_bytes));
    for (const auto & [p, c] : entries) {
        io.write(&p, sizeof(p));
        for (const auto & layer : layers) {
            for (ggml_tensor * tr : { layer.kr, layer.vr }) {
                if (tr) {
                    io.write_tensor(tr, strm*tr->nb[2] + (c % n_ring)*tr->nb[1], tr->nb[1]);
                }
            }
        }
    }
}

bool llama_kv_turbo::state_read_ring(llama_io_read_i & io, uint32_t strm, uint32_t cell_count, const std::vector<uint32_t> & idxs) const {
    // the cells read hold the state's data now: none of them is in the window until its entry says so
    for (uint32_t i = 0; n_ring > 0 && i < cell_count; ++i) {
        int32_t & held = ring_cell[strm][idxs[i] % n_ring];
        held = held == (int32_t) idxs[i] ? -1 : held;
    }
    uint32_t n = 0;
    uint64_t entry_bytes = 0;
    io.read(&n, sizeof(n));
    io.read(&entry_bytes, sizeof(entry_bytes));
    if (n > cell_count || entry_bytes > (1u << 24)) {
        LLAMA_LOG_ERROR("%s: invalid turbo window section (%u rows of %llu bytes for %u cells)\n", __func__, n,
                        (unsigned long long) entry_bytes, cell_count);
        return false;
    }
    const bool use = n_ring > 0 && entry_bytes == llama_kv_ring_entry_bytes(layers);
    std::vector<uint8_t> row;
    for (uint32_t e = 0; e < n; ++e) {
        uint32_t p = 0;
        io.read(&p, sizeof(p));
        if (p >= cell_count) {
            LLAMA_LOG_ERROR("%s: invalid turbo window row for cell %u of %u\n", __func__, p, cell_count);
            return false;
        }
        if (!use) {
            row.resize(entry_bytes);
            io.read(row.data(), entry_bytes);
            continue;
        }
        const uint32_t c = idxs[p];
        for (const auto & layer : layers) {
            for (ggml_tensor * tr : { layer.kr, layer.vr }) {
                if (tr) {
                    row.resize(tr->nb[1]);
                    io.read(row.data(), row.size());
                    ggml_backend_tensor_set(tr, row.data(), strm*tr->nb[2] + (c % n_ring)*tr->nb[1], tr->nb[1]);
                }
            }
        }
        ring_cell[strm][c % n_ring] = (int32_t) c;
    }
    return true;
}

bool llama_kv_turbo::state_read_rows(const llama_kv_cache & kv, llama_io_read_i & io, uint32_t strm,
                                     uint32_t cell_count, const std::vector<std::vector<uint32_t>> & sinfo_idxs) const {
    GGML_UNUSED(kv);
    if (!llama_kv_turbo_has_cell0(layers)) {
        return true;
    }
    uint32_t has = 0;
    io.read(&has, sizeof(has));
    if (has > 1) {
        LLAMA_LOG_ERROR("%s: invalid turbo cell-0 flag %u (a state of another build?)\n", __func__, has);
        return false;
    }
    // the state's first cell is its cell 0 where `has`; the restore put it at sinfo's first index
    const auto & idxs = sinfo_idxs[0];
    const bool lands_on_0 = cell_count > 0 && idxs[0] == 0;
    bool writes_0 = false;
    for (uint32_t i = 0; i < cell_count; ++i) {
        writes_0 = writes_0 || idxs[i] == 0;
    }
    for (const auto & layer : layers) {
        for (ggml_tensor * t0 : { layer.k0, layer.v0 }) {
            if (!t0 || !has) {
                continue;
            }
            std::vector<uint8_t> row(t0->nb[1]);
            io.read(row.data(), row.size());
            if (lands_on_0) {
                ggml_backend_tensor_set(t0, row.data(), strm*t0->nb[1], t0->nb[1]);
            }
        }
    }
    if (writes_0 && !(has && lands_on_0)) {
        cell0_forget(true, true, strm); // cell 0 now holds another cell of the state, whose exact rows are not in it
    }
    return state_read_ring(io, strm, cell_count, idxs);
}

// the per-context key data (offsets, rescaled q/k norm weights) travel with the cells they were stored under.
// Layout: u32 layer count, then per layer with a key offset: i32 layer, then two arrays (u32 count, f32 values):
// the offset, the q/k norm weights (count 0 where this cache has none).
void llama_kv_turbo::state_write_keys(const llama_kv_cache & kv, llama_io_write_i & io) const {
    const std::map<int32_t, std::vector<float>> * maps[2] = { &k_off_host, &qk_gain_host };
    uint32_t n = 0;
    for (const auto & layer : layers) {
        n += layer.k_off ? 1 : 0;
    }
    io.write(&n, sizeof(n));
    for (size_t ikv = 0; ikv < layers.size(); ++ikv) {
        if (!layers[ikv].k_off) {
            continue;
        }
        const int32_t il = kv.layers[ikv].il;
        io.write(&il, sizeof(il));
        for (const auto * m : maps) {
            const auto it = m->find(il);
            const uint32_t cnt = it == m->end() ? 0 : (uint32_t) it->second.size();
            io.write(&cnt, sizeof(cnt));
            if (cnt) {
                io.write(it->second.data(), cnt*sizeof(float));
            }
        }
    }
}

void llama_kv_turbo::state_read_keys(llama_kv_cache & kv, llama_io_read_i & io, llama_seq_id seq_id) {
    try {
        state_read_turbo_keys(kv, io, seq_id);
    } catch (...) {
        // the cells just read were stored under key data this context cannot take: they must not stay
        if (seq_id == -1) {
            kv.clear(true);
        } else {
            kv.seq_rm(seq_id, -1, -1);
        }
        throw;
    }
}

void llama_kv_turbo::state_read_turbo_keys(llama_kv_cache & kv, llama_io_read_i & io, llama_seq_id seq_id) {
    std::map<int32_t, std::vector<float>> * maps[2] = { &k_off_host, &qk_gain_host };
    const char * what[2] = { "key offset", "q/k weights of the rescale" };
    uint32_t n = 0, n_own = 0;
    io.read(&n, sizeof(n));
    for (const auto & layer : layers) {
        n_own += layer.k_off ? 1 : 0;
    }
    if (n != n_own) {
        throw std::runtime_error(format("the state has turbo K key data for %u layers, this context's cache for %u "
                                        "(saved with another K cache type or model)", n, n_own));
    }
    std::vector<std::array<std::vector<float>, 2>> data(n);
    std::vector<int32_t> ils(n);
    bool differs = false;
    for (uint32_t i = 0; i < n; ++i) {
        io.read(&ils[i], sizeof(ils[i]));
        const auto it = kv.map_layer_ids.find(ils[i]);
        if (it == kv.map_layer_ids.end() || !layers[it->second].k_off) {
            throw std::runtime_error(format("the state has turbo K key data for layer %d, which this context's cache does not offset", ils[i]));
        }
        for (int j = 0; j < 2; ++j) {
            uint32_t cnt = 0;
            io.read(&cnt, sizeof(cnt));
            const auto own = maps[j]->find(ils[i]);
            const size_t n_have = own == maps[j]->end() ? 0 : own->second.size();
            if (cnt != n_have) {
                throw std::runtime_error(format("the state's %s of layer %d has %u values, this context's %zu (saved with "
                                                "another key transform: TURBO_K_RESCALE / TURBO_K_GAIN_ONCE / model)", what[j], ils[i], cnt, n_have));
            }
            data[i][j].resize(cnt);
            if (cnt) {
                io.read(data[i][j].data(), cnt*sizeof(float));
                differs = differs || memcmp(data[i][j].data(), own->second.data(), cnt*sizeof(float)) != 0;
            }
        }
    }
    if (!differs) {
        return;
    }
    // the keys in the state were stored under other offsets: adopt them, unless cells of other sequences,
    // stored under this context's, would stay in the cache (a whole-state restore clears the cache first)
    if (seq_id != -1) {
        for (uint32_t s = 0; s < kv.n_stream; ++s) {
            const auto & cells = kv.v_cells[s];
            for (uint32_t i = 0; i < cells.size(); ++i) {
                if (!cells.is_empty(i) && (cells.seq_count(i) > 1 || !cells.seq_has(i, seq_id))) {
                    throw std::runtime_error("the state's turbo K key offsets differ from this context's, and other "
                                             "sequences are cached under this context's: refusing to load it under other offsets");
                }
            }
        }
    }
    for (uint32_t i = 0; i < n; ++i) {
        const auto & d = data[i];
        const bool ok = kv.set_k_off(ils[i], d[0].data(), d[0].size()) &&
                        (d[1].empty() || kv.set_qk_gain(ils[i], d[1].data(), d[1].size()));
        if (!ok) {
            throw std::runtime_error(format("could not restore the turbo K key data of layer %d", ils[i]));
        }
    }
    LLAMA_LOG_WARN("%s: turbo K: the state's key offsets differ from this context's probe; using the state's "
                   "(its keys were stored under them)\n", __func__);
}
