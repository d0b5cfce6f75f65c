#include "rootfs-tools/image_lookup.h"

#include <algorithm>
#include <set>

namespace berth::images {

namespace {

bool is_hex(std::string_view s) {
    return !s.empty() && s.find_first_not_of("0123456789abcdef") == std::string_view::npos;
}

// Docker's rule: the first component names a registry when it has a dot or a port, or is
// "localhost".
bool names_registry(std::string_view text) {
    const size_t slash = text.find('/');
    if (slash == std::string_view::npos) return false;
    const std::string_view first = text.substr(0, slash);
    return first.find_first_of(".:") != std::string_view::npos || first == "localhost" ||
           first.front() == '[';
}

}  // namespace

std::vector<Reference> candidate_names(std::string_view text) {
    std::vector<Reference> out{parse_reference(text)};
    if (!names_registry(text)) {
        Reference local = out.front();
        local.registry = "localhost";
        // docker.io's one-word names live under library/; local ones keep the word.
        if (local.repository.rfind("library/", 0) == 0 && text.find('/') == std::string_view::npos)
            local.repository = local.repository.substr(8);
        out.push_back(std::move(local));
    }
    return out;
}

Image lookup_image(const ImageStore& store, std::string_view text) {
    if (text.empty()) throw std::invalid_argument("an image reference is required");
    std::string_view hex = text;
    const bool has_algorithm = hex.rfind("sha256:", 0) == 0;
    if (has_algorithm) hex.remove_prefix(7);

    // A digest or a prefix of one: "sha256:..." always, bare hex when no name matches.
    std::optional<std::string> name_error;
    if (!has_algorithm) {
        try {
            for (const auto& ref : candidate_names(text))
                if (auto im = store.find(ref)) return *im;
            name_error = "no image named " + std::string(text);
        } catch (const std::invalid_argument& e) {
            if (!is_hex(hex)) throw;
            name_error = e.what();
        }
        if (!is_hex(hex) || hex.size() < 4) throw ImageNotFound(*name_error);
    } else if (!is_hex(hex) || hex.size() < 4 || hex.size() > 64) {
        throw std::invalid_argument("'" + std::string(text) +
                                    "' is not a digest (sha256: and 4 to 64 lowercase hex digits)");
    }
    std::vector<Image> matches;
    std::set<std::string> manifests;
    for (auto& im : store.list()) {
        if (im.manifest.hex().substr(0, hex.size()) == hex) {
            manifests.insert(im.manifest.str());
            matches.push_back(std::move(im));
        }
    }
    if (matches.empty()) {
        throw ImageNotFound(name_error ? *name_error + ", and no image's digest starts with " +
                                             std::string(hex)
                                       : "no image has the digest " + std::string(text));
    }
    if (manifests.size() > 1) {
        throw std::invalid_argument("'" + std::string(text) + "' is the start of " +
                                    std::to_string(manifests.size()) +
                                    " images' digests: give more of it");
    }
    // Several names of one manifest: any is that image; the first by name, for stability.
    return *std::min_element(matches.begin(), matches.end(),
                             [](const Image& a, const Image& b) { return a.name < b.name; });
}

}  // namespace berth::images
