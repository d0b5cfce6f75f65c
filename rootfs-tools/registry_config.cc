#include "rootfs-tools/registry_config.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cerrno>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <utility>

// toml++ 3.3 checks its parser's invariants with TOML_ASSERT, and some fail on malformed
// input ("[[[[", "registry = [ [} ]": found by tests/fuzz/registries_conf). assert() would
// abort the daemon, and under NDEBUG toml++ makes them optimizer assumptions (undefined
// behaviour). Here they throw, with or without NDEBUG, and parse() reports a ConfigError.
// (A function, not a throw expression: the few TOML_ASSERTs in noexcept code stay as
// fatal as assert. This is the only file that includes toml++.)
namespace berth::images::toml_checks {
struct Invariant : std::logic_error {
    using std::logic_error::logic_error;
};
[[noreturn]] void failed(const char* expr);
}  // namespace berth::images::toml_checks
#pragma push_macro("NDEBUG")
#undef NDEBUG
#define TOML_ASSERT(expr) \
    ((expr) ? static_cast<void>(0) : ::berth::images::toml_checks::failed(#expr))
#include <toml++/toml.h>
#pragma pop_macro("NDEBUG")

#include "base/error.h"
#include "base/files.h"
#include "rootfs-tools/base64.h"

namespace berth::images {

void toml_checks::failed(const char* expr) {
    throw Invariant(expr);
}

using nlohmann::json;

namespace {

std::string lower(std::string s) {
    std::transform(s.begin(), s.end(), s.begin(),
                   [](unsigned char c) { return char(std::tolower(c)); });
    return s;
}

bool is_docker_hub(std::string_view host) {
    return host == "docker.io" || host == "index.docker.io" || host == "registry-1.docker.io";
}

// "https://index.docker.io/v1/" -> "docker.io"; "HTTP://Lab:5000/v2/" -> "lab:5000".
std::string normalize_host(std::string_view key) {
    for (std::string_view scheme : {"https://", "http://"}) {
        if (key.size() >= scheme.size() &&
            lower(std::string(key.substr(0, scheme.size()))) == scheme)
            key.remove_prefix(scheme.size());
    }
    key = key.substr(0, key.find('/'));
    std::string host = lower(std::string(key));
    return is_docker_hub(host) ? "docker.io" : host;
}

}  // namespace

bool is_loopback_host(std::string_view h) {
    std::string host;
    if (!h.empty() && h.front() == '[') {
        host = std::string(h.substr(1, h.find(']') - 1));
    } else if (std::count(h.begin(), h.end(), ':') == 1) {
        host = std::string(h.substr(0, h.find(':')));
    } else {
        host = std::string(h);  // a name, an IPv4 address, or a bare IPv6 address
    }
    host = lower(host);
    if (host == "localhost" || host == "::1") return true;
    in_addr a{};
    return ::inet_pton(AF_INET, host.c_str(), &a) == 1 && (ntohl(a.s_addr) >> 24) == 127;
}

AuthConfig AuthConfig::parse(std::string_view text, const std::string& what) {
    json j;
    try {
        j = json::parse(text);
    } catch (const json::exception& e) {  // parse_error, or out_of_range for 1e999
        throw ConfigError(what + ": not JSON (" + e.what() + ")");
    }
    if (!j.is_object()) throw ConfigError(what + ": not a JSON object");
    AuthConfig out;
    auto auths = j.find("auths");
    if (auths == j.end() || auths->is_null()) return out;
    if (!auths->is_object()) throw ConfigError(what + ": \"auths\" is not an object");
    for (auto it = auths->begin(); it != auths->end(); ++it) {
        const std::string where = what + ": auths[\"" + it.key() + "\"]";
        const json& e = it.value();
        if (!e.is_object()) throw ConfigError(where + " is not an object");
        auto string_of = [&](const char* key) -> std::optional<std::string> {
            auto f = e.find(key);
            if (f == e.end() || f->is_null()) return std::nullopt;
            if (!f->is_string()) throw ConfigError(where + "." + key + " is not a string");
            return f->get<std::string>();
        };
        Credentials c;
        if (auto auth = string_of("auth"); auth && !auth->empty()) {
            auto decoded = base64_decode(*auth);
            if (!decoded) throw ConfigError(where + ".auth is not base64");
            const size_t colon = decoded->find(':');
            if (colon == std::string::npos)
                throw ConfigError(where + ".auth is not base64 of \"user:password\"");
            c.username = decoded->substr(0, colon);
            c.password = decoded->substr(colon + 1);
        } else {
            auto user = string_of("username");
            auto password = string_of("password");
            // An identity token (docker login with OAuth) is not a password: no credentials.
            if (!user || !password) continue;
            c.username = *user;
            c.password = *password;
        }
        out.entries_[normalize_host(it.key())] = std::move(c);
    }
    return out;
}

AuthConfig AuthConfig::load(const std::string& path) {
    auto text = read_file_if_exists(path);
    return text ? parse(*text, path) : AuthConfig{};
}

std::optional<Credentials> AuthConfig::find(const std::string& registry_host) const {
    auto it = entries_.find(normalize_host(registry_host));
    if (it == entries_.end()) return std::nullopt;
    return it->second;
}

void AuthConfig::merge_over(const AuthConfig& base) {
    for (const auto& [host, creds] : base.entries_) entries_.emplace(host, creds);  // no overwrite
}

namespace {

// What toml++ 3.3 cannot be trusted with (found by tests/fuzz/registries_conf): its
// whitespace test reaches __builtin_unreachable on most non-ASCII characters (U+00E9,
// U+FEDF), wherever it looks for whitespace: in strings, after escapes, in comments as
// seen from a multi-line string. Refused first: control characters (no valid TOML has any
// but tab and line ends) and any non-ASCII byte (hosts, paths and flags are ASCII; so must
// comments be here).
void check_before_toml(std::string_view t, const std::string& what) {
    size_t line = 1;
    for (size_t i = 0; i < t.size(); ++i) {
        const auto c = static_cast<unsigned char>(t[i]);
        if (c == '\n') ++line;
        const bool control = (c < 0x20 && c != '\t' && c != '\n' && c != '\r') || c == 0x7f;
        if (control || c >= 0x80)
            throw ConfigError(what + ": line " + std::to_string(line) + ": " +
                              (control ? "control character " + std::to_string(c)
                                       : std::string("non-ASCII character")) +
                              " at byte " + std::to_string(i) + " (registries.conf is ASCII)");
    }
}

}  // namespace

RegistriesConfig RegistriesConfig::parse(std::string_view text, const std::string& what) {
    check_before_toml(text, what);
    toml::table doc;
    try {
        doc = toml::parse(text, what);
    } catch (const toml::parse_error& e) {
        throw ConfigError(what + ": line " + std::to_string(e.source().begin.line) + ", column " +
                          std::to_string(e.source().begin.column) + ": " +
                          std::string(e.description()));
    } catch (const toml_checks::Invariant& e) {
        throw ConfigError(what + ": not TOML (the parser's check " + e.what() + " failed)");
    }
    RegistriesConfig out;
    const toml::node* registries = doc.get("registry");
    if (!registries) return out;
    const toml::array* list = registries->as_array();
    if (!list) throw ConfigError(what + ": \"registry\" must be an array of tables ([[registry]])");

    auto check_keys = [&](const toml::table& t, const std::string& where,
                          std::initializer_list<std::string_view> known) {
        for (const auto& [key, value] : t) {
            if (std::find(known.begin(), known.end(), key.str()) == known.end())
                throw ConfigError(where + ": unknown key \"" + std::string(key.str()) + "\"");
        }
    };
    auto string_of = [&](const toml::table& t, const char* key, const std::string& where) {
        const toml::node* n = t.get(key);
        if (!n) return std::string();
        if (!n->is_string()) throw ConfigError(where + ": \"" + key + "\" must be a string");
        return std::string(n->as_string()->get());
    };
    auto bool_of = [&](const toml::table& t, const char* key, const std::string& where) {
        const toml::node* n = t.get(key);
        if (!n) return false;
        if (!n->is_boolean()) throw ConfigError(where + ": \"" + key + "\" must be true or false");
        return n->as_boolean()->get();
    };
    auto location_of = [&](const std::string& text, bool insecure, const std::string& where) {
        std::string loc = text;
        while (!loc.empty() && loc.back() == '/') loc.pop_back();
        if (loc.find("://") != std::string::npos)
            throw ConfigError(where + ": location \"" + text +
                              "\" must be host[:port][/path], without a scheme (use insecure = "
                              "true for http)");
        Location l;
        const size_t slash = loc.find('/');
        l.host = lower(loc.substr(0, slash));
        l.path = slash == std::string::npos ? "" : loc.substr(slash + 1);
        if (l.host.empty()) throw ConfigError(where + ": location \"" + text + "\" has no host");
        l.insecure = insecure;
        return l;
    };

    for (size_t i = 0; i < list->size(); ++i) {
        const std::string where = what + ": registry[" + std::to_string(i) + "]";
        const toml::table* t = list->get(i)->as_table();
        if (!t) throw ConfigError(where + " is not a table");
        check_keys(
            *t, where,
            {"prefix", "location", "insecure", "blocked", "mirror", "mirror-by-digest-only"});
        Entry e;
        e.insecure = bool_of(*t, "insecure", where);
        e.blocked = bool_of(*t, "blocked", where);
        e.mirror_by_digest_only = bool_of(*t, "mirror-by-digest-only", where);
        const std::string location = string_of(*t, "location", where);
        if (!location.empty()) e.location = location_of(location, e.insecure, where);
        e.prefix = lower(string_of(*t, "prefix", where));
        if (e.prefix.empty()) e.prefix = lower(location);  // registries.conf's rule
        while (!e.prefix.empty() && e.prefix.back() == '/') e.prefix.pop_back();
        if (e.prefix.empty()) throw ConfigError(where + ": neither prefix nor location");
        if (e.prefix.rfind("*.", 0) == 0) {
            if (e.prefix.find('/') != std::string::npos || e.location)
                throw ConfigError(where + ": a wildcard prefix (" + e.prefix +
                                  ") names hosts only and takes no location");
        } else if (e.prefix.find('*') != std::string::npos) {
            throw ConfigError(where + ": prefix \"" + e.prefix +
                              "\": a wildcard only as \"*.domain\"");
        }
        if (const toml::node* m = t->get("mirror")) {
            const toml::array* mirrors = m->as_array();
            if (!mirrors)
                throw ConfigError(where + ": \"mirror\" must be [[registry.mirror]] tables");
            for (size_t k = 0; k < mirrors->size(); ++k) {
                const std::string mw = where + ".mirror[" + std::to_string(k) + "]";
                const toml::table* mt = mirrors->get(k)->as_table();
                if (!mt) throw ConfigError(mw + " is not a table");
                check_keys(*mt, mw, {"location", "insecure"});
                const std::string ml = string_of(*mt, "location", mw);
                if (ml.empty()) throw ConfigError(mw + ": no location");
                e.mirrors.push_back(location_of(ml, bool_of(*mt, "insecure", mw), mw));
            }
        }
        for (const auto& other : out.entries_) {
            if (other.prefix == e.prefix)
                throw ConfigError(where + ": prefix \"" + e.prefix + "\" is configured twice");
        }
        out.entries_.push_back(std::move(e));
    }
    return out;
}

RegistriesConfig RegistriesConfig::load(const std::string& path) {
    auto text = read_file_if_exists(path);
    return text ? parse(*text, path) : RegistriesConfig{};
}

std::vector<Endpoint> RegistriesConfig::endpoints_for(const Reference& ref) const {
    const std::string registry = normalize_host(ref.registry);
    const std::string name = registry + "/" + ref.repository;
    // The longest prefix that matches at a path boundary (or a wildcard on the host).
    const Entry* match = nullptr;
    size_t matched = 0;  // how much of `name` the prefix covers
    for (const auto& e : entries_) {
        size_t covers = 0;
        if (e.prefix.rfind("*.", 0) == 0) {
            const std::string host = registry.substr(0, registry.find(':'));
            const std::string suffix = e.prefix.substr(1);  // ".example.com"
            if (host.size() > suffix.size() &&
                host.compare(host.size() - suffix.size(), suffix.size(), suffix) == 0)
                covers = registry.size();
        } else if (name == e.prefix ||
                   (name.size() > e.prefix.size() && name.rfind(e.prefix, 0) == 0 &&
                    name[e.prefix.size()] == '/')) {
            covers = e.prefix.size();
        }
        // A wildcard loses to any exact prefix (registries.conf's order).
        const bool exact = e.prefix.rfind("*.", 0) != 0;
        const bool match_exact = match && match->prefix.rfind("*.", 0) != 0;
        if (covers > 0 &&
            (!match || (exact && !match_exact) || (exact == match_exact && covers > matched))) {
            match = &e;
            matched = covers;
        }
    }
    if (match && match->blocked)
        throw ConfigError("registry " + match->prefix + " is blocked by the registries config (" +
                          ref.str() + ")");

    const std::string rest = name.substr(matched);  // "" or "/library/debian"
    auto make = [&](const Location& loc, bool mirror, bool same_repository) {
        Endpoint ep;
        ep.host = loc.host == "docker.io" || loc.host == "index.docker.io" ? "registry-1.docker.io"
                                                                           : loc.host;
        ep.insecure = loc.insecure || is_loopback_host(ep.host);
        ep.plain_http = ep.insecure;
        ep.repository_prefix_rewrite = loc.path;
        ep.repository = same_repository    ? ref.repository
                        : loc.path.empty() ? rest.substr(rest.empty() ? 0 : 1)
                                           : loc.path + rest;
        ep.mirror = mirror;
        if (ep.repository.empty()) {
            throw ConfigError("registries config: prefix " + match->prefix + " at " + loc.host +
                              " leaves no repository for " + ref.str() +
                              " (give the location a path)");
        }
        return ep;
    };
    std::vector<Endpoint> out;
    if (match && (!match->mirror_by_digest_only || ref.digest)) {
        for (const auto& m : match->mirrors) out.push_back(make(m, true, false));
    }
    if (match && match->location) {
        out.push_back(make(*match->location, false, false));
    } else {
        // The registry itself, the repository as the reference names it.
        out.push_back(make({registry, "", match && match->insecure}, false, true));
    }
    return out;
}

}  // namespace berth::images
