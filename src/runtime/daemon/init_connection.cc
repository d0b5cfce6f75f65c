#include "runtime/daemon/init_connection.h"

#include <sys/socket.h>
#include <sys/un.h>

#include <algorithm>
#include <cstring>

namespace berth::daemon {

InitConnection connect_to_init(const std::string& path, const std::string& sandbox_id) {
    InitConnection c;
    UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!fd) {
        c.code = v1::RESOURCE_EXHAUSTED;
        c.message = std::string("socket: ") + std::strerror(errno);
        return c;
    }
    // The path was checked when the sandbox was registered.
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path.c_str(), std::min(path.size() + 1, sizeof addr.sun_path - 1));
    if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
        const int e = errno;
        if (e == EAGAIN) {
            c.code = v1::RESOURCE_EXHAUSTED;
            c.message = "sandbox " + sandbox_id + " has too many requests starting at once";
        } else {
            c.code = v1::UNAVAILABLE;
            c.message = "sandbox " + sandbox_id +
                        " is not running (connect to its init: " + std::strerror(e) + ")";
        }
        return c;
    }
    c.fd = std::move(fd);
    return c;
}

}  // namespace berth::daemon
