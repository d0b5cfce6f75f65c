#include "ns/idmap.h"

#include <fstream>
#include <sstream>
#include <stdexcept>

#include "base/files.h"

namespace berth::ns {

std::optional<IdRange> find_subordinate_range(const std::string& file, const std::string& user,
                                              uid_t uid) {
    std::ifstream in(file);
    if (!in) return std::nullopt;
    const std::string uid_text = std::to_string(uid);
    std::string line;
    while (std::getline(in, line)) {
        if (line.empty() || line[0] == '#') continue;
        std::istringstream fields(line);
        std::string name, start, count;
        if (!std::getline(fields, name, ':') || !std::getline(fields, start, ':') ||
            !std::getline(fields, count)) {
            continue;
        }
        if (name != user && name != uid_text) continue;
        try {
            unsigned long s = std::stoul(start), c = std::stoul(count);
            if (c == 0 || s + c > 0xffffffffUL) continue;
            return IdRange{static_cast<uint32_t>(s), static_cast<uint32_t>(c)};
        } catch (const std::exception&) {
            continue;  // a malformed line is someone else's problem; keep looking
        }
    }
    return std::nullopt;
}

IdMapping mapping_for_user(const std::string& user, uid_t uid, const std::string& subuid_file,
                           const std::string& subgid_file) {
    auto uids = find_subordinate_range(subuid_file, user, uid);
    if (!uids) {
        throw std::runtime_error("no subordinate uid range for user '" + user + "' in " +
                                 subuid_file + " (add one: usermod --add-subuids 200000-265535 " +
                                 user + ")");
    }
    auto gids = find_subordinate_range(subgid_file, user, uid);
    if (!gids) {
        throw std::runtime_error("no subordinate gid range for user '" + user + "' in " +
                                 subgid_file + " (add one: usermod --add-subgids 200000-265535 " +
                                 user + ")");
    }
    // 65536 ids is what images expect (nobody = 65534); more would only widen exposure.
    uids->count = std::min<uint32_t>(uids->count, 65536);
    gids->count = std::min<uint32_t>(gids->count, 65536);
    return {*uids, *gids};
}

std::string map_line(const IdRange& range) {
    return "0 " + std::to_string(range.host_start) + " " + std::to_string(range.count) + "\n";
}

void write_id_maps(pid_t pid, const IdMapping& mapping) {
    const std::string proc = "/proc/" + std::to_string(pid);
    write_file(proc + "/uid_map", map_line(mapping.uids));
    write_file(proc + "/gid_map", map_line(mapping.gids));
}

}  // namespace berth::ns
