#include "scmoe/kernels/router.h"

#include "scmoe/kernels/error.h"

namespace scmoe {

void check_router_top_k(const char* what, int top_k, int num_experts) {
    SCMOE_CHECK(top_k >= 1 && top_k <= kMaxTopK,
                what << ": top_k = " << top_k << " outside [1, " << kMaxTopK
                     << "] (kMaxTopK: the router kernels hold a token's choices in registers)");
    SCMOE_CHECK(top_k <= num_experts, what << ": top_k = " << top_k << " exceeds num_experts = " << num_experts
                                           << " (a token's choices are distinct experts)");
}

}  // namespace scmoe
