#pragma once
// Unicode normalisation forms (NFC, NFD, NFKC, NFKD) for Hugging Face normalizers, on
// utf8proc. Invalid UTF-8 is kept as it is (only the valid runs around it are normalised,
// Note [invalid UTF-8] in regex.h). Builds without utf8proc refuse the forms when loading.
#include <string>
#include <string_view>

namespace forge::data {

enum class UnicodeForm { nfc, nfd, nfkc, nfkd };

// Throws forge::Error naming `origin` when this forge was built without utf8proc.
void check_unicode_normalization(UnicodeForm form, const std::string& origin);
std::string unicode_normalize(std::string_view text, UnicodeForm form);

}  // namespace forge::data
