// What a pull needs to know before it talks to a registry, read from files an operator
// writes: the credentials (docker's config.json format) and where each registry really is
// (mirrors and rewrites, in the spirit of containers' registries.conf). No network here, and
// no libcurl: the static CLI may use this to read a user's credentials.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/error.h"
#include "rootfs-tools/reference.h"

namespace berth::images {

// A configuration file that is not what it should be; what() names the file and the field.
class ConfigError : public Error {
  public:
    explicit ConfigError(const std::string& what) : Error(Kind::invalid_argument, what) {}
};

struct Credentials {
    std::string username, password;
};

// docker's config.json:
//   {"auths": {"host[:port]" | "https://index.docker.io/v1/":
//                 {"auth": base64("user:pass")} | {"username": U, "password": P}}}
// Keys may carry a scheme and a path (docker login writes "https://index.docker.io/v1/");
// only the host[:port] counts. Docker Hub's names (docker.io, index.docker.io,
// registry-1.docker.io) are one registry. credsStore/credHelpers are not consulted (they
// run programs); an entry without a password (an identitytoken only) gives no credentials.
class AuthConfig {
  public:
    static AuthConfig parse(std::string_view json, const std::string& what = "auth config");
    static AuthConfig load(const std::string& path);  // a missing file: no credentials
    std::optional<Credentials> find(const std::string& registry_host) const;
    void merge_over(const AuthConfig& base);  // entries of *this win
    bool empty() const { return entries_.empty(); }

  private:
    std::map<std::string, Credentials> entries_;  // by normalized host[:port]
};

// Where to pull a reference from, in order of preference.
struct Endpoint {
    std::string host;  // "127.0.0.1:5000", "registry-1.docker.io": connected to, credentials' key
    // Talk http first. Loopback hosts (127.0.0.0/8, ::1, localhost) get it by default, as
    // docker gives them; others only when marked insecure.
    bool plain_http = false;
    // TLS certificates are not verified, and the other scheme is tried when the first one
    // does not get an HTTP answer (an insecure registry may speak either).
    bool insecure = false;
    // The path the location put in front of the repository ("" when it adds none): a
    // location "lab:5000/hub" for prefix "docker.io" gives "hub".
    std::string repository_prefix_rewrite;
    std::string repository;  // the repository at this endpoint: "hub/library/debian"
    bool mirror = false;
    std::string str() const { return host + "/" + repository; }
};

// The configuration (TOML):
//   [[registry]]
//   prefix = "docker.io"            # a registry, or registry/namespace; "*.example.com"
//   location = "127.0.0.1:5000"     # where it really is (a rewrite), optionally with a path
//   insecure = true                 # http and unverified TLS allowed
//   blocked = false                 # true: refuse to pull from it
//   mirror-by-digest-only = false   # true: mirrors only for references pinned by digest
//   [[registry.mirror]]             # tried first, in order
//   location = "mirror.lab:5000"
//   insecure = true
// The longest matching prefix wins. Other top-level keys of containers' registries.conf
// (unqualified-search-registries, short-name-mode, ...) are ignored; unknown keys inside a
// [[registry]] are refused, so a typo does not silently send a pull to the internet. The
// file is ASCII (toml++ 3.3 is unsafe on some non-ASCII input: see registry_config.cc).
class RegistriesConfig {
  public:
    static RegistriesConfig parse(std::string_view toml, const std::string& what);
    static RegistriesConfig load(const std::string& path);  // a missing file: defaults
    // Mirrors first, then the registry itself (or its rewrite). Throws ConfigError when
    // the registry is blocked.
    std::vector<Endpoint> endpoints_for(const Reference& ref) const;

  private:
    struct Location {
        std::string host, path;
        bool insecure = false;
    };
    struct Entry {
        std::string prefix;
        std::optional<Location> location;
        bool insecure = false, blocked = false, mirror_by_digest_only = false;
        std::vector<Location> mirrors;
    };
    std::vector<Entry> entries_;
};

// 127.0.0.0/8, ::1 and localhost, with or without a port.
bool is_loopback_host(std::string_view host_and_port);

}  // namespace berth::images
