// Note [launch output] (launch_output.h): the ranks' lines, each error once with its ranks, and
// mpirun's own blocks only where they add something.
#include "forge/parallel/launch_output.h"

#include <charconv>
#include <utility>

namespace forge::parallel {

namespace {

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

// Lines that every rank may print alike: held to be printed once.
bool held_kind(std::string_view text) {
  return starts_with(text, "forge: error:") || starts_with(text, "forge: warning:");
}

// A line of 20+ dashes and nothing else: the frame of an Open MPI message block.
bool is_frame(std::string_view s) {
  while (!s.empty() && (s.back() == '\r' || s.back() == ' ')) s.remove_suffix(1);
  return s.size() >= 20 && s.find_first_not_of('-') == std::string_view::npos;
}

// The integer after `key` in `s` (skipping spaces), if any.
std::optional<int> int_after(std::string_view s, std::string_view key) {
  const size_t k = s.find(key);
  if (k == std::string_view::npos) return std::nullopt;
  size_t i = k + key.size();
  while (i < s.size() && s[i] == ' ') ++i;
  int v = 0;
  const auto r = std::from_chars(s.data() + i, s.data() + s.size(), v);
  if (r.ec != std::errc{}) return std::nullopt;
  return v;
}

// Open MPI's --tag-output tag, "[JOB,RANK]<stdout>:" (or <stderr>, <stddiag>; Open MPI 5 adds a
// space) at s[pos]: the rank and the tag's length, or nothing.
struct Tag {
  int rank;
  size_t size;
};
std::optional<Tag> tag_at(std::string_view s, size_t pos) {
  if (pos >= s.size() || s[pos] != '[') return std::nullopt;
  const size_t comma = s.find(',', pos), close = s.find(']', pos);
  if (comma == std::string_view::npos || close == std::string_view::npos || comma > close || close - pos > 24)
    return std::nullopt;
  for (size_t i = pos + 1; i < close; ++i)
    if (i != comma && (s[i] < '0' || s[i] > '9')) return std::nullopt;
  int rank = 0;
  const auto r = std::from_chars(s.data() + comma + 1, s.data() + close, rank);
  if (r.ec != std::errc{} || r.ptr != s.data() + close || comma == pos + 1) return std::nullopt;
  const std::string_view rest = s.substr(close + 1);
  for (std::string_view stream : {"<stdout>:", "<stderr>:", "<stddiag>:"})
    if (starts_with(rest, stream)) return Tag{rank, close + 1 - pos + stream.size()};
  return std::nullopt;
}

// The position of the next tag in s at or after pos (npos: none).
size_t next_tag(std::string_view s, size_t pos) {
  for (size_t i = s.find('[', pos); i != std::string_view::npos; i = s.find('[', i + 1))
    if (tag_at(s, i)) return i;
  return std::string_view::npos;
}

}  // namespace

std::string format_ranks(const std::set<int>& ranks) {
  std::string out;
  for (auto it = ranks.begin(); it != ranks.end();) {
    int first = *it, last = first;
    auto next = std::next(it);
    while (next != ranks.end() && *next == last + 1) last = *next++;
    if (!out.empty()) out += ", ";
    out += std::to_string(first);
    if (last > first) out += (last == first + 1 ? ", " : "-") + std::to_string(last);
    it = next;
  }
  return out;
}

LaunchOutput::LaunchOutput(Options opt, Sink sink) : opt_(opt), sink_(std::move(sink)) {}

std::string LaunchOutput::rank_prefix(const std::set<int>& ranks) const {
  if (!opt_.prefix || ranks.empty()) return {};
  return (ranks.size() == 1 ? "[rank " : "[ranks ") + format_ranks(ranks) + "] ";
}

void LaunchOutput::print(bool is_err, const std::string& prefix, std::string_view text) {
  std::string line = prefix;
  line.append(text).push_back('\n');
  sink_(is_err, line);
}

void LaunchOutput::line(int rank, bool is_err, std::string_view text, Clock::time_point now) {
  if (rank >= 0) return rank_line(rank, is_err, text, now);
  if (opt_.mpirun_tags && tag_at(text, 0)) return tagged_line(is_err, text, now);
  mpirun_line(is_err, text);
}

// Open MPI tags each piece a rank wrote, not each line: a rank that writes "forge: error: " and
// its message apart arrives as "[1,0]<stderr>:forge: error: [1,0]<stderr>:the message", and
// another rank's piece may come between the two. The pieces join in each rank's own line until
// a newline ends it (the newline ends the last piece of the physical line).
void LaunchOutput::tagged_line(bool is_err, std::string_view text, Clock::time_point now) {
  size_t pos = 0;
  while (pos < text.size()) {
    const auto tag = tag_at(text, pos);
    if (!tag) break;  // (cannot happen: pos is always at a tag)
    const size_t start = pos + tag->size;
    size_t end = next_tag(text, start);
    const bool last = end == std::string_view::npos;
    if (last) end = text.size();
    std::string_view piece = text.substr(start, end - start);
    std::string& partial = partial_[{tag->rank, is_err}];
    if (opt_.tag_space && partial.empty() && !piece.empty() && piece[0] == ' ') piece.remove_prefix(1);
    partial.append(piece);
    if (last) {
      const std::string whole = std::move(partial);
      partial_.erase({tag->rank, is_err});
      rank_line(tag->rank, is_err, whole, now);
    }
    pos = end;
  }
}

void LaunchOutput::rank_line(int rank, bool is_err, std::string_view text, Clock::time_point now) {
  if (!held_kind(text)) {
    flush_rank(rank);  // its held lines came first
    print(is_err, rank_prefix({rank}), text);
    return;
  }
  for (auto& h : held_) {
    if (h.text == text && h.is_err == is_err && !h.ranks.count(rank)) {
      h.ranks.insert(rank);
      if (opt_.world > 0 && static_cast<int>(h.ranks.size()) >= opt_.world) flush_held(static_cast<size_t>(&h - held_.data()));
      return;
    }
  }
  for (const auto& [t, ranks] : printed_) {
    if (t == text && !ranks.count(rank)) {
      print(is_err, rank_prefix({rank}), "(the same as " + std::string(ranks.size() == 1 ? "rank " : "ranks ") +
                                             format_ranks(ranks) + ")");
      return;
    }
  }
  held_.push_back({std::string(text), is_err, {rank}, now, next_id_++});
}

void LaunchOutput::flush_held(size_t i) {
  // The earlier held lines of these ranks come out first (each rank's lines keep their order);
  // flushing one may flush others before it, so the line is found again by its id each time.
  const uint64_t id = held_[i].id;
  auto index = [&] {
    size_t k = 0;
    while (held_[k].id != id) ++k;
    return k;
  };
  for (;;) {
    i = index();
    size_t j = 0;
    for (; j < i; ++j) {
      bool shared = false;
      for (int r : held_[j].ranks) shared |= held_[i].ranks.count(r) > 0;
      if (shared) break;
    }
    if (j == i) break;
    flush_held(j);
  }
  Held h = std::move(held_[i]);
  held_.erase(held_.begin() + static_cast<std::ptrdiff_t>(i));
  print(h.is_err, rank_prefix(h.ranks), h.text);
  printed_.emplace_back(std::move(h.text), std::move(h.ranks));
}

void LaunchOutput::flush_rank(int rank) {
  for (size_t i = 0; i < held_.size();) {
    if (held_[i].ranks.count(rank)) flush_held(i);
    else ++i;
  }
}

void LaunchOutput::tick(Clock::time_point now) {
  const auto hold = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(opt_.hold_seconds));
  for (size_t i = 0; i < held_.size();) {
    if (now - held_[i].since >= hold) flush_held(i);
    else ++i;
  }
}

void LaunchOutput::finish() {
  for (auto& [key, partial] : partial_) rank_line(key.first, key.second, partial, Clock::now());
  partial_.clear();
  while (!held_.empty()) flush_held(0);
  if (in_block_) {  // an unfinished block: as it came
    for (const auto& l : block_) print(block_is_err_, {}, l);
    block_.clear();
    in_block_ = false;
  }
}

void LaunchOutput::mpirun_line(bool is_err, std::string_view text) {
  if (!in_block_) {
    if (!is_frame(text)) return print(is_err, {}, text);
    in_block_ = true;
    block_is_err_ = is_err;
    block_.assign(1, std::string(text));
    return;
  }
  block_.emplace_back(text);
  if (is_frame(text)) end_block();
}

void LaunchOutput::end_block() {
  in_block_ = false;
  std::string all;
  for (const auto& l : block_) all += l + "\n";
  std::vector<std::string> lines = std::move(block_);
  block_.clear();
  // "Primary job  terminated normally, but 1 process returned a non-zero exit code. Per
  // user-direction, the job has been aborted.": the launcher says which rank, and how.
  if (all.find("terminated normally, but") != std::string::npos && all.find("non-zero exit code") != std::string::npos) {
    a_rank_failed_ = true;
    return;
  }
  // "mpirun detected that one or more processes exited with non-zero status ... Process name:
  // [[J,1],R]  Exit code: C"
  if (all.find("exited with non-zero status") != std::string::npos) {
    const size_t name = all.find("Process name:");
    const size_t inner = name == std::string::npos ? name : all.find("],", name);
    const auto rank = inner == std::string::npos ? std::nullopt : int_after(all.substr(inner), "],");
    const auto code = int_after(all, "Exit code:");
    if (rank && code) {
      if (!first_failure_) first_failure_ = RankFailure{*rank, *code, 0};
      return;
    }
  }
  // "mpirun noticed that process rank R with PID P on node N exited on signal S (Name)."
  if (all.find("mpirun noticed that process rank") != std::string::npos && all.find("on signal") != std::string::npos) {
    const auto rank = int_after(all, "process rank");
    const auto sig = int_after(all, "on signal");
    if (rank && sig) {
      if (!first_failure_) first_failure_ = RankFailure{*rank, -1, *sig};
      return;
    }
  }
  for (const auto& l : lines) print(block_is_err_, {}, l);
}

}  // namespace forge::parallel
