// The registries configuration (TOML, in the spirit of containers' registries.conf) and
// where it sends a few references: mirrors, rewrites, wildcard prefixes, blocked
// registries. An operator writes it, but it is read by a daemon that runs as root and it
// may come from a shared or generated file: it must fail with ConfigError, never crash.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "rootfs-tools/reference.h"
#include "rootfs-tools/registry_config.h"

namespace images = berth::images;

namespace {

void check(bool ok) {
    if (!ok) std::abort();
}

const images::Reference& ref(int i) {
    static const images::Reference refs[] = {
        images::parse_reference("debian:bookworm"),
        images::parse_reference("docker.io/library/busybox@sha256:"
                                "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"),
        images::parse_reference("quay.io/org/app:1.0"),
        images::parse_reference("localhost:5000/x/y"),
        images::parse_reference("a.b.example.com/ns/img:tag"),
        images::parse_reference("[::1]:5000/img"),
    };
    return refs[i];
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string_view text(reinterpret_cast<const char*>(data), size);
    try {
        const auto conf = images::RegistriesConfig::parse(text, "fuzz.conf");
        for (int i = 0; i < 6; ++i) {
            try {
                const auto endpoints = conf.endpoints_for(ref(i));
                check(!endpoints.empty());
                for (const auto& e : endpoints) check(!e.host.empty() && !e.repository.empty());
            } catch (const images::ConfigError&) {
            }
        }
    } catch (const images::ConfigError&) {
    }
    return 0;
}
