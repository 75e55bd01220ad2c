// CUDA decoding attention (scmoe/kernels/attention_decode.h) against the CPU op on the same
// (bf16-rounded) inputs: a batch of sequences of different lengths, a prefill-sized pass (several
// new tokens) and a decode step, MHA and GQA, f32 and bf16 storage. The cache after the append must
// hold exactly the K/V parts of the qkv rows (a copy: bitwise), and the attention rows agree within
// |gpu - cpu| <= tol * max(1, |cpu|): 1e-4 f32 (sum order), 2e-2 bf16 (one rounding of the output).
#include <gtest/gtest.h>

#include <string>

#include "gpu_test_util.h"
#include "scmoe/kernels/attention_decode.h"

namespace scmoe {
namespace {

using namespace gpu_testing;

void check_decode(DType dt, std::int64_t heads, std::int64_t kv_heads, std::int64_t new_tokens) {
    SCOPED_TRACE(std::string(dtype_name(dt)) + " heads " + std::to_string(heads) + " kv_heads " +
                 std::to_string(kv_heads) + " new_tokens " + std::to_string(new_tokens));
    Backends b;
    const std::int64_t batch = 3, D = 40, max_length = 24, width = (heads + 2 * kv_heads) * D;
    const I lengths = {static_cast<std::int32_t>(new_tokens + 2), static_cast<std::int32_t>(max_length),
                       static_cast<std::int32_t>(new_tokens)};
    auto round = [dt](F v) { return dt == DType::kBF16 ? round_bf16(std::move(v)) : v; };
    const F qkv = round(random_uniform(batch * new_tokens * width, 1.0f, 1));
    // Earlier positions already cached: random contents, the same on both sides.
    const F cache0 = round(random_uniform(batch * kv_heads * max_length * D, 1.0f, 2));
    const F cache1 = round(random_uniform(batch * kv_heads * max_length * D, 1.0f, 3));
    DeviceBuffer gq = upload(b, qkv, dt), gk = upload(b, cache0, dt), gv = upload(b, cache1, dt);
    DeviceBuffer gl = upload_i32(b, lengths), go = upload(b, F(static_cast<std::size_t>(batch * new_tokens * heads * D), 0.0f), dt);
    F ck = cache0, cv = cache1, co(static_cast<std::size_t>(batch * new_tokens * heads * D));
    I cl = lengths;
    kv_cache_append({batch, new_tokens, heads, kv_heads, D, max_length, dt, gq.data(), gl.as<std::int32_t>(), gk.data(), gv.data()}, *b.gpu_stream);
    attention_decode({batch, new_tokens, heads, kv_heads, D, max_length, dt, gq.data(), gl.as<std::int32_t>(), gk.data(), gv.data(), go.data()}, *b.gpu_stream);
    kv_cache_append({batch, new_tokens, heads, kv_heads, D, max_length, DType::kF32, qkv.data(), cl.data(), ck.data(), cv.data()}, *b.cpu_stream);
    attention_decode({batch, new_tokens, heads, kv_heads, D, max_length, DType::kF32, qkv.data(), cl.data(), ck.data(), cv.data(), co.data()}, *b.cpu_stream);
    b.cpu_stream->synchronize();
    expect_bitwise_equal(download(b, gk.data(), static_cast<std::int64_t>(ck.size()), dt), ck, "K cache");
    expect_bitwise_equal(download(b, gv.data(), static_cast<std::int64_t>(cv.size()), dt), cv, "V cache");
    expect_close(download(b, go.data(), static_cast<std::int64_t>(co.size()), dt), co, dt == DType::kBF16 ? 2e-2f : 1e-4f,
                 "attention rows");
}

TEST(GpuAttentionDecode, MatchesTheCpuOp) {
    SCMOE_REQUIRE_GPU();
    for (DType dt : {DType::kF32, DType::kBF16})
        for (std::int64_t kv : {4, 2, 1})
            for (std::int64_t n : {1, 5}) check_decode(dt, 4, kv, n);
}

}  // namespace
}  // namespace scmoe
