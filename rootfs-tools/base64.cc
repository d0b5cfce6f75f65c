#include "rootfs-tools/base64.h"

namespace berth::images {

namespace {

const char* chars(Base64Alphabet a) {
    return a == Base64Alphabet::standard
               ? "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
               : "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
}

int value_of(char c, Base64Alphabet a) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == (a == Base64Alphabet::standard ? '+' : '-')) return 62;
    if (c == (a == Base64Alphabet::standard ? '/' : '_')) return 63;
    return -1;
}

}  // namespace

std::string base64_encode(std::string_view bytes, Base64Alphabet alphabet) {
    const char* table = chars(alphabet);
    std::string out;
    out.reserve((bytes.size() + 2) / 3 * 4);
    size_t i = 0;
    for (; i + 3 <= bytes.size(); i += 3) {
        const uint32_t v = uint32_t(uint8_t(bytes[i])) << 16 |
                           uint32_t(uint8_t(bytes[i + 1])) << 8 | uint8_t(bytes[i + 2]);
        out += table[v >> 18 & 63];
        out += table[v >> 12 & 63];
        out += table[v >> 6 & 63];
        out += table[v & 63];
    }
    const size_t left = bytes.size() - i;
    if (left > 0) {
        uint32_t v = uint32_t(uint8_t(bytes[i])) << 16;
        if (left == 2) v |= uint32_t(uint8_t(bytes[i + 1])) << 8;
        out += table[v >> 18 & 63];
        out += table[v >> 12 & 63];
        if (left == 2) out += table[v >> 6 & 63];
        // JWTs (the URL alphabet) are written without padding.
        if (alphabet == Base64Alphabet::standard) out.append(3 - left, '=');
    }
    return out;
}

std::optional<std::string> base64_decode(std::string_view text, Base64Alphabet alphabet) {
    while (!text.empty() && text.back() == '=') text.remove_suffix(1);
    if (text.size() % 4 == 1) return std::nullopt;  // no byte count ends like that
    std::string out;
    out.reserve(text.size() * 3 / 4);
    uint32_t acc = 0;
    int bits = 0;
    for (char c : text) {
        const int v = value_of(c, alphabet);
        if (v < 0) return std::nullopt;
        acc = acc << 6 | uint32_t(v);
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out += char(acc >> bits & 0xff);
        }
    }
    // The bits left over must be zero, or the text was not made by an encoder.
    if ((acc & ((1u << bits) - 1)) != 0) return std::nullopt;
    return out;
}

}  // namespace berth::images
