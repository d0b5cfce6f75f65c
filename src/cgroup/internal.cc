#include "cgroup/internal.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <stdexcept>

#include "base/error.h"
#include "base/files.h"

namespace berth::cgroup::internal {

namespace {

// mountinfo writes space, tab, newline and backslash in paths as \ooo octal escapes.
std::string unescape(std::string_view s) {
    std::string out;
    for (size_t i = 0; i < s.size(); ++i) {
        if (s[i] == '\\' && i + 3 < s.size()) {
            out +=
                static_cast<char>((s[i + 1] - '0') << 6 | (s[i + 2] - '0') << 3 | (s[i + 3] - '0'));
            i += 3;
        } else {
            out += s[i];
        }
    }
    return out;
}

// Super options of a v1 cgroup mount that are not controllers.
bool is_mount_flag(std::string_view opt) {
    static constexpr std::string_view kFlags[] = {"rw",    "ro",           "all",
                                                  "none",  "noprefix",     "clone_children",
                                                  "xattr", "favordynmods", "cpuset_v2_mode"};
    if (opt.find('=') != std::string_view::npos) return true;  // name=systemd, release_agent=
    return std::find(std::begin(kFlags), std::end(kFlags), opt) != std::end(kFlags);
}

std::optional<uint64_t> to_u64(std::string_view s) {
    while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.remove_suffix(1);
    uint64_t v = 0;
    auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec != std::errc() || end != s.data() + s.size() || s.empty()) return std::nullopt;
    return v;
}

}  // namespace

std::vector<std::string_view> split(std::string_view s, char sep) {
    std::vector<std::string_view> out;
    while (!s.empty()) {
        size_t end = s.find(sep);
        if (end != 0) out.push_back(s.substr(0, end));
        if (end == std::string_view::npos) break;
        s.remove_prefix(end + 1);
    }
    return out;
}

Mounts parse_mountinfo(std::string_view mountinfo) {
    Mounts m;
    for (std::string_view line : split(mountinfo, '\n')) {
        // "id parent maj:min root mountpoint opts [optional...] - fstype source superopts"
        std::vector<std::string_view> f = split(line, ' ');
        size_t dash = 6;
        while (dash < f.size() && f[dash] != "-") ++dash;
        if (dash + 3 >= f.size()) continue;
        std::string_view fstype = f[dash + 1];
        if (fstype == "cgroup2") {
            if (m.unified.empty()) m.unified = unescape(f[4]);
        } else if (fstype == "cgroup") {
            for (std::string_view opt : split(f[dash + 3], ','))
                if (!is_mount_flag(opt)) m.v1.emplace(opt, unescape(f[4]));
        }
    }
    return m;
}

Mounts read_mounts() {
    return parse_mountinfo(read_file("/proc/self/mountinfo"));
}

std::string missing_controllers(const std::vector<std::string>& have) {
    std::string out;
    for (std::string_view c : kRequired) {
        if (std::find(have.begin(), have.end(), c) != have.end()) continue;
        if (!out.empty()) out += ' ';
        out += c;
    }
    return out;
}

uint64_t cpu_quota_us(double cpus) {
    if (!std::isfinite(cpus) || cpus <= 0)
        throw std::invalid_argument("cpus must be a positive number, got " + std::to_string(cpus));
    return std::max<uint64_t>(std::llround(cpus * kCpuPeriodUs), 1000);
}

void check_limits(const Limits& limits) {
    if (limits.cpus) cpu_quota_us(*limits.cpus);
}

std::optional<uint64_t> find_key(std::string_view text, std::string_view key) {
    for (std::string_view line : split(text, '\n')) {
        if (line.size() > key.size() && line.starts_with(key) && line[key.size()] == ' ')
            return to_u64(line.substr(key.size() + 1));
    }
    return std::nullopt;
}

uint64_t parse_u64(std::string_view text, std::string_view what) {
    if (auto v = to_u64(text)) return *v;
    throw std::runtime_error(std::string(what) + ": expected a number, read '" + std::string(text) +
                             "'");
}

uint64_t read_u64(const std::string& path) {
    return parse_u64(read_file(path), path);
}

std::vector<std::string> read_controllers(const std::string& path) {
    std::string text = read_file(path);
    std::vector<std::string> out;
    for (std::string_view line : split(text, '\n'))
        for (std::string_view name : split(line, ' ')) out.emplace_back(name);
    return out;
}

bool exists(const std::string& path) {
    return ::access(path.c_str(), F_OK) == 0;
}

void check_relative(std::string_view what, std::string_view path, bool allow_nested) {
    bool ok = !path.empty() && path.front() != '/' && path.back() != '/' &&
              path.find("//") == path.npos && (allow_nested || path.find('/') == path.npos);
    for (std::string_view part : split(path, '/')) ok = ok && part != "." && part != "..";
    if (!ok)
        throw std::invalid_argument("bad cgroup " + std::string(what) + " '" + std::string(path) +
                                    "'");
}

std::vector<std::string> child_dirs(const std::string& dir) {
    std::vector<std::string> out;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
        std::error_code type_ec;
        if (e.is_directory(type_ec)) out.push_back(e.path().filename().string());
    }
    if (ec && ec != std::errc::no_such_file_or_directory)
        throw SysError("opendir", dir, ec.value());
    std::sort(out.begin(), out.end());
    return out;
}

bool make_dir(const std::string& path) {
    // Try the leaf first: after the first sandbox its parents exist, so one mkdir suffices.
    if (::mkdir(path.c_str(), 0755) == 0) return true;
    if (errno == EEXIST) return false;
    if (errno != ENOENT) throw_sys("mkdir", path);
    make_dirs(path.substr(0, path.rfind('/')));
    if (::mkdir(path.c_str(), 0755) == 0) return true;
    if (errno != EEXIST) throw_sys("mkdir", path);
    return false;
}

void remove_dir(const std::string& path, Clock::time_point deadline) {
    int err = 0;
    bool gone = poll_until(deadline, [&] {
        err = ::rmdir(path.c_str()) == 0 ? 0 : errno;
        return err != EBUSY;
    });
    if (!gone || (err != 0 && err != ENOENT)) throw_sys("rmdir", path, err);
}

std::vector<pid_t> read_pids(const std::string& procs) {
    std::vector<pid_t> pids;
    std::optional<std::string> text = read_file_if_exists(procs);
    if (!text) return pids;
    for (std::string_view line : split(*text, '\n')) {
        // 0 stands for a task outside our pid namespace; kill(0) would hit our own group.
        if (pid_t pid = static_cast<pid_t>(parse_u64(line, procs)); pid > 0) pids.push_back(pid);
    }
    return pids;
}

void kill_pid(pid_t pid) {
    if (::kill(pid, SIGKILL) != 0 && errno != ESRCH) throw_sys("kill", std::to_string(pid));
}

bool kill_procs(const std::string& procs, Clock::time_point deadline) {
    return poll_until(deadline, [&] {
        std::vector<pid_t> pids = read_pids(procs);
        for (pid_t pid : pids) kill_pid(pid);
        return pids.empty();
    });
}

}  // namespace berth::cgroup::internal
