// NFC/NFD/NFKC/NFKD through utf8proc (unicode_normalize.h), compiled in with FORGE_WITH_UTF8PROC.
#include "forge/data/unicode_normalize.h"

#include <cstdlib>

#include "forge/core/error.h"
#include "forge/data/regex.h"

#if FORGE_WITH_UTF8PROC
#include <utf8proc.h>
#endif

namespace forge::data {

#if FORGE_WITH_UTF8PROC

void check_unicode_normalization(UnicodeForm, const std::string&) {}

std::string unicode_normalize(std::string_view text, UnicodeForm form) {
  int options = UTF8PROC_STABLE;
  switch (form) {
    case UnicodeForm::nfc: options |= UTF8PROC_COMPOSE; break;
    case UnicodeForm::nfd: options |= UTF8PROC_DECOMPOSE; break;
    case UnicodeForm::nfkc: options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
    case UnicodeForm::nfkd: options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
  }
  std::string out;
  out.reserve(text.size());
  for_each_utf8_run(text, [&](std::string_view run, bool valid) {
    bool ascii = true;
    for (const unsigned char c : run) ascii = ascii && c < 0x80;
    if (!valid || ascii) {  // ASCII is in every normal form
      out += run;
      return;
    }
    utf8proc_uint8_t* dst = nullptr;
    const auto n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(run.data()),
                                static_cast<utf8proc_ssize_t>(run.size()), &dst, static_cast<utf8proc_option_t>(options));
    FORGE_CHECK(n >= 0, "Unicode normalisation failed: ", utf8proc_errmsg(n));
    out.append(reinterpret_cast<const char*>(dst), static_cast<size_t>(n));
    std::free(dst);
  });
  return out;
}

#else

void check_unicode_normalization(UnicodeForm, const std::string& origin) {
  FORGE_THROW(origin, ": its Unicode normalizer (NFC/NFD/NFKC/NFKD) needs utf8proc, and this forge was built "
              "without it: install libutf8proc-dev (scripts/install-deps.sh) and configure again");
}
std::string unicode_normalize(std::string_view text, UnicodeForm) { return std::string(text); }

#endif

}  // namespace forge::data
