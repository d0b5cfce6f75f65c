// The filesystem berth-images' workers see: a small tmpfs, mounted over `staging` (an
// existing directory, in a mount namespace of the worker's own) while it is made, then made
// the root by pivot_root and remounted read-only. It holds the host's /usr and /etc
// (read-only binds: the programs' libraries, the resolver's and TLS configuration), the
// /bin and /lib links (or directories), the resolver's directory when /etc/resolv.conf points
// outside /etc, /dev/{null,zero,random,urandom}, and optionally a /proc of its own (the
// worker must then be in a pid namespace of its own). Nothing else: no /home, /tmp, /var or
// /run, so a worker that a stranger's bytes subverted reads and writes nothing of the host's
// beyond the programs' own files, and reaches no berth socket or store.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace berth::images_service {

struct WorkerRoot {
    std::string staging;
    std::vector<std::string> dirs;   // made in order (full paths under staging)
    std::vector<std::string> files;  // empty files made, then bound over (device nodes)
    struct Bind {
        std::string from, to;
        unsigned long extra_flags;  // MS_NODEV for trees, 0 for the device nodes
    };
    std::vector<Bind> binds;
    std::vector<std::pair<std::string, std::string>> links;  // target, path
    std::string proc, old_root;
};

// A directory any user may reach that a worker's root can be made over: /tmp, else /var/tmp
// or /mnt (std::runtime_error when the host has none).
std::string worker_root_staging();

// Works out the mounts (before the fork: the child only makes system calls).
WorkerRoot make_worker_root(const std::string& staging, bool proc);
// In the child, in its own mount namespace, privileged there: builds `root` and enters it.
// 0, or the number of the step that failed.
int enter_worker_root(const WorkerRoot& root);

}  // namespace berth::images_service
