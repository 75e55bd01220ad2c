#include "scmoe/comm/topology.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>
#include <sstream>
#include <cstdlib>

#include "scmoe/kernels/error.h"

namespace scmoe {
namespace {

// NVLink presets: NVSwitch boards, every GPU at its full NVLink bandwidth to every other.
Topology nvlink(std::string name, std::string gpu, double link_gbps, double efficiency, int comm_sms) {
    Topology t;
    t.name = std::move(name);
    t.gpu = std::move(gpu);
    t.fabric = Topology::Fabric::kNvlink;
    t.gpu_link_gbps = link_gbps;
    t.link_efficiency = efficiency;
    t.comm_sms = comm_sms;
    t.hop_latency_us = 3.4;
    t.sources = {"latencies: NCCL src/graph/tuning.cc (base Simple 8.4 us; NVLink 3.4, PCIe 5.7, NET 14.0 us "
                 "per step), docs/emu-sources.md item 6"};
    return t;
}

std::vector<Topology> make_presets() {
    std::vector<Topology> v;
    {
        Topology t;
        t.name = "a30-pcie-8";
        t.gpu = "A30";
        t.fabric = Topology::Fabric::kPcie;
        t.gpu_link_gbps = 32;       // PCIe Gen4 x16: 64 GB/s both directions (A30 datasheet)
        t.gpus_per_switch = 4;      // assumption: the paper does not describe its server
        t.switch_uplink_gbps = 32;  // assumption: one Gen4 x16 uplink per switch
        t.link_efficiency = 0.8;    // assumption: as NCCL reaches on NVLink (78-82%); no PCIe figure found
        t.hop_latency_us = 5.7;
        t.comm_sms = 8;  // PCIe peers get 2 p2p channels each in NCCL's paths.cc; 2-8 channels in total
        t.sources = {"A30 datasheet: PCIe Gen4 64GB/s", "NCCL src/graph/paths.cc: 2 p2p channels per PCIe peer",
                     "NCCL src/graph/tuning.cc latencies"};
        t.assumptions = {{"pcie-switches", "2 PCIe switches of 4 GPUs, each with one Gen4 x16 uplink (32 GB/s per "
                                           "direction) to the CPU: the ScMoE paper does not describe its A30 server"},
                         {"pcie-efficiency", "NCCL reaches 80% of a PCIe link, as on NVLink (no PCIe measurement "
                                             "found)"}};
        v.push_back(t);
    }
    {
        Topology t = nvlink("a800-nvlink-8", "A800 SXM4", 200, 0.78, 16);
        t.sources.push_back("A800 datasheet: NVLink 400GB/s (both directions)");
        t.sources.push_back("A100 nccl-tests all_reduce busbw 234.89 GB/s = 78% of 300 GB/s per direction");
        t.sources.push_back("16 p2p channels on the H800 (NVLink limited to 400 GB/s): NVIDIA/nccl issue #892");
        v.push_back(t);
    }
    {
        Topology t = nvlink("a800-2x8", "A800 SXM4", 200, 0.78, 16);
        t.nodes = 2;
        t.nic_gbps = 12.5;  // assumption: the paper says "lower-bandwidth Ethernet" without a speed
        t.nics_per_node = 1;
        t.nic_kind = "Ethernet";
        t.nic_efficiency = 0.9;
        t.sources.push_back("A800 datasheet: NVLink 400GB/s");
        t.assumptions = {{"nic", "one 100 Gb/s Ethernet NIC per node (12.5 GB/s): the ScMoE paper (App. A.8) says "
                                 "'lower-bandwidth Ethernet' without a speed; sweep it with scmoe-plan --nic-gbit-s "
                                 "100,200,400,..."},
                         {"nic-efficiency", "the Ethernet NICs reach 90% of their line rate"}};
        v.push_back(t);
    }
    {
        Topology t = nvlink("h100-nvlink-8", "H100 SXM5", 450, 0.82, 32);
        t.sources.push_back("H100 datasheet: NVLink 900GB/s; H100 ring all_reduce ~370 GB/s busbw = 82% of 450");
        t.sources.push_back("32 p2p channels on 8xH100 (nccl-tests log, docs/emu-sources.md item 4)");
        v.push_back(t);
    }
    {
        Topology t = nvlink("h100-ib-2x8", "H100 SXM5", 450, 0.82, 32);
        t.nodes = 2;
        t.nic_gbps = 400;  // 8 NICs x 50 GB/s
        t.nics_per_node = 8;
        t.nic_kind = "NDR InfiniBand";
        t.nic_efficiency = 0.95;  // 46-49 GB/s measured per NDR NIC
        t.sources.push_back("H100 datasheet: NVLink 900GB/s; NDR 400 Gb/s = 50 GB/s per NIC, 46-49 measured");
        v.push_back(t);
    }
    {
        Topology t = nvlink("h200-nvlink-8", "H200 SXM", 450, 0.82, 32);
        t.sources.push_back("H200 product page: NVLink 900GB/s");
        v.push_back(t);
    }
    return v;
}

std::string fixed(double v, int digits) {
    std::ostringstream os;
    os.setf(std::ios::fixed);
    os.precision(digits);
    os << v;
    return os.str();
}

// 12.5 -> "12.5", 200 -> "200", 0.104 -> "0.104"
std::string number(double v) {
    std::ostringstream os;
    os << v;
    return os.str();
}

double gbps_us(double bytes, double gbps) { return gbps > 0 ? bytes / (gbps * 1e3) : 0.0; }  // GB/s = 1e3 B/us

struct Span {
    int nodes = 1;
    int switches = 1;
};

Span span_of(const Topology& t, std::span<const int> ranks) {
    std::set<int> nodes, switches;
    for (int r : ranks) {
        nodes.insert(t.node_of(r));
        switches.insert(t.switch_of(r));
    }
    return {static_cast<int>(nodes.size()), static_cast<int>(switches.size())};
}

// The bus bandwidth of a ring over `ranks`: its slowest hop.
double ring_bus_gbps(const Topology& t, std::span<const int> ranks) {
    const Span s = span_of(t, ranks);
    double bw = t.gpu_link_gbps * t.link_efficiency;
    if (t.fabric == Topology::Fabric::kPcie && s.switches > 1) bw = std::min(bw, t.switch_uplink_gbps * t.link_efficiency);
    if (s.nodes > 1) bw = std::min(bw, t.nic_gbps * t.nic_efficiency);
    return bw;
}

double step_latency_us(const Topology& t, int steps, int inter_steps) {
    return t.base_latency_us + (steps - inter_steps) * t.hop_latency_us + inter_steps * t.net_latency_us;
}

void check_ranks(const Topology& t, std::span<const int> ranks) {
    SCMOE_CHECK(!ranks.empty(), "topology " << t.name << ": a collective with no members");
    for (int r : ranks)
        SCMOE_CHECK(r >= 0 && r < t.world_size(), "topology " << t.name << ": rank " << r << " outside its "
                                                               << t.world_size() << " GPUs");
}

}  // namespace

int Topology::switch_of(int rank) const {
    if (fabric != Fabric::kPcie || gpus_per_switch <= 0) return node_of(rank);
    const int per_node = (gpus_per_node + gpus_per_switch - 1) / gpus_per_switch;
    return node_of(rank) * per_node + (rank % gpus_per_node) / gpus_per_switch;
}

const std::vector<Topology>& topology_presets() {
    static const std::vector<Topology> presets = make_presets();
    return presets;
}

Topology cluster_topology(std::string_view name) {
    if (name.rfind("link:", 0) == 0) {
        Topology t;
        t.name = std::string(name);
        t.gpu = "GPUs";
        t.gpus_per_node = 64;
        t.link_efficiency = 1.0;
        t.base_latency_us = 0.0;
        t.hop_latency_us = 0.0;
        t.comm_sms = 0;
        std::stringstream in{std::string(name.substr(5))};
        for (std::string item; std::getline(in, item, ',');) {
            const auto eq = item.find('=');
            SCMOE_CHECK(eq != std::string::npos, "cluster '" << name << "': '" << item << "' is not key=value");
            const std::string key = item.substr(0, eq), value = item.substr(eq + 1);
            char* end = nullptr;
            const double v = std::strtod(value.c_str(), &end);
            SCMOE_CHECK(!value.empty() && end && *end == 0 && v >= 0,
                        "cluster '" << name << "': " << key << " = '" << value << "' is not a number >= 0");
            if (key == "gbps")
                SCMOE_FAIL("cluster '" << name << "': the key 'gbps' is renamed 'gbyte_s' (its value is in GB/s, "
                                          "gigabytes per second, each way: link:gbyte_s=" << value << ")");
            if (key == "gbyte_s") t.gpu_link_gbps = v;
            else if (key == "latency_us") t.base_latency_us = v;
            else if (key == "gpus") t.gpus_per_node = static_cast<int>(v);
            else SCMOE_FAIL("cluster '" << name << "': unknown key '" << key << "' (gbyte_s, latency_us, gpus)");
        }
        SCMOE_CHECK(t.gpu_link_gbps > 0 && t.gpus_per_node >= 1,
                    "cluster '" << name << "': needs gbyte_s > 0 and gpus >= 1");
        return t;
    }
    std::string names;
    for (const Topology& t : topology_presets()) {
        if (t.name == name) return t;
        names += (names.empty() ? "" : ", ") + t.name;
    }
    SCMOE_FAIL("unknown cluster '" << name << "': presets are " << names << ", or link:gbyte_s=X[,latency_us=Y][,gpus=N] (X in GB/s)");
}

std::string default_cluster_for_gpu(std::string_view gpu) {
    if (gpu == "a30") return "a30-pcie-8";
    if (gpu == "a800") return "a800-nvlink-8";
    if (gpu == "h200") return "h200-nvlink-8";
    return "h100-nvlink-8";
}

std::string describe_nic_rate(double nic_gbyte_s) {
    return number(nic_gbyte_s * 8) + " Gb/s (" + number(nic_gbyte_s) + " GB/s)";
}

std::string describe(const Topology& t) {
    std::ostringstream os;
    os << t.name << ": ";
    if (t.name.rfind("link:", 0) == 0) {
        os << t.gpus_per_node << " " << t.gpu << ", each on one emulated link of " << number(t.gpu_link_gbps)
           << " GB/s per direction (x" << fixed(t.link_efficiency, 2) << "), " << number(t.base_latency_us)
           << " us per collective; comm kernels hold " << t.comm_sms << " SMs";
        return os.str();
    }
    if (t.nodes > 1) os << t.nodes << " nodes x ";
    os << t.gpus_per_node << " " << t.gpu << "; ";
    if (t.fabric == Topology::Fabric::kNvlink) {
        os << "NVLink " << number(t.gpu_link_gbps) << " GB/s per GPU per direction (x" << fixed(t.link_efficiency, 2)
           << ")";
    } else {
        os << "PCIe " << number(t.gpu_link_gbps) << " GB/s per GPU per direction (x" << fixed(t.link_efficiency, 2)
           << ")";
        if (t.gpus_per_switch > 0 && t.gpus_per_switch < t.gpus_per_node)
            os << ", " << (t.gpus_per_node + t.gpus_per_switch - 1) / t.gpus_per_switch << " switches of "
               << t.gpus_per_switch << " GPUs per node, uplink " << number(t.switch_uplink_gbps) << " GB/s each";
    }
    if (t.nodes > 1) {
        os << "; between nodes ";
        if (t.nics_per_node > 0) os << t.nics_per_node << "x " << number(t.nic_gbps * 8 / t.nics_per_node) << " Gb/s ";
        if (!t.nic_kind.empty()) os << t.nic_kind << " ";
        os << "NICs per node = " << describe_nic_rate(t.nic_gbps) << " per direction (x" << fixed(t.nic_efficiency, 2)
           << ")";
    }
    os << "; comm kernels hold " << t.comm_sms << " SMs";
    return os.str();
}

std::string cluster_label(const Topology& t) {
    std::ostringstream os;
    if (t.nodes > 1) os << t.nodes << " nodes x ";
    os << t.gpus_per_node << " " << t.gpu << ", ";
    if (t.name.rfind("link:", 0) == 0) os << "link " << number(t.gpu_link_gbps) << " GB/s";
    else os << (t.fabric == Topology::Fabric::kNvlink ? "NVLink " : "PCIe ") << number(t.gpu_link_gbps) << " GB/s";
    if (t.nodes > 1) os << ", " << number(t.nic_gbps * 8) << " Gb/s" << (t.nic_kind.empty() ? "" : " " + t.nic_kind);
    return os.str();
}

std::vector<double> all_to_all_us(const Topology& t, std::span<const int> ranks, std::span<const double> bytes) {
    check_ranks(t, ranks);
    const std::size_t n = ranks.size();
    SCMOE_CHECK(bytes.size() == n * n, "all_to_all_us: " << bytes.size() << " byte counts for " << n << " members");
    std::vector<double> link_out(n, 0), link_in(n, 0);
    std::vector<double> switch_up(static_cast<std::size_t>(t.nodes * t.gpus_per_node), 0), switch_down(switch_up);
    std::vector<double> nic_out(static_cast<std::size_t>(t.nodes), 0), nic_in(nic_out);
    bool crosses_nodes = false;
    for (std::size_t i = 0; i < n; ++i) {
        for (std::size_t j = 0; j < n; ++j) {
            const double b = bytes[i * n + j];
            if (i == j || b <= 0) continue;
            const int ri = ranks[i], rj = ranks[j];
            const bool same_node = t.node_of(ri) == t.node_of(rj);
            // NVLink carries a node's own traffic (the rest goes to the NICs); a PCIe link carries
            // everything leaving the GPU.
            if (same_node || t.fabric == Topology::Fabric::kPcie) {
                link_out[i] += b;
                link_in[j] += b;
            }
            if (t.fabric == Topology::Fabric::kPcie && t.switch_of(ri) != t.switch_of(rj)) {
                switch_up[static_cast<std::size_t>(t.switch_of(ri))] += b;
                switch_down[static_cast<std::size_t>(t.switch_of(rj))] += b;
            }
            if (!same_node) {
                crosses_nodes = true;
                nic_out[static_cast<std::size_t>(t.node_of(ri))] += b;
                nic_in[static_cast<std::size_t>(t.node_of(rj))] += b;
            }
        }
    }
    const double latency = t.base_latency_us + (crosses_nodes ? t.net_latency_us : t.hop_latency_us);
    const double a2a = t.all_to_all_efficiency;  // the all-to-all implementation's factor (the stack's)
    std::vector<double> out(n);
    for (std::size_t i = 0; i < n; ++i) {
        const int r = ranks[i];
        double busiest = gbps_us(std::max(link_out[i], link_in[i]), t.gpu_link_gbps * t.link_efficiency * a2a);
        if (t.fabric == Topology::Fabric::kPcie) {
            const auto s = static_cast<std::size_t>(t.switch_of(r));
            busiest = std::max(busiest, gbps_us(std::max(switch_up[s], switch_down[s]),
                                                t.switch_uplink_gbps * t.link_efficiency * a2a));
        }
        if (t.nodes > 1) {
            const auto node = static_cast<std::size_t>(t.node_of(r));
            busiest = std::max(busiest,
                               gbps_us(std::max(nic_out[node], nic_in[node]), t.nic_gbps * t.nic_efficiency * a2a));
        }
        out[i] = latency + busiest;
    }
    return out;
}

double all_reduce_us(const Topology& t, std::span<const int> ranks, double bytes) {
    check_ranks(t, ranks);
    const int n = static_cast<int>(ranks.size());
    if (n == 1) return 0.0;
    const Span s = span_of(t, ranks);
    const double bw = ring_bus_gbps(t, ranks);
    const double data = 2.0 * (n - 1) / n * bytes;
    const int inter = s.nodes > 1 ? 2 * (s.nodes - 1) : 0;
    const double ring = step_latency_us(t, 2 * (n - 1), inter) + gbps_us(data, bw);
    const int depth = static_cast<int>(std::ceil(std::log2(static_cast<double>(n))));
    const double tree = step_latency_us(t, 2 * depth, s.nodes > 1 ? 2 : 0) + gbps_us(data, bw);
    return std::min(ring, tree);
}

double all_gather_us(const Topology& t, std::span<const int> ranks, double bytes_per_rank) {
    check_ranks(t, ranks);
    const int n = static_cast<int>(ranks.size());
    if (n == 1) return 0.0;
    const Span s = span_of(t, ranks);
    return step_latency_us(t, n - 1, s.nodes > 1 ? s.nodes - 1 : 0) +
           gbps_us((n - 1) * bytes_per_rank, ring_bus_gbps(t, ranks));
}

double broadcast_us(const Topology& t, std::span<const int> ranks, double bytes) {
    check_ranks(t, ranks);
    const int n = static_cast<int>(ranks.size());
    if (n == 1) return 0.0;
    const Span s = span_of(t, ranks);
    return step_latency_us(t, n - 1, s.nodes > 1 ? s.nodes - 1 : 0) + gbps_us(bytes, ring_bus_gbps(t, ranks));
}

}  // namespace scmoe
