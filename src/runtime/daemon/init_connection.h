// Opening a connection to a sandbox's init (its control socket): one per exec or file
// operation.
#pragma once

#include <string>

#include "base/unique_fd.h"
#include "berth.pb.h"

namespace berth::daemon {

struct InitConnection {
    UniqueFd fd;  // non-blocking, close-on-exec; invalid on failure
    v1::ErrorCode code = v1::ERROR_CODE_UNSPECIFIED;
    std::string message;  // why not, naming the sandbox
};

InitConnection connect_to_init(const std::string& socket_path, const std::string& sandbox_id);

}  // namespace berth::daemon
