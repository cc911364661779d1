// Which of the node's network devices (libfabric domains) a rank drives.
//
// libfabric lists one fi_info per device; taking the first, every rank of an
// 8-GPU node would share one of its EFA devices (a P5 has 32, four behind
// each GPU's PCIe switch). A rank takes instead:
//   - the devices EPCOMM_FI_DOMAIN names: a comma-separated list of domain
//     names, read `rails` entries per local rank (one name: every rank);
//   - else, with its data region in GPU memory, the devices nearest the
//     GPU: the longest common stretch of their PCIe paths from the root
//     complex (the same switch before the same root port), ties spread by
//     local rank, so that GPUs sharing a switch start on different devices;
//   - else (host memory), the node's ranks spread evenly over the devices
//     on the PCI bus, in their listed order (each rank's share starts at
//     device local_rank * devices / local_ranks); devices libfabric places
//     on no bus (loopback, a provider that does not say) are never spread
//     over: with none on the bus, libfabric's first choice, as before.
// Rail 0 is the first of those; further rails (transport.hpp stripes large
// puts over them) take the next ones in turn, and come round again when
// there are more rails than devices: several endpoints on one device.
// Pure functions over names and paths; transport.hpp reads them from
// fi_info, sysfs and CUDA.
#pragma once

#include <algorithm>
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace epcomm::libfabric {

struct nic {
  std::string domain;             // fi_info domain_attr->name
  std::vector<std::string> path;  // PCIe path from the root complex; empty: unknown
};

// The PCIe path in a sysfs device path, e.g. "/sys/devices/pci0000:00/
// 0000:00:01.0/0000:4f:00.0" -> {"pci0000:00", "0000:00:01.0", "0000:4f:00.0"}.
inline std::vector<std::string> pci_path(std::string_view sysfs) {
  std::vector<std::string> out;
  const std::size_t start = sysfs.find("/pci");
  if (start == std::string_view::npos) return out;
  sysfs.remove_prefix(start + 1);
  while (!sysfs.empty()) {
    const std::size_t slash = sysfs.find('/');
    out.emplace_back(sysfs.substr(0, slash));
    if (slash == std::string_view::npos) break;
    sysfs.remove_prefix(slash + 1);
  }
  return out;
}

inline std::size_t common_prefix(const std::vector<std::string>& a,
                                 const std::vector<std::string>& b) {
  std::size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
  return n;
}

// The entry of EPCOMM_FI_DOMAIN's list for rail `rail` of `rails` of this
// rank; empty when unset.
inline std::string domain_override(const char* value, int local_rank, std::size_t rail = 0,
                                   std::size_t rails = 1) {
  std::vector<std::string> names;
  for (std::string_view v = value ? value : ""; !v.empty();) {
    const std::size_t comma = v.find(',');
    if (comma != 0) names.emplace_back(v.substr(0, comma));
    if (comma == std::string_view::npos) break;
    v.remove_prefix(comma + 1);
  }
  const std::size_t lr = static_cast<std::size_t>(local_rank < 0 ? 0 : local_rank);
  return names.empty() ? std::string{} : names[(lr * rails + rail) % names.size()];
}

// The devices a rank may drive, by the rules above (without the override),
// and which of them its rail 0 takes.
struct nic_candidates {
  std::vector<std::size_t> devices;  // indices into the nics given
  std::size_t first = 0;             // index into devices
};

// `nics`: not empty. `gpu`: the GPU's PCIe path, empty for host memory.
inline nic_candidates nic_candidates_for(const std::vector<nic>& nics,
                                         const std::vector<std::string>& gpu, int local_rank,
                                         int local_ranks) {
  const std::size_t lr = static_cast<std::size_t>(local_rank < 0 ? 0 : local_rank);
  if (!gpu.empty()) {
    std::size_t best = 0;
    std::vector<std::size_t> nearest;
    for (std::size_t i = 0; i < nics.size(); ++i) {
      const std::size_t shared = common_prefix(gpu, nics[i].path);
      if (shared > best) {
        best = shared;
        nearest.clear();
      }
      if (shared == best && shared > 0) nearest.push_back(i);
    }
    if (!nearest.empty()) return {nearest, lr % nearest.size()};
  }
  std::vector<std::size_t> on_bus;
  for (std::size_t i = 0; i < nics.size(); ++i)
    if (!nics[i].path.empty()) on_bus.push_back(i);
  if (on_bus.empty()) return {{0}, 0};
  // This rank's share of the devices; with fewer devices than ranks, the
  // one its share would start at.
  const std::size_t ranks = static_cast<std::size_t>(local_ranks < 1 ? 1 : local_ranks);
  const std::size_t begin = lr % ranks * on_bus.size() / ranks;
  const std::size_t end = std::max(begin + 1, (lr % ranks + 1) * on_bus.size() / ranks);
  return {{on_bus.begin() + static_cast<std::ptrdiff_t>(begin),
           on_bus.begin() + static_cast<std::ptrdiff_t>(end)},
          0};
}

// The index in `nics` (not empty) rail 0 of this rank drives.
inline std::size_t choose_nic(const std::vector<nic>& nics, const std::vector<std::string>& gpu,
                              int local_rank, int local_ranks) {
  const nic_candidates c = nic_candidates_for(nics, gpu, local_rank, local_ranks);
  return c.devices[c.first];
}

// The indices in `nics` (not empty) this rank's rails drive, rail by rail;
// `rails` 0: one rail per candidate device.
inline std::vector<std::size_t> choose_nics(const std::vector<nic>& nics,
                                            const std::vector<std::string>& gpu, int local_rank,
                                            int local_ranks, std::size_t rails) {
  const nic_candidates c = nic_candidates_for(nics, gpu, local_rank, local_ranks);
  std::vector<std::size_t> out;
  for (std::size_t k = 0; k < (rails == 0 ? c.devices.size() : rails); ++k)
    out.push_back(c.devices[(c.first + k) % c.devices.size()]);
  return out;
}

}  // namespace epcomm::libfabric
