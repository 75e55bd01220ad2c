// Tensor: a non-owning view of memory (host memory on the CPU backend, device memory on CUDA)
// with a row-major shape and a dtype. Views never allocate; workspaces and parameters are owned
// by whoever created them.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "scmoe/kernels/dtype.h"

namespace scmoe {

struct Tensor {
    static constexpr int kMaxDims = 4;

    void* data = nullptr;
    DType dtype = DType::kF32;
    int ndim = 0;
    std::array<std::int64_t, kMaxDims> dims{};

    Tensor() = default;
    Tensor(void* ptr, DType type, std::initializer_list<std::int64_t> shape);

    std::int64_t dim(int i) const { return dims[static_cast<std::size_t>(i)]; }
    std::int64_t numel() const;
    std::size_t bytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype); }
    bool defined() const { return data != nullptr || ndim > 0; }

    template <class T>
    T* as() const {
        return static_cast<T*>(data);
    }
};

// "[4, 8] f32"
std::string describe(const Tensor& t);

// Throws Error "<what>: expected [a, b] <dtype>, got ..." unless t has exactly this shape and dtype.
void check_tensor(const Tensor& t, std::initializer_list<std::int64_t> shape, DType dtype, const char* what);

}  // namespace scmoe
