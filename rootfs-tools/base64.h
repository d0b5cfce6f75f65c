// Base64 as registries use it: the standard alphabet with padding in docker's config.json
// ("auth": base64("user:pass")), the URL-safe one without padding in JSON web tokens.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace berth::images {

enum class Base64Alphabet { standard, url };

std::string base64_encode(std::string_view bytes,
                          Base64Alphabet alphabet = Base64Alphabet::standard);

// The decoded bytes, or nothing when `text` is not base64 of that alphabet. Padding is
// optional (some writers leave it off); whitespace is not allowed.
std::optional<std::string> base64_decode(std::string_view text,
                                         Base64Alphabet alphabet = Base64Alphabet::standard);

}  // namespace berth::images
