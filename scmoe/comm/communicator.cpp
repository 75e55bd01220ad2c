#include "scmoe/comm/communicator.h"

#include <cmath>
#include <cstdlib>
#include <sstream>
#include <vector>

#include "scmoe/comm/detail/collective_util.h"
#include "scmoe/kernels/error.h"
#include "scmoe/kernels/math.h"

namespace scmoe {
namespace {

double parse_timeout() {
    const char* text = std::getenv("SCMOE_COMM_TIMEOUT_S");
    if (text == nullptr || *text == '\0') return 300.0;
    char* end = nullptr;
    double value = std::strtod(text, &end);
    SCMOE_CHECK(end != text && *end == '\0' && std::isfinite(value) && value > 0.0,
                "SCMOE_COMM_TIMEOUT_S='" << text << "' is not a positive number of seconds");
    return value;
}

template <class T>
void all_reduce_sum_host(Communicator& comm, T* values, std::int64_t count, DType dtype, void* scratch, Stream& stream) {
    const auto bytes = static_cast<std::size_t>(count) * sizeof(T);
    stream.copy(scratch, values, bytes);
    comm.all_reduce_sum(scratch, count, dtype, stream);
    stream.copy(values, scratch, bytes);
    stream.synchronize();
}

}  // namespace

void all_reduce_sum_host(Communicator& comm, float* values, std::int64_t count, void* scratch, Stream& stream) {
    all_reduce_sum_host(comm, values, count, DType::kF32, scratch, stream);
}

void all_reduce_sum_host(Communicator& comm, std::int32_t* values, std::int64_t count, void* scratch, Stream& stream) {
    all_reduce_sum_host(comm, values, count, DType::kI32, scratch, stream);
}

double comm_timeout_seconds() {
    static const double timeout_s = parse_timeout();
    return timeout_s;
}

namespace comm_detail {

void check_known_counts(int rank, int size, const std::int64_t* expected, const std::int64_t* received) {
    for (int p = 0; p < size; ++p)
        SCMOE_CHECK(expected[p] == received[p],
                    "rank " << rank << ": all_to_all_v_known: rank " << p << " sends " << received[p]
                            << " elements, this rank was told to receive " << expected[p]
                            << " (the receive counts do not match the exchange)");
}

const char* comm_op_name(CommOp op) {
    switch (op) {
        case CommOp::kAllToAllV:
            return "all_to_all_v";
        case CommOp::kAllReduceSum:
            return "all_reduce_sum";
        case CommOp::kAllGather:
            return "all_gather";
        case CommOp::kBroadcast:
            return "broadcast";
        case CommOp::kBarrier:
            return "barrier";
        case CommOp::kAllToAllVKnown:
            return "all_to_all_v_known";
    }
    return "?";
}

void sum_in_rank_order(const void* const* inputs, int num_inputs, void* out, std::int64_t count, DType dtype) {
    SCMOE_CHECK(num_inputs > 0, "sum of no contributions");
    switch (dtype) {
        case DType::kF32: {
            auto* o = static_cast<float*>(out);
            for (std::int64_t i = 0; i < count; ++i) o[i] = static_cast<const float*>(inputs[0])[i];
            for (int r = 1; r < num_inputs; ++r) {
                const auto* in = static_cast<const float*>(inputs[r]);
                for (std::int64_t i = 0; i < count; ++i) o[i] += in[i];
            }
            break;
        }
        case DType::kBF16: {
            std::vector<float> acc(static_cast<std::size_t>(count), 0.0f);
            for (int r = 0; r < num_inputs; ++r) {
                const auto* in = static_cast<const std::uint16_t*>(inputs[r]);
                for (std::int64_t i = 0; i < count; ++i)
                    acc[static_cast<std::size_t>(i)] += math::bf16_bits_to_f32(in[i]);
            }
            auto* o = static_cast<std::uint16_t*>(out);
            for (std::int64_t i = 0; i < count; ++i) o[i] = math::f32_to_bf16_bits(acc[static_cast<std::size_t>(i)]);
            break;
        }
        case DType::kI32: {
            // Unsigned adds wrap instead of overflowing into undefined behaviour.
            std::vector<std::uint32_t> acc(static_cast<std::size_t>(count), 0u);
            for (int r = 0; r < num_inputs; ++r) {
                const auto* in = static_cast<const std::int32_t*>(inputs[r]);
                for (std::int64_t i = 0; i < count; ++i)
                    acc[static_cast<std::size_t>(i)] += static_cast<std::uint32_t>(in[i]);
            }
            auto* o = static_cast<std::int32_t*>(out);
            for (std::int64_t i = 0; i < count; ++i) o[i] = static_cast<std::int32_t>(acc[static_cast<std::size_t>(i)]);
            break;
        }
    }
}

std::size_t checked_bytes(std::int64_t count, DType dtype, const char* what) {
    SCMOE_CHECK(count >= 0, what << " = " << count << " is negative");
    return static_cast<std::size_t>(count) * dtype_size(dtype);
}

std::string format_seconds(double seconds) {
    std::ostringstream os;
    os << seconds;
    return os.str();
}

std::string timeout_message(int rank, CommOp op, double timeout_s, const std::vector<int>& peers) {
    std::string who = peers.size() == 1 ? "rank " : "ranks ";
    for (std::size_t i = 0; i < peers.size(); ++i) who += (i > 0 ? ", " : "") + std::to_string(peers[i]);
    return "rank " + std::to_string(rank) + ": " + comm_op_name(op) + " timed out after " + format_seconds(timeout_s) +
           " s waiting for " + who + " (SCMOE_COMM_TIMEOUT_S)";
}

}  // namespace comm_detail
}  // namespace scmoe
