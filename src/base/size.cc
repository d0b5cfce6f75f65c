#include "base/size.h"

#include <cctype>
#include <cmath>
#include <cstdio>

namespace berth {

std::optional<uint64_t> parse_size(std::string_view text, std::string* error) {
    const std::string quoted = "'" + std::string(text) + "'";
    size_t i = 0;
    long double value = 0;
    bool digits = false;
    while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) {
        value = value * 10 + (text[i++] - '0');
        digits = true;
    }
    if (i < text.size() && text[i] == '.') {
        long double scale = 0.1L;
        for (++i; i < text.size() && std::isdigit(static_cast<unsigned char>(text[i])); ++i) {
            value += (text[i] - '0') * scale;
            scale /= 10;
            digits = true;
        }
    }
    if (!digits) {
        *error = quoted + " is not a size (a number of bytes, or with a unit: 512m, 10g)";
        return std::nullopt;
    }
    std::string unit;
    for (; i < text.size(); ++i)
        unit += static_cast<char>(std::tolower(static_cast<unsigned char>(text[i])));
    long double mult = 1;
    if (unit.empty() || unit == "b") {
        mult = 1;
    } else {
        static constexpr std::string_view kUnits = "kmgt";
        const size_t power = kUnits.find(unit[0]);
        const std::string_view rest = std::string_view(unit).substr(1);
        if (power == std::string_view::npos || !(rest.empty() || rest == "b" || rest == "ib")) {
            *error = quoted + ": unknown size unit '" +
                     std::string(text.substr(text.size() - unit.size())) + "' (b, k, m, g or t)";
            return std::nullopt;
        }
        mult = std::pow(1024.0L, static_cast<long double>(power + 1));
    }
    const long double bytes = std::floor(value * mult);
    if (!std::isfinite(bytes) || bytes > 18446744073709551615.0L) {
        *error = quoted + " is too large";
        return std::nullopt;
    }
    return static_cast<uint64_t>(bytes);
}

std::string format_size(uint64_t bytes) {
    static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    double value = static_cast<double>(bytes);
    size_t unit = 0;
    while (value >= 1024 && unit + 1 < std::size(kUnits)) {
        value /= 1024;
        ++unit;
    }
    char buf[64];
    if (unit == 0 || value == std::floor(value))
        std::snprintf(buf, sizeof buf, "%.0f %s", value, kUnits[unit]);
    else
        std::snprintf(buf, sizeof buf, "%.1f %s", value, kUnits[unit]);
    return buf;
}

}  // namespace berth
