// What the two extraction targets share: the input goes through a pipe (as an upload's
// socket or a layer's decompressor does) into transfer::extract_archive under the scratch
// directory. SysError is the extractor's one way to refuse an input; any other exception
// escapes and libFuzzer reports it as a crash.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "base/error.h"
#include "base/unique_fd.h"
#include "scratch.h"
#include "transfer/archive.h"
#include "transfer/root.h"

namespace berth::fuzz {

inline Scratch& scratch() {
    static Scratch s;
    return s;
}

// Extracts `data` into a fresh directory of the scratch dir and wipes it afterwards.
inline void extract(const uint8_t* data, size_t size, const transfer::ExtractOptions& options) {
    int p[2];
    if (::pipe2(p, O_CLOEXEC) != 0) {
        std::perror("pipe2");
        std::abort();
    }
    UniqueFd rd(p[0]), wr(p[1]);
    transfer::enlarge_pipe(wr.get());
    // The whole input must fit in the pipe's buffer (one thread): larger inputs are not
    // tried (run with -max_len <= 1 MiB; the pipe is 1 MiB unless pipe-max-size is lower).
    const int capacity = ::fcntl(wr.get(), F_GETPIPE_SZ);
    if (capacity < 0 || size > static_cast<size_t>(capacity)) return;
    for (size_t done = 0; done < size;) {
        const ssize_t n = ::write(wr.get(), data + done, size - done);
        if (n <= 0) {
            std::perror("write");
            std::abort();
        }
        done += static_cast<size_t>(n);
    }
    wr.reset();
    try {
        transfer::Root root = transfer::Root::open(scratch().path());
        transfer::extract_archive(rd.get(), root, "out", options);
    } catch (const SysError&) {
        // refused (and rolled back)
    }
    scratch().wipe();
}

}  // namespace berth::fuzz
