// Topology: the interconnect of an emulated cluster, and the time NCCL's collectives take on it.
// Used by EmuCommunicator (scmoe/comm/emu_communicator.h); presets for the ScMoE paper's machines and for
// planning. Every preset number cites its source in topology.cpp (quotes in docs/emu-sources.md).
//
// The model, per collective:
//  - all-to-all (grouped send/recv): each GPU's traffic crosses its own link (NVLink to the
//    switch, or its PCIe x16 link); on PCIe, traffic leaving a switch shares that switch's uplink;
//    traffic leaving a node shares the node's NICs. A member finishes after the latency plus its
//    busiest resource: max(its link, its switch's uplink, its node's NICs), each as
//    bytes / (bandwidth * efficiency) in the direction that carries more.
//  - all-reduce: NCCL's ring (2(n-1) steps) or tree (2 log2 n steps), whichever is faster, at the
//    bus bandwidth of the slowest hop the ring crosses (a GPU link, a switch uplink, a NIC):
//    time = base latency + steps * hop latency + 2 (n-1)/n * bytes / bus bandwidth (ring).
//  - all-gather, broadcast: the ring's (n-1) steps and (n-1)/n of the gathered bytes; one pass.
// Latencies are NCCL's own tuning constants (src/graph/tuning.cc: base 8.4 us for the Simple
// protocol; per hop NVLink 3.4, PCIe 5.7, network 14.0 us).
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace scmoe {

struct Topology {
    enum class Fabric { kNvlink, kPcie };

    std::string name;         // preset name: "a800-nvlink-8" (with launch/emu_choice's overrides: "a800-2x8+nic-gbit-s=200")
    std::string gpu;          // the GPU model the preset describes, for describe(): "A800 SXM4" (the tools put
                              // the emulated GPU's own name here)
    int nodes = 1;
    int gpus_per_node = 8;
    Fabric fabric = Fabric::kNvlink;
    double gpu_link_gbps = 0;       // per GPU, one direction: NVLink total / 2, or PCIe x16
    int gpus_per_switch = 0;        // kPcie: GPUs behind one PCIe switch (0: all of the node's)
    double switch_uplink_gbps = 0;  // kPcie: one direction of a switch's uplink to the CPU
    // NICs between nodes: nic_gbps is in GB/s (bytes; = line rate in Gb/s / 8), per node, one direction,
    // all its NICs together. The flags take the line rate in Gb/s (--nic-gbit-s, as NICs are sold).
    double nic_gbps = 0;
    int nics_per_node = 0;          // for describe(); 0: not stated
    std::string nic_kind;           // for describe(): "Ethernet", "NDR InfiniBand"
    double link_efficiency = 0.8;   // achieved fraction of a GPU link or uplink for NCCL
    double nic_efficiency = 0.95;   // achieved fraction of the NICs' line rate
    double all_to_all_efficiency = 1.0;  // the all-to-all implementation's factor on both (emu Stack)
    double base_latency_us = 8.4;   // per collective
    double hop_latency_us = 3.4;    // per step within a node (NVLink 3.4, PCIe 5.7)
    double net_latency_us = 14.0;   // per step that crosses nodes
    int comm_sms = 16;              // SMs a communication kernel holds while it runs (NCCL channels)
    std::vector<std::string> sources;
    // What a preset rests on without a source (the tools print each as "assumed: <text>"); `about`
    // names the parameter, so that an override of it (launch/emu_choice) drops the assumption.
    struct Assumption {
        std::string about;  // "nic", "pcie-switches", "pcie-efficiency", "nic-efficiency", "nvlink"
        std::string text;
    };
    std::vector<Assumption> assumptions;

    int world_size() const { return nodes * gpus_per_node; }
    int node_of(int rank) const { return rank / gpus_per_node; }
    int switch_of(int rank) const;  // a global switch index (kPcie), else the node
};

// Presets: a30-pcie-8, a800-nvlink-8, a800-2x8, h100-nvlink-8, h100-ib-2x8, h200-nvlink-8.
const std::vector<Topology>& topology_presets();
// A preset by name, or a single emulated link like EmulatedLink's:
// "link:gbyte_s=X[,latency_us=Y][,gpus=N]" (N GPUs, default 64, each with X GB/s = gigabytes per second
// each way, no SM share, Y us per collective; the key was "gbps" before, refused now, naming the new
// one). Throws Error listing the presets otherwise.
Topology cluster_topology(std::string_view name);
// One line from the cluster's own fields (so it stays true after overrides): "a800-2x8: 2 nodes x 8
// A800 SXM4; NVLink 200 GB/s per GPU per direction (x0.78); between nodes 1x 100 Gb/s Ethernet per
// node = 12.5 GB/s (x0.90); comm kernels hold 16 SMs".
std::string describe(const Topology& t);
// A short label for a chart legend, from the same fields: "2 nodes x 4 a100-40gb, PCIe, 100 Gb/s
// Ethernet"; two clusters that differ in nodes, GPUs, fabric, link or NIC speed get different labels.
std::string cluster_label(const Topology& t);
// "100 Gb/s (12.5 GB/s)" for a NIC rate held in GB/s.
std::string describe_nic_rate(double nic_gbyte_s);
// The single-node preset of an emulated GPU: a30 -> a30-pcie-8, a800 -> a800-nvlink-8, h100 ->
// h100-nvlink-8, h200 -> h200-nvlink-8.
std::string default_cluster_for_gpu(std::string_view gpu);

// Times in microseconds for the members of a collective; `ranks` are the members' global ranks
// (their places in the topology), in member order.
// bytes: [n * n], bytes[i * n + j] = what member i sends to member j.
std::vector<double> all_to_all_us(const Topology& t, std::span<const int> ranks, std::span<const double> bytes);
double all_reduce_us(const Topology& t, std::span<const int> ranks, double bytes);
double all_gather_us(const Topology& t, std::span<const int> ranks, double bytes_per_rank);
double broadcast_us(const Topology& t, std::span<const int> ranks, double bytes);

}  // namespace scmoe
