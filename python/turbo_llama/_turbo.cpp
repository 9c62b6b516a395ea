// NumPy face of the cpu_ref/ turbo quantizer: the same C code that turbo-llama compiles into ggml.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

extern "C" {
#include "ggml-turbo.h"
}

namespace py = pybind11;

namespace {

struct TurboType {
    const char * name;
    int64_t      block_size;   // values per block: QK_TURBO, or QK_TURBO_64 for the _64 types
    int64_t      type_size;
    void (*quantize)(const float *, void *, int64_t);
    void (*dequantize)(const void *, float *, int64_t);
};

void q3(const float * x, void * y, int64_t k) { quantize_row_turbo3_ref(x, (block_turbo3 *) y, k); }
void q2(const float * x, void * y, int64_t k) { quantize_row_turbo2_ref(x, (block_turbo2 *) y, k); }
void d3(const void * x, float * y, int64_t k) { dequantize_row_turbo3((const block_turbo3 *) x, y, k); }
void d2(const void * x, float * y, int64_t k) { dequantize_row_turbo2((const block_turbo2 *) x, y, k); }
void q4(const float * x, void * y, int64_t k) { quantize_row_turbo4_ref(x, (block_turbo4 *) y, k); }
void d4(const void * x, float * y, int64_t k) { dequantize_row_turbo4((const block_turbo4 *) x, y, k); }
void q3_64(const float * x, void * y, int64_t k) { quantize_row_turbo3_64_ref(x, (block_turbo3_64 *) y, k); }
void q2_64(const float * x, void * y, int64_t k) { quantize_row_turbo2_64_ref(x, (block_turbo2_64 *) y, k); }
void q4_64(const float * x, void * y, int64_t k) { quantize_row_turbo4_64_ref(x, (block_turbo4_64 *) y, k); }
void d3_64(const void * x, float * y, int64_t k) { dequantize_row_turbo3_64((const block_turbo3_64 *) x, y, k); }
void d2_64(const void * x, float * y, int64_t k) { dequantize_row_turbo2_64((const block_turbo2_64 *) x, y, k); }
void d4_64(const void * x, float * y, int64_t k) { dequantize_row_turbo4_64((const block_turbo4_64 *) x, y, k); }

const TurboType kTypes[] = {
    {"turbo4", QK_TURBO, (int64_t) sizeof(block_turbo4), q4, d4},
    {"turbo3", QK_TURBO, (int64_t) sizeof(block_turbo3), q3, d3},
    {"turbo2", QK_TURBO, (int64_t) sizeof(block_turbo2), q2, d2},
    {"turbo4_64", QK_TURBO_64, (int64_t) sizeof(block_turbo4_64), q4_64, d4_64},
    {"turbo3_64", QK_TURBO_64, (int64_t) sizeof(block_turbo3_64), q3_64, d3_64},
    {"turbo2_64", QK_TURBO_64, (int64_t) sizeof(block_turbo2_64), q2_64, d2_64},
};

const TurboType & lookup(const std::string & name) {
    for (const auto & t : kTypes) {
        if (name == t.name) {
            return t;
        }
    }
    throw py::value_error("unknown turbo type '" + name + "': expected 'turbo4', 'turbo3', 'turbo2', 'turbo4_64', "
                          "'turbo3_64' or 'turbo2_64'");
}

// The array must already be an ndarray of the right dtype: no silent casts from other dtypes.
py::array require(const py::handle & obj, const py::dtype & want, const char * what, const char * fn) {
    if (!py::isinstance<py::array>(obj)) {
        throw py::type_error(std::string(fn) + ": expected a numpy.ndarray of " + what +
                             ", got " + std::string(py::str(obj.get_type().attr("__name__"))));
    }
    py::array a = py::reinterpret_borrow<py::array>(obj);
    if (!a.dtype().is(want)) {
        throw py::type_error(std::string(fn) + ": expected dtype " + what + ", got " +
                             std::string(py::str(a.dtype())));
    }
    if (a.ndim() < 1) {
        throw py::value_error(std::string(fn) + ": expected at least one dimension, got a 0-d array");
    }
    // non-contiguous input is copied (documented): the C loops read rows in place
    return py::array::ensure(a, py::array::c_style | py::array::forcecast);
}

std::vector<py::ssize_t> shape_of(const py::array & a) {
    return std::vector<py::ssize_t>(a.shape(), a.shape() + a.ndim());
}

py::array quantize(const py::handle & obj, const std::string & type) {
    const TurboType & t = lookup(type);
    py::array x = require(obj, py::dtype::of<float>(), "float32", "quantize");
    auto shape = shape_of(x);
    const int64_t n = shape.back();
    if (n <= 0 || n % t.block_size != 0) {
        throw py::value_error("quantize: the last dimension must be a positive multiple of " +
                              std::to_string(t.block_size) + " for " + type + ", got " + std::to_string(n));
    }
    const int64_t total = (int64_t) x.size();
    shape.back() = (py::ssize_t) (n / t.block_size * t.type_size);
    py::array_t<uint8_t> out(shape);
    const float * src = static_cast<const float *>(x.data());
    uint8_t * dst = out.mutable_data();
    {
        py::gil_scoped_release release;
        t.quantize(src, dst, total);
    }
    return std::move(out);
}

// invalid: "raise" (ValueError naming the first block whose norm is NaN, Inf or negative) or "zero" (such blocks
// decode to zeros); the rule of ggml_validate_row_data, see "Invalid blocks" in ggml-turbo.h
py::array dequantize(const py::handle & obj, const std::string & type, const std::string & invalid) {
    const TurboType & t = lookup(type);
    if (invalid != "raise" && invalid != "zero") {
        throw py::value_error("dequantize: invalid must be 'raise' or 'zero', got '" + invalid + "'");
    }
    py::array q = require(obj, py::dtype::of<uint8_t>(), "uint8", "dequantize");
    auto shape = shape_of(q);
    const int64_t nbytes = shape.back();
    if (nbytes <= 0 || nbytes % t.type_size != 0) {
        throw py::value_error("dequantize: the last dimension (" + std::to_string(nbytes) +
                              " bytes) is not a positive multiple of the " + type + " block size (" +
                              std::to_string(t.type_size) + " bytes)");
    }
    const int64_t total_bytes = (int64_t) q.size();
    shape.back() = (py::ssize_t) (nbytes / t.type_size * t.block_size);
    py::array_t<float> out(shape);
    const uint8_t * src = static_cast<const uint8_t *>(q.data());
    float * dst = out.mutable_data();
    const int64_t nblocks = total_bytes / t.type_size;
    const int64_t bad = turbo_first_invalid_block(src, nblocks, (size_t) t.type_size);
    if (bad >= 0 && invalid == "raise") {
        uint16_t h;
        std::memcpy(&h, src + bad*t.type_size, sizeof(h));
        char norm[8];
        std::snprintf(norm, sizeof(norm), "0x%04x", h);
        throw py::value_error("dequantize: " + type + " block " + std::to_string(bad) + " (byte offset " +
                              std::to_string(bad*t.type_size) + ") has an invalid norm " + norm +
                              " (NaN, Inf or negative: never written by quantize, rejected by ggml's row "
                              "validation); pass invalid='zero' to decode such blocks as zeros");
    }
    {
        py::gil_scoped_release release;
        t.dequantize(src, dst, nblocks * t.block_size);
        for (int64_t ib = bad; ib >= 0 && ib < nblocks; ib++) {   // invalid == "zero"
            if (turbo_first_invalid_block(src + ib*t.type_size, 1, (size_t) t.type_size) == 0) {
                std::memset(dst + ib*t.block_size, 0, t.block_size * sizeof(float));
            }
        }
    }
    return std::move(out);
}

py::array rotate(const py::handle & obj, bool inverse, int64_t block) {
    if (block != QK_TURBO && block != QK_TURBO_64) {
        throw py::value_error("rotate: block must be 128 or 64, got " + std::to_string(block));
    }
    py::array x = require(obj, py::dtype::of<float>(), "float32", "rotate");
    const int64_t n = x.shape(x.ndim() - 1);
    if (n <= 0 || n % block != 0) {
        throw py::value_error("rotate: the last dimension must be a positive multiple of " +
                              std::to_string(block) + ", got " + std::to_string(n));
    }
    py::array_t<float> out(shape_of(x));
    std::memcpy(out.mutable_data(), x.data(), (size_t) x.size() * sizeof(float));
    float * p = out.mutable_data();
    const int64_t total = (int64_t) x.size();
    {
        py::gil_scoped_release release;
        if (inverse) {
            turbo_rotate_inverse_qk(p, total, (int) block);
        } else {
            turbo_rotate_forward_qk(p, total, (int) block);
        }
    }
    return std::move(out);
}

}  // namespace

PYBIND11_MODULE(_turbo, m) {
    m.doc() = "turbo4/turbo3/turbo2 KV-cache quantizer and their 64-value block types (cpu_ref/ggml-turbo.c)";
    m.attr("BLOCK_SIZE") = QK_TURBO;
    py::dict sizes, blocks;
    for (const auto & t : kTypes) {
        sizes[t.name]  = t.type_size;
        blocks[t.name] = t.block_size;
    }
    m.attr("TYPE_SIZES")  = sizes;
    m.attr("BLOCK_SIZES") = blocks;
    m.def("quantize", &quantize, py::arg("x"), py::arg("type"),
          "Quantize float32 (..., n), n a multiple of the type's block size (128; 64 for the _64 types), to uint8\n"
          "(..., n/block*type_size). Non-contiguous input is copied first.");
    m.def("dequantize", &dequantize, py::arg("q"), py::arg("type"), py::kw_only(), py::arg("invalid") = "raise",
          "Inverse of quantize: uint8 (..., nbytes) to float32 (..., nbytes/type_size*128).\n"
          "A block whose FP16 norm is NaN, Inf or negative (sign bit set) is invalid: quantize never writes one and\n"
          "ggml's validate_row_data rejects it. invalid='raise' (default): ValueError naming the first such block\n"
          "(its index over all blocks in C order and its byte offset); invalid='zero': such blocks decode to zeros.\n"
          "Every valid block decodes to finite values, so random bytes never give NaN or Inf silently.");
    m.def("rotate", [](const py::handle & x, int64_t block) { return rotate(x, false, block); }, py::arg("x"),
          py::kw_only(), py::arg("block") = QK_TURBO,
          "The encoder's rotation H*D (orthonormal) applied to each block (128 or 64 values) of the last axis.");
    m.def("unrotate", [](const py::handle & x, int64_t block) { return rotate(x, true, block); }, py::arg("x"),
          py::kw_only(), py::arg("block") = QK_TURBO,
          "The inverse rotation D*H.");
}
