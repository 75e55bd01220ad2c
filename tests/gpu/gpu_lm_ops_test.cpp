// CUDA embedding and cross-entropy against the CPU ops on the same (bf16-rounded) inputs, f32 and
// bf16 storage; bitwise run-to-run determinism; in-place cross-entropy; non-finite logits; and
// out-of-range ids/targets, which CUDA does not validate (the caller does) but must not read past.
//
// Tolerances (|gpu - cpu| <= tol * max(1, |cpu|)):
//   embedding out, grad_table, grad_positions:  exact. Forward is one f32 add (then, for bf16, one
//       rounding, the same on both sides); the gradient sums start from the same value and add the
//       same f32 values in the same order (increasing t), and adds are never contracted.
//   cross-entropy loss (f32):                    5e-5  (sum order and expf/logf ulps; rows shifted by
//                                                       +-1000 lose ulp(1000) = 6e-5 absolute)
//   cross-entropy grad_logits f32:               1e-5
//   cross-entropy grad_logits bf16:              1e-2  (one bf16 rounding of values in [-1, 1])
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>

#include "gpu_test_util.h"
#include "scmoe/kernels/cross_entropy.h"
#include "scmoe/kernels/embedding.h"
#include "scmoe/kernels/error.h"
#include "test_util.h"

namespace scmoe {
namespace {

using namespace gpu_testing;
using testing::random_ids;
using testing::sz;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

F maybe_round(F v, DType dtype) { return dtype == DType::kBF16 ? round_bf16(std::move(v)) : v; }

// ---- Embedding --------------------------------------------------------------------------------

struct EmbedShape {
    std::int64_t tokens, hidden, vocab, seq_len;
    std::string name() const {
        return "tokens=" + std::to_string(tokens) + " hidden=" + std::to_string(hidden) +
               " vocab=" + std::to_string(vocab) + " seq_len=" + std::to_string(seq_len);
    }
};

struct EmbedInputs {
    I ids;
    F table, positions, grad_out, base;  // base: grad_table's contents before an accumulating backward
};

EmbedInputs make_embed_inputs(const EmbedShape& s, DType dt, std::uint64_t seed) {
    return {random_ids(s.tokens, s.vocab, seed), maybe_round(random_uniform(s.vocab * s.hidden, 1.0f, seed + 1), dt),
            maybe_round(random_uniform(s.seq_len * s.hidden, 0.5f, seed + 2), dt),
            maybe_round(random_uniform(s.tokens * s.hidden, 1.0f, seed + 3), dt),
            random_uniform(s.vocab * s.hidden, 1.0f, seed + 4)};
}

struct EmbedResult {
    F out, grad_table, grad_positions;
};

EmbeddingArgs embed_args(const EmbedShape& s, DType dt, const std::int32_t* ids, const void* table,
                         const void* positions, void* out) {
    EmbeddingArgs a;
    a.tokens = s.tokens;
    a.hidden = s.hidden;
    a.vocab = s.vocab;
    a.seq_len = s.seq_len;
    a.dtype = dt;
    a.ids = ids;
    a.table = table;
    a.positions = positions;
    a.out = out;
    return a;
}

EmbeddingBackwardArgs embed_backward_args(const EmbedShape& s, DType dt, const std::int32_t* ids, const void* grad_out,
                                          float* grad_table, bool accumulate, float* grad_positions) {
    EmbeddingBackwardArgs a;
    a.tokens = s.tokens;
    a.hidden = s.hidden;
    a.vocab = s.vocab;
    a.seq_len = s.seq_len;
    a.dtype = dt;
    a.ids = ids;
    a.grad_out = grad_out;
    a.grad_table = grad_table;
    a.accumulate_table = accumulate;
    a.grad_positions = grad_positions;
    return a;
}

EmbedResult run_embedding_gpu(Backends& b, DType dt, const EmbedShape& s, const EmbedInputs& in, bool with_positions,
                              bool accumulate) {
    DeviceBuffer ids = upload_i32(b, in.ids), table = upload(b, in.table, dt), pos = upload(b, in.positions, dt);
    DeviceBuffer go = upload(b, in.grad_out, dt), out = upload(b, F(sz(s.tokens * s.hidden), kNaN), dt);
    DeviceBuffer gt = upload(b, accumulate ? in.base : F(in.base.size(), kNaN), DType::kF32);
    DeviceBuffer gp = upload(b, F(sz(s.seq_len * s.hidden), kNaN), DType::kF32);  // must be overwritten
    const auto* id_ptr = ids.as<const std::int32_t>();
    embedding_forward(embed_args(s, dt, id_ptr, table.data(), with_positions ? pos.data() : nullptr, out.data()),
                      *b.gpu_stream);
    embedding_backward(embed_backward_args(s, dt, id_ptr, go.data(), gt.as<float>(), accumulate, gp.as<float>()),
                       *b.gpu_stream);
    return {download(b, out.data(), s.tokens * s.hidden, dt), download(b, gt.data(), s.vocab * s.hidden, DType::kF32),
            download(b, gp.data(), s.seq_len * s.hidden, DType::kF32)};
}

EmbedResult run_embedding_cpu(Backends& b, const EmbedShape& s, const EmbedInputs& in, bool with_positions,
                              bool accumulate) {
    EmbedResult r{F(sz(s.tokens * s.hidden)), accumulate ? in.base : F(in.base.size()), F(sz(s.seq_len * s.hidden))};
    embedding_forward(embed_args(s, DType::kF32, in.ids.data(), in.table.data(),
                                 with_positions ? in.positions.data() : nullptr, r.out.data()),
                      *b.cpu_stream);
    embedding_backward(embed_backward_args(s, DType::kF32, in.ids.data(), in.grad_out.data(), r.grad_table.data(),
                                           accumulate, r.grad_positions.data()),
                       *b.cpu_stream);
    b.cpu_stream->synchronize();
    return r;
}

TEST(GpuLmEmbedding, ForwardBackwardMatchCpuExactly) {
    SCMOE_REQUIRE_GPU();
    Backends b;
    std::uint64_t seed = 100;
    const EmbedShape shapes[] = {
        {4096, 600, 256, 512},  // byte vocabulary; hidden not a multiple of the 128-column tile
        {300, 96, 7, 100},      // many tokens per vocab row
        {130, 33, 300, 13},     // rows with no token (their gradient is 0 or the old value)
        {1, 1, 1, 1},
    };
    for (DType dt : {DType::kF32, DType::kBF16}) {
        for (const EmbedShape& s : shapes) {
            for (bool with_positions : {false, true}) {
                for (bool accumulate : {false, true}) {
                    SCOPED_TRACE(std::string("embedding ") + dtype_name(dt) + " " + s.name() + " positions=" +
                                 std::to_string(with_positions) + " accumulate=" + std::to_string(accumulate));
                    const EmbedInputs in = make_embed_inputs(s, dt, seed += 5);
                    const EmbedResult got = run_embedding_gpu(b, dt, s, in, with_positions, accumulate);
                    const EmbedResult want = run_embedding_cpu(b, s, in, with_positions, accumulate);
                    expect_bitwise_equal(got.out, maybe_round(want.out, dt), "out");
                    expect_bitwise_equal(got.grad_table, want.grad_table, "grad_table");
                    expect_bitwise_equal(got.grad_positions, want.grad_positions, "grad_positions");
                }
            }
        }
    }
}

TEST(GpuLmEmbedding, BackwardIsBitwiseDeterministic) {
    SCMOE_REQUIRE_GPU();
    Backends b;
    const EmbedShape s{16384, 512, 256, 1024};
    for (DType dt : {DType::kF32, DType::kBF16}) {
        const EmbedInputs in = make_embed_inputs(s, dt, 7);
        const EmbedResult first = run_embedding_gpu(b, dt, s, in, true, true);
        for (int run = 0; run < 2; ++run) {
            const EmbedResult again = run_embedding_gpu(b, dt, s, in, true, true);
            expect_bitwise_equal(again.out, first.out, "out");
            expect_bitwise_equal(again.grad_table, first.grad_table, "grad_table");
            expect_bitwise_equal(again.grad_positions, first.grad_positions, "grad_positions");
        }
    }
}

TEST(GpuLmEmbedding, OutOfRangeIdsReadNothingOutOfBounds) {
    SCMOE_REQUIRE_GPU();
    Backends b;
    // Ids are the caller's to validate; on CUDA a bad id's output row is NaN and its gradient is
    // dropped from grad_table (grad_positions still counts it).
    const EmbedShape s{8, 40, 5, 4};
    EmbedInputs in = make_embed_inputs(s, DType::kF32, 50);
    in.ids[2] = 5;
    in.ids[6] = -1;
    const EmbedResult got = run_embedding_gpu(b, DType::kF32, s, in, true, false);
    EmbedInputs valid = in;
    for (std::int64_t t : {2, 6}) {
        valid.ids[sz(t)] = 0;
        for (std::int64_t h = 0; h < s.hidden; ++h) valid.grad_out[sz(t * s.hidden + h)] = 0.0f;
    }
    const EmbedResult want = run_embedding_cpu(b, s, valid, true, false);
    const EmbedResult want_positions = run_embedding_cpu(b, s, make_embed_inputs(s, DType::kF32, 50), true, false);
    for (std::int64_t t = 0; t < s.tokens; ++t) {
        for (std::int64_t h = 0; h < s.hidden; ++h) {
            const float v = got.out[sz(t * s.hidden + h)];
            if (t == 2 || t == 6) {
                EXPECT_TRUE(std::isnan(v)) << "token " << t << " column " << h;
            } else {
                EXPECT_EQ(v, want.out[sz(t * s.hidden + h)]) << "token " << t << " column " << h;
            }
        }
    }
    expect_close(got.grad_table, want.grad_table, 1e-6f, "grad_table");
    expect_bitwise_equal(got.grad_positions, want_positions.grad_positions, "grad_positions");
}

// ---- Cross entropy ----------------------------------------------------------------------------

struct XentShape {
    std::int64_t tokens, vocab;
    float grad_scale;
    std::string name() const {
        return "tokens=" + std::to_string(tokens) + " vocab=" + std::to_string(vocab) +
               " grad_scale=" + std::to_string(grad_scale);
    }
};

CrossEntropyArgs xent_args(const XentShape& s, DType dt, const void* logits, const std::int32_t* targets, float* loss,
                           void* grad) {
    CrossEntropyArgs a;
    a.tokens = s.tokens;
    a.vocab = s.vocab;
    a.dtype = dt;
    a.logits = logits;
    a.targets = targets;
    a.loss = loss;
    a.grad_logits = grad;
    a.grad_scale = s.grad_scale;
    return a;
}

struct XentResult {
    F loss, grad;
};

// in_place: grad_logits is the logits buffer itself.
XentResult run_xent_gpu(Backends& b, DType dt, const XentShape& s, const F& logits, const I& targets, bool in_place) {
    DeviceBuffer dl = upload(b, logits, dt), dtargets = upload_i32(b, targets);
    DeviceBuffer dloss = upload(b, F(sz(s.tokens), kNaN), DType::kF32), dg = upload(b, F(logits.size(), kNaN), dt);
    void* grad = in_place ? dl.data() : dg.data();
    cross_entropy(xent_args(s, dt, dl.data(), dtargets.as<const std::int32_t>(), dloss.as<float>(), grad),
                  *b.gpu_stream);
    return {download(b, dloss.data(), s.tokens, DType::kF32), download(b, grad, s.tokens * s.vocab, dt)};
}

XentResult run_xent_cpu(Backends& b, const XentShape& s, const F& logits, const I& targets) {
    XentResult r{F(sz(s.tokens)), F(logits.size())};
    cross_entropy(xent_args(s, DType::kF32, logits.data(), targets.data(), r.loss.data(), r.grad.data()),
                  *b.cpu_stream);
    b.cpu_stream->synchronize();
    return r;
}

F make_logits(const XentShape& s, DType dt, std::uint64_t seed) {
    F logits = random_uniform(s.tokens * s.vocab, 6.0f, seed);
    // Rows far from zero: exp() without the max subtraction would overflow or underflow.
    if (s.tokens > 2) {
        for (std::int64_t v = 0; v < s.vocab; ++v) {
            logits[sz(1 * s.vocab + v)] += 1000.0f;
            logits[sz(2 * s.vocab + v)] -= 1000.0f;
        }
    }
    return maybe_round(std::move(logits), dt);
}

TEST(GpuLmCrossEntropy, MatchesCpu) {
    SCMOE_REQUIRE_GPU();
    Backends b;
    std::uint64_t seed = 300;
    const XentShape shapes[] = {
        {512, 256, 1.0f / 512},  // byte vocabulary
        {5, 50257, 1.0f},        // large vocabulary: many elements per thread
        {300, 7, 0.5f},          // vocab smaller than a warp
        {3, 257, 1.0f},
    };
    for (DType dt : {DType::kF32, DType::kBF16}) {
        for (const XentShape& s : shapes) {
            SCOPED_TRACE(std::string("cross_entropy ") + dtype_name(dt) + " " + s.name());
            const F logits = make_logits(s, dt, seed += 5);
            const I targets = random_ids(s.tokens, s.vocab, seed + 1);
            const XentResult got = run_xent_gpu(b, dt, s, logits, targets, false);
            const XentResult want = run_xent_cpu(b, s, logits, targets);
            const bool bf16 = dt == DType::kBF16;
            expect_close(got.loss, want.loss, 5e-5f, "loss");
            expect_close(got.grad, maybe_round(want.grad, dt), bf16 ? 1e-2f : 1e-5f, "grad_logits");
            const XentResult in_place = run_xent_gpu(b, dt, s, logits, targets, true);
            expect_bitwise_equal(in_place.loss, got.loss, "in-place loss");
            expect_bitwise_equal(in_place.grad, got.grad, "in-place grad_logits");
        }
    }
}

TEST(GpuLmCrossEntropy, IsBitwiseDeterministic) {
    SCMOE_REQUIRE_GPU();
    Backends b;
    const XentShape s{4096, 256, 1.0f / 4096};
    for (DType dt : {DType::kF32, DType::kBF16}) {
        const F logits = make_logits(s, dt, 400);
        const I targets = random_ids(s.tokens, s.vocab, 401);
        const XentResult first = run_xent_gpu(b, dt, s, logits, targets, false);
        for (int run = 0; run < 2; ++run) {
            const XentResult again = run_xent_gpu(b, dt, s, logits, targets, run == 1);
            expect_bitwise_equal(again.loss, first.loss, "loss");
            expect_bitwise_equal(again.grad, first.grad, "grad_logits");
        }
    }
}

TEST(GpuLmCrossEntropy, NonFiniteLogitGivesNonFiniteLoss) {
    SCMOE_REQUIRE_GPU();
    Backends b;
    const XentShape s{5, 300, 1.0f};
    for (DType dt : {DType::kF32, DType::kBF16}) {
        SCOPED_TRACE(dtype_name(dt));
        F logits = random_uniform(s.tokens * s.vocab, 1.0f, 500);
        const I targets = {0, 1, 2, 3, 4};
        logits[sz(0 * s.vocab + 299)] = kNaN;
        logits[sz(1 * s.vocab + 100)] = kInf;
        logits[sz(2 * s.vocab + 200)] = -kInf;  // a plain softmax would give it probability 0
        logits[sz(3 * s.vocab + 3)] = kNaN;     // the target itself
        const XentResult got = run_xent_gpu(b, dt, s, maybe_round(logits, dt), targets, false);
        for (std::int64_t t = 0; t < 4; ++t) EXPECT_FALSE(std::isfinite(got.loss[sz(t)])) << "token " << t;
        EXPECT_TRUE(std::isfinite(got.loss[4]));
    }
}

TEST(GpuLmCrossEntropy, OutOfRangeTargetGivesNaNLoss) {
    SCMOE_REQUIRE_GPU();
    Backends b;
    // Targets are the caller's to validate; on CUDA a bad one reads nothing and its loss is NaN.
    const XentShape s{4, 64, 1.0f};
    const F logits = random_uniform(s.tokens * s.vocab, 2.0f, 600);
    const I targets = {3, 64, -1, 0};
    const XentResult got = run_xent_gpu(b, DType::kF32, s, logits, targets, false);
    const XentResult want = run_xent_cpu(b, s, logits, I{3, 0, 0, 0});
    EXPECT_TRUE(std::isnan(got.loss[1]));
    EXPECT_TRUE(std::isnan(got.loss[2]));
    EXPECT_NEAR(got.loss[0], want.loss[0], 5e-5f * std::max(1.0f, want.loss[0]));
    EXPECT_NEAR(got.loss[3], want.loss[3], 5e-5f * std::max(1.0f, want.loss[3]));
}

TEST(GpuLmArgs, ArgumentsAreCheckedAtTheCall) {
    SCMOE_REQUIRE_GPU();
    Backends b;
    DeviceBuffer ids(*b.gpu, 1 << 10), in(*b.gpu, 1 << 16), out(*b.gpu, 1 << 16);
    const auto* id_ptr = ids.as<const std::int32_t>();
    // bf16 passes the dtype check on CUDA; 4 tokens are not whole sequences of 3.
    const EmbedShape s{4, 2, 3, 3};
    EXPECT_THROW(embedding_forward(embed_args(s, DType::kBF16, id_ptr, in.data(), nullptr, out.data()), *b.gpu_stream),
                 Error);
    EXPECT_THROW(
        embedding_backward(embed_backward_args(s, DType::kBF16, id_ptr, in.data(), out.as<float>(), false, nullptr),
                           *b.gpu_stream),
        Error);
    EXPECT_THROW(cross_entropy(xent_args({0, 4, 1.0f}, DType::kBF16, in.data(), id_ptr, out.as<float>(), nullptr),
                               *b.gpu_stream),
                 Error);
    EXPECT_THROW(
        cross_entropy(xent_args({2, 4, 1.0f}, DType::kI32, in.data(), id_ptr, out.as<float>(), nullptr), *b.gpu_stream),
        Error);
    b.gpu_stream->synchronize();  // nothing was enqueued
}

}  // namespace
}  // namespace scmoe
