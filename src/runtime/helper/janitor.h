// Removal of a deleted sandbox's directories off the delete's critical path.
//
// A delete is answered once the sandbox is dead and its directories are out of sight (renamed
// into a trash directory beside them), not once they are off the disk: a writable layer can
// hold gigabytes, and even an empty one costs milliseconds of inode evictions on a journaled
// filesystem. A process of the helper's own (berth-janitor, forked while the helper is small)
// empties the trash directories in parallel. Nothing leaks: what a janitor did not finish (the
// helper died) is swept by the next janitor when it starts.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "base/child_process.h"
#include "base/unique_fd.h"

namespace berth::helper {

class Janitor {
  public:
    // `trash_dirs` are made (0700) if missing; whatever an earlier helper left in them is
    // removed. Each must be on the filesystem of the paths later discarded into it.
    explicit Janitor(std::vector<std::string> trash_dirs);
    // Closes the janitor's socket: it finishes the sweep at hand and exits.
    ~Janitor();
    Janitor(const Janitor&) = delete;
    Janitor& operator=(const Janitor&) = delete;

    // Moves `path` (absent: nothing to do) to `trash_dirs[trash]/name`, where it is removed
    // in the background. Where it cannot be moved (another filesystem, a name taken), or
    // no janitor can be started, it is removed here and now. Throws SysError if that fails.
    void discard(const std::string& path, size_t trash, const std::string& name);

    pid_t pid() const { return process_.pid(); }

  private:
    // Forks a janitor (it sweeps the trash as it starts). A dead one is replaced at the
    // next discard, its zombie reaped.
    void start();

    std::vector<std::string> trash_;
    UniqueFd poke_;  // our end of the janitor's socket: one byte = "look again"
    ChildProcess process_;
};

// Removes every entry of each directory in `dirs` (not the directories). Reports failures
// to stderr and goes on; returns how many entries could not be removed.
size_t sweep_trash(const std::vector<std::string>& dirs);

}  // namespace berth::helper
