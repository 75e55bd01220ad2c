// Language-model ops on the CPU backend: the token + position embedding (forward by hand, backward
// against exact and order-exact references, accumulation) and the softmax cross-entropy (against a
// double-precision reference, finite differences of its own loss, in-place use, non-finite logits),
// plus argument checks at the call and out-of-range ids/targets failing on the stream.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "scmoe/kernels/cross_entropy.h"
#include "scmoe/kernels/device.h"
#include "scmoe/kernels/embedding.h"
#include "scmoe/kernels/error.h"
#include "test_util.h"

namespace scmoe {
namespace {

using F = std::vector<float>;
using I = std::vector<std::int32_t>;
using testing::bitwise_equal;
using testing::Cpu;
using testing::random_floats;
using testing::random_ids;
using testing::sz;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// ---- Embedding --------------------------------------------------------------------------------

struct Embed {
    std::int64_t tokens, hidden, vocab, seq_len;

    EmbeddingArgs forward_args(const I& ids, const F& table, const F* positions, F& out) const {
        EmbeddingArgs a;
        a.tokens = tokens;
        a.hidden = hidden;
        a.vocab = vocab;
        a.seq_len = seq_len;
        a.ids = ids.data();
        a.table = table.data();
        a.positions = positions ? positions->data() : nullptr;
        a.out = out.data();
        return a;
    }
    F forward(Cpu& c, const I& ids, const F& table, const F* positions) const {
        F out(sz(tokens * hidden), kNaN);
        embedding_forward(forward_args(ids, table, positions, out), *c.stream);
        c.stream->synchronize();
        return out;
    }
    EmbeddingBackwardArgs backward_args(const I& ids, const F& grad_out, F* grad_table, bool accumulate,
                                        F* grad_positions) const {
        EmbeddingBackwardArgs a;
        a.tokens = tokens;
        a.hidden = hidden;
        a.vocab = vocab;
        a.seq_len = seq_len;
        a.ids = ids.data();
        a.grad_out = grad_out.data();
        a.grad_table = grad_table ? grad_table->data() : nullptr;
        a.accumulate_table = accumulate;
        a.grad_positions = grad_positions ? grad_positions->data() : nullptr;
        return a;
    }
    void backward(Cpu& c, const I& ids, const F& grad_out, F* grad_table, bool accumulate, F* grad_positions) const {
        embedding_backward(backward_args(ids, grad_out, grad_table, accumulate, grad_positions), *c.stream);
        c.stream->synchronize();
    }
};

TEST(LmEmbedding, ForwardKnownValues) {
    Cpu c;
    // vocab 3, hidden 2, two sequences of 2 tokens: out[t] = table[ids[t]] + positions[t % 2].
    const Embed e{4, 2, 3, 2};
    const I ids = {2, 0, 2, 1};
    const F table = {1, 2, 10, 20, 100, 200};
    const F positions = {0.5f, -0.5f, 0.25f, -0.25f};
    const F out = e.forward(c, ids, table, &positions);
    const F want = {100.5f, 199.5f, 1.25f, 1.75f, 100.5f, 199.5f, 10.25f, 19.75f};
    EXPECT_TRUE(bitwise_equal(out, want));
    const F no_positions = e.forward(c, ids, table, nullptr);
    const F want_rows = {100, 200, 1, 2, 100, 200, 10, 20};
    EXPECT_TRUE(bitwise_equal(no_positions, want_rows));
}

TEST(LmEmbedding, BackwardExactOnSmallIntegers) {
    Cpu c;
    // Half-integer gradients: every sum is exact in f32, so the expectations are exact too.
    const Embed e{12, 3, 5, 4};
    const I ids = {1, 3, 1, 0, 3, 3, 1, 0, 2, 1, 0, 0};  // vocab row 4 gets no token
    F grad_out(sz(e.tokens * e.hidden));
    for (std::size_t i = 0; i < grad_out.size(); ++i) grad_out[i] = 0.5f * static_cast<float>(int(i * 7 % 17) - 8);
    F want_table(sz(e.vocab * e.hidden), 0.0f), want_positions(sz(e.seq_len * e.hidden), 0.0f);
    for (std::int64_t t = 0; t < e.tokens; ++t) {
        for (std::int64_t h = 0; h < e.hidden; ++h) {
            want_table[sz(ids[sz(t)] * e.hidden + h)] += grad_out[sz(t * e.hidden + h)];
            want_positions[sz((t % e.seq_len) * e.hidden + h)] += grad_out[sz(t * e.hidden + h)];
        }
    }
    // Outputs start as NaN: both must be overwritten.
    F grad_table(want_table.size(), kNaN), grad_positions(want_positions.size(), kNaN);
    e.backward(c, ids, grad_out, &grad_table, false, &grad_positions);
    EXPECT_EQ(grad_table, want_table);
    EXPECT_EQ(grad_positions, want_positions);
    for (std::int64_t h = 0; h < e.hidden; ++h) EXPECT_EQ(grad_table[sz(4 * e.hidden + h)], 0.0f);

    // accumulate_table: the tied LM head's gradient is already there and is added to, exactly;
    // grad_positions is still overwritten.
    F base(want_table.size());
    for (std::size_t i = 0; i < base.size(); ++i) base[i] = static_cast<float>(i) - 4.0f;
    F accumulated = base, positions_again(want_positions.size(), 123.0f);
    e.backward(c, ids, grad_out, &accumulated, true, &positions_again);
    for (std::size_t i = 0; i < base.size(); ++i) EXPECT_EQ(accumulated[i], base[i] + want_table[i]) << i;
    EXPECT_EQ(positions_again, want_positions);

    // Either gradient alone; the other buffer is not touched.
    F table_only(want_table.size(), kNaN);
    e.backward(c, ids, grad_out, &table_only, false, nullptr);
    EXPECT_EQ(table_only, want_table);
    F positions_only(want_positions.size(), kNaN);
    e.backward(c, ids, grad_out, nullptr, false, &positions_only);
    EXPECT_EQ(positions_only, want_positions);
}

TEST(LmEmbedding, BackwardSumsTokensInIncreasingOrder) {
    Cpu c;
    // Random values: the header's contract (start from the old value or zero, add tokens in
    // increasing t) is what the CUDA kernels follow too, so it must hold bit for bit.
    const Embed e{64, 8, 6, 16};
    const I ids = random_ids(e.tokens, e.vocab, 3);
    const F grad_out = random_floats(e.tokens * e.hidden, 4, 3.0f), base = random_floats(e.vocab * e.hidden, 5);
    F want_table = base, want_positions(sz(e.seq_len * e.hidden), 0.0f);
    for (std::int64_t t = 0; t < e.tokens; ++t) {
        for (std::int64_t h = 0; h < e.hidden; ++h) {
            const float g = grad_out[sz(t * e.hidden + h)];
            want_table[sz(ids[sz(t)] * e.hidden + h)] += g;
            want_positions[sz((t % e.seq_len) * e.hidden + h)] += g;
        }
    }
    F grad_table = base, grad_positions(want_positions.size(), kNaN);
    e.backward(c, ids, grad_out, &grad_table, true, &grad_positions);
    EXPECT_TRUE(bitwise_equal(grad_table, want_table));
    EXPECT_TRUE(bitwise_equal(grad_positions, want_positions));
}

TEST(LmEmbedding, BackwardIsTheGradientOfForward) {
    Cpu c;
    // L = <forward(table, positions), G> is linear, so dL/dtable[v, h] is a difference of two
    // forwards with table[v, h] moved by +-1: exact for these small integer values.
    const Embed e{6, 2, 4, 3};
    const I ids = {3, 1, 3, 0, 1, 1};
    F table = {1, -2, 3, 4, -5, 6, 7, -8}, positions = {1, 2, 3, 4, 5, 6};
    F grad_out(sz(e.tokens * e.hidden));
    for (std::size_t i = 0; i < grad_out.size(); ++i) grad_out[i] = static_cast<float>(int(i % 5) - 2);
    auto loss = [&] {
        const F out = e.forward(c, ids, table, &positions);
        double l = 0.0;
        for (std::size_t i = 0; i < out.size(); ++i) l += static_cast<double>(out[i]) * grad_out[i];
        return l;
    };
    auto fd = [&](F& v, std::size_t i) {
        const float saved = v[i];
        v[i] = saved + 1.0f;
        const double up = loss();
        v[i] = saved - 1.0f;
        const double down = loss();
        v[i] = saved;
        return (up - down) / 2.0;
    };
    F grad_table(table.size(), kNaN), grad_positions(positions.size(), kNaN);
    e.backward(c, ids, grad_out, &grad_table, false, &grad_positions);
    for (std::size_t i = 0; i < table.size(); ++i) EXPECT_EQ(grad_table[i], fd(table, i)) << "table " << i;
    for (std::size_t i = 0; i < positions.size(); ++i) EXPECT_EQ(grad_positions[i], fd(positions, i)) << "pos " << i;
}

// ---- Cross entropy ----------------------------------------------------------------------------

struct Xent {
    std::int64_t tokens, vocab;
    float grad_scale = 1.0f;

    CrossEntropyArgs args(const F& logits, const I& targets, F& loss, void* grad) const {
        CrossEntropyArgs a;
        a.tokens = tokens;
        a.vocab = vocab;
        a.logits = logits.data();
        a.targets = targets.data();
        a.loss = loss.data();
        a.grad_logits = grad;
        a.grad_scale = grad_scale;
        return a;
    }
    // Returns the per-token loss; fills *grad when given (null: loss only).
    F run(Cpu& c, const F& logits, const I& targets, F* grad) const {
        F loss(sz(tokens), kNaN);
        if (grad) grad->assign(logits.size(), kNaN);
        cross_entropy(args(logits, targets, loss, grad ? grad->data() : nullptr), *c.stream);
        c.stream->synchronize();
        return loss;
    }
};

// loss and grad_scale * (softmax - onehot) in double, from the equations.
void reference_cross_entropy(const Xent& x, const F& logits, const I& targets, std::vector<double>& loss,
                             std::vector<double>& grad) {
    loss.assign(sz(x.tokens), 0.0);
    grad.assign(logits.size(), 0.0);
    for (std::int64_t t = 0; t < x.tokens; ++t) {
        const float* row = logits.data() + t * x.vocab;
        double max = -INFINITY;
        for (std::int64_t v = 0; v < x.vocab; ++v) max = std::max(max, static_cast<double>(row[v]));
        double sum = 0.0;
        for (std::int64_t v = 0; v < x.vocab; ++v) sum += std::exp(row[v] - max);
        loss[sz(t)] = max + std::log(sum) - row[targets[sz(t)]];
        for (std::int64_t v = 0; v < x.vocab; ++v) {
            const double p = std::exp(row[v] - max) / sum;
            grad[sz(t * x.vocab + v)] = x.grad_scale * (p - (v == targets[sz(t)] ? 1.0 : 0.0));
        }
    }
}

TEST(LmCrossEntropy, MatchesDoubleReference) {
    Cpu c;
    const Xent x{9, 300, 0.125f};
    F logits = random_floats(x.tokens * x.vocab, 11, 6.0f);
    // Rows far from zero: without the max subtraction exp() would overflow or underflow to 0.
    for (std::int64_t v = 0; v < x.vocab; ++v) {
        logits[sz(1 * x.vocab + v)] += 1000.0f;
        logits[sz(2 * x.vocab + v)] -= 1000.0f;
    }
    // A peaked row: the target dominates, the loss is tiny.
    for (std::int64_t v = 0; v < x.vocab; ++v) logits[sz(3 * x.vocab + v)] = v == 7 ? 40.0f : 0.0f;
    I targets = random_ids(x.tokens, x.vocab, 12);
    targets[3] = 7;
    targets[4] = 0;
    targets[5] = static_cast<std::int32_t>(x.vocab - 1);
    F grad;
    const F loss = x.run(c, logits, targets, &grad);
    std::vector<double> want_loss, want_grad;
    reference_cross_entropy(x, logits, targets, want_loss, want_grad);
    for (std::int64_t t = 0; t < x.tokens; ++t) {
        // 1000 + log(sum) - x_target in f32: absolute error ~ ulp(1000) = 6e-5 for the shifted rows.
        EXPECT_NEAR(loss[sz(t)], want_loss[sz(t)], 1e-4 + 1e-6 * want_loss[sz(t)]) << "token " << t;
    }
    EXPECT_LT(loss[3], 1e-12f);
    for (std::size_t i = 0; i < grad.size(); ++i) {
        ASSERT_NEAR(grad[i], want_grad[i], 1e-7 + 1e-5 * std::abs(want_grad[i])) << "element " << i;
    }
}

TEST(LmCrossEntropy, GradientMatchesFiniteDifferences) {
    Cpu c;
    const Xent x{3, 7, 0.5f};
    F logits = random_floats(x.tokens * x.vocab, 21, 2.0f);
    const I targets = {4, 0, 6};
    // L = grad_scale * sum_t loss[t], the scalar whose gradient grad_logits is.
    auto total_loss = [&] {
        const F loss = x.run(c, logits, targets, nullptr);
        double l = 0.0;
        for (float v : loss) l += v;
        return x.grad_scale * l;
    };
    F grad;
    x.run(c, logits, targets, &grad);
    const std::vector<double> fd = testing::finite_differences(logits, 1e-2f, total_loss);
    // f32 loss rounding (~2e-7 of ~2) over 2 * step, plus O(step^2) truncation.
    EXPECT_LE(testing::worst_violation(grad, fd, 1e-4, 1e-2), 1.0);
    // Each row of softmax - onehot sums to zero.
    for (std::int64_t t = 0; t < x.tokens; ++t) {
        double row_sum = 0.0;
        for (std::int64_t v = 0; v < x.vocab; ++v) row_sum += grad[sz(t * x.vocab + v)];
        EXPECT_NEAR(row_sum, 0.0, 1e-6) << "token " << t;
    }
}

TEST(LmCrossEntropy, InPlaceAndLossOnlyMatchOutOfPlace) {
    Cpu c;
    const Xent x{17, 129, 1.0f / 17.0f};
    const F logits = random_floats(x.tokens * x.vocab, 31, 4.0f);
    const I targets = random_ids(x.tokens, x.vocab, 32);
    F grad;
    const F loss = x.run(c, logits, targets, &grad);
    F in_place = logits, in_place_loss(sz(x.tokens), kNaN);
    cross_entropy(x.args(in_place, targets, in_place_loss, in_place.data()), *c.stream);
    c.stream->synchronize();
    EXPECT_TRUE(bitwise_equal(in_place, grad));
    EXPECT_TRUE(bitwise_equal(in_place_loss, loss));
    const F loss_only = x.run(c, logits, targets, nullptr);
    EXPECT_TRUE(bitwise_equal(loss_only, loss));
    const F again = x.run(c, logits, targets, &in_place);
    EXPECT_TRUE(bitwise_equal(again, loss));
    EXPECT_TRUE(bitwise_equal(in_place, grad));
}

TEST(LmCrossEntropy, NonFiniteLogitGivesNonFiniteLoss) {
    Cpu c;
    const Xent x{5, 6};
    F logits = random_floats(x.tokens * x.vocab, 41);
    const I targets = {0, 1, 2, 3, 4};
    F clean_grad;
    const F clean = x.run(c, logits, targets, &clean_grad);
    // Non-target positions: NaN, +inf, -inf (which a plain softmax would silently treat as a
    // probability of 0); row 4 stays finite.
    logits[sz(0 * x.vocab + 3)] = kNaN;
    logits[sz(1 * x.vocab + 5)] = kInf;
    logits[sz(2 * x.vocab + 0)] = -kInf;
    logits[sz(3 * x.vocab + 3)] = kNaN;  // the target itself
    for (bool with_grad : {false, true}) {
        F grad;
        const F loss = x.run(c, logits, targets, with_grad ? &grad : nullptr);
        for (std::int64_t t = 0; t < 4; ++t) EXPECT_FALSE(std::isfinite(loss[sz(t)])) << "token " << t;
        EXPECT_EQ(loss[4], clean[4]);
        if (with_grad) {
            for (std::int64_t v = 0; v < x.vocab; ++v) {
                EXPECT_EQ(grad[sz(4 * x.vocab + v)], clean_grad[sz(4 * x.vocab + v)]);
            }
        }
    }
}

// ---- Arguments --------------------------------------------------------------------------------

TEST(LmArgs, InvalidArgumentsThrowAtTheCall) {
    Cpu c;
    const Embed e{4, 2, 3, 2};
    const I ids = {0, 1, 2, 0};
    const F table(6, 1.0f), positions(4, 1.0f);
    F out(8), grad_out(8, 1.0f), grad_table(6), grad_positions(4);
    auto fwd = [&](auto&& edit) {
        EmbeddingArgs a = e.forward_args(ids, table, &positions, out);
        edit(a);
        embedding_forward(a, *c.stream);
    };
    EXPECT_THROW(fwd([](EmbeddingArgs& a) { a.tokens = 0; }), Error);
    EXPECT_THROW(fwd([](EmbeddingArgs& a) { a.hidden = -1; }), Error);
    EXPECT_THROW(fwd([](EmbeddingArgs& a) { a.vocab = 0; }), Error);
    EXPECT_THROW(fwd([](EmbeddingArgs& a) { a.seq_len = 0; }), Error);
    EXPECT_THROW(fwd([](EmbeddingArgs& a) { a.seq_len = 3; }), Error);  // 4 tokens are not whole sequences of 3
    EXPECT_THROW(fwd([](EmbeddingArgs& a) { a.dtype = DType::kBF16; }), Error);
    EXPECT_THROW(fwd([](EmbeddingArgs& a) { a.ids = nullptr; }), Error);
    EXPECT_THROW(fwd([](EmbeddingArgs& a) { a.table = nullptr; }), Error);
    EXPECT_THROW(fwd([](EmbeddingArgs& a) { a.out = nullptr; }), Error);
    EXPECT_THROW(fwd([&](EmbeddingArgs& a) { a.out = const_cast<float*>(table.data()); }), Error);
    try {
        fwd([](EmbeddingArgs& a) { a.seq_len = 3; });
        FAIL() << "expected an Error";
    } catch (const Error& err) {
        EXPECT_NE(std::string(err.what()).find("seq_len 3"), std::string::npos) << err.what();
    }
    auto bwd = [&](auto&& edit) {
        EmbeddingBackwardArgs a = e.backward_args(ids, grad_out, &grad_table, false, &grad_positions);
        edit(a);
        embedding_backward(a, *c.stream);
    };
    EXPECT_THROW(bwd([](EmbeddingBackwardArgs& a) { a.tokens = 3; }), Error);
    EXPECT_THROW(bwd([](EmbeddingBackwardArgs& a) { a.vocab = -2; }), Error);
    EXPECT_THROW(bwd([](EmbeddingBackwardArgs& a) { a.dtype = DType::kBF16; }), Error);
    EXPECT_THROW(bwd([](EmbeddingBackwardArgs& a) { a.grad_out = nullptr; }), Error);
    EXPECT_THROW(bwd([](EmbeddingBackwardArgs& a) { a.grad_table = a.grad_positions = nullptr; }), Error);
    EXPECT_THROW(bwd([](EmbeddingBackwardArgs& a) { a.grad_positions = a.grad_table; }), Error);
    EXPECT_THROW(bwd([&](EmbeddingBackwardArgs& a) { a.grad_table = grad_out.data(); }), Error);

    const Xent x{2, 3};
    const F logits(6, 0.0f);
    const I targets = {0, 2};
    F loss(2), grad(6);
    auto xent = [&](auto&& edit) {
        CrossEntropyArgs a = x.args(logits, targets, loss, grad.data());
        edit(a);
        cross_entropy(a, *c.stream);
    };
    EXPECT_THROW(xent([](CrossEntropyArgs& a) { a.tokens = 0; }), Error);
    EXPECT_THROW(xent([](CrossEntropyArgs& a) { a.vocab = 0; }), Error);
    EXPECT_THROW(xent([](CrossEntropyArgs& a) { a.dtype = DType::kBF16; }), Error);
    EXPECT_THROW(xent([](CrossEntropyArgs& a) { a.logits = nullptr; }), Error);
    EXPECT_THROW(xent([](CrossEntropyArgs& a) { a.targets = nullptr; }), Error);
    EXPECT_THROW(xent([](CrossEntropyArgs& a) { a.loss = nullptr; }), Error);
    EXPECT_THROW(xent([](CrossEntropyArgs& a) { a.grad_scale = kNaN; }), Error);
    EXPECT_THROW(xent([](CrossEntropyArgs& a) { a.loss = static_cast<float*>(a.grad_logits); }), Error);
    c.stream->synchronize();  // nothing was enqueued, nothing fails later
}

TEST(LmArgs, OutOfRangeIdsAndTargetsFailOnTheStream) {
    Cpu c;
    // The CPU ops validate every id before writing: the error names the token and its value, and
    // the outputs keep their old contents.
    auto expect_stream_error = [&](const char* what) {
        try {
            c.stream->synchronize();
            ADD_FAILURE() << "expected an Error containing \"" << what << "\"";
        } catch (const Error& err) {
            EXPECT_NE(std::string(err.what()).find(what), std::string::npos) << err.what();
        }
    };
    const Embed e{4, 2, 3, 2};
    const F table(6, 1.0f), positions(4, 1.0f), grad_out(8, 1.0f);
    F out(8, -7.0f), grad_table(6, -7.0f), grad_positions(4, -7.0f);
    const I too_big = {0, 1, 3, 0}, negative = {0, 1, 2, -1};
    embedding_forward(e.forward_args(too_big, table, &positions, out), *c.stream);
    expect_stream_error("ids[2] = 3");
    EXPECT_EQ(out, F(8, -7.0f));
    embedding_forward(e.forward_args(negative, table, nullptr, out), *c.stream);
    expect_stream_error("ids[3] = -1");
    embedding_backward(e.backward_args(too_big, grad_out, &grad_table, false, &grad_positions), *c.stream);
    expect_stream_error("ids[2] = 3");
    EXPECT_EQ(grad_table, F(6, -7.0f));
    EXPECT_EQ(grad_positions, F(4, -7.0f));

    const Xent x{3, 4};
    const F logits(12, 0.0f);
    const I bad_targets = {0, 4, 1};
    F loss(3, -7.0f), grad(12, -7.0f);
    cross_entropy(x.args(logits, bad_targets, loss, grad.data()), *c.stream);
    expect_stream_error("targets[1] = 4");
    EXPECT_EQ(loss, F(3, -7.0f));
    EXPECT_EQ(grad, F(12, -7.0f));
    // The stream works again once the error has been reported.
    EXPECT_NO_THROW(x.run(c, logits, I{0, 3, 1}, &grad));
}

}  // namespace
}  // namespace scmoe
