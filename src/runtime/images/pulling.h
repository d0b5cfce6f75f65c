// How berth-images pulls: the registry puller (rootfs-tools/puller.h) reading registries
// through an unprivileged fetcher (fetcher.h), with the system's registries.conf and
// credentials, read again for every pull (an admin's edit applies to the next one), the
// client's credentials over them, and its events as ImageProgress.
#pragma once

#include <string>

#include "berth.pb.h"
#include "runtime/images/fetcher.h"
#include "runtime/images/service.h"

namespace berth::images_service {

Pulling make_pulling(images::ImageStore& store, FetcherSpec fetcher);

}  // namespace berth::images_service
