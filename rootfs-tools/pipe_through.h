// A stream made on one thread and taken on another, through a pipe: how a layer goes from
// its decompressor to the extractor, and a directory's tar from the archive writer to the
// blob store, without ever being held whole.
#pragma once

#include <functional>
#include <string>

namespace berth::images {

// Runs `produce(write_fd)` on a thread of its own and `consume(read_fd)` on this one; each
// end is closed when its side returns or throws, so the other sees EOF or EPIPE. When both
// fail, the error reported is the cause: the consumer's if the producer only got EPIPE
// (the consumer stopped reading), else the producer's (the consumer saw its stream cut).
void pipe_through(const std::function<void(int fd)>& produce,
                  const std::function<void(int fd)>& consume, const std::string& what);

}  // namespace berth::images
