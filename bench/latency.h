// Latency samples for the benchmark programs: milliseconds since a point, and a summary
// with medians first (these machines are noisy).
#pragma once

#include <algorithm>
#include <chrono>
#include <vector>

namespace berth::bench {

using Clock = std::chrono::steady_clock;

inline double ms_since(Clock::time_point t) {
    return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

struct Summary {
    double p50 = 0, p90 = 0, min = 0, max = 0;
    size_t n = 0;
};

inline Summary summarize(std::vector<double> v) {
    if (v.empty()) return {};
    std::sort(v.begin(), v.end());
    auto at = [&](double q) {
        return v[std::min(v.size() - 1, static_cast<size_t>(q * v.size()))];
    };
    return {at(0.5), at(0.9), v.front(), v.back(), v.size()};
}

}  // namespace berth::bench
