#include "scmoe/kernels/embedding.h"

#include "scmoe/kernels/error.h"

namespace scmoe {
namespace {

void check_common(const char* op, std::int64_t tokens, std::int64_t hidden, std::int64_t vocab, std::int64_t seq_len,
                  DType dtype, Backend backend) {
    SCMOE_CHECK(tokens > 0 && hidden > 0 && vocab > 0 && seq_len > 0,
                op << ": tokens, hidden, vocab and seq_len must be positive, got tokens=" << tokens
                   << " hidden=" << hidden << " vocab=" << vocab << " seq_len=" << seq_len);
    SCMOE_CHECK(tokens % seq_len == 0,
                op << ": tokens (" << tokens << ") must be a whole number of sequences of seq_len " << seq_len);
    SCMOE_CHECK(dtype == DType::kF32 || (dtype == DType::kBF16 && backend != Backend::kCpu),
                op << ": dtype " << dtype_name(dtype) << " not supported on " << backend_name(backend)
                   << " (CPU: f32; CUDA: f32 or bf16)");
}

}  // namespace

void check_embedding_args(const EmbeddingArgs& a, Backend backend) {
    check_common("embedding_forward", a.tokens, a.hidden, a.vocab, a.seq_len, a.dtype, backend);
    SCMOE_CHECK(a.ids && a.table && a.out, "embedding_forward: ids, table and out must not be null");
    SCMOE_CHECK(a.out != a.table && a.out != a.positions, "embedding_forward: out must not alias table or positions");
}

void check_embedding_backward_args(const EmbeddingBackwardArgs& a, Backend backend) {
    check_common("embedding_backward", a.tokens, a.hidden, a.vocab, a.seq_len, a.dtype, backend);
    SCMOE_CHECK(a.ids && a.grad_out, "embedding_backward: ids and grad_out must not be null");
    // A call that computes nothing is a caller bug (a gradient buffer left unset), not a no-op.
    SCMOE_CHECK(a.grad_table || a.grad_positions, "embedding_backward: grad_table and grad_positions are both null");
    SCMOE_CHECK(a.grad_table != a.grad_positions, "embedding_backward: grad_table must not alias grad_positions");
    SCMOE_CHECK(a.grad_out != static_cast<const void*>(a.grad_table) &&
                    a.grad_out != static_cast<const void*>(a.grad_positions),
                "embedding_backward: grad_table and grad_positions must not alias grad_out");
}

}  // namespace scmoe
