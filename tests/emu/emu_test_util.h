// A GPU spec with round numbers, so expected model times can be worked out by hand, an emulated
// device on it, and the modeled time of what a stream runs.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <vector>

#include "scmoe/kernels/attention.h"
#include "scmoe/kernels/emu/emu_device.h"
#include "scmoe/kernels/emu/gpu_spec.h"
#include "scmoe/kernels/emu/stack.h"

namespace scmoe::test {

inline emu::GpuSpec round_spec() {
    emu::GpuSpec s;
    s.name = "round";
    s.description = "a GPU with round numbers";
    s.bf16_tflops = 100;           // 1e8 FLOP per us
    s.fp32_tflops = 10;
    s.hbm_gbps = 1000;             // 1e3 bytes per ns = 1e6 bytes per us
    s.memory_bytes = 1ull << 30;   // 1 GiB
    s.sms = 100;
    s.threads_per_sm = 1000;
    s.host_link_gbps = 10;         // 1e4 bytes per us
    s.gemm_efficiency = 1.0;
    s.bandwidth_efficiency = 1.0;
    s.launch_us = 2;
    s.kernel_gap_us = 1;
    s.host_task_us = 10;
    s.sync_us = 3;
    return s;
}

// round_spec() with no launch cost: each kernel is its 1 us gap and its work.
inline emu::GpuSpec round_spec_without_launch() {
    emu::GpuSpec s = round_spec();
    s.launch_us = 0;
    return s;
}

// An emulated device on `spec` running `stack`.
inline std::unique_ptr<Device> device_with(emu::Stack stack, emu::GpuSpec spec = round_spec()) {
    emu::EmuOptions options;
    options.spec = std::move(spec);
    options.stack = std::move(stack);
    return emu::make_device(std::move(options));
}

// Modeled time between two events around `enqueue` on a fresh stream of `device` (events report float
// milliseconds: compare to about 1e-4 us).
inline double elapsed_us(Device& device, const std::function<void(Stream&)>& enqueue) {
    auto stream = device.create_stream();
    auto start = device.create_event(), end = device.create_event();
    start->record(*stream);
    enqueue(*stream);
    end->record(*stream);
    end->synchronize();
    return end->elapsed_ms_since(*start) * 1000.0;
}

// The hand-checked attention of the stack tests: batch 1, 10 heads of 128, seq 1280, bf16, causal
// (Q = 1,638,400 elements in each of q, k, v and out; 12,800 lse rows). The shape alone, for kernel
// lists that need no device:
inline AttentionArgs hand_attention_shape() {
    AttentionArgs a;
    a.batch = 1, a.seq = 1280, a.heads = 10, a.head_dim = 128, a.dtype = DType::kBF16;
    return a;
}
// ... and its buffers on `device`, with the forward and backward arguments pointing at them.
struct HandAttention {
    static constexpr std::size_t kQ = 1638400;
    DeviceBuffer qkv, out, grad_out, grad_qkv;
    std::vector<float> lse = std::vector<float>(12800);
    AttentionArgs fwd = hand_attention_shape();
    AttentionBackwardArgs bwd;
    explicit HandAttention(Device& device)
        : qkv(device, 3 * kQ * 2), out(device, kQ * 2), grad_out(device, kQ * 2), grad_qkv(device, 3 * kQ * 2) {
        fwd.qkv = qkv.data(), fwd.out = out.data(), fwd.lse = lse.data();
        bwd.batch = fwd.batch, bwd.seq = fwd.seq, bwd.heads = fwd.heads, bwd.head_dim = fwd.head_dim,
        bwd.dtype = fwd.dtype;
        bwd.qkv = qkv.data(), bwd.out = out.data(), bwd.lse = lse.data(), bwd.grad_out = grad_out.data(),
        bwd.grad_qkv = grad_qkv.data();
    }
};

// A small training attention for the memory tests: batch 1, 2 heads of 16, seq 64, bf16 (one bf16
// score tensor is 16,384 B), its buffers on `device`, the forward keeping lse (a training forward).
struct SmallAttention {
    DeviceBuffer qkv, out, grad_qkv;
    std::vector<float> lse = std::vector<float>(128);
    AttentionArgs fwd;
    AttentionBackwardArgs bwd;
    explicit SmallAttention(Device& device)
        : qkv(device, 3 * 2048 * 2), out(device, 2048 * 2), grad_qkv(device, 3 * 2048 * 2) {
        fwd.batch = 1, fwd.seq = 64, fwd.heads = 2, fwd.head_dim = 16, fwd.dtype = DType::kBF16;
        fwd.qkv = qkv.data(), fwd.out = out.data(), fwd.lse = lse.data();
        bwd.batch = 1, bwd.seq = 64, bwd.heads = 2, bwd.head_dim = 16, bwd.dtype = DType::kBF16;
        bwd.qkv = qkv.data(), bwd.out = out.data(), bwd.lse = lse.data(), bwd.grad_out = out.data(),
        bwd.grad_qkv = grad_qkv.data();
    }
};

}  // namespace scmoe::test
