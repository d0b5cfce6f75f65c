// Resource limits every sandbox process starts with.
#include <sys/resource.h>

#include <algorithm>
#include <fstream>

#include "base/error.h"
#include "ns/security.h"

namespace berth::ns {
namespace {

// Enough for any real workload, and the kernel's default fs.nr_open.
constexpr rlim_t kNofileCeiling = rlim_t{1} << 20;

// The kernel rejects RLIMIT_NOFILE above fs.nr_open with EPERM. Returns 0 when it cannot be
// read (no /proc in this mount namespace): then only kNofileCeiling applies.
rlim_t read_nr_open() {
    std::ifstream in("/proc/sys/fs/nr_open");
    rlim_t value = 0;
    if (!(in >> value)) return 0;
    return value;
}

}  // namespace

rlim_t raise_nofile_limit() {
    rlimit lim{};
    check_sys("getrlimit", "RLIMIT_NOFILE", [&] { return getrlimit(RLIMIT_NOFILE, &lim); });
    rlim_t target = std::min(lim.rlim_max, kNofileCeiling);
    if (const rlim_t nr_open = read_nr_open(); nr_open > 0) target = std::min(target, nr_open);
    // Soft = hard: programs that never call setrlimit get the full limit at once. The hard
    // limit only ever goes down here, to what the kernel would let a process use anyway.
    lim.rlim_cur = lim.rlim_max = target;
    check_sys("setrlimit", "RLIMIT_NOFILE", [&] { return setrlimit(RLIMIT_NOFILE, &lim); });
    return target;
}

}  // namespace berth::ns
