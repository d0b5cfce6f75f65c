// A registry's WWW-Authenticate challenges (RFC 7235): the scheme and its parameters, as
// in `Bearer realm="https://auth.example/token",service="registry",scope="repository:a/b:pull"`
// or `Basic realm="Registry"`. One header may carry several challenges.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace berth::images {

struct AuthChallenge {
    std::string scheme;                         // lowercased: "bearer", "basic"
    std::map<std::string, std::string> params;  // names lowercased, values unquoted
    std::string param(const std::string& name) const {
        auto it = params.find(name);
        return it == params.end() ? std::string() : it->second;
    }
};

// Throws std::invalid_argument quoting the header and saying where it stops making sense.
std::vector<AuthChallenge> parse_www_authenticate(std::string_view header);

}  // namespace berth::images
