#include "scmoe/kernels/tensor.h"

#include <sstream>

#include "scmoe/kernels/error.h"

namespace scmoe {

Tensor::Tensor(void* ptr, DType type, std::initializer_list<std::int64_t> shape) : data(ptr), dtype(type) {
    SCMOE_CHECK(shape.size() <= kMaxDims, "tensor rank " << shape.size() << " exceeds " << kMaxDims);
    for (std::int64_t d : shape) dims[static_cast<std::size_t>(ndim++)] = d;
}

std::int64_t Tensor::numel() const {
    std::int64_t n = 1;
    for (int i = 0; i < ndim; ++i) n *= dim(i);
    return n;
}

std::string describe(const Tensor& t) {
    std::ostringstream os;
    os << '[';
    for (int i = 0; i < t.ndim; ++i) os << (i ? ", " : "") << t.dim(i);
    os << "] " << dtype_name(t.dtype);
    return os.str();
}

void check_tensor(const Tensor& t, std::initializer_list<std::int64_t> shape, DType dtype, const char* what) {
    bool ok = t.dtype == dtype && t.ndim == static_cast<int>(shape.size()) && (t.data != nullptr || t.numel() == 0);
    int i = 0;
    for (std::int64_t d : shape) ok = ok && t.dim(i++) == d;
    if (!ok) {
        Tensor expected;
        expected.dtype = dtype;
        for (std::int64_t d : shape) expected.dims[static_cast<std::size_t>(expected.ndim++)] = d;
        SCMOE_FAIL(what << ": expected " << describe(expected) << ", got " << describe(t)
                        << (t.data == nullptr && t.numel() != 0 ? " (null data)" : ""));
    }
}

}  // namespace scmoe
