// The host CPU from sysfs/procfs (contract in host_info.h; fields and sources in docs/bench.md).
#include "forge/bench/host_info.h"

#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <utility>

#include "forge/core/error.h"

namespace forge::bench {
namespace {

namespace fs = std::filesystem;

// The first line of a file without its trailing whitespace; "" when it cannot be read.
std::string read_line(const fs::path& p) {
  std::ifstream in(p);
  std::string s;
  if (!in || !std::getline(in, s)) return "";
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  return s;
}

std::string trim(std::string s) {
  size_t b = 0;
  while (b < s.size() && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  size_t e = s.size();
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

bool read_int(const fs::path& p, int& out) {
  const std::string s = read_line(p);
  if (s.empty()) return false;
  try {
    out = std::stoi(s);
  } catch (const std::exception&) {
    return false;
  }
  return true;
}

// /proc/cpuinfo: the model name and the "processor" entries (the fallback thread count).
void read_cpuinfo(const fs::path& root, HostInfo& h, int& processors) {
  std::ifstream in(root / "proc/cpuinfo");
  std::string line;
  processors = 0;
  while (std::getline(in, line)) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    const std::string key = trim(line.substr(0, colon));
    const std::string value = trim(line.substr(colon + 1));
    if (key == "processor") ++processors;
    else if (h.cpu_model.empty() && (key == "model name" || key == "Model" || key == "cpu model")) h.cpu_model = value;
  }
}

}  // namespace

std::vector<int> parse_cpu_list(const std::string& list) {
  std::vector<int> out;
  std::stringstream ss(trim(list));
  std::string part;
  while (std::getline(ss, part, ',')) {
    part = trim(part);
    if (part.empty()) continue;
    try {
      const auto dash = part.find('-');
      if (dash == std::string::npos) {
        out.push_back(std::stoi(part));
      } else {
        const int a = std::stoi(part.substr(0, dash)), b = std::stoi(part.substr(dash + 1));
        FORGE_CHECK(a <= b, "bad CPU range '", part, "'");
        for (int i = a; i <= b; ++i) out.push_back(i);
      }
    } catch (const std::invalid_argument&) {
      FORGE_THROW("bad CPU list '", list, "'");
    } catch (const std::out_of_range&) {
      FORGE_THROW("bad CPU list '", list, "'");
    }
  }
  return out;
}

int64_t parse_size(const std::string& s0) {
  const std::string s = trim(s0);
  if (s.empty()) return 0;
  size_t used = 0;
  int64_t v = 0;
  try {
    v = std::stoll(s, &used);
  } catch (const std::exception&) {
    return 0;
  }
  const std::string unit = trim(s.substr(used));
  if (unit.empty() || unit == "B") return v;
  switch (std::toupper(static_cast<unsigned char>(unit[0]))) {
    case 'K': return v << 10;
    case 'M': return v << 20;
    case 'G': return v << 30;
    default: return 0;
  }
}

std::string cache_name(const CacheInfo& c) {
  std::string n = "L";  // (not "L" + to_string: GCC 12 -Wrestrict false positive)
  n += std::to_string(c.level);
  if (c.type == "Data") n += "d";
  else if (c.type == "Instruction") n += "i";
  return n;
}

HostInfo host_info(const std::string& root_str) {
  const fs::path root(root_str);
  const fs::path cpu_dir = root / "sys/devices/system/cpu";
  HostInfo h;
  int processors = 0;
  read_cpuinfo(root, h, processors);

  std::vector<int> online;
  const std::string online_list = read_line(cpu_dir / "online");
  if (!online_list.empty()) {
    try {
      online = parse_cpu_list(online_list);
    } catch (const Error&) {
      online.clear();
    }
  }
  if (online.empty())
    for (int i = 0; i < processors; ++i) online.push_back(i);
  h.threads = static_cast<int>(online.size());

  std::set<int> packages;
  std::set<std::pair<int, int>> cores;
  // (level, type) -> the distinct shared_cpu_lists: one per cache instance.
  std::map<std::pair<int, std::string>, std::set<std::string>> instances;
  for (int cpu : online) {
    const fs::path dir = cpu_dir / ("cpu" + std::to_string(cpu));
    int pkg = 0, core = 0;
    if (read_int(dir / "topology/physical_package_id", pkg) && read_int(dir / "topology/core_id", core)) {
      packages.insert(pkg);
      cores.insert({pkg, core});
    }
    std::error_code ec;
    for (int i = 0;; ++i) {
      const fs::path idx = dir / "cache" / ("index" + std::to_string(i));
      if (!fs::is_directory(idx, ec)) break;
      int level = 0;
      if (!read_int(idx / "level", level)) continue;
      instances[{level, read_line(idx / "type")}].insert(read_line(idx / "shared_cpu_list"));
    }
  }
  h.sockets = static_cast<int>(packages.size());
  h.cores = static_cast<int>(cores.size());

  // The sizes from the first online CPU, in its index order.
  if (!online.empty()) {
    const fs::path dir = cpu_dir / ("cpu" + std::to_string(online.front())) / "cache";
    std::error_code ec;
    for (int i = 0;; ++i) {
      const fs::path idx = dir / ("index" + std::to_string(i));
      if (!fs::is_directory(idx, ec)) break;
      CacheInfo c;
      if (!read_int(idx / "level", c.level)) continue;
      c.type = read_line(idx / "type");
      c.size_bytes = parse_size(read_line(idx / "size"));
      try {
        c.cpus_per_instance = static_cast<int>(parse_cpu_list(read_line(idx / "shared_cpu_list")).size());
      } catch (const Error&) {
        c.cpus_per_instance = 0;
      }
      c.instances = static_cast<int>(instances[{c.level, c.type}].size());
      h.caches.push_back(c);
    }
  }

  std::error_code ec;
  const fs::path node_dir = root / "sys/devices/system/node";
  if (fs::is_directory(node_dir, ec)) {
    for (const auto& e : fs::directory_iterator(node_dir, ec)) {
      const std::string name = e.path().filename().string();
      if (name.size() > 4 && name.compare(0, 4, "node") == 0 &&
          name.find_first_not_of("0123456789", 4) == std::string::npos && e.is_directory(ec))
        ++h.numa_nodes;
    }
  }

  std::ifstream mem(root / "proc/meminfo");
  std::string line;
  while (std::getline(mem, line)) {
    if (line.rfind("MemTotal:", 0) != 0) continue;
    std::stringstream ss(line.substr(9));
    int64_t kb = 0;
    ss >> kb;
    h.memory_bytes = kb * 1024;  // /proc/meminfo's "kB" are KiB
    break;
  }
  return h;
}

nlohmann::json to_json(const HostInfo& h) {
  nlohmann::json caches = nlohmann::json::array();
  for (const auto& c : h.caches)
    caches.push_back({{"name", cache_name(c)},
                      {"level", c.level},
                      {"type", c.type},
                      {"size_bytes", c.size_bytes},
                      {"cpus_per_instance", c.cpus_per_instance},
                      {"instances", c.instances}});
  return {{"cpu_model", h.cpu_model}, {"sockets", h.sockets},       {"cores", h.cores},
          {"threads", h.threads},     {"numa_nodes", h.numa_nodes}, {"caches", caches},
          {"memory_bytes", h.memory_bytes}};
}

}  // namespace forge::bench
