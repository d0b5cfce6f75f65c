// A dnsmasq for DNS tests: started on 127.0.0.1 on a free port, answering only from a hosts
// file of the test's (no upstream, no /etc/hosts), TTL 1, logging the queries it gets to a
// file (what reached upstream). Killed when it goes.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "base/child_process.h"
#include "base/error.h"
#include "base/unique_fd.h"

namespace berth::net::testing {

inline sockaddr_in addr(const char* ip, uint16_t port) {
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(port);
    ::inet_pton(AF_INET, ip, &sa.sin_addr);
    return sa;
}

inline UniqueFd udp_socket(const char* bind_ip, uint16_t port = 0) {
    UniqueFd fd(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    const sockaddr_in sa = addr(bind_ip, port);
    if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&sa), sizeof sa) != 0)
        throw_sys("bind", bind_ip);
    return fd;
}

inline uint16_t port_of(int fd) {
    sockaddr_in sa{};
    socklen_t len = sizeof sa;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
    return ntohs(sa.sin_port);
}

// A port free on 127.0.0.1 for UDP and TCP a moment ago (the kernel's pick for a socket
// closed again: nothing else on a test machine races for loopback ports).
inline uint16_t free_port() {
    return port_of(udp_socket("127.0.0.1").get());
}

// A query for `name` (class IN, RD).
inline std::vector<uint8_t> dns_query(const std::string& name, uint16_t qtype = 1,
                                      uint16_t id = 0x4242) {
    std::vector<uint8_t> b = {
        static_cast<uint8_t>(id >> 8), static_cast<uint8_t>(id), 0x01, 0, 0, 1, 0, 0, 0, 0, 0, 0};
    size_t start = 0;
    while (start < name.size()) {
        size_t dot = name.find('.', start);
        if (dot == std::string::npos) dot = name.size();
        b.push_back(static_cast<uint8_t>(dot - start));
        b.insert(b.end(), name.begin() + static_cast<long>(start),
                 name.begin() + static_cast<long>(dot));
        start = dot + 1;
    }
    b.insert(b.end(), {0, static_cast<uint8_t>(qtype >> 8), static_cast<uint8_t>(qtype), 0, 1});
    return b;
}

class Dnsmasq {
  public:
    // `dir` holds its hosts file (written from `hosts`) and log.
    // `extra`: more options (--cname=...).
    Dnsmasq(const std::string& dir, const std::string& hosts,
            const std::vector<std::string>& extra = {})
        : dir_(dir) {
        std::ofstream(dir_ + "/hosts") << hosts;
        port_ = free_port();
        std::vector<std::string> args = {
            "/usr/sbin/dnsmasq",
            "--no-daemon",
            "--conf-file=/dev/null",
            "--port=" + std::to_string(port_),
            "--listen-address=127.0.0.1",
            "--bind-interfaces",
            "--no-resolv",
            "--no-hosts",
            "--addn-hosts=" + dir_ + "/hosts",
            "--local-ttl=1",
            "--pid-file",
            "--log-queries",
            "--log-facility=" + dir_ + "/log",
        };
        args.insert(args.end(), extra.begin(), extra.end());
        // (As root it would drop to nobody, who may not write the log here.)
        if (::geteuid() == 0) args.push_back("--user=root");
        process_ = ChildProcess::fork("dnsmasq", {}, [&] {
            std::vector<char*> argv;
            for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
            argv.push_back(nullptr);
            // (It logs to stderr too: the test's output is the test's.)
            const int null = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
            ::dup2(null, 2);
            ::execv(argv[0], argv.data());
            return 127;
        });
        wait_ready();
    }

    static bool available() { return ::access("/usr/sbin/dnsmasq", X_OK) == 0; }

    uint16_t port() const { return port_; }
    std::string log() const {
        std::ifstream in(dir_ + "/log");
        return std::string(std::istreambuf_iterator<char>(in), {});
    }

  private:
    void wait_ready() {
        using namespace std::chrono_literals;
        const auto until = std::chrono::steady_clock::now() + 10s;
        UniqueFd s = udp_socket("127.0.0.1");
        const sockaddr_in up = addr("127.0.0.1", port_);
        ::connect(s.get(), reinterpret_cast<const sockaddr*>(&up), sizeof up);
        const std::vector<uint8_t> q = dns_query("localhost.invalid");
        while (std::chrono::steady_clock::now() < until) {
            ::send(s.get(), q.data(), q.size(), 0);
            pollfd p{s.get(), POLLIN, 0};
            if (::poll(&p, 1, 100) == 1) {
                uint8_t buf[512];
                if (::recv(s.get(), buf, sizeof buf, 0) > 0) return;
            }
        }
        throw std::runtime_error("dnsmasq did not answer");
    }

    std::string dir_;
    uint16_t port_ = 0;
    ChildProcess process_;
};

// A directory of its own under /tmp, removed when it goes.
class TempDir {
  public:
    TempDir() {
        char tmpl[] = "/tmp/berth-dns-test-XXXXXX";
        if (!::mkdtemp(tmpl)) throw_sys("mkdtemp", tmpl);
        path_ = tmpl;
    }
    ~TempDir() { std::filesystem::remove_all(path_); }
    const std::string& path() const { return path_; }

  private:
    std::string path_;
};

}  // namespace berth::net::testing
