#include "rootfs-tools/document_parser.h"

#include <nlohmann/json.hpp>

namespace berth::images {

using nlohmann::json;

namespace {

json parse_json(const std::string& text, const std::string& what) {
    try {
        return json::parse(text);
    } catch (const json::exception& e) {  // parse_error, or out_of_range for 1e999
        throw ManifestError(what + ": not JSON (" + e.what() + ")");
    }
}

std::string annotation(const json& entry, const char* key) {
    if (!entry.is_object() || !entry.contains("annotations") || !entry["annotations"].is_object())
        return "";
    const json& a = entry["annotations"];
    return a.contains(key) && a[key].is_string() ? a[key].get<std::string>() : "";
}

}  // namespace

void parse_oci_layout(const std::string& bytes, const std::string& where) {
    const json layout = parse_json(bytes, where);
    if (!layout.is_object() || layout.value("imageLayoutVersion", json()) != "1.0.0")
        throw ManifestError(where + ": not an OCI image layout 1.0.0");
}

LayoutIndex parse_layout_index(const std::string& bytes, const std::string& where) {
    auto top = parse_manifest_or_index(bytes, media::kOciIndex);
    if (!std::holds_alternative<Index>(top)) throw ManifestError(where + ": not an index");
    LayoutIndex out{std::get<Index>(std::move(top)), {}};
    const json index_json = parse_json(bytes, where);
    for (size_t i = 0; i < out.index.manifests.size(); ++i) {
        const json& entry = index_json["manifests"][i];
        out.names.push_back({annotation(entry, "org.opencontainers.image.ref.name"),
                             annotation(entry, "io.containerd.image.name")});
    }
    return out;
}

std::vector<DockerArchiveEntry> parse_docker_manifest(const std::string& bytes,
                                                      const std::string& where) {
    const json list = parse_json(bytes, where);
    if (!list.is_array() || list.empty()) throw ManifestError(where + ": lists no image");
    std::vector<DockerArchiveEntry> out;
    for (const auto& e : list) {
        if (!e.is_object()) throw ManifestError(where + ": an entry is not an object");
        DockerArchiveEntry entry;
        const json config = e.value("Config", json());
        if (!config.is_string()) throw ManifestError(where + ": Config is not a path");
        entry.config = config.get<std::string>();
        const json layers = e.value("Layers", json::array());
        if (!layers.is_array()) throw ManifestError(where + ": Layers is not a list");
        for (const auto& l : layers) {
            if (!l.is_string()) throw ManifestError(where + ": Layers is not a path");
            entry.layers.push_back(l.get<std::string>());
        }
        if (e.contains("RepoTags") && e["RepoTags"].is_array())
            for (const auto& t : e["RepoTags"])
                if (t.is_string()) entry.repo_tags.push_back(t.get<std::string>());
        out.push_back(std::move(entry));
    }
    return out;
}

}  // namespace berth::images
