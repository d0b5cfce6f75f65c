// Real servers for the pull tests: Debian's docker-registry on a free loopback port (with
// htpasswd or token auth when asked), images pushed into it with skopeo, a TCP proxy that
// counts requests and can cut or stall a transfer, and a token server that signs RS256 JWTs
// the way docker-registry's `auth: token` wants them.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "base/unique_fd.h"
#include "rootfs-tools/base64.h"
#include "rootfs-tools/digest.h"

namespace berth::images::testing {

inline std::string slurp(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
}

// Runs a shell command, its output into `log`; the output is returned for messages.
inline int run_logged(const std::string& cmd, const std::string& log) {
    const int rc = std::system((cmd + " >" + log + " 2>&1").c_str());
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
}

// A listening socket on 127.0.0.1, an ephemeral port.
inline UniqueFd listen_loopback(int* port) {
    UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    int one = 1;
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        ::listen(fd.get(), 64) != 0)
        throw std::runtime_error(std::string("bind/listen: ") + std::strerror(errno));
    socklen_t len = sizeof a;
    ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&a), &len);
    *port = ntohs(a.sin_port);
    return fd;
}

inline int free_port() {
    int port = 0;
    listen_loopback(&port);  // closed at once: the registry binds it next
    return port;
}

inline UniqueFd connect_loopback(int port) {
    UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port));
    if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return UniqueFd();
    return fd;
}

inline bool send_all(int fd, std::string_view data) {
    while (!data.empty()) {
        const ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
        if (n <= 0) return false;
        data.remove_prefix(static_cast<size_t>(n));
    }
    return true;
}

// Accepts connections on a thread and gives each to `serve` on a thread of its own;
// everything is shut down and joined when it goes.
class TcpServer {
  public:
    explicit TcpServer(std::function<void(int fd, const std::atomic<bool>& stopping)> serve)
        : serve_(std::move(serve)) {
        listener_ = listen_loopback(&port_);
        acceptor_ = std::thread([this] { accept_loop(); });
    }
    ~TcpServer() {
        stopping_ = true;
        ::shutdown(listener_.get(), SHUT_RDWR);
        acceptor_.join();
        {
            std::lock_guard lock(mu_);
            for (int fd : open_) ::shutdown(fd, SHUT_RDWR);
        }
        for (auto& t : threads_) t.join();
    }
    int port() const { return port_; }
    int connections() const { return connections_.load(); }

  private:
    void accept_loop() {
        for (;;) {
            const int fd = ::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC);
            if (fd < 0) {
                if (stopping_ || errno == EINVAL) return;
                continue;
            }
            ++connections_;
            std::lock_guard lock(mu_);
            open_.push_back(fd);
            threads_.emplace_back([this, fd] {
                UniqueFd owned(fd);
                serve_(fd, stopping_);
                std::lock_guard l(mu_);
                open_.erase(std::find(open_.begin(), open_.end(), fd));
            });
        }
    }

    std::function<void(int, const std::atomic<bool>&)> serve_;
    UniqueFd listener_;
    int port_ = 0;
    std::atomic<bool> stopping_{false};
    std::atomic<int> connections_{0};
    std::mutex mu_;
    std::vector<int> open_;
    std::vector<std::thread> threads_;
    std::thread acceptor_;
};

// A byte-level proxy in front of the registry that notes each request it carries and can
// cut (close) or stall (stop forwarding, keep open) the first answer to a request whose
// path contains some text, once a number of its bytes have gone through.
class Proxy {
  public:
    enum class Fault { none, cut, stall };

    explicit Proxy(int upstream)
        : upstream_(upstream), server_([this](int fd, const auto& stop) { carry(fd, stop); }) {}

    int port() const { return server_.port(); }
    int connections() const { return server_.connections(); }
    void fault_once(Fault f, std::string path_part, size_t after_bytes) {
        std::lock_guard lock(mu_);
        fault_ = f;
        fault_path_ = std::move(path_part);
        fault_after_ = after_bytes;
    }
    bool fault_happened() const { return fault_done_.load(); }
    // Requests go upstream without their Range header (a registry that ignores ranges).
    void strip_range() { strip_range_ = true; }
    // "GET /v2/x/blobs/sha256:.. range=N-" lines, in order.
    std::vector<std::string> requests() const {
        std::lock_guard lock(mu_);
        return requests_;
    }
    size_t count(const std::string& part) const {
        size_t n = 0;
        for (const auto& r : requests()) n += r.find(part) != std::string::npos;
        return n;
    }
    void clear() {
        std::lock_guard lock(mu_);
        requests_.clear();
    }

  private:
    void carry(int client, const std::atomic<bool>& stopping) {
        UniqueFd up = connect_loopback(upstream_);
        if (!up) return;
        std::string head;     // the client's bytes not yet seen as a whole request head
        bool target = false;  // the answer in flight is the one to break
        size_t answered = 0;  // its bytes so far
        bool stalled = false;
        char buf[16384];
        while (!stopping) {
            pollfd p[2] = {{client, POLLIN, 0}, {up.get(), short(stalled ? 0 : POLLIN), 0}};
            if (::poll(p, 2, 100) < 0 && errno != EINTR) return;
            if (p[0].revents & (POLLIN | POLLHUP | POLLERR)) {
                const ssize_t n = ::recv(client, buf, sizeof buf, 0);
                if (n <= 0) return;
                head.append(buf, static_cast<size_t>(n));
                const bool rewrite = strip_range_;
                for (size_t end; (end = head.find("\r\n\r\n")) != std::string::npos;) {
                    std::string request = head.substr(0, end + 4);
                    target = note(request.substr(0, end));
                    answered = 0;
                    head.erase(0, end + 4);
                    // (GET requests: no bodies follow their heads.)
                    if (rewrite) {
                        if (size_t r = request.find("\r\nRange: "); r != std::string::npos)
                            request.erase(r, request.find("\r\n", r + 2) - r);
                        if (!send_all(up.get(), request)) return;
                    }
                }
                if (!rewrite && !send_all(up.get(), std::string_view(buf, size_t(n)))) return;
            }
            if (!stalled && (p[1].revents & (POLLIN | POLLHUP | POLLERR))) {
                const ssize_t n = ::recv(up.get(), buf, sizeof buf, 0);
                if (n <= 0) return;
                size_t pass = static_cast<size_t>(n);
                bool trip = false;
                if (target) {
                    std::lock_guard lock(mu_);
                    if (answered + pass >= fault_after_) {
                        pass = fault_after_ - answered;
                        trip = true;
                    }
                }
                answered += pass;
                if (!send_all(client, std::string_view(buf, pass))) return;
                if (trip) {
                    Fault f;
                    {
                        std::lock_guard lock(mu_);
                        f = fault_;
                        fault_ = Fault::none;
                    }
                    target = false;
                    fault_done_ = true;
                    if (f == Fault::cut) return;  // both connections closed on the way out
                    stalled = true;  // the client hears nothing more, the connection stays
                }
            }
        }
    }
    // Records a request head; says whether its answer is the one to break.
    bool note(const std::string& head) {
        std::string line = head.substr(0, head.find("\r\n"));
        line = line.substr(0, line.rfind(' '));  // without " HTTP/1.1"
        const size_t range = head.find("\r\nRange: bytes=");
        if (range != std::string::npos)
            line += " range=" + head.substr(range + 15, head.find("\r\n", range + 2) - range - 15);
        std::lock_guard lock(mu_);
        requests_.push_back(line);
        return fault_ != Fault::none && line.find(fault_path_) != std::string::npos;
    }

    int upstream_;
    mutable std::mutex mu_;
    std::vector<std::string> requests_;
    Fault fault_ = Fault::none;
    std::string fault_path_;
    size_t fault_after_ = 0;
    std::atomic<bool> fault_done_{false};
    std::atomic<bool> strip_range_{false};
    TcpServer server_;  // last: its threads use the members above
};

// Hands out RS256-signed JWTs for docker-registry's `auth: token`, to `user`:`password`
// (any scope asked for) and to anonymous callers (no access at all).
class TokenServer {
  public:
    TokenServer(const std::string& dir, std::string user, std::string password)
        : user_(std::move(user)),
          password_(std::move(password)),
          cert_(dir + "/token.crt"),
          server_([this](int fd, const auto&) { serve(fd); }) {
        const std::string key = dir + "/token.key";
        const std::string cmd = "openssl req -x509 -newkey rsa:2048 -nodes -keyout " + key +
                                " -out " + cert_ + " -subj /CN=berth-test-token -days 2";
        if (run_logged(cmd, dir + "/openssl.log") != 0)
            throw std::runtime_error("openssl req failed: " + slurp(dir + "/openssl.log"));
        key_pem_ = slurp(key);
        const std::string pem = slurp(cert_);
        BIO* bio = BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()));
        X509* x = PEM_read_bio_X509(bio, nullptr, nullptr, nullptr);
        BIO_free(bio);
        if (!x) throw std::runtime_error("cannot read " + cert_);
        unsigned char* der = nullptr;
        const int len = i2d_X509(x, &der);
        cert_der_b64_ = base64_encode(std::string(reinterpret_cast<char*>(der), len));
        OPENSSL_free(der);
        X509_free(x);
    }

    int port() const { return server_.port(); }
    const std::string& cert() const { return cert_; }
    static constexpr const char* kService = "berth-test-registry";
    static constexpr const char* kIssuer = "berth-test-issuer";
    int requests() const { return requests_.load(); }

  private:
    void serve(int fd) {
        std::string req;
        char buf[4096];
        while (req.find("\r\n\r\n") == std::string::npos) {
            const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
            if (n <= 0) return;
            req.append(buf, static_cast<size_t>(n));
        }
        ++requests_;
        const std::string line = req.substr(0, req.find("\r\n"));
        const std::string target =
            line.substr(line.find(' ') + 1, line.rfind(' ') - line.find(' ') - 1);
        std::vector<std::string> scopes;
        const size_t q = target.find('?');
        std::string query = q == std::string::npos ? "" : target.substr(q + 1);
        for (size_t i = 0; i <= query.size();) {
            size_t j = query.find('&', i);
            if (j == std::string::npos) j = query.size();
            const std::string kv = query.substr(i, j - i);
            if (kv.rfind("scope=", 0) == 0) scopes.push_back(unescape(kv.substr(6)));
            i = j + 1;
        }
        bool authed = false;
        std::string subject;
        if (size_t a = req.find("\r\nAuthorization: Basic "); a != std::string::npos) {
            const size_t start = a + 23;
            auto decoded = base64_decode(req.substr(start, req.find("\r\n", start) - start));
            if (!decoded || *decoded != user_ + ":" + password_) {
                send_all(
                    fd,
                    "HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
                return;
            }
            authed = true;
            subject = user_;
        }
        nlohmann::json access = nlohmann::json::array();
        if (authed) {
            for (const auto& s : scopes) {  // "repository:test/app:pull,push"
                const size_t c1 = s.find(':'), c2 = s.rfind(':');
                nlohmann::json actions = nlohmann::json::array();
                std::string acts = s.substr(c2 + 1);
                for (size_t i = 0; i <= acts.size();) {
                    size_t j = acts.find(',', i);
                    if (j == std::string::npos) j = acts.size();
                    actions.push_back(acts.substr(i, j - i));
                    i = j + 1;
                }
                access.push_back({{"type", s.substr(0, c1)},
                                  {"name", s.substr(c1 + 1, c2 - c1 - 1)},
                                  {"actions", actions}});
            }
        }
        const long now = static_cast<long>(::time(nullptr));
        const nlohmann::json header = {{"alg", "RS256"}, {"typ", "JWT"}, {"x5c", {cert_der_b64_}}};
        const nlohmann::json claims = {{"iss", kIssuer},
                                       {"sub", subject},
                                       {"aud", kService},
                                       {"exp", now + 300},
                                       {"nbf", now - 10},
                                       {"iat", now - 10},
                                       {"jti", std::to_string(now) + std::to_string(requests_)},
                                       {"access", access}};
        const std::string signing_input = base64_encode(header.dump(), Base64Alphabet::url) + "." +
                                          base64_encode(claims.dump(), Base64Alphabet::url);
        const std::string token =
            signing_input + "." + base64_encode(sign(signing_input), Base64Alphabet::url);
        const std::string body = nlohmann::json{{"token", token}, {"expires_in", 300}}.dump();
        send_all(fd, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " +
                         std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body);
    }
    std::string sign(const std::string& data) {
        BIO* bio = BIO_new_mem_buf(key_pem_.data(), static_cast<int>(key_pem_.size()));
        EVP_PKEY* key = PEM_read_bio_PrivateKey(bio, nullptr, nullptr, nullptr);
        BIO_free(bio);
        EVP_MD_CTX* ctx = EVP_MD_CTX_new();
        size_t len = 0;
        EVP_DigestSignInit(ctx, nullptr, EVP_sha256(), nullptr, key);
        EVP_DigestSign(ctx, nullptr, &len, reinterpret_cast<const unsigned char*>(data.data()),
                       data.size());
        std::string sig(len, '\0');
        EVP_DigestSign(ctx, reinterpret_cast<unsigned char*>(sig.data()), &len,
                       reinterpret_cast<const unsigned char*>(data.data()), data.size());
        sig.resize(len);
        EVP_MD_CTX_free(ctx);
        EVP_PKEY_free(key);
        return sig;
    }
    static std::string unescape(const std::string& s) {
        std::string out;
        for (size_t i = 0; i < s.size(); ++i) {
            if (s[i] == '%' && i + 2 < s.size()) {
                out += char(std::stoi(s.substr(i + 1, 2), nullptr, 16));
                i += 2;
            } else {
                out += s[i] == '+' ? ' ' : s[i];
            }
        }
        return out;
    }

    std::string user_, password_, cert_, key_pem_, cert_der_b64_;
    std::atomic<int> requests_{0};
    TcpServer server_;  // last
};

// docker-registry serving DIR/storage on a free loopback port, with htpasswd or token
// auth when asked. Stopped (SIGTERM, then waited for) when it goes.
class LocalRegistry {
  public:
    struct Auth {
        enum { none, htpasswd, token } kind = none;
        std::string user, password;
        const TokenServer* token_server = nullptr;
    };

    explicit LocalRegistry(const std::string& dir)
        : LocalRegistry(dir, Auth{Auth::none, "", "", nullptr}) {}
    LocalRegistry(const std::string& dir, Auth auth) : dir_(dir) {
        std::filesystem::create_directories(dir_);
        port_ = free_port();
        std::string config =
            "version: 0.1\nlog:\n  level: info\nstorage:\n  filesystem:\n"
            "    rootdirectory: " +
            dir_ +
            "/storage\n"
            "http:\n  addr: 127.0.0.1:" +
            std::to_string(port_) + "\n";
        if (auth.kind == Auth::htpasswd) {
            const std::string file = dir_ + "/htpasswd";
            if (run_logged("htpasswd -Bbn " + auth.user + " " + auth.password + " > " + file +
                               ".tmp && mv " + file + ".tmp " + file,
                           dir_ + "/htpasswd.log") != 0)
                throw std::runtime_error("htpasswd failed: " + slurp(dir_ + "/htpasswd.log"));
            config += "auth:\n  htpasswd:\n    realm: berth-test\n    path: " + file + "\n";
        } else if (auth.kind == Auth::token) {
            config += "auth:\n  token:\n    realm: http://127.0.0.1:" +
                      std::to_string(auth.token_server->port()) +
                      "/token\n    service: " + TokenServer::kService +
                      "\n    issuer: " + TokenServer::kIssuer +
                      "\n    rootcertbundle: " + auth.token_server->cert() + "\n";
        }
        std::ofstream(dir_ + "/config.yml") << config;
        pid_ = ::fork();
        if (pid_ == 0) {
            // A test that dies without its destructors (a crash, std::terminate) must not
            // leave a registry behind.
            ::prctl(PR_SET_PDEATHSIG, SIGTERM);
            const int log = ::open((dir_ + "/registry.log").c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
            ::dup2(log, 1);
            ::dup2(log, 2);
            ::execl("/usr/bin/docker-registry", "docker-registry", "serve",
                    (dir_ + "/config.yml").c_str(), static_cast<char*>(nullptr));
            ::_exit(127);
        }
        // Ready when it answers on its port.
        for (int i = 0; i < 200; ++i) {
            if (UniqueFd fd = connect_loopback(port_)) return;
            if (::waitpid(pid_, nullptr, WNOHANG) == pid_) {
                pid_ = -1;
                break;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
        throw std::runtime_error("docker-registry did not start: " + slurp(dir_ + "/registry.log"));
    }
    ~LocalRegistry() {
        if (pid_ > 0) {
            ::kill(pid_, SIGTERM);
            ::waitpid(pid_, nullptr, 0);
        }
    }

    int port() const { return port_; }
    std::string host() const { return "127.0.0.1:" + std::to_string(port_); }
    std::string log() const { return slurp(dir_ + "/registry.log"); }
    std::string blob_data(const Digest& d) const {
        const std::string hex(d.hex());
        return dir_ + "/storage/docker/registry/v2/blobs/sha256/" + hex.substr(0, 2) + "/" + hex +
               "/data";
    }

    // skopeo copy oci:LAYOUT:TAG docker://HOST/REPO_TAG (--all: every manifest of an index),
    // the layout's digests kept (skopeo would gzip an uncompressed layer otherwise).
    void push(const std::string& layout, const std::string& tag, const std::string& repo_tag,
              bool all = false, const std::string& creds = "") const {
        const std::string cmd =
            "skopeo --insecure-policy copy --quiet --preserve-digests --dest-tls-verify=false " +
            std::string(all ? "--all " : "") +
            (creds.empty() ? "" : "--dest-creds " + creds + " ") + "oci:" + layout + ":" + tag +
            " docker://" + host() + "/" + repo_tag;
        if (run_logged(cmd, dir_ + "/skopeo.log") != 0)
            throw std::runtime_error(cmd + " failed: " + slurp(dir_ + "/skopeo.log") +
                                     "\nregistry log:\n" + log());
    }

  private:
    std::string dir_;
    int port_ = 0;
    pid_t pid_ = -1;
};

}  // namespace berth::images::testing
