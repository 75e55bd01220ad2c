#include "scmoe/kernels/nvtx.h"

#if SCMOE_WITH_CUDA
#include <nvtx3/nvToolsExt.h>
#endif

namespace scmoe {
namespace {

thread_local std::vector<std::string>* log_ = nullptr;

#if SCMOE_WITH_CUDA
nvtxDomainHandle_t domain() {
    static const nvtxDomainHandle_t d = nvtxDomainCreateA("scmoe");
    return d;
}
#endif

}  // namespace

NvtxRange::NvtxRange(const std::string& name, bool comm) {
    if (log_) log_->push_back(name);
#if SCMOE_WITH_CUDA
    nvtxEventAttributes_t a{};
    a.version = NVTX_VERSION;
    a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
    a.colorType = NVTX_COLOR_ARGB;
    a.color = comm ? 0xFFE07020u : 0xFF3070C0u;  // communication orange, compute blue
    a.messageType = NVTX_MESSAGE_TYPE_ASCII;
    a.message.ascii = name.c_str();
    nvtxDomainRangePushEx(domain(), &a);
#else
    (void)comm;
#endif
}

NvtxRange::~NvtxRange() {
#if SCMOE_WITH_CUDA
    nvtxDomainRangePop(domain());
#endif
}

void set_nvtx_log(std::vector<std::string>* log) { log_ = log; }

}  // namespace scmoe
