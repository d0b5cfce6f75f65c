#include "runtime/init/users.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <charconv>

#include "base/files.h"
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

bool IdRanges::contains(uint32_t id) const {
    for (auto [first, count] : extents) {
        if (id >= first && id - first < count) return true;
    }
    return false;
}

IdRanges IdRanges::parse(std::string_view map_text) {
    IdRanges out;
    for (std::string_view line : split(map_text, '\n')) {
        uint32_t fields[3];
        size_t n = 0;
        size_t pos = 0;
        while (n < 3 && pos < line.size()) {
            while (pos < line.size() && line[pos] == ' ') ++pos;
            size_t end = line.find(' ', pos);
            if (end == std::string_view::npos) end = line.size();
            auto id = parse_id(line.substr(pos, end - pos));
            if (!id) break;
            fields[n++] = *id;
            pos = end;
        }
        if (n == 3) out.extents.emplace_back(fields[0], fields[2]);
    }
    return out;
}

namespace {

std::string describe(const IdRanges& ranges) {
    std::string out;
    for (auto [first, count] : ranges.extents) {
        if (!out.empty()) out += ", ";
        out += std::to_string(first) + "-" + std::to_string(uint64_t{first} + count - 1);
    }
    return out.empty() ? "none" : out;
}

}  // namespace

std::string check_mapped(const ResolvedUser& user, const IdRanges& uids, const IdRanges& gids) {
    if (!uids.contains(user.uid)) {
        return "user: uid " + std::to_string(user.uid) + " is not mapped in the sandbox (ids " +
               describe(uids) + ")";
    }
    if (!gids.contains(user.gid)) {
        return "user: gid " + std::to_string(user.gid) + " is not mapped in the sandbox (ids " +
               describe(gids) + ")";
    }
    for (gid_t g : user.groups) {
        if (!gids.contains(g)) {
            return "user: supplementary group " + std::to_string(g) +
                   " is not mapped in the sandbox (ids " + describe(gids) + ")";
        }
    }
    return {};
}

std::string check_mapped_here(const ResolvedUser& user) {
    // The maps are written once, before init starts, and never change.
    // (A file in /proc has no size: read it to its end. Unreadable, nothing counts as
    // mapped, and every exec is refused saying so.)
    auto ranges = [](const char* path) {
        try {
            return IdRanges::parse(read_file(path));
        } catch (const std::exception&) {
            return IdRanges{};
        }
    };
    static const IdRanges uids = ranges("/proc/self/uid_map");
    static const IdRanges gids = ranges("/proc/self/gid_map");
    return check_mapped(user, uids, gids);
}

std::optional<ResolvedUser> resolve_sandbox_user(std::string_view spec, std::string* error) {
    return resolve_user(spec, read_account_file("/etc/passwd"), read_account_file("/etc/group"),
                        error);
}

}  // namespace berth::init
