// A pipe whose two ends are owned.
#pragma once

#include <fcntl.h>

#include <string_view>

#include "base/unique_fd.h"

namespace berth {

struct Pipe {
    UniqueFd read;
    UniqueFd write;
};

// pipe2(`flags`, O_CLOEXEC by default). Throws SysError naming `what` (EMFILE and ENFILE
// included: callers that answer a client map them to RESOURCE_EXHAUSTED).
Pipe make_pipe(std::string_view what, int flags = O_CLOEXEC);

}  // namespace berth
