// The sandbox's network namespace as it starts: loopback only, and up.
#pragma once

namespace berth::ns {

// Sets `lo` up in the calling process's network namespace. Throws SysError.
void bring_up_loopback();

}  // namespace berth::ns
