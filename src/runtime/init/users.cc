#include "runtime/init/users.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <charconv>

#include "base/unique_fd.h"

namespace berth::init {

namespace {

std::vector<std::string_view> split(std::string_view line, char sep) {
    std::vector<std::string_view> out;
    size_t start = 0;
    for (;;) {
        size_t pos = line.find(sep, start);
        out.push_back(line.substr(start, pos == std::string_view::npos ? pos : pos - start));
        if (pos == std::string_view::npos) return out;
        start = pos + 1;
    }
}

std::optional<uint32_t> parse_id(std::string_view text) {
    uint32_t value = 0;
    if (text.empty()) return std::nullopt;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
    return value;
}

// Calls f(fields) for each well-formed line of a colon-separated database.
template <typename F>
void for_each_entry(std::string_view db, size_t min_fields, F&& f) {
    for (std::string_view line : split(db, '\n')) {
        if (line.empty() || line[0] == '#') continue;
        auto fields = split(line, ':');
        if (fields.size() < min_fields) continue;
        if (f(fields)) return;
    }
}

}  // namespace

std::optional<ResolvedUser> resolve_user(std::string_view spec, std::string_view passwd,
                                         std::string_view group, std::string* error) {
    std::string_view user_part = spec, group_part;
    if (auto colon = spec.find(':'); colon != std::string_view::npos) {
        user_part = spec.substr(0, colon);
        group_part = spec.substr(colon + 1);
    }
    ResolvedUser out;
    if (user_part.empty()) user_part = "0";

    bool found = false;
    auto numeric_uid = parse_id(user_part);
    for_each_entry(passwd, 7, [&](const std::vector<std::string_view>& f) {
        auto uid = parse_id(f[2]);
        auto gid = parse_id(f[3]);
        if (!uid || !gid) return false;
        if (numeric_uid ? *uid != *numeric_uid : f[0] != user_part) return false;
        out.uid = *uid;
        out.gid = *gid;
        out.name = f[0];
        out.home = f[5].empty() ? "/" : std::string(f[5]);
        found = true;
        return true;
    });
    if (!found) {
        if (!numeric_uid) {
            *error = "user '" + std::string(user_part) + "' not found in the sandbox's /etc/passwd";
            return std::nullopt;
        }
        out.uid = *numeric_uid;
        out.gid = *numeric_uid;
    }

    if (!group_part.empty()) {
        auto numeric_gid = parse_id(group_part);
        bool group_found = false;
        for_each_entry(group, 3, [&](const std::vector<std::string_view>& f) {
            auto gid = parse_id(f[2]);
            if (!gid) return false;
            if (numeric_gid ? *gid != *numeric_gid : f[0] != group_part) return false;
            out.gid = *gid;
            group_found = true;
            return true;
        });
        if (!group_found) {
            if (!numeric_gid) {
                *error =
                    "group '" + std::string(group_part) + "' not found in the sandbox's /etc/group";
                return std::nullopt;
            }
            out.gid = *numeric_gid;
        }
    }

    // Supplementary groups: every group that lists the user by name.
    if (!out.name.empty()) {
        for_each_entry(group, 4, [&](const std::vector<std::string_view>& f) {
            auto gid = parse_id(f[2]);
            if (!gid || *gid == out.gid) return false;
            for (std::string_view member : split(f[3], ',')) {
                if (member == out.name) {
                    out.groups.push_back(*gid);
                    break;
                }
            }
            return false;
        });
    }
    return out;
}

namespace {

std::string read_account_file(const char* path) {
    UniqueFd fd(::open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY));
    if (!fd) return {};
    struct stat st;
    if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_size > (4 << 20)) return {};
    std::string data(static_cast<size_t>(st.st_size), '\0');
    size_t got = 0;
    while (got < data.size()) {
        ssize_t n = ::read(fd.get(), data.data() + got, data.size() - got);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        got += static_cast<size_t>(n);
    }
    data.resize(got);
    return data;
}

}  // namespace

std::optional<ResolvedUser> resolve_sandbox_user(std::string_view spec, std::string* error) {
    return resolve_user(spec, read_account_file("/etc/passwd"), read_account_file("/etc/group"),
                        error);
}

}  // namespace berth::init
