#include "scmoe/interop/dlpack.h"

#include <array>
#include <cstdint>
#include <memory>
#include <sstream>
#include <string>
#include <utility>

#include "scmoe/kernels/error.h"

namespace scmoe {
namespace {

// What an export allocates: the managed struct with the shape and strides it points at. The deleter
// frees this and nothing else (the tensor's memory is not the export's).
template <class Managed>
struct Export {
    Managed managed{};
    std::array<std::int64_t, Tensor::kMaxDims> shape{}, strides{};

    static void deleter(Managed* self) { delete static_cast<Export*>(self->manager_ctx); }
};

std::string device_name(const DLDevice& d) {
    std::ostringstream os;
    switch (d.device_type) {
        case kDLCPU:
            os << "kDLCPU";
            break;
        case kDLCUDA:
            os << "kDLCUDA";
            break;
        case kDLCUDAHost:
            os << "kDLCUDAHost";
            break;
        case kDLCUDAManaged:
            os << "kDLCUDAManaged";
            break;
        case kDLROCM:
            os << "kDLROCM";
            break;
        default:
            os << "device type " << static_cast<int>(d.device_type);
            break;
    }
    os << ':' << d.device_id;
    return os.str();
}

std::string dl_dtype_name(const DLDataType& t) {
    std::ostringstream os;
    switch (t.code) {
        case kDLInt:
            os << "int";
            break;
        case kDLUInt:
            os << "uint";
            break;
        case kDLFloat:
            os << "float";
            break;
        case kDLBfloat:
            os << "bfloat";
            break;
        case kDLComplex:
            os << "complex";
            break;
        case kDLBool:
            os << "bool";
            break;
        default:
            os << "code " << static_cast<int>(t.code) << " bits ";
            break;
    }
    os << static_cast<int>(t.bits);
    if (t.lanes != 1) os << " x" << t.lanes << " lanes";
    return os.str();
}

std::string shape_string(const std::int64_t* v, int n) {
    std::ostringstream os;
    os << '[';
    for (int i = 0; i < n; ++i) os << (i ? ", " : "") << v[i];
    os << ']';
    return os.str();
}

DLDevice export_device(const Device& device) {
    switch (device.backend()) {
        case Backend::kCpu:
            return DLDevice{kDLCPU, 0};
        case Backend::kCuda:
            return DLDevice{kDLCUDA, device.ordinal()};
        case Backend::kEmu:
            break;
    }
    SCMOE_FAIL(
        "DLPack export: the emu backend's memory is modeled, not computed on; DLPack interop takes the "
        "cpu and cuda backends");
}

DLDataType export_dtype(DType t) {
    switch (t) {
        case DType::kF32:
            return DLDataType{kDLFloat, 32, 1};
        case DType::kBF16:
            return DLDataType{kDLBfloat, 16, 1};
        case DType::kI32:
            return DLDataType{kDLInt, 32, 1};
    }
    SCMOE_FAIL("DLPack export: unknown scmoe dtype " << static_cast<int>(t));
}

// Fills `out` to describe t; shape and strides point at the export's arrays.
template <class Managed>
void describe_export(const Tensor& t, const Device& device, Export<Managed>& e, DLTensor& out) {
    SCMOE_CHECK(t.ndim >= 0 && t.ndim <= Tensor::kMaxDims, "DLPack export: tensor rank " << t.ndim);
    SCMOE_CHECK(t.data != nullptr || t.numel() == 0, "DLPack export: " << describe(t) << " has no data (null pointer)");
    std::int64_t stride = 1;
    for (int i = t.ndim - 1; i >= 0; --i) {
        SCMOE_CHECK(t.dim(i) >= 0, "DLPack export: negative dimension in " << describe(t));
        e.shape[static_cast<std::size_t>(i)] = t.dim(i);
        e.strides[static_cast<std::size_t>(i)] = stride;
        stride *= t.dim(i) > 0 ? t.dim(i) : 1;
    }
    out.data = t.data;
    out.device = export_device(device);
    out.ndim = t.ndim;
    out.dtype = export_dtype(t.dtype);
    out.shape = e.shape.data();
    out.strides = e.strides.data();  // never NULL: DLPack 1.2 consumers may require them
    out.byte_offset = 0;
}

void check_device(const DLDevice& d, const Device& device, const char* what) {
    switch (device.backend()) {
        case Backend::kCpu:
            SCMOE_CHECK(d.device_type == kDLCPU || d.device_type == kDLCUDAHost,
                        what << ": DLPack device " << device_name(d)
                             << " is not host memory: the cpu backend takes kDLCPU (or kDLCUDAHost, pinned) tensors");
            return;
        case Backend::kCuda:
            SCMOE_CHECK(d.device_type == kDLCUDA || d.device_type == kDLCUDAManaged,
                        what << ": DLPack device " << device_name(d)
                             << " is not CUDA device memory: the cuda backend takes kDLCUDA (or kDLCUDAManaged) "
                                "tensors of cuda:"
                             << device.ordinal());
            SCMOE_CHECK(d.device_type == kDLCUDAManaged || d.device_id == device.ordinal(),
                        what << ": DLPack device " << device_name(d) << " is another GPU than this device, cuda:"
                             << device.ordinal() << " (device_id must be " << device.ordinal() << ")");
            return;
        case Backend::kEmu:
            break;
    }
    SCMOE_FAIL(what << ": the emu backend's memory is modeled, not computed on; DLPack interop takes the cpu and "
                       "cuda backends");
}

DType import_dtype(const DLDataType& t, const char* what) {
    SCMOE_CHECK(t.lanes == 1, what << ": DLPack dtype " << dl_dtype_name(t) << " has " << t.lanes
                                   << " lanes; scmoe tensors have 1 (f32, bf16 or i32)");
    if (t.code == kDLFloat && t.bits == 32) return DType::kF32;
    if (t.code == kDLBfloat && t.bits == 16) return DType::kBF16;
    if (t.code == kDLInt && t.bits == 32) return DType::kI32;
    SCMOE_FAIL(what << ": DLPack dtype " << dl_dtype_name(t) << " (code " << static_cast<int>(t.code) << ", bits "
                    << static_cast<int>(t.bits)
                    << ") is not an scmoe dtype: f32 (kDLFloat, 32), bf16 (kDLBfloat, 16) or i32 (kDLInt, 32)");
}

}  // namespace

DLManagedTensorVersioned* to_dlpack_versioned(const Tensor& t, const Device& device, bool read_only) {
    auto e = std::make_unique<Export<DLManagedTensorVersioned>>();
    describe_export(t, device, *e, e->managed.dl_tensor);
    e->managed.version = DLPackVersion{DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION};
    e->managed.flags = read_only ? DLPACK_FLAG_BITMASK_READ_ONLY : 0;
    e->managed.manager_ctx = e.get();
    e->managed.deleter = &Export<DLManagedTensorVersioned>::deleter;
    return &e.release()->managed;
}

DLManagedTensor* to_dlpack(const Tensor& t, const Device& device) {
    auto e = std::make_unique<Export<DLManagedTensor>>();
    describe_export(t, device, *e, e->managed.dl_tensor);
    e->managed.manager_ctx = e.get();
    e->managed.deleter = &Export<DLManagedTensor>::deleter;
    return &e.release()->managed;
}

Tensor tensor_from_dlpack(const DLTensor& t, const Device& device, const char* what) {
    check_device(t.device, device, what);
    Tensor out;
    out.dtype = import_dtype(t.dtype, what);
    SCMOE_CHECK(t.ndim >= 0 && t.ndim <= Tensor::kMaxDims, what << ": DLPack ndim " << t.ndim << " is outside [0, "
                                                                << Tensor::kMaxDims
                                                                << "], the ranks an scmoe::Tensor holds");
    SCMOE_CHECK(t.ndim == 0 || t.shape != nullptr, what << ": DLPack shape is NULL for ndim " << t.ndim);
    std::int64_t numel = 1;
    for (int i = 0; i < t.ndim; ++i) {
        SCMOE_CHECK(t.shape[i] >= 0,
                    what << ": DLPack shape " << shape_string(t.shape, t.ndim) << " has a negative extent");
        SCMOE_CHECK(!__builtin_mul_overflow(numel, t.shape[i], &numel),
                    what << ": DLPack shape " << shape_string(t.shape, t.ndim) << " overflows 64-bit element counts");
        out.dims[static_cast<std::size_t>(i)] = t.shape[i];
    }
    out.ndim = t.ndim;
    // Compact row-major: stride[i] = product of the extents after i. An extent-1 dimension's stride is
    // never used to address an element, and an empty tensor has no elements: producers differ there
    // (PyTorch keeps arbitrary strides on size-1 dimensions), so those are not compared.
    if (t.strides != nullptr && numel > 0) {
        std::int64_t expected = 1;
        for (int i = t.ndim - 1; i >= 0; --i) {
            if (t.shape[i] != 1 && t.strides[i] != expected) {
                std::array<std::int64_t, Tensor::kMaxDims> compact{};
                std::int64_t s = 1;
                for (int j = t.ndim - 1; j >= 0; --j) {
                    compact[static_cast<std::size_t>(j)] = s;
                    s *= t.shape[j];
                }
                SCMOE_FAIL(what << ": DLPack strides " << shape_string(t.strides, t.ndim) << " of shape "
                                << shape_string(t.shape, t.ndim) << " are not compact row-major (expected "
                                << shape_string(compact.data(), t.ndim)
                                << "): an scmoe::Tensor is contiguous; pass a contiguous tensor (torch: "
                                   ".contiguous())");
            }
            expected *= t.shape[i];
        }
    }
    SCMOE_CHECK(t.data != nullptr || numel == 0,
                what << ": DLPack data is NULL for a tensor of " << numel << " elements");
    if (t.data != nullptr) {
        char* data = static_cast<char*>(t.data) + t.byte_offset;
        const std::size_t align = dtype_size(out.dtype);
        SCMOE_CHECK(reinterpret_cast<std::uintptr_t>(data) % align == 0,
                    what << ": DLPack data " << t.data << " + byte_offset " << t.byte_offset << " is not aligned to "
                         << align << " bytes, the size of its " << scmoe::dtype_name(out.dtype) << " elements");
        out.data = data;
    }
    return out;
}

DLPackTensor::DLPackTensor(DLManagedTensorVersioned* managed, const Device& device, const char* what,
                           DLPackAccess access)
    : versioned_(managed) {
    SCMOE_CHECK(managed != nullptr, what << ": the DLManagedTensorVersioned pointer is NULL");
    try {
        // Only version, manager_ctx, deleter and flags keep their place across major versions: the
        // tensor of another major version is released unread.
        SCMOE_CHECK(managed->version.major == DLPACK_MAJOR_VERSION,
                    what << ": DLPack version " << managed->version.major << "." << managed->version.minor
                         << ": this scmoe reads DLPack " << DLPACK_MAJOR_VERSION
                         << ".x (the tensor was released unread)");
        SCMOE_CHECK(access == DLPackAccess::kRead || (managed->flags & DLPACK_FLAG_BITMASK_READ_ONLY) == 0,
                    what << ": DLPack flags 0x" << std::hex << managed->flags << std::dec
                         << " mark the tensor read-only (DLPACK_FLAG_BITMASK_READ_ONLY), but scmoe writes it "
                            "(DLPackAccess::kWrite)");
        tensor_ = tensor_from_dlpack(managed->dl_tensor, device, what);
    } catch (...) {
        reset();
        throw;
    }
}

DLPackTensor::DLPackTensor(DLManagedTensor* managed, const Device& device, const char* what) : legacy_(managed) {
    SCMOE_CHECK(managed != nullptr, what << ": the DLManagedTensor pointer is NULL");
    try {
        tensor_ = tensor_from_dlpack(managed->dl_tensor, device, what);
    } catch (...) {
        reset();
        throw;
    }
}

DLPackTensor::~DLPackTensor() { reset(); }

DLPackTensor::DLPackTensor(DLPackTensor&& other) noexcept
    : versioned_(std::exchange(other.versioned_, nullptr)),
      legacy_(std::exchange(other.legacy_, nullptr)),
      tensor_(std::exchange(other.tensor_, Tensor())) {}

DLPackTensor& DLPackTensor::operator=(DLPackTensor&& other) noexcept {
    if (this != &other) {
        reset();
        versioned_ = std::exchange(other.versioned_, nullptr);
        legacy_ = std::exchange(other.legacy_, nullptr);
        tensor_ = std::exchange(other.tensor_, Tensor());
    }
    return *this;
}

void DLPackTensor::reset() {
    // NOTES: runs in the destructor: the producer's deleter must not throw (DLPack's are C functions).
    if (DLManagedTensorVersioned* m = std::exchange(versioned_, nullptr); m != nullptr && m->deleter != nullptr)
        m->deleter(m);
    if (DLManagedTensor* m = std::exchange(legacy_, nullptr); m != nullptr && m->deleter != nullptr) m->deleter(m);
    tensor_ = Tensor();
}

}  // namespace scmoe
