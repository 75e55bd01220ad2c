// R, the SMs compute leaves free for an exchange (scmoe/comm/comm_sms.h): where it comes from, in order,
// and what is refused.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "scmoe/comm/comm_sms.h"
#include "scmoe/comm/emu_communicator.h"
#include "scmoe/comm/emulated_link.h"
#include "scmoe/comm/local_communicator.h"
#include "scmoe/comm/topology.h"
#include "scmoe/kernels/error.h"

namespace scmoe {
namespace {

using Env = std::map<std::string, std::string>;

CommSms resolve(const Env& env, int kernel_sms = -1) {
    return resolve_comm_sms(
        [&env](const char* name) {
            auto it = env.find(name);
            return it == env.end() ? static_cast<const char*>(nullptr) : it->second.c_str();
        },
        kernel_sms);
}

TEST(CommSms, DefaultsToNcclsDocumentedMaxCtas) {
    const CommSms r = resolve({});
    EXPECT_EQ(r.sms, 32);
    EXPECT_EQ(r.sms, kNcclDefaultMaxCtas);
    EXPECT_EQ(r.source, "NCCL's default maxCTAs");
}

TEST(CommSms, ScmoeCommSmsWinsOverEverythingAndZeroReservesNothing) {
    EXPECT_EQ(resolve({{"SCMOE_COMM_SMS", "12"}, {"NCCL_MAX_NCHANNELS", "4"}}, 16).sms, 12);
    EXPECT_EQ(resolve({{"SCMOE_COMM_SMS", "12"}}).source, "SCMOE_COMM_SMS");
    EXPECT_EQ(resolve({{"SCMOE_COMM_SMS", "0"}}, 16).sms, 0);
    EXPECT_EQ(resolve({{"SCMOE_COMM_SMS", "auto"}}, 16).sms, 16) << "auto: as unset";
    EXPECT_EQ(resolve({{"SCMOE_COMM_SMS", ""}}).sms, 32) << "empty: as unset";
}

TEST(CommSms, TheCommunicatorsOwnCountComesBeforeNcclsSettings) {
    const CommSms r = resolve({{"NCCL_MAX_NCHANNELS", "4"}}, 16);
    EXPECT_EQ(r.sms, 16);
    EXPECT_EQ(r.source, "the communicator's own count");
    EXPECT_EQ(resolve({}, 0).sms, 0) << "a communicator that uses no SMs needs none kept";
    EXPECT_EQ(resolve({}, -1).sms, 32) << "-1: not known";
}

TEST(CommSms, NcclsMaximaCapItTheSmallestWinsAndItsMinimaRaiseIt) {
    EXPECT_EQ(resolve({{"NCCL_MAX_NCHANNELS", "8"}}).sms, 8);
    EXPECT_EQ(resolve({{"NCCL_MAX_NCHANNELS", "8"}}).source, "NCCL_MAX_NCHANNELS");
    EXPECT_EQ(resolve({{"NCCL_MAX_P2P_NCHANNELS", "4"}, {"NCCL_MAX_NCHANNELS", "8"}}).sms, 4);
    EXPECT_EQ(resolve({{"NCCL_MAX_CTAS", "24"}, {"NCCL_MAX_NCHANNELS", "40"}}).sms, 24);
    EXPECT_EQ(resolve({{"NCCL_MAX_NCHANNELS", "64"}}).sms, 64) << "a maximum above the default is the count";
    EXPECT_EQ(resolve({{"NCCL_MIN_NCHANNELS", "40"}}).sms, 40);
    EXPECT_EQ(resolve({{"NCCL_MIN_NCHANNELS", "40"}}).source, "NCCL_MIN_NCHANNELS");
    EXPECT_EQ(resolve({{"NCCL_MIN_CTAS", "4"}}).sms, 32) << "a minimum below the default changes nothing";
    EXPECT_EQ(resolve({{"NCCL_MAX_NCHANNELS", "8"}, {"NCCL_MIN_CTAS", "12"}}).sms, 12);
}

TEST(CommSms, AValueThatIsNoCountIsRefusedNamingTheVariable) {
    for (const auto& [name, value] : std::map<std::string, std::string>{{"SCMOE_COMM_SMS", "-1"},
                                                                        {"SCMOE_COMM_SMS", "many"},
                                                                        {"NCCL_MAX_NCHANNELS", "0"},
                                                                        {"NCCL_MIN_CTAS", "8x"}}) {
        try {
            resolve({{name, value}});
            ADD_FAILURE() << name << "=" << value << " was accepted";
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
        }
    }
}

// Communicator::kernel_sms: the emulated NCCL knows its channels (its topology's comm_sms; none on
// a link: cluster); the in-process communicator uses no SMs (0); an EmulatedLink's hold kernel one.
TEST(CommSms, CommunicatorsSayWhatTheirCollectivesOccupy) {
    auto emu = EmuGroup::create(cluster_topology("h100-nvlink-8"), {0, 1});
    EXPECT_EQ(emu->communicator(0)->kernel_sms(), 32);
    auto a800 = EmuGroup::create(cluster_topology("a800-nvlink-8"), {0, 1});
    EXPECT_EQ(a800->communicator(1)->kernel_sms(), 16);
    auto link = EmuGroup::create(cluster_topology("link:gbyte_s=1,gpus=2"), {0, 1});
    EXPECT_EQ(link->communicator(0)->kernel_sms(), 0);
    auto local = LocalGroup::create(2);
    auto local0 = local->communicator(0);
    EXPECT_EQ(local0->kernel_sms(), 0);
    EmulatedLink wrapped(*local0, LinkModel{"test", 1.0, 0.0});
    EXPECT_EQ(wrapped.kernel_sms(), 1);
}

}  // namespace
}  // namespace scmoe
