#include "runtime/daemon/sandboxes.h"

#include <dirent.h>
#include <google/protobuf/util/json_util.h>
#include <sys/stat.h>

#include <cstring>
#include <nlohmann/json.hpp>

#include "base/files.h"
#include "base/proc.h"

namespace berth::daemon {

std::string in_workdir(const std::string& workdir, const std::string& path) {
    if (!path.empty() && path[0] == '/') return path;
    const std::string base = workdir.empty() ? "/" : workdir;
    return path.empty() ? base : base + "/" + path;
}

SandboxRegistry::SandboxRegistry(std::string runtime_dir, cgroup::Driver* driver)
    : runtime_dir_(std::move(runtime_dir)), driver_(driver) {
    make_dirs(runtime_dir_ + "/meta", 0700);
}

Sandbox* SandboxRegistry::by_id(const std::string& id) {
    auto it = by_id_.find(id);
    return it == by_id_.end() ? nullptr : it->second.get();
}

Sandbox* SandboxRegistry::find(const std::string& key, std::string* error) {
    if (key.empty()) {
        *error = "no sandbox given";
        return nullptr;
    }
    // Ids first, then id prefixes, then names: a name (which anybody may choose) must never
    // take over what an id says. Names that look like an id prefix are refused at create,
    // so the order matters only for sandboxes named by an older berth.
    if (auto* s = by_id(key)) return s;
    Sandbox* match = nullptr;
    if (key.size() >= 4) {
        for (auto it = by_id_.lower_bound(key); it != by_id_.end(); ++it) {
            if (it->first.compare(0, key.size(), key) != 0) break;
            if (match) {
                *error = "sandbox id prefix '" + key + "' is ambiguous";
                return nullptr;
            }
            match = it->second.get();
        }
    }
    if (match) return match;
    for (auto& [id, s] : by_id_) {
        if (s->info.name() == key) return s.get();
    }
    *error = "no such sandbox: '" + key + "'";
    return nullptr;
}

bool SandboxRegistry::init_alive(const Sandbox& sandbox) const {
    return process_start_time(sandbox.info.init_pid()) == sandbox.init_start_time;
}

bool SandboxRegistry::name_taken(const std::string& name) const {
    for (const auto& [id, s] : by_id_) {
        if (s->info.name() == name) return true;
    }
    return false;
}

Sandbox& SandboxRegistry::add(v1::SandboxInfo info, std::string init_socket,
                              uint64_t init_start_time, const std::string& cgroup_name) {
    auto sandbox = std::make_unique<Sandbox>();
    sandbox->info = std::move(info);
    sandbox->init_socket = std::move(init_socket);
    sandbox->init_start_time = init_start_time;
    try {
        // Its shell's name (runtime/helper/shell.h); a sandbox of an older berth: its id.
        sandbox->cgroup = driver_->open(cgroup_name.empty() ? sandbox->info.id() : cgroup_name);
    } catch (const std::exception&) {
        // Stats will read as zero; the sandbox itself still works.
    }
    Sandbox& ref = *sandbox;
    by_id_[ref.info.id()] = std::move(sandbox);
    return ref;
}

void SandboxRegistry::remove(const std::string& id) {
    by_id_.erase(id);
    ::unlink((runtime_dir_ + "/meta/" + id + ".json").c_str());
}

std::vector<Sandbox*> SandboxRegistry::all() {
    std::vector<Sandbox*> out;
    for (auto& [id, s] : by_id_) out.push_back(s.get());
    return out;
}

void SandboxRegistry::save_meta(const Sandbox& sandbox) const {
    std::string json;
    google::protobuf::util::MessageToJsonString(sandbox.info, &json);
    write_file_atomic(runtime_dir_ + "/meta/" + sandbox.info.id() + ".json", json, 0600);
}

std::vector<SandboxRegistry::Found> SandboxRegistry::scan() const {
    std::vector<Found> out;
    const std::string dir = runtime_dir_ + "/sandboxes";
    DIR* d = ::opendir(dir.c_str());
    if (!d) {
        if (errno != ENOENT) {
            throw std::runtime_error("cannot list " + dir +
                                     " to reattach sandboxes: " + std::strerror(errno));
        }
        return out;
    }
    while (dirent* e = ::readdir(d)) {
        std::string id = e->d_name;
        if (id.size() != 32) continue;
        Found found;
        try {
            auto state = nlohmann::json::parse(read_file(dir + "/" + id + "/state.json"));
            found.init_socket = state.at("init_socket").get<std::string>();
            found.init_start_time = state.at("init_start_time").get<uint64_t>();
            int pid = state.at("init_pid").get<int>();
            found.alive = process_start_time(pid) == found.init_start_time;
            found.info.set_id(id);
            found.info.set_init_pid(pid);
            found.info.set_rootfs(state.value("rootfs", ""));
            found.info.set_hostname(state.value("hostname", ""));
            found.info.set_host_root_uid(state.value("host_root_uid", 0u));
            const std::string network = state.value("network", std::string("none"));
            found.info.set_network(network == "public"      ? v1::NETWORK_PUBLIC
                                   : network == "allowlist" ? v1::NETWORK_ALLOWLIST
                                                            : v1::NETWORK_NONE);
            for (const auto& a : state.value("allow", std::vector<std::string>{}))
                found.info.add_allow(a);
            for (uint32_t p : state.value("host_ports", std::vector<uint32_t>{}))
                found.info.add_host_ports(p);
            for (const auto& p : state.value("published", nlohmann::json::array())) {
                auto* out = found.info.add_publish();
                out->set_host_ip(p.value("host_ip", std::string()));
                out->set_host_port(p.value("host_port", 0u));
                out->set_port(p.value("port", 0u));
            }
            found.info.set_address(state.value("address", std::string()));
            found.cgroup_name = state.value("cgroup_name", std::string());
            // (The helper's key is UID:NAME; the name is what the client gave.)
            const std::string group = state.value("peer_group", std::string());
            found.info.set_peer_group(group.substr(group.find(':') + 1));
            found.info.set_cgroup_driver(state.value("cgroup_driver", ""));
            for (const auto& p : state.value("cgroup_paths", std::vector<std::string>{}))
                found.info.add_cgroup_paths(p);
        } catch (const std::exception&) {
            // A half-made sandbox (helper died mid-create): report it dead so it is removed.
            found.info.set_id(id);
            found.alive = false;
        }
        try {
            v1::SandboxInfo meta;
            if (google::protobuf::util::JsonStringToMessage(
                    read_file(runtime_dir_ + "/meta/" + id + ".json"), &meta)
                    .ok()) {
                found.info.set_name(meta.name());
                found.info.set_persistent(meta.persistent());
                found.info.set_owner_uid(meta.owner_uid());
                *found.info.mutable_resources() = meta.resources();
                found.info.set_created_unix_ms(meta.created_unix_ms());
                found.info.set_workdir(meta.workdir());
                found.info.set_image(meta.image());
                found.info.set_image_digest(meta.image_digest());
                *found.info.mutable_image_config() = meta.image_config();
            }
        } catch (const std::exception&) {
            // No daemon metadata: the daemon died between the helper's create and its save.
        }
        out.push_back(std::move(found));
    }
    ::closedir(d);
    return out;
}

}  // namespace berth::daemon
