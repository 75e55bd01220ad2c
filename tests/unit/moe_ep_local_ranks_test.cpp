// Expert parallelism with in-process ranks (LocalCommunicator, one thread per rank): the
// distributed layer's output, dropped-token count and every gradient equal the single-rank layer
// run on each rank's tokens (fp32, relative 1e-5), for ep = 2 and 4, dp x ep = 2 x 2, top-1 and
// top-2, capacity and dropless, a rank with zero tokens, skewed token counts.
#include <gtest/gtest.h>

#include <chrono>
#include <exception>
#include <thread>

#include "scmoe/comm/local_communicator.h"
#include "scmoe/kernels/layout.h"
#include "ep_reference.h"

namespace scmoe {
namespace {

using testing::EpCase;

constexpr double kTol = 1e-5;

class MoeEpLocalRanks : public ::testing::TestWithParam<EpCase> {};

TEST_P(MoeEpLocalRanks, EqualsSingleRankLayer) {
    const EpCase& c = GetParam();
    const int world = c.dp * c.ep;
    ASSERT_EQ(static_cast<int>(c.tokens.size()), world);
    std::vector<testing::RankReference> refs;
    for (int w = 0; w < world; ++w) refs.push_back(testing::single_rank_reference(c, w));

    std::vector<std::shared_ptr<LocalGroup>> groups;
    for (int d = 0; d < c.dp; ++d) groups.push_back(LocalGroup::create(c.ep, 60.0));
    std::vector<std::string> errors(static_cast<std::size_t>(world));
    std::vector<std::thread> threads;
    for (int w = 0; w < world; ++w) {
        threads.emplace_back([&, w] {
            try {
                auto comm = groups[static_cast<std::size_t>(w / c.ep)]->communicator(w % c.ep);
                errors[static_cast<std::size_t>(w)] = testing::run_ep_rank(c, w, *comm, refs, kTol);
            } catch (const std::exception& e) {
                errors[static_cast<std::size_t>(w)] = std::string("world rank ") + std::to_string(w) + " threw: " + e.what();
            }
        });
    }
    for (auto& t : threads) t.join();
    for (const std::string& e : errors) EXPECT_EQ(e, "");
}

const auto kCap = DispatchMode::kCapacity;
const auto kDropless = DispatchMode::kDropless;

INSTANTIATE_TEST_SUITE_P(
    Cpu, MoeEpLocalRanks,
    ::testing::Values(EpCase{"ep2_top1_capacity", 1, 2, 1, kCap, {12, 12}, false},
                      EpCase{"ep2_top2_dropless", 1, 2, 2, kDropless, {12, 9}, false},
                      EpCase{"ep2_top2_capacity_shared", 1, 2, 2, kCap, {10, 10}, true},
                      EpCase{"ep4_top2_capacity", 1, 4, 2, kCap, {8, 8, 8, 8}, false},
                      EpCase{"ep4_top1_dropless_zero_token_rank", 1, 4, 1, kDropless, {9, 0, 5, 13}, false},
                      EpCase{"ep4_top2_capacity_uneven", 1, 4, 2, kCap, {16, 3, 0, 7}, true},
                      EpCase{"dp2_ep2_top2_dropless", 2, 2, 2, kDropless, {6, 11, 8, 4}, false},
                      EpCase{"dp2_ep2_top1_capacity", 2, 2, 1, kCap, {10, 10, 10, 10}, true},
                      EpCase{"ep2_top3_capacity_shared", 1, 2, 3, kCap, {12, 9}, true},
                      EpCase{"ep4_top3_dropless_zero_token_rank", 1, 4, 3, kDropless, {9, 0, 5, 13}, false},
                      EpCase{"ep4_top3_capacity_uneven", 1, 4, 3, kCap, {16, 3, 0, 7}, false}),
    [](const ::testing::TestParamInfo<EpCase>& param_info) { return param_info.param.name; });

TEST(MoeEpLocalRanks, MismatchedConfigGivesTheSameErrorOnEveryRank) {
    auto group = LocalGroup::create(2, 30.0);
    std::vector<std::string> errors(2);
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; ++r) {
        threads.emplace_back([&, r] {
            MoeConfig c = testing::ep_config(EpCase{});
            if (r == 1) c.ffn = 16;  // rank 1 disagrees
            auto comm = group->communicator(r);
            auto device = make_device("cpu");
            try {
                MoeLayer layer(c, *device, 8, comm.get());
            } catch (const Error& e) {
                errors[static_cast<std::size_t>(r)] = e.what();
            }
        });
    }
    for (auto& t : threads) t.join();
    for (const std::string& e : errors) EXPECT_NE(e.find("MoeConfig differs across the 2 expert-parallel ranks"), std::string::npos) << e;
    // Same table of hashes on both ranks.
    auto table = [](const std::string& e) { return e.substr(0, e.find("this is rank")); };
    EXPECT_EQ(table(errors[0]), table(errors[1]));
}

TEST(MoeEpLocalRanks, ExpertsNotDivisibleByEpIsRejected) {
    auto group = LocalGroup::create(3, 5.0);
    MoeConfig c = testing::ep_config(EpCase{});  // 8 experts
    auto comm = group->communicator(0);
    auto device = make_device("cpu");
    try {
        MoeLayer layer(c, *device, 8, comm.get());
        FAIL() << "8 experts over 3 ranks accepted";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("not divisible by the expert-parallel size 3"), std::string::npos) << e.what();
    }
}

// Hand-checkable routing table: rank r's token i goes to expert (r*T + i) mod E (second choice: the
// next expert) and holds the value r*1000 + i + h/16 in column h, so every received row names its
// source and token. Each rank's expert-side rows must be exactly: per local expert, per source rank
// in rank order, that source's first choices in token order then its second choices (GShard
// priority); in capacity mode cut at, and padded with zero rows to, that source's capacity.
struct TableCase {
    const char* name;
    int ep, top_k;
    DispatchMode dispatch;
    std::int64_t tokens;
};

class MoeEpRoutingTable : public ::testing::TestWithParam<TableCase> {};

TEST_P(MoeEpRoutingTable, ReceivedRowsMatchTheTable) {
    const TableCase tc = GetParam();
    MoeConfig config = testing::ep_config(EpCase{"", 1, tc.ep, tc.top_k, tc.dispatch, {}, false});
    const int E = config.num_experts, El = E / tc.ep, K = tc.top_k;
    const std::int64_t T = tc.tokens, H = config.hidden;
    auto value = [](int r, std::int64_t i, std::int64_t h) { return static_cast<float>(r * 1000 + i) + static_cast<float>(h) / 16.0f; };
    auto expert_of = [&](int r, std::int64_t i, int j) { return static_cast<int>((r * T + i + j) % E); };
    const std::int64_t C = tc.dispatch == DispatchMode::kCapacity
                               ? expert_capacity(T, E, K, config.capacity_factor)
                               : T * K;  // dropless: no limit

    auto group = LocalGroup::create(tc.ep, 60.0);
    std::vector<std::string> errors(static_cast<std::size_t>(tc.ep));
    std::vector<std::thread> threads;
    for (int r = 0; r < tc.ep; ++r) {
        threads.emplace_back([&, r] {
            try {
                auto comm = group->communicator(r);
                auto device = make_device("cpu");
                auto stream = device->create_stream();
                MoeLayer layer(config, *device, T, comm.get());
                MoeParamStore params(*device, config, DType::kF32, tc.ep);
                testing::fill_uniform(static_cast<float*>(params.data()), params.numel(), 0.5f, 5);
                std::vector<float> x(static_cast<std::size_t>(T * H)), y(x.size());
                for (std::int64_t i = 0; i < T; ++i)
                    for (std::int64_t h = 0; h < H; ++h) x[static_cast<std::size_t>(i * H + h)] = value(r, i, h);
                std::vector<std::int32_t> index;
                std::vector<float> weight;
                for (std::int64_t i = 0; i < T; ++i)
                    for (int j = 0; j < K; ++j) {
                        index.push_back(expert_of(r, i, j));
                        weight.push_back(1.0f / static_cast<float>(K));
                    }
                layer.force_routing(index, weight);
                layer.forward(testing::host_tensor(x, T, H), Tensor(), params.view(), testing::host_tensor(y, T, H),
                              *stream);
                const MoeExpertInputs got = layer.expert_inputs(*stream);
                std::string& err = errors[static_cast<std::size_t>(r)];
                for (int e = 0; e < El && err.empty(); ++e) {
                    const int g = r * El + e;
                    std::vector<float> want;
                    for (int s = 0; s < tc.ep; ++s) {
                        std::int64_t taken = 0;
                        for (int j = 0; j < K; ++j)
                            for (std::int64_t i = 0; i < T; ++i)
                                if (expert_of(s, i, j) == g && taken++ < C)
                                    for (std::int64_t h = 0; h < H; ++h) want.push_back(value(s, i, h));
                        // Capacity mode moves fixed-size slots: a source's unused slots arrive as zero rows.
                        if (tc.dispatch == DispatchMode::kCapacity)
                            for (; taken < C; ++taken) want.insert(want.end(), static_cast<std::size_t>(H), 0.0f);
                    }
                    const std::vector<float>& rows = got.rows[static_cast<std::size_t>(e)];
                    if (rows.size() != want.size()) {
                        err = "rank " + std::to_string(r) + " expert " + std::to_string(g) + ": " +
                              std::to_string(rows.size() / static_cast<std::size_t>(H)) + " rows, want " +
                              std::to_string(want.size() / static_cast<std::size_t>(H));
                        break;
                    }
                    for (std::size_t k = 0; k < want.size(); ++k)
                        if (rows[k] != want[k]) {
                            err = "rank " + std::to_string(r) + " expert " + std::to_string(g) + " element " +
                                  std::to_string(k) + ": " + std::to_string(rows[k]) + ", want " +
                                  std::to_string(want[k]);
                            break;
                        }
                }
            } catch (const std::exception& e) {
                errors[static_cast<std::size_t>(r)] = std::string("rank ") + std::to_string(r) + " threw: " + e.what();
            }
        });
    }
    for (auto& t : threads) t.join();
    for (const std::string& e : errors) EXPECT_EQ(e, "");
}

INSTANTIATE_TEST_SUITE_P(Cpu, MoeEpRoutingTable,
                         ::testing::Values(TableCase{"ep2_top1_dropless", 2, 1, kDropless, 12},
                                           TableCase{"ep2_top2_capacity_drops", 2, 2, kCap, 12},
                                           TableCase{"ep4_top2_dropless", 4, 2, kDropless, 10},
                                           TableCase{"ep4_top1_capacity", 4, 1, kCap, 8},
                                           TableCase{"ep2_top3_capacity_drops", 2, 3, kCap, 12},
                                           TableCase{"ep4_top3_dropless", 4, 3, kDropless, 10}),
                         [](const ::testing::TestParamInfo<TableCase>& p) { return std::string(p.param.name); });

struct ToOneRank {
    std::vector<std::size_t> received;  // elements each rank's first local expert received
    std::vector<std::string> errors;
};

// Every token of every rank chooses expert 0 (owned by rank 0), dropless, 2 ranks of 7 tokens, top-1:
// rank 0 receives 14 rows, rank 1 none. recv_limit_factor: the receive limit (MoeConfig).
ToOneRank all_tokens_to_rank0(float recv_limit_factor, double timeout_s) {
    const int ep = 2;
    MoeConfig config = testing::ep_config(EpCase{"", 1, ep, 1, kDropless, {}, false});
    config.recv_limit_factor = recv_limit_factor;
    const std::int64_t T = 7, H = config.hidden;
    auto group = LocalGroup::create(ep, timeout_s);
    ToOneRank out{std::vector<std::size_t>(ep), std::vector<std::string>(ep)};
    std::vector<std::thread> threads;
    for (int r = 0; r < ep; ++r) {
        threads.emplace_back([&, r] {
            try {
                auto comm = group->communicator(r);
                auto device = make_device("cpu");
                auto stream = device->create_stream();
                MoeLayer layer(config, *device, T, comm.get());
                MoeParamStore params(*device, config, DType::kF32, ep);
                testing::fill_uniform(static_cast<float*>(params.data()), params.numel(), 0.5f, 5);
                std::vector<float> x(static_cast<std::size_t>(T * H), 1.0f), y(x.size());
                layer.force_routing(std::vector<std::int32_t>(static_cast<std::size_t>(T), 0),
                                    std::vector<float>(static_cast<std::size_t>(T), 1.0f));
                layer.forward(testing::host_tensor(x, T, H), Tensor(), params.view(), testing::host_tensor(y, T, H),
                              *stream);
                out.received[static_cast<std::size_t>(r)] = layer.expert_inputs(*stream).rows[0].size();
            } catch (const std::exception& e) {
                out.errors[static_cast<std::size_t>(r)] = e.what();
            }
        });
    }
    for (auto& t : threads) t.join();
    return out;
}

TEST(MoeEpLocalRanks, AllTokensToOneRankAreReceivedThere) {
    const std::int64_t H = testing::ep_config(EpCase{"", 1, 2, 1, kDropless, {}, false}).hidden;
    for (float limit : {0.0f, 2.0f}) {  // no limit; the default (2 x 7 rows = all 14)
        const ToOneRank r = all_tokens_to_rank0(limit, 60.0);
        for (const std::string& e : r.errors) EXPECT_EQ(e, "") << "limit " << limit;
        EXPECT_EQ(r.received[0], static_cast<std::size_t>(2 * 7 * H));
        EXPECT_EQ(r.received[1], 0u);
    }
}

// A receive limit of 1 x the balanced load (7 rows): rank 0 fails before any data moves, naming
// itself, its experts' counts and the limit; rank 1, whose data exchange rank 0 never joins, times
// out naming rank 0.
TEST(MoeEpLocalRanks, ReceiveLimitExceededIsNamedBeforeAnyDataMoves) {
    const ToOneRank r = all_tokens_to_rank0(1.0f, 2.0);
    EXPECT_NE(r.errors[0].find("rank 0 receives 14 rows for its experts (expert 0: 14, expert 1: 0, expert 2: 0, expert 3: 0), more than the 7"),
              std::string::npos)
        << r.errors[0];
    EXPECT_NE(r.errors[0].find("recv_limit_factor 1 x max_tokens 7 x top_k 1"), std::string::npos) << r.errors[0];
    EXPECT_NE(r.errors[1].find("rank 0"), std::string::npos) << r.errors[1];
}

// The receive limit sizes the dropless expert side: below the unlimited workspace, equal to it once
// the limit reaches ep (every assignment of every rank), and capacity mode does not depend on it.
MoeConfig dropless_top2(std::int64_t hidden, std::int64_t ffn, DType dtype) {
    MoeConfig c;
    c.hidden = hidden;
    c.ffn = ffn;
    c.num_experts = 8;
    c.top_k = 2;
    c.dtype = dtype;
    c.dispatch = DispatchMode::kDropless;
    return c;
}

TEST(MoeWorkspace, ReceiveLimitBoundsTheDroplessExpertSide) {
    const MoeConfig c = dropless_top2(64, 128, DType::kF32);
    const std::int64_t T = 256;
    const int ep = 8;
    auto bytes = [&](float factor, DispatchMode d) {
        MoeConfig k = c;
        k.recv_limit_factor = factor;
        k.dispatch = d;
        return MoeLayer::workspace_bytes(k, T, ep);
    };
    EXPECT_LT(bytes(2.0f, kDropless), bytes(0.0f, kDropless));
    EXPECT_EQ(bytes(8.0f, kDropless), bytes(0.0f, kDropless));
    EXPECT_LT(bytes(2.0f, kDropless), bytes(4.0f, kDropless));
    EXPECT_EQ(bytes(2.0f, DispatchMode::kCapacity), bytes(0.0f, DispatchMode::kCapacity));
    // The review's shape (C1): hidden 4096, ffn 14336, 8 experts top-2, bf16, 16384 tokens, ep 8.
    const MoeConfig big = dropless_top2(4096, 14336, DType::kBF16);
    MoeConfig unlimited = big;
    unlimited.recv_limit_factor = 0.0f;
    const double gib = 1024.0 * 1024.0 * 1024.0;
    const double before = static_cast<double>(MoeLayer::workspace_bytes(unlimited, 16384, 8)) / gib;
    const double after = static_cast<double>(MoeLayer::workspace_bytes(big, 16384, 8)) / gib;
    std::printf("workspace per layer at hidden 4096, ffn 14336, 16384 tokens, ep 8, dropless, bf16: %.2f GiB "
                "without a receive limit, %.2f GiB with the default (2x); 32 layers: %.1f vs %.1f GiB\n",
                before, after, 32 * before, 32 * after);
    EXPECT_LT(after, before);
}

// The shareable scratch (the backward's gradients, the exchanges' staging) is a part of the
// workspace: kept + scratch = the whole, on one rank and with expert parallelism. A layer given a
// shared scratch needs only the kept part, and one too small is refused. At the review's shape, a
// 32-layer model holds one scratch instead of 32.
TEST(MoeWorkspace, SharedScratchIsTheWorkspaceMinusWhatTheLayerKeeps) {
    for (const int ep : {1, 8})
        for (const DispatchMode d : {DispatchMode::kCapacity, kDropless}) {
            MoeConfig c = dropless_top2(64, 128, DType::kF32);
            c.dispatch = d;
            c.shared_expert = true;
            c.coefficient_gate = true;
            const std::size_t whole = MoeLayer::workspace_bytes(c, 256, ep);
            const std::size_t kept = MoeLayer::workspace_bytes(c, 256, ep, true);
            const std::size_t scratch = MoeLayer::scratch_bytes(c, 256, ep);
            EXPECT_EQ(kept + scratch, whole) << "ep " << ep;
            EXPECT_GT(scratch, 0u);
            EXPECT_LT(kept, whole);
        }
    auto device = make_device("cpu");
    const MoeConfig c = testing::ep_config(EpCase{});
    DeviceBuffer small(*device, MoeLayer::scratch_bytes(c, 4) - 256);
    try {
        MoeLayer layer(c, *device, 4, nullptr, nullptr, 0, small.data(), small.bytes());
        ADD_FAILURE() << "a scratch too small was accepted";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("scratch_bytes()"), std::string::npos) << e.what();
    }

    const MoeConfig big = dropless_top2(4096, 14336, DType::kBF16);  // default receive limit (2x)
    const double gib = 1024.0 * 1024.0 * 1024.0;
    const double whole = static_cast<double>(MoeLayer::workspace_bytes(big, 16384, 8)) / gib;
    const double kept = static_cast<double>(MoeLayer::workspace_bytes(big, 16384, 8, true)) / gib;
    const double scratch = static_cast<double>(MoeLayer::scratch_bytes(big, 16384, 8)) / gib;
    std::printf("workspace per layer at hidden 4096, ffn 14336, 16384 tokens, ep 8, dropless, bf16, receive limit 2x: "
                "%.2f GiB alone, %.2f GiB with a shared scratch of %.2f GiB; 32 layers: %.1f GiB vs %.1f GiB\n",
                whole, kept, scratch, 32 * whole, 32 * kept + scratch);
    EXPECT_LT(32 * kept + scratch, 32 * whole);
}

TEST(MoeEpLocalRanks, ForcedRoutingRejectsBadTables) {
    auto device = make_device("cpu");
    MoeConfig config = testing::ep_config(EpCase{});
    MoeLayer layer(config, *device, 4);
    auto expect_error = [&](std::vector<std::int32_t> index, std::vector<float> weight, const char* what) {
        try {
            layer.force_routing(std::move(index), std::move(weight));
            ADD_FAILURE() << "accepted: " << what;
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
        }
    };
    expect_error({0, 9}, {1, 1}, "names expert 9 of 8");
    expect_error({3, 3}, {1, 1}, "chooses expert 3 twice");
    expect_error({0, 1, 2}, {1, 1, 1}, "not a multiple of top_k");
    expect_error({0, 1}, {1}, "2 expert indices but 1 gate weights");
    // Top-3: a token's third choice repeating its first (not only its second) is refused too.
    MoeLayer top3(testing::ep_config(EpCase{"", 1, 2, 3, kCap, {}, false}), *device, 4);
    try {
        top3.force_routing({0, 1, 2, 4, 5, 4}, {1, 1, 1, 1, 1, 1});
        ADD_FAILURE() << "accepted token 1 choosing expert 4 twice";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("token 1 chooses expert 4 twice"), std::string::npos) << e.what();
    }
    EXPECT_NO_THROW(top3.force_routing({0, 1, 2, 4, 5, 6}, {1, 1, 1, 1, 1, 1}));
}

// A rank that stops taking part in the middle of the layer (after the count exchange of dispatch,
// before the rows): the others fail with the communicator's timeout naming the missing rank, never hang.
TEST(MoeEpLocalRanks, RankLeavingMidLayerGivesATimeoutError) {
    const int ep = 2;
    MoeConfig config = testing::ep_config(EpCase{"", 1, ep, 2, kDropless, {}, false});
    const std::int64_t T = 6, H = config.hidden;
    auto group = LocalGroup::create(ep, 2.0);
    std::string error;
    double waited_s = 0;
    std::vector<std::thread> threads;
    for (int r = 0; r < ep; ++r) {
        threads.emplace_back([&, r] {
            auto comm = group->communicator(r);
            auto device = make_device("cpu");
            auto stream = device->create_stream();
            MoeLayer layer(config, *device, T, comm.get());
            if (r == 1) return;  // leaves after construction: never joins the layer's all-to-alls
            MoeParamStore params(*device, config, DType::kF32, ep);
            testing::fill_uniform(static_cast<float*>(params.data()), params.numel(), 0.5f, 5);
            std::vector<float> x(static_cast<std::size_t>(T * H), 0.5f), y(x.size());
            const auto start = std::chrono::steady_clock::now();
            try {
                layer.forward(testing::host_tensor(x, T, H), Tensor(), params.view(), testing::host_tensor(y, T, H),
                              *stream);
                stream->synchronize();
            } catch (const Error& e) {
                error = e.what();
            }
            waited_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        });
    }
    for (auto& t : threads) t.join();
    EXPECT_NE(error.find("timed out after 2 s waiting for rank 1"), std::string::npos) << error;
    EXPECT_GE(waited_s, 2.0) << "a timeout never fires early";  // how late depends on the load
}

}  // namespace
}  // namespace scmoe
