#include "rootfs-tools/digest.h"

#include <stdexcept>

namespace berth::images {

Digest Digest::parse(std::string_view text) {
    constexpr std::string_view prefix = "sha256:";
    auto bad = [&](const char* why) {
        return std::invalid_argument("not a sha256 digest (" + std::string(why) + "): '" +
                                     std::string(text.substr(0, 100)) + "'");
    };
    if (text.substr(0, prefix.size()) != prefix) throw bad("it must start with sha256:");
    std::string_view hex = text.substr(prefix.size());
    if (hex.size() != 64) throw bad("it needs 64 hex digits");
    for (char ch : hex) {
        if (!((ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f')))
            throw bad("lowercase hex digits only");
    }
    return Digest(std::string(text));
}

Sha256::Sha256() : ctx_(EVP_MD_CTX_new()) {
    if (!ctx_ || EVP_DigestInit_ex(ctx_.get(), EVP_sha256(), nullptr) != 1)
        throw std::runtime_error("EVP_DigestInit_ex(sha256) failed");
}

void Sha256::update(const void* data, size_t len) {
    if (EVP_DigestUpdate(ctx_.get(), data, len) != 1)
        throw std::runtime_error("EVP_DigestUpdate failed");
}

Digest Sha256::finish() {
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    if (EVP_DigestFinal_ex(ctx_.get(), md, &len) != 1 || len != 32)
        throw std::runtime_error("EVP_DigestFinal_ex failed");
    static constexpr char kHex[] = "0123456789abcdef";
    std::string text = "sha256:";
    for (unsigned i = 0; i < len; ++i) {
        text += kHex[md[i] >> 4];
        text += kHex[md[i] & 15];
    }
    return Digest::parse(text);
}

Digest sha256_of(std::string_view data) {
    Sha256 h;
    h.update(data.data(), data.size());
    return h.finish();
}

}  // namespace berth::images
