// PCRE2 behind forge::data::Regex (regex.h). Compiled only into builds that found PCRE2
// (FORGE_WITH_PCRE2); without it a Regex cannot be made and says how to get one.
#include "forge/data/regex.h"

#include "forge/core/error.h"
#include "forge/data/tokenizer.h"

#if FORGE_WITH_PCRE2
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#endif

namespace forge::data {

size_t utf8_char_len(std::string_view text, size_t pos) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data()) + pos;
  const size_t left = text.size() - pos;
  const unsigned char b0 = s[0];
  auto cont = [&](size_t i) { return i < left && (s[i] & 0xC0) == 0x80; };
  if (b0 < 0x80) return 1;
  if (b0 >= 0xC2 && b0 <= 0xDF) return cont(1) ? 2 : 0;
  if (b0 >= 0xE0 && b0 <= 0xEF) {
    if (!cont(1) || !cont(2)) return 0;
    if (b0 == 0xE0 && s[1] < 0xA0) return 0;  // overlong
    if (b0 == 0xED && s[1] > 0x9F) return 0;  // surrogates
    return 3;
  }
  if (b0 >= 0xF0 && b0 <= 0xF4) {
    if (!cont(1) || !cont(2) || !cont(3)) return 0;
    if (b0 == 0xF0 && s[1] < 0x90) return 0;  // overlong
    if (b0 == 0xF4 && s[1] > 0x8F) return 0;  // above U+10FFFF
    return 4;
  }
  return 0;
}

#if FORGE_WITH_PCRE2

bool have_regex_support() { return true; }

namespace {

// Each thread's match data (one ovector pair: only the whole match is read) and JIT stack.
struct ThreadMatch {
  pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
  pcre2_jit_stack* stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
  pcre2_match_context* context = pcre2_match_context_create(nullptr);
  ThreadMatch() { pcre2_jit_stack_assign(context, nullptr, stack); }
  ~ThreadMatch() {
    pcre2_match_context_free(context);
    pcre2_jit_stack_free(stack);
    pcre2_match_data_free(data);
  }
  ThreadMatch(const ThreadMatch&) = delete;
  ThreadMatch& operator=(const ThreadMatch&) = delete;
};

ThreadMatch& thread_match() {
  thread_local ThreadMatch m;
  return m;
}

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  const int n = pcre2_get_error_message(code, buf, sizeof(buf));
  return n < 0 ? "PCRE2 error " + std::to_string(code) : std::string(reinterpret_cast<const char*>(buf));
}

}  // namespace

struct Regex::Impl {
  std::string pattern;
  pcre2_code* code = nullptr;
  ~Impl() { pcre2_code_free(code); }
};

Regex::Regex(std::string_view pattern, const std::string& origin) {
  auto impl = std::make_shared<Impl>();
  impl->pattern = std::string(pattern);
  int err = 0;
  PCRE2_SIZE offset = 0;
  impl->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                             PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &offset, nullptr);
  FORGE_CHECK(impl->code != nullptr, origin, ": the pre-tokenizer pattern \"", pattern,
              "\" does not compile (PCRE2: ", pcre2_message(err), " at offset ", offset, ")");
  pcre2_jit_compile(impl->code, PCRE2_JIT_COMPLETE);  // without a JIT, pcre2_match interprets
  impl_ = std::move(impl);
}

void Regex::find(std::string_view text, size_t start, size_t& begin, size_t& end) const {
  ThreadMatch& m = thread_match();
  const int rc = pcre2_match(impl_->code, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), start, 0, m.data,
                             m.context);
  if (rc == PCRE2_ERROR_NOMATCH) {
    begin = end = std::string_view::npos;
    return;
  }
  FORGE_CHECK(rc >= 0, "pre-tokenizer pattern \"", impl_->pattern, "\": matching failed (PCRE2: ", pcre2_message(rc),
              ")");
  const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(m.data);
  begin = ov[0];
  end = ov[1];
}

#else  // no PCRE2

bool have_regex_support() { return false; }

struct Regex::Impl {
  std::string pattern;
};

Regex::Regex(std::string_view pattern, const std::string& origin) {
  FORGE_THROW(origin, ": the pre-tokenizer pattern \"", pattern,
              "\" needs PCRE2, and this forge was built without it: install libpcre2-dev "
              "(scripts/install-deps.sh) and configure again");
}

void Regex::find(std::string_view, size_t, size_t& begin, size_t& end) const {
  begin = end = std::string_view::npos;
}

#endif

const std::string& Regex::pattern() const { return impl_->pattern; }

}  // namespace forge::data
