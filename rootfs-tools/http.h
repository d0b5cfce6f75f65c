// One HTTP(S) connection as a registry client uses it (libcurl underneath, out of sight):
// a request, its final answer's status and headers, its body either kept (small JSON
// documents and error bodies) or handed to a sink as it arrives (blobs, never held whole).
// Redirects are followed; a cancel check is polled while bytes flow and while they do not.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/error.h"
#include "rootfs-tools/registry_config.h"

namespace berth::images {

struct HttpTimeouts {
    std::chrono::milliseconds connect{15000};
    // A transfer that moves fewer than `low_speed_bytes` per second for `low_speed_time` is
    // given up as stalled (a dead peer behind a live TCP connection sends nothing at all).
    uint32_t low_speed_bytes = 1024;
    std::chrono::seconds low_speed_time{30};
};

struct HttpRequest {
    std::string url;
    std::vector<std::string> headers;  // "Name: value"
    std::optional<Credentials> basic;  // sent to the first host only, never after a redirect
    bool verify_tls = true;
    std::optional<uint64_t> range_from;  // "Range: bytes=N-"
};

struct HttpResponse {
    long status = 0;
    std::multimap<std::string, std::string> headers;  // the final answer's; names lowercased
    std::string body;                                 // when not given to a sink
    std::string url;                                  // where it came from, after redirects

    std::string header(const std::string& lowercase_name) const {
        auto it = headers.find(lowercase_name);
        return it == headers.end() ? std::string() : it->second;
    }
};

// Where a 200 or 206 answer's body goes: `begin` once its status and headers are known
// (before the first byte), then `data` for each piece. Anything either throws ends the
// transfer and comes out of perform(). Other answers' bodies are kept in HttpResponse::body.
struct HttpSink {
    std::function<void(const HttpResponse&)> begin;
    std::function<void(std::string_view)> data;
};

// No HTTP answer, or one cut short: refused, reset, timed out, stalled, a TLS failure.
// Worth another try (a registry restarting, a proxy dropping a connection).
class HttpTransportError : public Error {
  public:
    HttpTransportError(const std::string& what, bool no_connection)
        : Error(Kind::unavailable, what), no_connection_(no_connection) {}
    // Nothing was reached at all (refused, unresolvable): the next endpoint is the better bet.
    bool no_connection() const { return no_connection_; }

  private:
    bool no_connection_;
};

// The cancel check said stop.
class HttpCancelled : public Error {
  public:
    explicit HttpCancelled(const std::string& what) : Error(Kind::cancelled, what) {}
};

class HttpClient {
  public:
    // `cancelled` is polled while a transfer runs (at least once a second while it stalls).
    HttpClient(HttpTimeouts timeouts, std::function<bool()> cancelled);
    ~HttpClient();
    HttpClient(const HttpClient&) = delete;
    HttpClient& operator=(const HttpClient&) = delete;

    // Performs a GET. Kept bodies are limited to `body_limit` bytes (HttpTransportError past
    // it: a registry's JSON is small, and a larger answer is not one). Throws
    // HttpTransportError, HttpCancelled, or what the sink threw.
    HttpResponse get(const HttpRequest& request, const HttpSink* sink = nullptr,
                     size_t body_limit = 4 << 20);

  private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

// Percent-encodes a query parameter's value.
std::string url_escape(std::string_view s);

}  // namespace berth::images
