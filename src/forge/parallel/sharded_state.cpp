#include "forge/parallel/sharded_state.h"

#include <algorithm>
#include <charconv>
#include <cmath>

#include "forge/autograd/grad_mode.h"
#include "forge/core/error.h"
#include "forge/io/checkpoint.h"
#include "forge/ops/creation.h"

namespace forge::parallel {

namespace fs = std::filesystem;

namespace {

std::string range_key(const std::string& param, int64_t lo) { return param + "|" + std::to_string(lo); }

// A count from a shard file's names or metadata (untrusted input, issue 43): decimal digits alone,
// in [0, 2^62], else a forge::Error naming the file and the field (never std::stoll's exceptions).
int64_t file_count(const std::string& text, const std::string& what, const std::string& where) {
  int64_t v = -1;
  const char* end = text.data() + text.size();
  const auto [p, ec] = std::from_chars(text.data(), end, v);
  FORGE_CHECK(!text.empty() && ec == std::errc() && p == end && v >= 0 && v <= (int64_t{1} << 62), where, ": ", what,
              " '", text.substr(0, 40), "' is not a count (decimal digits, at most 2^62)");
  return v;
}

}  // namespace

void write_optimizer_shard(const fs::path& file, const std::vector<ShardPiece>& pieces,
                           const std::vector<std::map<std::string, Tensor>>& state, const std::vector<int64_t>& steps,
                           int64_t checkpoint_step) {
  FORGE_CHECK(state.size() == pieces.size() && steps.size() == pieces.size(),
              "write_optimizer_shard: pieces, state and steps differ in length");
  std::vector<std::pair<std::string, Tensor>> tensors;
  io::SafetensorsMetadata meta{{"format", "forge-optimizer-shard"}, {"forge_step", std::to_string(checkpoint_step)}};
  for (size_t k = 0; k < pieces.size(); ++k) {
    if (steps[k] <= 0 && state[k].empty()) continue;
    const std::string key = range_key(pieces[k].param, pieces[k].lo);
    meta["step|" + key] = std::to_string(steps[k]);
    for (const auto& [name, t] : state[k]) {
      FORGE_CHECK(t.numel() == pieces[k].hi - pieces[k].lo, "write_optimizer_shard: state '", name, "' of ", key,
                  " has ", t.numel(), " elements for a range of ", pieces[k].hi - pieces[k].lo);
      tensors.emplace_back(name + "|" + key, t.reshape({-1}).to(Device::cpu()));
    }
  }
  io::check_finite(tensors, "checkpoint of step " + std::to_string(checkpoint_step) + " not written (" +
                                file.filename().string() + ")");
  // save_safetensors writes through a temporary and a rename (io/atomic_file.h).
  io::save_safetensors(file, tensors, meta);
}

void RangedState::add(const std::string& param, int64_t lo, int64_t hi, int64_t step, const std::string& name,
                      const Tensor& t) {
  auto& rs = ranges_[param];
  auto it = std::find_if(rs.begin(), rs.end(), [&](const Range& r) { return r.lo == lo; });
  // Ranges of one parameter are disjoint or the same (one per saving rank's piece): an overlap
  // could leave elements of get()'s result unwritten while the count of covered ones still adds up.
  for (const Range& r : rs)
    FORGE_CHECK(r.lo == lo || hi <= r.lo || r.hi <= lo, "optimizer state: the ranges [", r.lo, ", ", r.hi, ") and [",
                lo, ", ", hi, ") of '", param, "' overlap; a shard file of the checkpoint is damaged or from another run");
  if (it == rs.end()) {
    rs.push_back({lo, hi, step, {}});
    it = rs.end() - 1;
  }
  FORGE_CHECK(it->hi == hi, "optimizer state: two ranges of '", param, "' start at ", lo, " with different ends (",
              it->hi, ", ", hi, ")");
  if (!name.empty()) it->state[name] = t;
}

void RangedState::add_shard_file(const fs::path& file) {
  const io::SafetensorsFile f = io::load_safetensors(file);
  const std::string where = "optimizer shard '" + file.string() + "'";
  std::map<std::string, int64_t> steps;
  for (const auto& [k, v] : f.metadata)
    if (k.rfind("step|", 0) == 0) steps[k.substr(5)] = file_count(v, "the update count of " + k.substr(5), where);
  for (const auto& [key, t] : f.tensors) {
    const auto a = key.find('|');
    const auto b = key.rfind('|');
    FORGE_CHECK(a != std::string::npos && b != a, "optimizer shard '", file.string(), "': tensor name '", key,
                "' is not <state>|<param>|<lo>");
    const std::string name = key.substr(0, a), param = key.substr(a + 1, b - a - 1);
    const int64_t lo = file_count(key.substr(b + 1), "the first element <lo> of tensor '" + key + "'", where);
    const auto st = steps.find(range_key(param, lo));
    add(param, lo, lo + t.numel(), st == steps.end() ? 0 : st->second, name, t);
  }
}

void RangedState::add_full_state(const io::NamedTensors& tensors, const std::map<std::string, double>& scalars,
                                 const std::vector<std::string>& slot_names) {
  for (const auto& [key, t] : tensors) {
    FORGE_CHECK(key.rfind("state.", 0) == 0, "optimizer state: unexpected tensor '", key, "'");
    const auto dot = key.find('.', 6);
    FORGE_CHECK(dot != std::string::npos, "optimizer state: tensor '", key, "' is not state.<slot>.<name>");
    const auto k = static_cast<size_t>(file_count(key.substr(6, dot - 6), "the slot of tensor '" + key + "'",
                                                  "optimizer state"));
    FORGE_CHECK(k < slot_names.size(), "optimizer state: slot ", k, " of '", key, "' is beyond the ",
                slot_names.size(), " parameters of this model");
    const auto st = scalars.find("state." + std::to_string(k) + ".step");
    const double step = st == scalars.end() ? 0.0 : st->second;
    FORGE_CHECK(step >= 0 && step <= 4.6e18 && step == std::floor(step), "optimizer state: the update count ", step,
                " of slot ", k, " is not a count");  // (NaN fails the first test)
    add(slot_names[k], 0, t.numel(), static_cast<int64_t>(step), key.substr(dot + 1),
        t.reshape({-1}));
  }
}

Tensor RangedState::get(const std::string& param, const std::string& name, int64_t lo, int64_t hi) const {
  auto it = ranges_.find(param);
  if (it == ranges_.end()) return Tensor();
  NoGradGuard no_grad;
  Tensor out;
  int64_t covered = 0;
  bool any_state = false;
  for (const Range& r : it->second) {
    auto s = r.state.find(name);
    if (s == r.state.end()) continue;
    any_state = true;
    const int64_t a = std::max(lo, r.lo), e = std::min(hi, r.hi);
    if (a >= e) continue;
    if (!out.defined()) out = forge::empty({hi - lo}, {.dtype = s->second.dtype()});
    out.narrow(0, a - lo, e - a).copy_(s->second.narrow(0, a - r.lo, e - a));
    covered += e - a;
  }
  if (!any_state) return Tensor();
  FORGE_CHECK(covered == hi - lo, "optimizer state: the saved ranges of '", name, "' for '", param, "' cover ",
              covered, " of the elements [", lo, ", ", hi,
              "); a shard file of the checkpoint is missing or from another model");
  return out;
}

int64_t RangedState::step(const std::string& param, int64_t lo, int64_t hi) const {
  auto it = ranges_.find(param);
  if (it == ranges_.end()) return 0;
  int64_t step = -1;
  for (const Range& r : it->second) {
    if (std::max(lo, r.lo) >= std::min(hi, r.hi)) continue;
    FORGE_CHECK(step < 0 || step == r.step, "optimizer state: the saved ranges of '", param,
                "' disagree on the update count (", step, " vs ", r.step, ")");
    step = r.step;
  }
  return std::max<int64_t>(step, 0);
}

std::set<std::string> RangedState::state_names() const {
  std::set<std::string> names;
  for (const auto& [p, rs] : ranges_)
    for (const auto& r : rs)
      for (const auto& [n, t] : r.state) names.insert(n);
  return names;
}

}  // namespace forge::parallel
