#include "ns/net.h"

#include <net/if.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

#include <cstring>

#include "base/error.h"
#include "base/unique_fd.h"

namespace berth::ns {

void bring_up_loopback() {
    UniqueFd sock(check_sys("socket", "AF_INET",
                            [] { return ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0); }));
    ifreq req{};
    std::strncpy(req.ifr_name, "lo", IFNAMSIZ - 1);
    check_sys("ioctl SIOCGIFFLAGS", "lo", [&] { return ::ioctl(sock.get(), SIOCGIFFLAGS, &req); });
    req.ifr_flags = static_cast<short>(req.ifr_flags | IFF_UP | IFF_RUNNING);
    check_sys("ioctl SIOCSIFFLAGS", "lo", [&] { return ::ioctl(sock.get(), SIOCSIFFLAGS, &req); });
}

}  // namespace berth::ns
