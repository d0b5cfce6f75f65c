#include "rootfs-tools/reference.h"

#include <stdexcept>
#include <vector>

namespace berth::images {

namespace {

bool lower_alnum(char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
}
bool alnum(char c) {
    return lower_alnum(c) || (c >= 'A' && c <= 'Z');
}

[[noreturn]] void bad(std::string_view text, const std::string& why) {
    throw std::invalid_argument("invalid image reference '" + std::string(text.substr(0, 300)) +
                                "': " + why);
}

// path-component: [a-z0-9]+ ( ( "." | "_" | "__" | "-"+ ) [a-z0-9]+ )*
bool valid_path_component(std::string_view c) {
    if (c.empty() || !lower_alnum(c.front()) || !lower_alnum(c.back())) return false;
    for (size_t i = 0; i < c.size();) {
        if (lower_alnum(c[i])) {
            ++i;
            continue;
        }
        size_t j = i;
        while (j < c.size() && !lower_alnum(c[j])) ++j;
        std::string_view sep = c.substr(i, j - i);
        const bool dashes = sep.find_first_not_of('-') == std::string_view::npos;
        if (!(sep == "." || sep == "_" || sep == "__" || dashes)) return false;
        i = j;
    }
    return true;
}

// domain: host components separated by dots (or a bracketed IPv6 address), then :port.
bool valid_domain(std::string_view d) {
    std::string_view host = d;
    if (!d.empty() && d.front() == '[') {
        const size_t close = d.find(']');
        if (close == std::string_view::npos || close < 3) return false;
        for (char c : d.substr(1, close - 1)) {
            if (!(std::isxdigit(static_cast<unsigned char>(c)) || c == ':')) return false;
        }
        host = {};
        d = d.substr(close + 1);
        if (!d.empty() && d.front() != ':') return false;
    } else {
        const size_t colon = d.find(':');
        host = d.substr(0, colon);
        d = colon == std::string_view::npos ? std::string_view{} : d.substr(colon);
        if (host.empty()) return false;
        size_t i = 0;
        while (i <= host.size()) {
            size_t j = host.find('.', i);
            if (j == std::string_view::npos) j = host.size();
            std::string_view label = host.substr(i, j - i);
            if (label.empty() || !alnum(label.front()) || !alnum(label.back())) return false;
            for (char c : label) {
                if (!(alnum(c) || c == '-')) return false;
            }
            i = j + 1;
        }
    }
    if (!d.empty()) {  // ":port"
        std::string_view port = d.substr(1);
        if (port.empty() || port.size() > 5) return false;
        for (char c : port) {
            if (c < '0' || c > '9') return false;
        }
    }
    return true;
}

// tag: [A-Za-z0-9_][A-Za-z0-9_.-]{0,127}
bool valid_tag(std::string_view t) {
    if (t.empty() || t.size() > 128 || !(alnum(t[0]) || t[0] == '_')) return false;
    for (char c : t) {
        if (!(alnum(c) || c == '_' || c == '.' || c == '-')) return false;
    }
    return true;
}

}  // namespace

Reference parse_reference(std::string_view text) {
    if (text.empty()) bad(text, "it is empty");
    Reference ref;
    std::string_view rest = text;
    if (const size_t at = rest.find('@'); at != std::string_view::npos) {
        try {
            ref.digest = Digest::parse(rest.substr(at + 1));
        } catch (const std::invalid_argument& e) {
            bad(text, e.what());
        }
        rest = rest.substr(0, at);
    }
    // A tag is after the last colon that comes after the last slash (a port's colon is in
    // the domain, before a slash).
    const size_t slash = rest.rfind('/');
    const size_t colon = rest.rfind(':');
    if (colon != std::string_view::npos && (slash == std::string_view::npos || colon > slash)) {
        std::string_view tag = rest.substr(colon + 1);
        if (!valid_tag(tag)) bad(text, "the tag '" + std::string(tag) + "' is not valid");
        ref.tag = std::string(tag);
        rest = rest.substr(0, colon);
    }
    if (rest.empty()) bad(text, "it has no name");
    std::vector<std::string_view> parts;
    for (size_t i = 0; i <= rest.size();) {
        size_t j = rest.find('/', i);
        if (j == std::string_view::npos) j = rest.size();
        parts.push_back(rest.substr(i, j - i));
        i = j + 1;
    }
    // The first part names a registry when it looks like a host: a dot, a port, or
    // "localhost" (docker's rule; "library/x" and "org/x" stay on docker.io).
    std::string_view first = parts.front();
    const bool has_domain =
        parts.size() > 1 && (first.find_first_of(".:") != std::string_view::npos ||
                             first == "localhost" || (!first.empty() && first.front() == '['));
    if (has_domain) {
        if (!valid_domain(first))
            bad(text, "the registry '" + std::string(first) + "' is not valid");
        ref.registry = std::string(first);
        parts.erase(parts.begin());
    } else {
        ref.registry = std::string(kDefaultRegistry);
    }
    for (std::string_view p : parts) {
        if (!valid_path_component(p)) {
            bad(text, "'" + std::string(p) +
                          "' is not a valid name component (lowercase letters, digits, "
                          "and . _ __ - between them)");
        }
    }
    std::string repo;
    for (std::string_view p : parts) {
        if (!repo.empty()) repo += '/';
        repo += p;
    }
    if (ref.registry == kDefaultRegistry && parts.size() == 1) repo = "library/" + repo;
    if (ref.registry.size() + 1 + repo.size() > 255) bad(text, "the name is over 255 characters");
    ref.repository = std::move(repo);
    if (!ref.tag && !ref.digest) ref.tag = "latest";
    return ref;
}

std::string Reference::str() const {
    std::string s = name();
    if (tag) s += ":" + *tag;
    if (digest) s += "@" + digest->str();
    return s;
}

std::string Reference::familiar() const {
    std::string s;
    if (registry != kDefaultRegistry) {
        s = name();
    } else {
        s = repository.rfind("library/", 0) == 0 && repository.find('/', 8) == std::string::npos
                ? repository.substr(8)
                : repository;
        // "docker.io/foo.bar/x" short would be read as registry foo.bar: it keeps its registry.
        const std::string_view first = std::string_view(s).substr(0, s.find('/'));
        if (s.find('/') != std::string::npos &&
            (first.find_first_of(".:") != std::string_view::npos || first == "localhost"))
            s = name();
    }
    if (tag) s += ":" + *tag;
    if (digest) s += "@" + digest->str();
    return s;
}

}  // namespace berth::images
