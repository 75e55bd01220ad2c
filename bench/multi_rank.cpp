#include "multi_rank.h"

#include <unistd.h>

#include <cstdlib>
#include <iomanip>
#include <sstream>

#include "common.h"
#include "launch/cli_options.h"
#include "scmoe/kernels/error.h"

#if SCMOE_WITH_MPI
#include <mpi.h>
#endif

namespace scmoe::bench {

void add_link_options(cxxopts::Options& options, const std::string& group) {
    // clang-format off
    options.add_options(group)
        ("link", "Wrap the communicator in an EmulatedLink: pcie4, nvlink4, ib-ndr, 100gbe, or "
                 "gbps=X,latency_us=Y (X in GB/s, gigabytes per second, per direction; Y in us)",
         cxxopts::value<std::string>())
        ("link-gbyte-s", "EmulatedLink bandwidth in GB/s (gigabytes per second) per direction (instead of --link)",
         cxxopts::value<double>())
        ("link-latency-us", "EmulatedLink latency in us per op (with --link-gbyte-s)",
         cxxopts::value<double>()->default_value("0"));
    // clang-format on
    launch::add_renamed_option(options, "link-gbps");
}

std::optional<LinkModel> read_link_options(const cxxopts::ParseResult& r) {
    try {
        launch::refuse_renamed_options(r);
    } catch (const Error& e) {
        throw UsageError(e.what());
    }
    if (r.count("link") && r.count("link-gbyte-s")) throw UsageError("give either --link or --link-gbyte-s, not both");
    if (r.count("link-latency-us") && !r.count("link-gbyte-s"))
        throw UsageError("--link-latency-us needs --link-gbyte-s");
    try {
        if (r.count("link")) return parse_link_model(r["link"].as<std::string>());
        if (r.count("link-gbyte-s")) {
            std::ostringstream text;
            text << std::setprecision(17) << "gbps=" << r["link-gbyte-s"].as<double>()
                 << ",latency_us=" << r["link-latency-us"].as<double>();
            return parse_link_model(text.str());
        }
    } catch (const Error& e) {
        throw UsageError(std::string("--link: ") + e.what());
    }
    return std::nullopt;
}

nlohmann::ordered_json link_json(const std::optional<LinkModel>& link) {
    if (!link) return nullptr;
    return {{"name", link->name}, {"gbps", link->gbps}, {"latency_us", link->latency_us}};
}


#if SCMOE_WITH_MPI

std::vector<std::string> mpi_rank_lines(const std::optional<LinkModel>& link) {
    int me = 0, n = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    char host[64] = {};
    gethostname(host, sizeof(host) - 1);
    std::vector<char> hosts(static_cast<std::size_t>(n) * sizeof(host));
    int pid = static_cast<int>(getpid());
    std::vector<int> pids(static_cast<std::size_t>(n));
    MPI_Gather(host, sizeof(host), MPI_CHAR, hosts.data(), sizeof(host), MPI_CHAR, 0, MPI_COMM_WORLD);
    MPI_Gather(&pid, 1, MPI_INT, pids.data(), 1, MPI_INT, 0, MPI_COMM_WORLD);
    std::vector<std::string> lines;
    if (me != 0) return lines;
    for (int r = 0; r < n; ++r)
        lines.push_back("Rank " + std::to_string(r) + " Pid " + std::to_string(pids[static_cast<std::size_t>(r)]) +
                        " on " + std::string(hosts.data() + r * sizeof(host)) + ": mpi(rank " + std::to_string(r) +
                        " of " + std::to_string(n) + ")" + (link ? " behind " + describe_link_model(*link) : ""));
    return lines;
}

#endif  // SCMOE_WITH_MPI

}  // namespace scmoe::bench
