// A tiny TCP probe for bench/run-network, linked statically so that it runs inside a busybox
// rootfs as it runs on the host: the same code times both paths, and the timing is taken
// inside the process (clock_gettime around the system calls), so neither the exec into the
// sandbox nor any process start-up is in a sample.
//
//   netprobe serve ADDR PORT          the test host's server: per connection (a thread) a
//                                     command byte: 'E' echo, 'S' sink (read to EOF, answer
//                                     one byte), 'R' + 8-byte count (send that many bytes);
//                                     a connection closed with no byte is just closed
//   netprobe connect ADDR PORT N      N connects: prints the microseconds of each connect(2)
//                                     (SYN to SYN-ACK; then an orderly close, not timed)
//   netprobe rr ADDR PORT N           one connection, N one-byte echo round trips (us each)
//   netprobe send ADDR PORT MIB       MIB MiB up to the sink: prints seconds until its answer
//   netprobe recv ADDR PORT MIB       MIB MiB down from the server: prints seconds to EOF
// Output: one number a line. Exit status 1 on any failure, with the reason on stderr.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>

namespace {

constexpr size_t kChunk = 256 * 1024;

double now_us() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return static_cast<double>(ts.tv_sec) * 1e6 + static_cast<double>(ts.tv_nsec) / 1e3;
}

[[noreturn]] void die(const char* what) {
    std::fprintf(stderr, "netprobe: %s: %s\n", what, std::strerror(errno));
    std::exit(1);
}

sockaddr_in address(const char* host, const char* port) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(std::atoi(port)));
    if (inet_pton(AF_INET, host, &a.sin_addr) != 1) {
        std::fprintf(stderr, "netprobe: not an IPv4 address: %s\n", host);
        std::exit(2);
    }
    return a;
}

bool write_all(int fd, const char* p, size_t n) {
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return false;
        p += w;
        n -= static_cast<size_t>(w);
    }
    return true;
}

bool read_all(int fd, char* p, size_t n) {
    while (n > 0) {
        ssize_t r = read(fd, p, n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return false;
        p += r;
        n -= static_cast<size_t>(r);
    }
    return true;
}

// Reads until EOF (or an error); returns the bytes read.
uint64_t drain(int fd, char* buf) {
    uint64_t total = 0;
    for (;;) {
        ssize_t r = read(fd, buf, kChunk);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return total;
        total += static_cast<uint64_t>(r);
    }
}

void* serve_one(void* arg) {
    int fd = static_cast<int>(reinterpret_cast<intptr_t>(arg));
    char cmd = 0;
    char* buf = nullptr;
    if (read_all(fd, &cmd, 1) && (buf = static_cast<char*>(std::calloc(1, kChunk)))) {
        if (cmd == 'E') {
            int one = 1;
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
            for (;;) {
                ssize_t r = read(fd, buf, kChunk);
                if (r <= 0 || !write_all(fd, buf, static_cast<size_t>(r))) break;
            }
        } else if (cmd == 'S') {
            drain(fd, buf);
            write_all(fd, "k", 1);
        } else if (cmd == 'R') {
            uint64_t left = 0;
            if (read_all(fd, reinterpret_cast<char*>(&left), sizeof left)) {
                while (left > 0) {
                    size_t n = left < kChunk ? static_cast<size_t>(left) : kChunk;
                    if (!write_all(fd, buf, n)) break;
                    left -= n;
                }
            }
        }
    }
    std::free(buf);
    close(fd);
    return nullptr;
}

int serve(const sockaddr_in& a) {
    int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(s, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0) die("bind");
    if (listen(s, 1024) != 0) die("listen");
    for (;;) {
        int fd = accept4(s, nullptr, nullptr, SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED) continue;
            die("accept");
        }
        pthread_t t;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        pthread_attr_setstacksize(&attr, 64 * 1024);
        if (pthread_create(&t, &attr, serve_one,
                           reinterpret_cast<void*>(static_cast<intptr_t>(fd))) != 0)
            close(fd);
        pthread_attr_destroy(&attr);
    }
}

int dial(const sockaddr_in& a) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) die("socket");
    if (connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0) die("connect");
    return fd;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 4) {
        std::fprintf(stderr, "usage: netprobe serve|connect|rr|send|recv ADDR PORT [N|MIB]\n");
        return 2;
    }
    const char* mode = argv[1];
    sockaddr_in a = address(argv[2], argv[3]);
    long n = argc > 4 ? std::atol(argv[4]) : 1;
    if (std::strcmp(mode, "serve") == 0) return serve(a);
    char* buf = static_cast<char*>(std::calloc(1, kChunk));
    if (std::strcmp(mode, "connect") == 0) {
        for (long i = 0; i < n; ++i) {
            int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
            if (fd < 0) die("socket");
            double t0 = now_us();
            if (connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0) die("connect");
            double t1 = now_us();
            // Orderly: our FIN, the server's EOF and close, so that one connection's
            // teardown does not overlap the next one's handshake.
            shutdown(fd, SHUT_WR);
            drain(fd, buf);
            close(fd);
            std::printf("%.2f\n", t1 - t0);
        }
    } else if (std::strcmp(mode, "rr") == 0) {
        int fd = dial(a);
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        if (!write_all(fd, "E", 1)) die("write");
        for (long i = 0; i < n; ++i) {
            char c = 'x';
            double t0 = now_us();
            if (!write_all(fd, &c, 1) || !read_all(fd, &c, 1)) die("echo");
            std::printf("%.2f\n", now_us() - t0);
        }
        close(fd);
    } else if (std::strcmp(mode, "send") == 0) {
        uint64_t left = static_cast<uint64_t>(n) << 20;
        double t0 = now_us();
        int fd = dial(a);
        if (!write_all(fd, "S", 1)) die("write");
        while (left > 0) {
            size_t k = left < kChunk ? static_cast<size_t>(left) : kChunk;
            if (!write_all(fd, buf, k)) die("send");
            left -= k;
        }
        shutdown(fd, SHUT_WR);
        char ack = 0;
        if (!read_all(fd, &ack, 1) || ack != 'k') die("the sink's answer");
        std::printf("%.6f\n", (now_us() - t0) / 1e6);
        close(fd);
    } else if (std::strcmp(mode, "recv") == 0) {
        uint64_t want = static_cast<uint64_t>(n) << 20;
        double t0 = now_us();
        int fd = dial(a);
        char req[9] = {'R'};
        std::memcpy(req + 1, &want, sizeof want);
        if (!write_all(fd, req, sizeof req)) die("write");
        uint64_t got = drain(fd, buf);
        if (got != want) {
            std::fprintf(stderr, "netprobe: received %llu of %llu bytes\n",
                         static_cast<unsigned long long>(got),
                         static_cast<unsigned long long>(want));
            return 1;
        }
        std::printf("%.6f\n", (now_us() - t0) / 1e6);
        close(fd);
    } else {
        std::fprintf(stderr, "netprobe: unknown mode %s\n", mode);
        return 2;
    }
    return 0;
}
