#include "base/proc.h"

#include <string>

#include "base/error.h"
#include "base/files.h"

namespace berth {

uint64_t process_start_time(pid_t pid) {
    std::string stat;
    try {
        stat = read_file("/proc/" + std::to_string(pid) + "/stat");
    } catch (const SysError& e) {
        // ESRCH: the process exited between open() and read().
        if (e.code() == ENOENT || e.code() == ESRCH) return 0;
        throw;
    }
    // The command name (field 2) may hold spaces and parentheses: count from the last ')'.
    size_t pos = stat.rfind(')');
    if (pos == std::string::npos) return 0;
    // A zombie (Z) or dying (X) process has ended: to every caller (is a sandbox's init
    // still there?) it is gone. One whose parent does not reap it stays a zombie for good:
    // an init reparented, once the helper exited, to a subreaper that never waits.
    if (pos + 2 < stat.size() && (stat[pos + 2] == 'Z' || stat[pos + 2] == 'X')) return 0;
    int field = 2;
    for (size_t i = pos + 1; i < stat.size(); ++i) {
        if (stat[i] == ' ' && ++field == 22) return std::stoull(stat.substr(i + 1));
    }
    return 0;
}

}  // namespace berth
