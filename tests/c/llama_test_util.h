// Shared by the tests/c programs on the llama.h API: fatal errors, a quiet log, cache types by name, and the
// cached keys of a sequence read back through llama_state_seq_get_data. The program defines TEST_PROGRAM (its
// name, for the messages) before including this header.
#pragma once

#include "ggml.h"
#include "llama.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

static void die(const char * msg) {
    fprintf(stderr, "%s: %s\n", TEST_PROGRAM, msg);
    exit(1);
}

static void quiet_log(ggml_log_level level, const char * text, void *) {
    if (level >= GGML_LOG_LEVEL_WARN) {
        fputs(text, stderr);
    }
}

static ggml_type type_by_name(const std::string & name) {
    for (int t = 0; t < GGML_TYPE_COUNT; ++t) {
        const char * n = ggml_type_name((ggml_type) t);
        if (n && name == n) {
            return (ggml_type) t;
        }
    }
    die(("unknown ggml type '" + name + "'").c_str());
    return GGML_TYPE_COUNT;
}

// The cached keys of a sequence, dequantized with ggml's own to_float (f32 rows copied).

// One float row per (layer, cell) for the first n_cells cells. The sequence state of this llama.cpp (b11312,
// llama_context::state_seq_get_data: u32 magic 0xaf143cd8, i32 seq_id; then llama_kv_cache::state_write; an
// iSWA model writes its two caches one after the other), per cache:
// u32 n_stream; per stream: u32 cell_count, then (when > 0) per cell i32 pos, u32 n_seq, i32 seq[n_seq];
// u32 v_trans, u32 n_layer; per layer i32 k_type, u64 k_row_size, cell_count rows; then the values; then, where a
// layer's K or V is turbo, the cell-0 section (llama_kv_turbo::state_write_rows): u32 has,
// and where has = 1 each layer's exact cell-0 K row, then V row, as f32, for its turbo side(s); then the recent
// window's section (u32 count, u64 entry bytes, entries of u32 place + rows). After the streams, turbo-llama's key data (llama_kv_cache::state_write_turbo_keys): u32 n; per layer i32 il and two
// arrays (u32 count, count f32): skipped here, the keys are compared as stored.
struct k_dump {
    std::vector<std::vector<float>> rows;  // per layer: n_cells x n_embd
    std::vector<int> n_embd;
    std::vector<ggml_type> k_type;
    std::vector<std::vector<int>> pos;     // per layer: the cells' positions
};

struct reader {
    const uint8_t * p;
    const uint8_t * end;
    template <typename T> T get() {
        if (p + sizeof(T) > end) die("sequence state: truncated");
        T v;
        memcpy(&v, p, sizeof(T));
        p += sizeof(T);
        return v;
    }
    const uint8_t * take(size_t n) {
        if (n > (size_t) (end - p)) die("sequence state: truncated");
        const uint8_t * q = p;
        p += n;
        return q;
    }
};

static inline k_dump read_keys(llama_context * ctx, int n_cells) {
    std::vector<uint8_t> buf(llama_state_seq_get_size(ctx, 0));
    if (llama_state_seq_get_data(ctx, buf.data(), buf.size(), 0) != buf.size()) die("llama_state_seq_get_data failed");
    reader r{buf.data(), buf.data() + buf.size()};
    k_dump d;
    if (r.get<uint32_t>() != 0xaf143cd8u || r.get<int32_t>() != 0) die("sequence state: unexpected header");
    while (r.p < r.end) {  // one KV cache after the other
        const uint32_t n_stream = r.get<uint32_t>();
        for (uint32_t st = 0; st < n_stream; ++st) {
            const uint32_t n = r.get<uint32_t>();
            if (n == 0) continue;
            if ((int) n < n_cells) die("sequence state: fewer cells than expected");
            std::vector<int> pos(n);
            for (uint32_t c = 0; c < n; ++c) {
                pos[c] = r.get<int32_t>();
                const uint32_t n_seq = r.get<uint32_t>();
                if (n_seq > 64) die("sequence state: unexpected layout");
                r.take(n_seq * sizeof(int32_t));
            }
            const uint32_t v_trans = r.get<uint32_t>();
            const uint32_t n_layer = r.get<uint32_t>();
            if (v_trans || n_layer > 1024) die("sequence state: unexpected layout (transposed V?)");
            for (uint32_t l = 0; l < n_layer; ++l) {
                const int32_t  t   = r.get<int32_t>();
                const uint64_t row = r.get<uint64_t>();
                if (t < 0 || t >= GGML_TYPE_COUNT) die("sequence state: bad K type");
                const auto *  tr   = ggml_get_type_traits((ggml_type) t);
                const int64_t ne   = (int64_t) (row / tr->type_size) * tr->blck_size;
                if ((!tr->to_float && t != GGML_TYPE_F32) || ggml_row_size((ggml_type) t, ne) != row) die("sequence state: bad K row");
                const uint8_t * data = r.take(n * row);
                std::vector<float> out((size_t) n_cells * ne);
                for (int c = 0; c < n_cells; ++c) {
                    if (t == GGML_TYPE_F32) {
                        memcpy(out.data() + (size_t) c * ne, data + c * row, ne * sizeof(float));
                    } else {
                        tr->to_float(data + c * row, out.data() + (size_t) c * ne, ne);
                    }
                }
                d.rows.push_back(std::move(out));
                d.n_embd.push_back((int) ne);
                d.k_type.push_back((ggml_type) t);
                d.pos.push_back(pos);
            }
            std::vector<int64_t> ne_v(n_layer);
            std::vector<bool> turbo_v(n_layer);
            for (uint32_t l = 0; l < n_layer; ++l) {  // the values: skipped
                const int32_t  t   = r.get<int32_t>();
                const uint64_t row = r.get<uint64_t>();
                if (t < 0 || t >= GGML_TYPE_COUNT) die("sequence state: bad V type");
                ne_v[l]    = (int64_t) (row / ggml_type_size((ggml_type) t)) * ggml_blck_size((ggml_type) t);
                turbo_v[l] = ggml_is_turbo((ggml_type) t);
                r.take(n * row);
            }
            // the cell-0 section: skipped
            const size_t l0 = d.n_embd.size() - n_layer;
            bool any = false;
            for (uint32_t l = 0; l < n_layer; ++l) {
                any = any || ggml_is_turbo(d.k_type[l0 + l]) || turbo_v[l];
            }
            if (any) {
                const uint32_t has = r.get<uint32_t>();
                if (has > 1) die("sequence state: unexpected cell-0 section");
                for (uint32_t l = 0; has && l < n_layer; ++l) {
                    if (ggml_is_turbo(d.k_type[l0 + l])) r.take(d.n_embd[l0 + l] * sizeof(float));
                    if (turbo_v[l])                      r.take(ne_v[l] * sizeof(float));
                }
                // the recent window's rows (llama_kv_turbo::state_write_ring): u32 count, u64 bytes per entry,
                // per entry u32 place + the rows: skipped
                const uint32_t n_win = r.get<uint32_t>();
                const uint64_t entry = r.get<uint64_t>();
                if (n_win > n) die("sequence state: unexpected window section");
                r.take((size_t) n_win * (sizeof(uint32_t) + entry));
            }
        }
        const uint32_t n_turbo = r.get<uint32_t>();
        if (n_turbo > 1024) die("sequence state: unexpected turbo key data");
        for (uint32_t l = 0; l < n_turbo; ++l) {
            r.get<int32_t>();
            for (int a = 0; a < 2; ++a) r.take(r.get<uint32_t>() * sizeof(float));
        }
    }
    if (d.rows.empty()) die("sequence state: no keys");
    return d;
}
