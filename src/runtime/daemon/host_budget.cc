#include "runtime/daemon/host_budget.h"

#include <algorithm>
#include <charconv>
#include <string_view>

#include "base/error.h"
#include "base/files.h"
#include "base/size.h"

namespace berth::daemon {

namespace {

constexpr uint64_t kGiB = uint64_t{1} << 30, kMiB = uint64_t{1} << 20;

uint64_t number_in(const std::string& text, const std::string& path) {
    uint64_t value = 0;
    const char* begin = text.data();
    while (begin < text.data() + text.size() && (*begin == ' ' || *begin == '\t')) ++begin;
    auto [end, ec] = std::from_chars(begin, text.data() + text.size(), value);
    if (ec != std::errc() || end == begin) throw SysError("parse", path, EINVAL);
    return value;
}

}  // namespace

HostFacts read_host_facts() {
    HostFacts facts;
    const std::string meminfo = read_file("/proc/meminfo");
    const size_t at = meminfo.find("MemTotal:");
    if (at == std::string::npos) throw SysError("parse", "/proc/meminfo (no MemTotal)", EINVAL);
    facts.memory_total = number_in(meminfo.substr(at + 9), "/proc/meminfo") * 1024;  // kB
    facts.pid_max = number_in(read_file("/proc/sys/kernel/pid_max"), "/proc/sys/kernel/pid_max");
    facts.threads_max =
        number_in(read_file("/proc/sys/kernel/threads-max"), "/proc/sys/kernel/threads-max");
    return facts;
}

HostBudget derive_budget(const HostFacts& host) {
    HostBudget b;
    if (host.memory_total >= 2 * kGiB) {
        b.total_memory = host.memory_total - std::max(kGiB, host.memory_total / 5);
    } else {
        b.total_memory = host.memory_total / 2;
    }
    b.total_memory -= b.total_memory % kMiB;  // whole MiB, as the kernel keeps whole pages
    uint64_t tasks = host.pid_max;
    if (host.threads_max) tasks = std::min(tasks, host.threads_max);
    b.total_pids = tasks / 2;
    derive_defaults(&b);
    return b;
}

void derive_defaults(HostBudget* b) {
    b->default_memory =
        b->total_memory ? std::min(b->total_memory, std::max(512 * kMiB, b->total_memory / 8)) : 0;
    b->default_memory -= b->default_memory % kMiB;
    b->default_pids =
        b->total_pids ? std::min(b->total_pids, std::clamp<uint64_t>(b->total_pids / 16, 256, 4096))
                      : 4096;
}

bool parse_budget_option(const std::string& text, bool size, uint64_t derived, uint64_t* out,
                         std::string* error) {
    if (text == "auto") {
        *out = derived;
        return true;
    }
    if (text == "none" || text == "0") {
        *out = 0;
        return true;
    }
    if (size) {
        auto bytes = parse_size(text, error);
        if (!bytes) return false;
        *out = *bytes;
        return true;
    }
    uint64_t value = 0;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (ec != std::errc() || end != text.data() + text.size() || text.empty()) {
        *error = "'" + text + "' is not a number, auto or none";
        return false;
    }
    *out = value;
    return true;
}

}  // namespace berth::daemon
