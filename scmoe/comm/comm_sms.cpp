#include "scmoe/comm/comm_sms.h"

#include <algorithm>
#include <cstdlib>
#include <string>
#include <string_view>

#include "scmoe/comm/communicator.h"
#include "scmoe/kernels/error.h"

namespace scmoe {
namespace {

// The integer value of `name` (at least `least`), or -1 when it is unset (or "auto" for SCMOE_COMM_SMS).
int read_count(const std::function<const char*(const char*)>& env, const char* name, int least) {
    const char* v = env(name);
    if (v == nullptr || *v == 0) return -1;
    const std::string_view text = v;
    if (text == "auto" && std::string_view(name) == "SCMOE_COMM_SMS") return -1;
    std::size_t used = 0;
    long value = -1;
    try {
        value = std::stol(std::string(text), &used);
    } catch (const std::exception&) {
        used = 0;
    }
    SCMOE_CHECK(used == text.size() && value >= least && value <= 1 << 20,
                name << "='" << text << "': expected an integer >= " << least
                     << (std::string_view(name) == "SCMOE_COMM_SMS"
                             ? " (SMs kept free for an exchange beside overlapped compute; 0: none), or auto"
                             : ""));
    return static_cast<int>(value);
}

}  // namespace

CommSms resolve_comm_sms(const std::function<const char*(const char*)>& env, int kernel_sms) {
    if (const int r = read_count(env, "SCMOE_COMM_SMS", 0); r >= 0) return {r, "SCMOE_COMM_SMS"};
    if (kernel_sms >= 0) return {kernel_sms, "the communicator's own count"};
    CommSms c{kNcclDefaultMaxCtas, "NCCL's default maxCTAs"};
    bool capped = false;
    for (const char* name : {"NCCL_MAX_CTAS", "NCCL_MAX_NCHANNELS", "NCCL_MAX_P2P_NCHANNELS"}) {
        const int v = read_count(env, name, 1);
        if (v < 0) continue;
        if (!capped || v < c.sms) c = {v, name};
        capped = true;
    }
    for (const char* name : {"NCCL_MIN_CTAS", "NCCL_MIN_NCHANNELS"}) {
        const int v = read_count(env, name, 1);
        if (v > c.sms) c = {v, name};
    }
    return c;
}

CommSms default_comm_sms(const Communicator* comm) {
    return resolve_comm_sms([](const char* name) { return std::getenv(name); }, comm ? comm->kernel_sms() : -1);
}

}  // namespace scmoe
