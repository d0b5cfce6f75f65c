// A base image made here, without a registry: `debian:SUITE` is debootstrap --variant=minbase
// SUITE from the host's own apt mirror into a scratch directory of the store, then a
// one-layer image of that tree (ImageStore::import_rootfs_dir). debootstrap and everything
// it starts run in a pid and mount namespace of their own, whose first process dies with
// the thread that started it (PR_SET_PDEATHSIG): when the image service dies or the
// bootstrap is cancelled, no debootstrap, dpkg or mount outlives it, and the scratch
// directory is swept by the store's next open.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "base/cancel.h"
#include "base/error.h"
#include "rootfs-tools/image_store.h"

namespace berth::images {

struct BootstrapOptions {
    std::function<void(const std::string& line)> progress;  // debootstrap's output, by line
    const CancelToken* cancel = nullptr;  // polled; cancelled: stop (BootstrapError "cancelled")
    std::string mirror;                   // empty: host_debian_mirror(), else its default
    std::string debootstrap = "/usr/sbin/debootstrap";
};

// debootstrap failed or was cancelled; what() ends with its last lines of output.
class BootstrapError : public Error {
  public:
    explicit BootstrapError(const std::string& what) : Error(Kind::internal, what) {}
};

// What `source` asks for ("debian:bookworm" -> "bookworm"); std::invalid_argument saying
// what is supported otherwise.
std::string debian_suite(std::string_view source);

// The Debian mirror the host's apt uses (one-line sources.list and deb822 .sources files
// under `apt_dir`; security and non-Debian archives skipped), if any.
std::optional<std::string> host_debian_mirror(const std::string& apt_dir = "/etc/apt");

// Bootstraps `source` and records it as `name`. Its config: Env PATH (Debian's default),
// Cmd ["/bin/bash"], the host's platform, created now. Host-specific files debootstrap
// copies in (/etc/hostname, /etc/resolv.conf) and apt's package lists are left out.
Image bootstrap_image(ImageStore& store, std::string_view source, const Reference& name,
                      const BootstrapOptions& options);

}  // namespace berth::images
