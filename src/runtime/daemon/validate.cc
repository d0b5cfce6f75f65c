#include "runtime/daemon/validate.h"

#include <limits.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>

namespace berth::daemon {

namespace {

bool has_nul(std::string_view s) {
    return s.find('\0') != std::string_view::npos;
}

bool all_digits(std::string_view s) {
    return !s.empty() &&
           std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

std::string quoted(std::string_view s) {
    // Shown to the client: keep it printable and short.
    std::string out = "'";
    for (char c : s.substr(0, 64)) {
        const auto u = static_cast<unsigned char>(c);
        if (u < 0x20 || u == 0x7f) {
            static const char* hex = "0123456789abcdef";
            out += "\\x";
            out += hex[u >> 4];
            out += hex[u & 15];
        } else {
            out += c;
        }
    }
    if (s.size() > 64) out += "...";
    return out + "'";
}

std::string check_id_or_name(std::string_view field, std::string_view part, const char* what) {
    if (all_digits(part)) {
        uint64_t value = 0;
        auto [end, ec] = std::from_chars(part.data(), part.data() + part.size(), value);
        if (ec != std::errc() || end != part.data() + part.size() || value >= UINT32_MAX) {
            return std::string(field) + ": " + what + " " + quoted(part) +
                   " is out of range (0 to 4294967294)";
        }
        return {};
    }
    if (part.size() > 32) return std::string(field) + ": " + what + " name is longer than 32 bytes";
    for (char c : part) {
        const auto u = static_cast<unsigned char>(c);
        if (u < 0x21 || u == 0x7f || c == ':' || c == '/' || c == ',') {
            return std::string(field) + ": " + what + " " + quoted(part) +
                   " is neither a number nor a valid name";
        }
    }
    return {};
}

}  // namespace

std::string check_sandbox_name(std::string_view name) {
    const auto ok_char = [](char c) {
        return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
               c == '_' || c == '.' || c == '-';
    };
    if (name.empty() || name.size() > 64 || !ok_char(name[0]) || name[0] == '_' || name[0] == '.' ||
        name[0] == '-' || !std::all_of(name.begin(), name.end(), ok_char)) {
        return "name " + quoted(name) + " must match [A-Za-z0-9][A-Za-z0-9_.-]{0,63}";
    }
    const bool hex = std::all_of(name.begin(), name.end(), [](char c) {
        return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
    });
    if (hex && name.size() >= 4) {
        return "name " + quoted(name) +
               " could be read as a sandbox id prefix (4 or more hex digits): choose another";
    }
    return {};
}

std::string check_user_spec(std::string_view field, std::string_view spec) {
    if (spec.empty()) return {};
    if (has_nul(spec)) return std::string(field) + ": contains a NUL byte";
    std::string_view user = spec, group;
    if (auto colon = spec.find(':'); colon != std::string_view::npos) {
        user = spec.substr(0, colon);
        group = spec.substr(colon + 1);
        if (group.empty()) return std::string(field) + ": " + quoted(spec) + " has an empty group";
    }
    if (user.empty()) return std::string(field) + ": " + quoted(spec) + " has an empty user";
    if (auto e = check_id_or_name(field, user, "user"); !e.empty()) return e;
    if (!group.empty()) return check_id_or_name(field, group, "group");
    return {};
}

std::string check_sandbox_path(std::string_view field, std::string_view path, bool absolute,
                               bool allow_empty) {
    if (path.empty()) return allow_empty ? std::string() : std::string(field) + ": is empty";
    if (has_nul(path)) return std::string(field) + ": contains a NUL byte";
    if (path.size() >= PATH_MAX) return std::string(field) + ": longer than PATH_MAX";
    if (absolute && path[0] != '/')
        return std::string(field) + ": " + quoted(path) + " is not an absolute path";
    return {};
}

std::string check_resources(const v1::Resources& r) {
    // (NaN fails every comparison: test for the good range, not against the bad one.)
    if (!(std::isfinite(r.cpus()) && r.cpus() >= 0 && r.cpus() <= 1024))
        return "cpus: must be a number from 0 (no limit) to 1024";
    if (r.memory_bytes() != 0 && r.memory_bytes() < (4u << 20))
        return "memory: must be at least 4 MiB";
    if (r.memory_bytes() > (uint64_t{1} << 50)) return "memory: more than 1 PiB";
    if (r.pids() > 4194304) return "pids: more than 4194304 (the kernel's largest pid_max)";
    // (Too large a value is the helper's to refuse: it knows what holds the layer.)
    if (r.storage_bytes() != 0 && r.storage_bytes() < kMinStorageBytes) {
        return "storage: must be at least 1 MiB (or 0 for the daemon's default), not " +
               std::to_string(r.storage_bytes()) + " bytes";
    }
    return {};
}

std::string check_create(const v1::CreateSandbox& req) {
    if (req.rootfs().empty() == req.image().empty()) {
        return req.image().empty() ? "image: an image reference is required (or a rootfs directory)"
                                   : "give an image or a rootfs directory, not both";
    }
    if (!req.rootfs().empty()) {
        if (auto e = check_sandbox_path("rootfs", req.rootfs(), true, false); !e.empty())
            return e + " (a directory on the host)";
    }
    if (has_nul(req.image()) || req.image().size() > 4096) return "image: not a reference";
    if (!req.name().empty()) {
        if (auto e = check_sandbox_name(req.name()); !e.empty()) return e;
    }
    if (!req.hostname().empty()) {
        const auto& h = req.hostname();
        const bool ok = h.size() <= 63 && std::all_of(h.begin(), h.end(), [](char c) {
                            return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
                                   (c >= '0' && c <= '9') || c == '-' || c == '.';
                        });
        if (!ok) return "hostname: " + quoted(h) + " must be up to 63 of [A-Za-z0-9.-]";
    }
    if (auto e = check_sandbox_path("workdir", req.workdir(), true, true); !e.empty()) return e;
    {
        const auto& g = req.peer_group();
        const bool ok = g.size() <= 64 && std::all_of(g.begin(), g.end(), [](char c) {
                            return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
                                   (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.';
                        });
        if (!ok) return "peer_group: " + quoted(g) + " must be up to 64 of [A-Za-z0-9_.-]";
    }
    return check_resources(req.resources());
}

std::string check_exec(const v1::Exec& req) {
    if (req.argv_size() == 0 || req.argv(0).empty()) return "argv: empty: nothing to run";
    for (const auto& a : req.argv()) {
        if (has_nul(a)) return "argv: an argument contains a NUL byte";
    }
    for (const auto& kv : req.env()) {
        const auto eq = kv.find('=');
        if (eq == std::string::npos || eq == 0) return "env: " + quoted(kv) + " is not KEY=value";
        if (has_nul(kv)) return "env: " + quoted(kv.substr(0, eq)) + " contains a NUL byte";
    }
    if (auto e = check_sandbox_path("cwd", req.cwd(), false, true); !e.empty()) return e;
    if (auto e = check_user_spec("user", req.user()); !e.empty()) return e;
    if (req.timeout_ms() > uint64_t{30} * 24 * 3600 * 1000) return "timeout: more than 30 days";
    return {};
}

}  // namespace berth::daemon
