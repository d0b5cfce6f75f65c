// Content digests as OCI writes them ("sha256:" + 64 lowercase hex digits), and the
// streaming hash that checks them.
#pragma once

#include <openssl/evp.h>

#include <memory>
#include <string>
#include <string_view>

namespace berth::images {

// A validated digest. Only sha256: what OCI images and registries use in practice; a
// reference to anything else is refused rather than trusted unchecked.
class Digest {
  public:
    // Throws std::invalid_argument naming the text unless it is "sha256:<64 hex>" in
    // lowercase (the form is also a file name in the store: nothing else may get in).
    static Digest parse(std::string_view text);
    static Digest from_hex(std::string_view hex) { return parse("sha256:" + std::string(hex)); }

    const std::string& str() const { return text_; }  // "sha256:ab12..."
    std::string_view hex() const { return std::string_view(text_).substr(7); }
    std::string_view algorithm() const { return "sha256"; }
    bool operator==(const Digest&) const = default;

  private:
    explicit Digest(std::string text) : text_(std::move(text)) {}
    std::string text_;
};

// SHA-256 over a stream of updates (OpenSSL's EVP).
class Sha256 {
  public:
    Sha256();
    void update(const void* data, size_t len);
    Digest finish();  // once

  private:
    struct Free {
        void operator()(EVP_MD_CTX* c) const { EVP_MD_CTX_free(c); }
    };
    std::unique_ptr<EVP_MD_CTX, Free> ctx_;
};

Digest sha256_of(std::string_view data);

}  // namespace berth::images
