#include "ns/idmap.h"

#include <fstream>
#include <sstream>
#include <stdexcept>

#include "base/files.h"

namespace berth::ns {

std::vector<IdRange> subordinate_ranges(const std::string& file, const std::string& user,
                                        uid_t uid) {
    std::vector<IdRange> out;
    std::ifstream in(file);
    if (!in) return out;
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
            out.push_back(IdRange{static_cast<uint32_t>(s), static_cast<uint32_t>(c)});
        } catch (const std::exception&) {
            continue;  // a malformed line is someone else's problem; keep looking
        }
    }
    return out;
}

std::optional<IdRange> find_subordinate_range(const std::string& file, const std::string& user,
                                              uid_t uid) {
    auto ranges = subordinate_ranges(file, user, uid);
    if (ranges.empty()) return std::nullopt;
    return ranges.front();
}

std::optional<IdRange> owner_range_for_user(const std::string& user, uid_t uid,
                                            const IdMapping& mapping,
                                            const std::string& subuid_file) {
    const uint64_t mapped_begin = mapping.uids.host_start,
                   mapped_end = mapped_begin + mapping.uids.count;
    for (const IdRange& r : subordinate_ranges(subuid_file, user, uid)) {
        const uint64_t begin = r.host_start, end = begin + r.count;
        if (begin == mapped_begin && end > mapped_end)  // the mapping's own range, longer
            return IdRange{static_cast<uint32_t>(mapped_end),
                           static_cast<uint32_t>(end - mapped_end)};
        if (end <= mapped_begin || begin >= mapped_end) return r;
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
