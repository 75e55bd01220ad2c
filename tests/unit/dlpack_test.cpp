// DLPack interop on the CPU backend (scmoe/interop/dlpack.h): Tensor -> DLPack -> Tensor round trips
// keep the pointer, shape and dtype (no copy), exported fields are what DLPack consumers read, the
// producer's deleter runs exactly once on every path, and every field scmoe cannot hold is refused
// with a message naming it.
#include "scmoe/interop/dlpack.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "scmoe/kernels/device.h"
#include "scmoe/kernels/error.h"

namespace scmoe {
namespace {

// Runs fn, which must throw scmoe::Error with `text` in its message.
void expect_error(const std::function<void()>& fn, const std::string& text) {
    try {
        fn();
        ADD_FAILURE() << "no error; expected one containing '" << text << "'";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(text), std::string::npos)
            << "message: " << e.what() << "\nexpected to contain: " << text;
    }
}

// A DLPack producer as another framework would be: its own memory and shape arrays, and a deleter
// that counts its calls (a tensor released twice or never shows in `deleted`).
struct Producer {
    std::vector<float> memory = std::vector<float>(64, 0.0f);
    std::int64_t shape[5] = {2, 3, 4, 1, 1};
    std::int64_t strides[5] = {12, 4, 1, 1, 1};
    DLManagedTensorVersioned versioned{};
    DLManagedTensor legacy{};
    int deleted = 0;

    // A [2, 3, 4] f32 tensor of `memory`, compact row-major.
    Producer() {
        for (std::size_t i = 0; i < memory.size(); ++i) memory[i] = static_cast<float>(i);
        versioned.version = {DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION};
        versioned.manager_ctx = this;
        versioned.deleter = [](DLManagedTensorVersioned* self) {
            ++static_cast<Producer*>(self->manager_ctx)->deleted;
        };
        describe(versioned.dl_tensor);
        legacy.manager_ctx = this;
        legacy.deleter = [](DLManagedTensor* self) { ++static_cast<Producer*>(self->manager_ctx)->deleted; };
        describe(legacy.dl_tensor);
    }
    void describe(DLTensor& t) {
        t.data = memory.data();
        t.device = {kDLCPU, 0};
        t.ndim = 3;
        t.dtype = {kDLFloat, 32, 1};
        t.shape = shape;
        t.strides = strides;
        t.byte_offset = 0;
    }
};

class DLPackTest : public ::testing::Test {
  protected:
    std::unique_ptr<Device> cpu = make_device("cpu");
};

TEST_F(DLPackTest, F32RoundTripKeepsPointerShapeAndDtype) {
    std::vector<float> host(24);
    Tensor t(host.data(), DType::kF32, {2, 3, 4});
    DLManagedTensorVersioned* m = to_dlpack_versioned(t, *cpu);
    ASSERT_NE(m, nullptr);
    EXPECT_EQ(m->version.major, 1u);
    EXPECT_EQ(m->flags, 0u);
    const DLTensor& d = m->dl_tensor;
    EXPECT_EQ(d.data, host.data());
    EXPECT_EQ(d.device.device_type, kDLCPU);
    EXPECT_EQ(d.device.device_id, 0);
    EXPECT_EQ(d.dtype.code, kDLFloat);
    EXPECT_EQ(d.dtype.bits, 32);
    EXPECT_EQ(d.dtype.lanes, 1);
    ASSERT_EQ(d.ndim, 3);
    ASSERT_NE(d.strides, nullptr);  // DLPack 1.2 consumers require strides
    EXPECT_EQ(std::vector<std::int64_t>(d.shape, d.shape + 3), (std::vector<std::int64_t>{2, 3, 4}));
    EXPECT_EQ(std::vector<std::int64_t>(d.strides, d.strides + 3), (std::vector<std::int64_t>{12, 4, 1}));
    EXPECT_EQ(d.byte_offset, 0u);

    DLPackTensor back(m, *cpu, "x");
    EXPECT_EQ(back.tensor().data, host.data());
    EXPECT_EQ(back.tensor().dtype, DType::kF32);
    EXPECT_EQ(describe(back.tensor()), "[2, 3, 4] f32");
    // A view, not a copy: writes through either side are seen by the other.
    back.tensor().as<float>()[23] = 7.5f;
    EXPECT_EQ(host[23], 7.5f);
    host[0] = -2.0f;
    EXPECT_EQ(back.tensor().as<float>()[0], -2.0f);
}

TEST_F(DLPackTest, Bf16RoundTripThroughTheLegacyStruct) {
    std::vector<std::uint16_t> host(4 * 8, 0x3f80);  // bf16 1.0
    Tensor t(host.data(), DType::kBF16, {4, 8});
    DLManagedTensor* m = to_dlpack(t, *cpu);
    EXPECT_EQ(m->dl_tensor.dtype.code, kDLBfloat);
    EXPECT_EQ(m->dl_tensor.dtype.bits, 16);
    EXPECT_EQ(std::vector<std::int64_t>(m->dl_tensor.strides, m->dl_tensor.strides + 2),
              (std::vector<std::int64_t>{8, 1}));
    DLPackTensor back(m, *cpu, "x");
    EXPECT_EQ(back.tensor().data, host.data());
    EXPECT_EQ(describe(back.tensor()), "[4, 8] bf16");
    EXPECT_EQ(back.tensor().bytes(), host.size() * sizeof(std::uint16_t));
}

TEST_F(DLPackTest, I32AndScalarAndEmptyTensorsRoundTrip) {
    std::int32_t ids[3] = {1, 2, 3};
    DLPackTensor i32(to_dlpack_versioned(Tensor(ids, DType::kI32, {3}), *cpu), *cpu, "ids");
    EXPECT_EQ(describe(i32.tensor()), "[3] i32");
    EXPECT_EQ(i32.tensor().data, ids);

    float value = 1.0f;
    Tensor scalar;
    scalar.data = &value;
    DLPackTensor s(to_dlpack_versioned(scalar, *cpu), *cpu, "scalar");
    EXPECT_EQ(s.tensor().ndim, 0);
    EXPECT_EQ(s.tensor().numel(), 1);
    EXPECT_EQ(s.tensor().data, &value);

    DLPackTensor empty(to_dlpack_versioned(Tensor(nullptr, DType::kF32, {0, 16}), *cpu), *cpu, "empty");
    EXPECT_EQ(describe(empty.tensor()), "[0, 16] f32");
    EXPECT_EQ(empty.tensor().numel(), 0);
}

TEST_F(DLPackTest, ReadOnlyExportSetsTheFlag) {
    float v[2] = {};
    DLPackTensor ro(to_dlpack_versioned(Tensor(v, DType::kF32, {2}), *cpu, /*read_only=*/true), *cpu, "x",
                    DLPackAccess::kRead);
    expect_error([&] { DLPackTensor(to_dlpack_versioned(Tensor(v, DType::kF32, {2}), *cpu, true), *cpu, "grad_x"); },
                 "grad_x: DLPack flags 0x1 mark the tensor read-only");
}

TEST_F(DLPackTest, TheProducersDeleterRunsExactlyOnce) {
    Producer p;
    {
        DLPackTensor a(&p.versioned, *cpu, "x");
        EXPECT_EQ(p.deleted, 0);
        DLPackTensor b(std::move(a));  // moves hold, never release
        DLPackTensor c;
        c = std::move(b);
        EXPECT_FALSE(a.holds());
        EXPECT_TRUE(c.holds());
        EXPECT_EQ(p.deleted, 0);
    }
    EXPECT_EQ(p.deleted, 1);
    {
        DLPackTensor a(&p.legacy, *cpu, "x");
        a.reset();
        EXPECT_EQ(p.deleted, 2);
        EXPECT_FALSE(a.tensor().defined());
        a.reset();  // idempotent
    }
    EXPECT_EQ(p.deleted, 2);
    // A refused tensor is released too (DLPack: the consumer owns it once handed over).
    p.versioned.dl_tensor.dtype = {kDLFloat, 64, 1};
    expect_error([&] { DLPackTensor(&p.versioned, *cpu, "x"); }, "DLPack dtype float64");
    EXPECT_EQ(p.deleted, 3);
}

TEST_F(DLPackTest, AnotherMajorVersionIsReleasedUnread) {
    Producer p;
    p.versioned.version = {2, 0};
    p.versioned.dl_tensor.ndim = 99;  // another layout: must not be read
    expect_error([&] { DLPackTensor(&p.versioned, *cpu, "x"); },
                 "x: DLPack version 2.0: this scmoe reads DLPack 1.x (the tensor was released unread)");
    EXPECT_EQ(p.deleted, 1);
    // A newer minor version only adds enum values: accepted.
    Producer q;
    q.versioned.version = {1, 99};
    DLPackTensor ok(&q.versioned, *cpu, "x");
    EXPECT_EQ(describe(ok.tensor()), "[2, 3, 4] f32");
}

TEST_F(DLPackTest, RefusesDeviceMemoryOnTheCpuBackend) {
    Producer p;
    p.versioned.dl_tensor.device = {kDLCUDA, 0};
    expect_error([&] { DLPackTensor(&p.versioned, *cpu, "x"); },
                 "x: DLPack device kDLCUDA:0 is not host memory: the cpu backend takes kDLCPU");
    p.versioned.dl_tensor.device = {kDLROCM, 1};
    expect_error([&] { tensor_from_dlpack(p.versioned.dl_tensor, *cpu, "y"); }, "y: DLPack device kDLROCM:1");
    // Pinned host memory is host memory.
    p.versioned.dl_tensor.device = {kDLCUDAHost, 0};
    EXPECT_EQ(tensor_from_dlpack(p.versioned.dl_tensor, *cpu, "x").data, p.memory.data());
}

TEST_F(DLPackTest, RefusesDtypesScmoeDoesNotHold) {
    Producer p;
    DLTensor& t = p.versioned.dl_tensor;
    const struct {
        DLDataType dtype;
        const char* message;
    } cases[] = {
        {{kDLFloat, 16, 1}, "x: DLPack dtype float16 (code 2, bits 16) is not an scmoe dtype"},
        {{kDLFloat, 64, 1}, "x: DLPack dtype float64 (code 2, bits 64)"},
        {{kDLInt, 64, 1}, "x: DLPack dtype int64 (code 0, bits 64)"},
        {{kDLUInt, 32, 1}, "x: DLPack dtype uint32 (code 1, bits 32)"},
        {{kDLBfloat, 32, 1}, "x: DLPack dtype bfloat32 (code 4, bits 32)"},
        {{kDLFloat, 32, 4}, "x: DLPack dtype float32 x4 lanes has 4 lanes; scmoe tensors have 1"},
        {{kDLBfloat, 16, 2}, "has 2 lanes"},
    };
    for (const auto& c : cases) {
        t.dtype = c.dtype;
        expect_error([&] { tensor_from_dlpack(t, *cpu, "x"); }, c.message);
    }
    t.dtype = {kDLBfloat, 16, 1};
    EXPECT_EQ(tensor_from_dlpack(t, *cpu, "x").dtype, DType::kBF16);
}

TEST_F(DLPackTest, RefusesStridesThatAreNotCompactRowMajor) {
    Producer p;
    DLTensor& t = p.versioned.dl_tensor;
    t.ndim = 2;
    p.shape[0] = 2;
    p.shape[1] = 3;
    p.strides[0] = 1;  // a transposed view
    p.strides[1] = 2;
    expect_error([&] { tensor_from_dlpack(t, *cpu, "x"); },
                 "x: DLPack strides [1, 2] of shape [2, 3] are not compact row-major (expected [3, 1])");
    p.strides[0] = 0;  // a broadcast row (torch's expand; sum()'s gradient is one)
    p.strides[1] = 1;
    expect_error([&] { tensor_from_dlpack(t, *cpu, "x"); }, "x: DLPack strides [0, 1] of shape [2, 3]");
    p.strides[0] = 6;  // every other row
    expect_error([&] { tensor_from_dlpack(t, *cpu, "x"); }, "DLPack strides [6, 1]");
    // Compact, given or NULL (legacy producers), is taken.
    p.strides[0] = 3;
    EXPECT_EQ(describe(tensor_from_dlpack(t, *cpu, "x")), "[2, 3] f32");
    t.strides = nullptr;
    EXPECT_EQ(describe(tensor_from_dlpack(t, *cpu, "x")), "[2, 3] f32");
    // An extent-1 dimension's stride addresses nothing: any value is compact (torch keeps odd ones).
    t.strides = p.strides;
    p.shape[0] = 1;
    p.strides[0] = 12345;
    EXPECT_EQ(describe(tensor_from_dlpack(t, *cpu, "x")), "[1, 3] f32");
    // So does every stride of an empty tensor.
    p.shape[0] = 0;
    p.strides[1] = 7;
    EXPECT_EQ(describe(tensor_from_dlpack(t, *cpu, "x")), "[0, 3] f32");
}

TEST_F(DLPackTest, RefusesRanksAndShapesScmoeDoesNotHold) {
    Producer p;
    DLTensor& t = p.versioned.dl_tensor;
    t.ndim = 5;
    expect_error([&] { tensor_from_dlpack(t, *cpu, "x"); },
                 "x: DLPack ndim 5 is outside [0, 4], the ranks an scmoe::Tensor holds");
    t.ndim = -1;
    expect_error([&] { tensor_from_dlpack(t, *cpu, "x"); }, "x: DLPack ndim -1");
    t.ndim = 4;  // [2, 3, 4, 1] fits
    EXPECT_EQ(describe(tensor_from_dlpack(t, *cpu, "x")), "[2, 3, 4, 1] f32");
    t.ndim = 2;
    p.shape[1] = -3;
    expect_error([&] { tensor_from_dlpack(t, *cpu, "x"); }, "x: DLPack shape [2, -3] has a negative extent");
    p.shape[1] = 3;
    t.shape = nullptr;
    expect_error([&] { tensor_from_dlpack(t, *cpu, "x"); }, "x: DLPack shape is NULL for ndim 2");
}

TEST_F(DLPackTest, ByteOffsetIsAddedAndMustKeepElementsAligned) {
    Producer p;
    DLTensor& t = p.versioned.dl_tensor;
    t.ndim = 1;
    p.shape[0] = 4;
    p.strides[0] = 1;
    t.byte_offset = 2 * sizeof(float);
    const Tensor v = tensor_from_dlpack(t, *cpu, "x");
    EXPECT_EQ(v.data, p.memory.data() + 2);
    EXPECT_EQ(v.as<float>()[0], 2.0f);
    t.byte_offset = 2;
    expect_error([&] { tensor_from_dlpack(t, *cpu, "x"); },
                 "+ byte_offset 2 is not aligned to 4 bytes, the size of its f32");
    t.dtype = {kDLBfloat, 16, 1};  // 2 bytes is a bf16 element
    EXPECT_EQ(tensor_from_dlpack(t, *cpu, "x").data, reinterpret_cast<char*>(p.memory.data()) + 2);
}

TEST_F(DLPackTest, RefusesNullDataOfANonEmptyTensor) {
    Producer p;
    p.versioned.dl_tensor.data = nullptr;
    expect_error([&] { tensor_from_dlpack(p.versioned.dl_tensor, *cpu, "x"); },
                 "x: DLPack data is NULL for a tensor of 24 elements");
    expect_error([&] { DLPackTensor(static_cast<DLManagedTensorVersioned*>(nullptr), *cpu, "x"); },
                 "x: the DLManagedTensorVersioned pointer is NULL");
    expect_error(
        [&] {
            to_dlpack_versioned(Tensor(nullptr, DType::kF32, {2, 3}), *cpu);
        },
        "DLPack export: [2, 3] f32 has no data (null pointer)");
}

TEST_F(DLPackTest, TheEmuBackendIsRefusedBothWays) {
    auto emu = make_device("emu");
    float v[4] = {};
    expect_error([&] { to_dlpack_versioned(Tensor(v, DType::kF32, {4}), *emu); },
                 "the emu backend's memory is modeled");
    Producer p;
    expect_error([&] { tensor_from_dlpack(p.versioned.dl_tensor, *emu, "x"); },
                 "x: the emu backend's memory is modeled");
}

}  // namespace
}  // namespace scmoe
