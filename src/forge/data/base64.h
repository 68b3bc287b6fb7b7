#pragma once
// Standard base64 (RFC 4648, with '=' padding): tiktoken rank files, and the forge wrapper
// that embeds a tokenizer file in a run directory (tokenizer.cpp).
#include <optional>
#include <string>
#include <string_view>

namespace forge::data {

std::string base64_encode(std::string_view bytes);
// nullopt when `text` is not base64.
std::optional<std::string> base64_decode(std::string_view text);

}  // namespace forge::data
