// Sizes as people write them: "512m", "10g", "1.5GiB", "4096". Unprivileged, pure.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace berth {

// A number (digits, optionally a fraction) and an optional binary unit: b, k, m, g, t
// (either case, with an optional "b"/"iB": "kb", "KiB", "MB"...). Strict: no sign, no
// exponent, no "nan"/"inf", no spaces, nothing after the unit, nothing past 2^64-1. Returns
// the number of bytes, or nullopt with `error` saying what was wrong with `text`.
std::optional<uint64_t> parse_size(std::string_view text, std::string* error);

// "64 MiB", "1.5 GiB", "512 B": for messages.
std::string format_size(uint64_t bytes);

}  // namespace berth
