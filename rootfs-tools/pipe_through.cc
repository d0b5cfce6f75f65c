#include "rootfs-tools/pipe_through.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <exception>
#include <thread>

#include "base/error.h"
#include "base/unique_fd.h"
#include "transfer/archive.h"

namespace berth::images {

void pipe_through(const std::function<void(int fd)>& produce,
                  const std::function<void(int fd)>& consume, const std::string& what) {
    int ends[2];
    if (::pipe2(ends, O_CLOEXEC) != 0) throw_sys("pipe2", what);
    UniqueFd read_end(ends[0]), write_end(ends[1]);
    transfer::enlarge_pipe(read_end.get());
    std::exception_ptr produce_error, consume_error;
    std::thread producer([&, out = std::move(write_end)]() mutable {
        // A consumer that stops early (a layer refused half way) closes the pipe: the write
        // then fails with EPIPE, and the SIGPIPE it raises stays pending on this thread
        // (which ends with it) instead of killing a process that did not ignore it.
        sigset_t pipe_signal;
        sigemptyset(&pipe_signal);
        sigaddset(&pipe_signal, SIGPIPE);
        pthread_sigmask(SIG_BLOCK, &pipe_signal, nullptr);
        try {
            produce(out.get());
        } catch (...) {
            produce_error = std::current_exception();
        }
        out.reset();
    });
    try {
        consume(read_end.get());
    } catch (...) {
        consume_error = std::current_exception();
    }
    read_end.reset();  // a producer still writing gets EPIPE and stops
    producer.join();
    if (produce_error && consume_error) {
        bool epipe = false;
        try {
            std::rethrow_exception(produce_error);
        } catch (const SysError& e) {
            epipe = e.code() == EPIPE;
        } catch (...) {
        }
        std::rethrow_exception(epipe ? consume_error : produce_error);
    }
    if (produce_error) std::rethrow_exception(produce_error);
    if (consume_error) std::rethrow_exception(consume_error);
}

}  // namespace berth::images
