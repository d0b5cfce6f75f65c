#include "rootfs-tools/manifest.h"

#include <sys/utsname.h>

#include <nlohmann/json.hpp>

namespace berth::images {

using nlohmann::json;

namespace {

[[noreturn]] void bad(const std::string& what) {
    throw ManifestError(what);
}

json parse_json(std::string_view text, const char* what) {
    try {
        json j = json::parse(text);
        if (!j.is_object()) bad(std::string(what) + ": not a JSON object");
        return j;
    } catch (const json::exception& e) {  // parse_error, or out_of_range for 1e999
        bad(std::string(what) + ": not JSON (" + e.what() + ")");
    }
}

std::string string_field(const json& j, const char* key, const std::string& where,
                         bool required = true) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) {
        if (required) bad(where + ": no \"" + key + "\"");
        return {};
    }
    if (!it->is_string()) bad(where + ": \"" + key + "\" is not a string");
    return it->get<std::string>();
}

std::vector<std::string> strings_field(const json& j, const char* key, const std::string& where) {
    std::vector<std::string> out;
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return out;
    if (!it->is_array()) bad(where + ": \"" + key + "\" is not a list");
    for (const auto& v : *it) {
        if (!v.is_string()) bad(where + ": \"" + key + "\" holds a non-string");
        out.push_back(v.get<std::string>());
    }
    return out;
}

Descriptor descriptor(const json& j, const std::string& where) {
    if (!j.is_object()) bad(where + ": not an object");
    Descriptor d{string_field(j, "mediaType", where), Digest::from_hex(std::string(64, '0')), 0,
                 std::nullopt};
    try {
        d.digest = Digest::parse(string_field(j, "digest", where));
    } catch (const std::invalid_argument& e) {
        bad(where + ": " + e.what());
    }
    auto size = j.find("size");
    if (size == j.end() || !size->is_number_integer() || size->get<int64_t>() < 0)
        bad(where + ": \"size\" must be a byte count");
    d.size = size->get<uint64_t>();
    if (auto p = j.find("platform"); p != j.end() && p->is_object()) {
        d.platform = Platform{string_field(*p, "os", where + " platform"),
                              string_field(*p, "architecture", where + " platform"),
                              string_field(*p, "variant", where + " platform", false)};
    }
    return d;
}

Compression layer_compression(const std::string& type, const std::string& where) {
    auto ends_with = [&](std::string_view s) {
        return type.size() >= s.size() && type.compare(type.size() - s.size(), s.size(), s) == 0;
    };
    if (type.find("nondistributable") != std::string::npos ||
        type.find("foreign") != std::string::npos)
        bad(where + ": foreign (non-distributable) layer " + type + " is not supported");
    if (type == "application/vnd.oci.image.layer.v1.tar" ||
        type == "application/vnd.docker.image.rootfs.diff.tar")
        return Compression::none;
    if (type == "application/vnd.oci.image.layer.v1.tar+gzip" ||
        type == "application/vnd.docker.image.rootfs.diff.tar.gzip")
        return Compression::gzip;
    if (type == "application/vnd.oci.image.layer.v1.tar+zstd" || ends_with("tar.zstd"))
        return Compression::zstd;
    bad(where + ": layer media type " + (type.empty() ? "(none)" : type) + " is not supported");
}

}  // namespace

std::string Platform::str() const {
    return os + "/" + architecture + (variant.empty() ? "" : "/" + variant);
}

Platform host_platform() {
    utsname u{};
    ::uname(&u);
    const std::string m = u.machine;
    if (m == "x86_64") return {"linux", "amd64", ""};
    if (m == "aarch64" || m == "arm64") return {"linux", "arm64", "v8"};
    if (m == "armv7l") return {"linux", "arm", "v7"};
    if (m == "armv6l") return {"linux", "arm", "v6"};
    if (m == "i386" || m == "i686") return {"linux", "386", ""};
    return {"linux", m, ""};  // ppc64le, s390x, riscv64 are spelt the same
}

std::variant<Manifest, Index> parse_manifest_or_index(std::string_view text,
                                                      std::string_view content_type) {
    json j = parse_json(text, "image manifest");
    auto schema = j.find("schemaVersion");
    if (schema == j.end() || !schema->is_number_integer()) bad("image manifest: no schemaVersion");
    if (schema->get<int>() == 1)
        bad("image manifest: Docker schema 1 (deprecated, unsigned layers) is not supported");
    if (schema->get<int>() != 2) bad("image manifest: schemaVersion " + schema->dump());
    std::string type = string_field(j, "mediaType", "image manifest", false);
    if (type.empty()) type = std::string(content_type);
    if (type.empty()) {  // OCI lets a document omit it: tell them apart by their fields
        type = j.contains("manifests") ? std::string(media::kOciIndex)
               : j.contains("layers")  ? std::string(media::kOciManifest)
                                       : std::string();
    }
    if (type == media::kOciIndex || type == media::kDockerList) {
        Index index{type, {}};
        auto list = j.find("manifests");
        if (list == j.end() || !list->is_array()) bad("image index: no \"manifests\" list");
        for (size_t i = 0; i < list->size(); ++i)
            index.manifests.push_back(
                descriptor((*list)[i], "image index manifests[" + std::to_string(i) + "]"));
        return index;
    }
    if (type == media::kOciManifest || type == media::kDockerManifest) {
        auto cfg = j.find("config");
        if (cfg == j.end()) bad("image manifest: no \"config\"");
        Manifest m{type, descriptor(*cfg, "image manifest config"), {}};
        if (m.config.media_type != media::kOciConfig && m.config.media_type != media::kDockerConfig)
            bad("image manifest config: media type " + m.config.media_type +
                " is not an image config (an artifact, not an image?)");
        auto layers = j.find("layers");
        if (layers == j.end() || !layers->is_array()) bad("image manifest: no \"layers\" list");
        for (size_t i = 0; i < layers->size(); ++i) {
            const std::string where = "image manifest layers[" + std::to_string(i) + "]";
            Descriptor d = descriptor((*layers)[i], where);
            const Compression c = layer_compression(d.media_type, where);
            m.layers.push_back({std::move(d), c});
        }
        return m;
    }
    bad("image manifest: media type " + (type.empty() ? std::string("(none)") : type) +
        " is neither an image manifest nor an index");
}

const Descriptor& select_manifest(const Index& index, const Platform& want) {
    auto variant_of = [](const Platform& p) {
        return p.architecture == "arm64" && p.variant.empty() ? std::string("v8") : p.variant;
    };
    const Descriptor* loose = nullptr;
    std::string have;
    for (const auto& d : index.manifests) {
        if (!d.platform) continue;
        const Platform& p = *d.platform;
        if (p.os == "unknown") continue;  // attestations, not images
        have += (have.empty() ? "" : ", ") + p.str();
        if (p.os != want.os || p.architecture != want.architecture) continue;
        const std::string pv = variant_of(p), wv = variant_of(want);
        if (pv == wv) return d;
        if (pv.empty() || wv.empty()) loose = loose ? loose : &d;
    }
    if (loose) return *loose;
    bad("image index: no manifest for " + want.str() +
        (have.empty() ? std::string(" (it names no platforms)") : " (it has " + have + ")"));
}

ImageConfig parse_config(std::string_view text) {
    json j = parse_json(text, "image config");
    ImageConfig c;
    c.platform = {string_field(j, "os", "image config"),
                  string_field(j, "architecture", "image config"),
                  string_field(j, "variant", "image config", false)};
    c.created = string_field(j, "created", "image config", false);
    if (auto cfg = j.find("config"); cfg != j.end() && cfg->is_object()) {
        c.env = strings_field(*cfg, "Env", "image config");
        c.entrypoint = strings_field(*cfg, "Entrypoint", "image config");
        c.cmd = strings_field(*cfg, "Cmd", "image config");
        c.working_dir = string_field(*cfg, "WorkingDir", "image config", false);
        c.user = string_field(*cfg, "User", "image config", false);
    }
    auto rootfs = j.find("rootfs");
    if (rootfs == j.end() || !rootfs->is_object()) bad("image config: no \"rootfs\"");
    if (string_field(*rootfs, "type", "image config rootfs") != "layers")
        bad("image config rootfs: type must be \"layers\"");
    for (const auto& id : strings_field(*rootfs, "diff_ids", "image config rootfs")) {
        try {
            c.diff_ids.push_back(Digest::parse(id));
        } catch (const std::invalid_argument& e) {
            bad(std::string("image config rootfs diff_ids: ") + e.what());
        }
    }
    return c;
}

}  // namespace berth::images
