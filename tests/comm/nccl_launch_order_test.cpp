// NCCL_LAUNCH_ORDER_IMPLICIT (scmoe/comm/detail/nccl_launch_order.h): turned on where NCCL has it
// (>= 2.26), never over the user's own setting, never for releases that lack it.
#include "scmoe/comm/detail/nccl_launch_order.h"

#include <gtest/gtest.h>

#include <string>

namespace scmoe {
namespace {

using comm_detail::nccl_launch_order_implicit_value;

TEST(NcclLaunchOrder, OnFromNccl226UnlessTheUserSetIt) {
    EXPECT_EQ(nccl_launch_order_implicit_value(22505, nullptr), nullptr) << "2.25.5 has no such variable";
    EXPECT_EQ(nccl_launch_order_implicit_value(22599, nullptr), nullptr);
    ASSERT_NE(nccl_launch_order_implicit_value(22600, nullptr), nullptr);
    EXPECT_EQ(std::string(nccl_launch_order_implicit_value(22600, nullptr)), "1");
    EXPECT_EQ(std::string(nccl_launch_order_implicit_value(22803, nullptr)), "1") << "2.28.3 (this toolkit's)";
    EXPECT_EQ(std::string(nccl_launch_order_implicit_value(30000, nullptr)), "1");
    // The user's value, whatever it is, stays.
    EXPECT_EQ(nccl_launch_order_implicit_value(22803, "0"), nullptr);
    EXPECT_EQ(nccl_launch_order_implicit_value(22803, ""), nullptr);
    EXPECT_EQ(nccl_launch_order_implicit_value(22803, "1"), nullptr);
}

}  // namespace
}  // namespace scmoe
