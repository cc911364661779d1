// Which EFA device each rank of a node drives (libfabric/nic_choice.hpp),
// against the recorded PCIe tree of a p5.48xlarge (fixtures/p5.48xlarge.pci).
#include <doctest/doctest.h>

#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "epcomm/libfabric/nic_choice.hpp"

using namespace epcomm::libfabric;

namespace {

struct topology {
  std::vector<std::vector<std::string>> gpus;  // by ordinal
  std::vector<nic> nics;                       // in the file's order
};

std::vector<std::string> split_path(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string part; std::getline(in, part, '/');) out.push_back(part);
  return out;
}

topology load(const std::string& name) {
  std::ifstream f(std::string(EPCOMM_FIXTURES) + "/" + name);
  REQUIRE(f.good());
  topology t;
  for (std::string line; std::getline(f, line);) {
    if (line.empty() || line[0] == '#') continue;
    std::stringstream in(line);
    std::string kind, id, path;
    in >> kind >> id >> path;
    if (kind == "gpu")
      t.gpus.push_back(split_path(path));
    else
      t.nics.push_back({id, split_path(path)});
  }
  return t;
}

// The switch a path hangs from: its second element.
std::string switch_of(const std::vector<std::string>& path) { return path.at(1); }

}  // namespace

TEST_CASE("p5.48xlarge: each GPU's rank drives an EFA device behind its own switch, all distinct") {
  const topology p5 = load("p5.48xlarge.pci");
  REQUIRE(p5.gpus.size() == 8);
  REQUIRE(p5.nics.size() == 32);
  const std::vector<nic> sorted = [&] {  // libfabric lists devices by name, not by switch
    auto s = p5.nics;
    std::sort(s.begin(), s.end(), [](const nic& a, const nic& b) { return a.domain < b.domain; });
    return s;
  }();
  for (const std::vector<nic>* list : {&p5.nics, &sorted}) {
    std::set<std::string> taken;
    for (int r = 0; r < 8; ++r) {
      const std::size_t i = choose_nic(*list, p5.gpus[r], r, 8);
      CHECK(switch_of((*list)[i].path) == switch_of(p5.gpus[r]));
      taken.insert((*list)[i].domain);
    }
    CHECK(taken.size() == 8);
  }
}

TEST_CASE("GPUs sharing a switch take different devices behind it") {
  // Two GPUs behind switch A with two devices; a third device elsewhere.
  const std::vector<nic> nics{
      {"a0", {"cpu0", "A", "n0"}}, {"far", {"cpu0", "B", "n2"}}, {"a1", {"cpu0", "A", "n1"}}};
  const std::vector<std::string> gpu0{"cpu0", "A", "g0"}, gpu1{"cpu0", "A", "g1"};
  CHECK(nics[choose_nic(nics, gpu0, 0, 2)].domain == "a0");
  CHECK(nics[choose_nic(nics, gpu1, 1, 2)].domain == "a1");
}

TEST_CASE("host memory: the node's ranks spread evenly over the devices") {
  const topology p5 = load("p5.48xlarge.pci");
  std::set<std::size_t> taken;
  std::set<std::string> switches;
  for (int r = 0; r < 8; ++r) {
    const std::size_t i = choose_nic(p5.nics, {}, r, 8);
    taken.insert(i);
    switches.insert(switch_of(p5.nics[i].path));
  }
  CHECK(taken == std::set<std::size_t>{0, 4, 8, 12, 16, 20, 24, 28});
  CHECK(switches.size() == 8);  // in the file's order, one device of each switch
  // More ranks than devices: each device serves ranks in turn.
  const std::vector<nic> two{{"d0", {"pci0000:00", "0000:00:02.0"}},
                             {"d1", {"pci0000:00", "0000:00:03.0"}}};
  CHECK(choose_nic(two, {}, 0, 4) == 0);
  CHECK(choose_nic(two, {}, 1, 4) == 0);
  CHECK(choose_nic(two, {}, 2, 4) == 1);
  CHECK(choose_nic(two, {}, 3, 4) == 1);
  // A GPU on another root complex than every device: spread as for host memory.
  CHECK(choose_nic(two, {"pci0000:80", "0000:80:01.0"}, 3, 4) == 1);
}

TEST_CASE("devices on no bus (loopback) are never spread over") {
  // tcp without FI_TCP_IFACE lists the host's interfaces: a rank bound to lo
  // could not be reached from another node.
  const std::vector<nic> tcp{{"eth0", {"pci0000:00", "0000:00:05.0"}}, {"lo", {}}};
  for (int r = 0; r < 4; ++r) CHECK(choose_nic(tcp, {}, r, 4) == 0);
  const std::vector<nic> unknown{{"x", {}}, {"y", {}}};
  for (int r = 0; r < 4; ++r) CHECK(choose_nic(unknown, {}, r, 4) == 0);
}

TEST_CASE("EPCOMM_FI_DOMAIN: one name for every rank, or one per local rank in turn") {
  CHECK(domain_override(nullptr, 3).empty());
  CHECK(domain_override("", 3).empty());
  CHECK(domain_override("lo", 5) == "lo");
  CHECK(domain_override("rdmap79s0-rdm,rdmap96s0-rdm", 0) == "rdmap79s0-rdm");
  CHECK(domain_override("rdmap79s0-rdm,rdmap96s0-rdm", 3) == "rdmap96s0-rdm");
  CHECK(domain_override("a,,b", 1) == "b");
}

TEST_CASE("rails: a GPU's rank takes every device behind its switch, rail 0 first") {
  const topology p5 = load("p5.48xlarge.pci");
  std::set<std::string> taken;
  for (int r = 0; r < 8; ++r) {
    const std::vector<std::size_t> rails = choose_nics(p5.nics, p5.gpus[r], r, 8, 0);
    REQUIRE(rails.size() == 4);  // four EFA devices behind each GPU's switch
    CHECK(rails[0] == choose_nic(p5.nics, p5.gpus[r], r, 8));
    for (std::size_t i : rails) {
      CHECK(switch_of(p5.nics[i].path) == switch_of(p5.gpus[r]));
      taken.insert(p5.nics[i].domain);
    }
  }
  CHECK(taken.size() == 32);
  // Two rails asked of four devices: the first two from the rank's start.
  CHECK(choose_nics(p5.nics, p5.gpus[0], 0, 8, 2) == std::vector<std::size_t>{0, 1});
}

TEST_CASE("rails: host memory gives each rank its share of the devices") {
  const topology p5 = load("p5.48xlarge.pci");
  std::set<std::size_t> taken;
  for (int r = 0; r < 8; ++r) {
    const std::vector<std::size_t> rails = choose_nics(p5.nics, {}, r, 8, 0);
    REQUIRE(rails.size() == 4);
    CHECK(rails[0] == choose_nic(p5.nics, {}, r, 8));
    taken.insert(rails.begin(), rails.end());
  }
  CHECK(taken.size() == 32);  // the shares do not overlap
  // Fewer devices than ranks: one each, as for one rail.
  const std::vector<nic> two{{"d0", {"pci0000:00", "0000:00:02.0"}},
                             {"d1", {"pci0000:00", "0000:00:03.0"}}};
  CHECK(choose_nics(two, {}, 2, 4, 0) == std::vector<std::size_t>{1});
}

TEST_CASE("rails: more rails than devices come round again; loopback gives one device") {
  const std::vector<nic> nics{
      {"a0", {"cpu0", "A", "n0"}}, {"far", {"cpu0", "B", "n2"}}, {"a1", {"cpu0", "A", "n1"}}};
  const std::vector<std::string> gpu1{"cpu0", "A", "g1"};
  CHECK(choose_nics(nics, gpu1, 1, 2, 3) == std::vector<std::size_t>{2, 0, 2});
  const std::vector<nic> lo{{"lo", {}}};
  CHECK(choose_nics(lo, {}, 3, 4, 0) == std::vector<std::size_t>{0});
  CHECK(choose_nics(lo, {}, 3, 4, 2) == std::vector<std::size_t>{0, 0});
}

TEST_CASE("EPCOMM_FI_DOMAIN with rails: each local rank reads as many entries as it has rails") {
  const char* list = "a,b,c,d";
  CHECK(domain_override(list, 0, 0, 2) == "a");
  CHECK(domain_override(list, 0, 1, 2) == "b");
  CHECK(domain_override(list, 1, 0, 2) == "c");
  CHECK(domain_override(list, 1, 1, 2) == "d");
  CHECK(domain_override(list, 2, 1, 2) == "b");  // round again
}

TEST_CASE("PCIe paths from sysfs") {
  CHECK(pci_path("/sys/devices/pci0000:00/0000:00:01.0/0000:4f:00.0") ==
        std::vector<std::string>{"pci0000:00", "0000:00:01.0", "0000:4f:00.0"});
  CHECK(pci_path("/sys/devices/virtual/net/lo").empty());
  CHECK(pci_path("").empty());
}
