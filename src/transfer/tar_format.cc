// ustar/pax/GNU encodings. Field offsets from POSIX.1-2001 (ustar) and GNU tar's tar.h.
#include "transfer/tar_format.h"

#include <algorithm>
#include <cstring>

namespace berth::transfer::tar {

namespace {

// Field offsets and sizes in a ustar header.
constexpr size_t kName = 0, kNameLen = 100;
constexpr size_t kMode = 100, kModeLen = 8;
constexpr size_t kUid = 108, kUidLen = 8;
constexpr size_t kGid = 116, kGidLen = 8;
constexpr size_t kSize = 124, kSizeLen = 12;
constexpr size_t kMtime = 136, kMtimeLen = 12;
constexpr size_t kChksum = 148, kChksumLen = 8;
constexpr size_t kType = 156;
constexpr size_t kLinkname = 157, kLinknameLen = 100;
constexpr size_t kMagic = 257;
constexpr size_t kVersion = 263;
constexpr size_t kDevMajor = 329, kDevMinor = 337, kDevLen = 8;
constexpr size_t kPrefix = 345, kPrefixLen = 155;

void put_string(char* block, size_t off, size_t len, std::string_view s) {
    // An empty field (no linkname, no owner name) may have no data pointer at all, and
    // memcpy from null is undefined even for 0 bytes (UBSan found it).
    if (s.empty()) return;
    std::memcpy(block + off, s.data(), std::min(len, s.size()));
}

// Octal in len-1 digits plus NUL when it fits, else base-256 (GNU/star extension).
void put_number(char* block, size_t off, size_t len, int64_t value) {
    uint64_t max_octal = (uint64_t{1} << (3 * (len - 1))) - 1;
    if (value >= 0 && static_cast<uint64_t>(value) <= max_octal) {
        uint64_t v = static_cast<uint64_t>(value);
        for (size_t i = len - 1; i-- > 0;) {
            block[off + i] = static_cast<char>('0' + (v & 7));
            v >>= 3;
        }
        block[off + len - 1] = '\0';
        return;
    }
    uint64_t v = static_cast<uint64_t>(value);
    for (size_t i = len; i-- > 1;) {
        block[off + i] = static_cast<char>(v & 0xff);
        v = value < 0 ? (v >> 8) | (uint64_t{0xff} << 56) : v >> 8;
    }
    block[off] = static_cast<char>(value < 0 ? 0xff : 0x80);
}

unsigned checksum(const char* block, int64_t* signed_sum) {
    unsigned sum = 0;
    int64_t ssum = 0;
    for (size_t i = 0; i < kBlock; ++i) {
        char c = (i >= kChksum && i < kChksum + kChksumLen) ? ' ' : block[i];
        sum += static_cast<unsigned char>(c);
        ssum += static_cast<signed char>(c);
    }
    if (signed_sum) *signed_sum = ssum;
    return sum;
}

std::string get_string(const char* block, size_t off, size_t len) {
    const char* p = block + off;
    return std::string(p, strnlen(p, len));
}

}  // namespace

bool is_zero_block(const char* block) {
    for (size_t i = 0; i < kBlock; ++i)
        if (block[i]) return false;
    return true;
}

bool fits_ustar_name(std::string_view name) {
    if (name.size() <= kNameLen) return true;
    if (name.size() > kNameLen + 1 + kPrefixLen) return false;
    // Split at a '/' so that the part after it fits the name field and before it the prefix.
    size_t from = name.size() - kNameLen - 1;
    size_t slash = name.find('/', from);
    return slash != std::string_view::npos && slash > 0 && slash <= kPrefixLen &&
           slash + 1 < name.size();
}

void encode_header(char* block, const HeaderFields& f) {
    std::memset(block, 0, kBlock);
    std::string_view name = f.name;
    if (name.size() > kNameLen && fits_ustar_name(name)) {
        size_t slash = name.find('/', name.size() - kNameLen - 1);
        put_string(block, kPrefix, kPrefixLen, name.substr(0, slash));
        name = name.substr(slash + 1);
    }
    put_string(block, kName, kNameLen, name);
    put_number(block, kMode, kModeLen, f.mode & 07777);
    put_number(block, kUid, kUidLen, static_cast<int64_t>(f.uid));
    put_number(block, kGid, kGidLen, static_cast<int64_t>(f.gid));
    put_number(block, kSize, kSizeLen, static_cast<int64_t>(f.size));
    put_number(block, kMtime, kMtimeLen, f.mtime);
    block[kType] = f.type;
    put_string(block, kLinkname, kLinknameLen, f.linkname);
    std::memcpy(block + kMagic, "ustar", 6);
    std::memcpy(block + kVersion, "00", 2);
    unsigned sum = checksum(block, nullptr);
    // Six octal digits, NUL, space: what GNU tar writes.
    for (size_t i = 6; i-- > 0;) {
        block[kChksum + i] = static_cast<char>('0' + (sum & 7));
        sum >>= 3;
    }
    block[kChksum + 6] = '\0';
    block[kChksum + 7] = ' ';
}

void append_pax_record(std::string& out, std::string_view key, std::string_view value) {
    size_t body = key.size() + value.size() + 3;  // ' ', '=', '\n'
    size_t len = body + 1;
    for (;;) {
        size_t total = body + std::to_string(len).size();
        if (total == len) break;
        len = total;
    }
    out += std::to_string(len);
    out += ' ';
    out += key;
    out += '=';
    out += value;
    out += '\n';
}

std::string format_pax_time(int64_t ns) {
    bool neg = ns < 0;
    uint64_t a = neg ? static_cast<uint64_t>(-(ns + 1)) + 1 : static_cast<uint64_t>(ns);
    char frac[16];
    std::snprintf(frac, sizeof frac, "%09llu", static_cast<unsigned long long>(a % 1000000000));
    return (neg ? "-" : "") + std::to_string(a / 1000000000) + "." + frac;
}

bool parse_number(const char* field, size_t len, int64_t* out) {
    auto first = static_cast<unsigned char>(field[0]);
    if (first == 0x80 || first == 0xff) {
        bool neg = first == 0xff;
        uint64_t v = neg ? ~uint64_t{0} : 0;  // two's complement, sign-extended
        for (size_t i = 1; i < len; ++i) {
            if (i < len - 8 && static_cast<unsigned char>(field[i]) != (neg ? 0xff : 0))
                return false;  // more than 64 bits
            v = (v << 8) | static_cast<unsigned char>(field[i]);
        }
        if (!neg && v > static_cast<uint64_t>(INT64_MAX)) return false;
        *out = static_cast<int64_t>(v);
        return true;
    }
    size_t i = 0;
    while (i < len && field[i] == ' ') ++i;
    uint64_t v = 0;
    bool any = false;
    for (; i < len && field[i] >= '0' && field[i] <= '7'; ++i) {
        if (v >> 60) return false;
        v = (v << 3) | static_cast<uint64_t>(field[i] - '0');
        any = true;
    }
    for (; i < len; ++i)
        if (field[i] != ' ' && field[i] != '\0') return false;
    if (!any) v = 0;  // an empty field is 0 (some writers leave devmajor etc. empty)
    *out = static_cast<int64_t>(v);
    return true;
}

DecodeResult decode_header(const char* block, Header* out) {
    int64_t stored;
    if (!parse_number(block + kChksum, kChksumLen, &stored)) return DecodeResult::bad_checksum;
    int64_t ssum;
    unsigned sum = checksum(block, &ssum);
    if (stored != static_cast<int64_t>(sum) && stored != ssum) return DecodeResult::bad_checksum;
    out->name = get_string(block, kName, kNameLen);
    // POSIX ustar ("ustar\0" "00") has a prefix; old GNU ("ustar  \0") uses that space for
    // other things.
    if (std::memcmp(block + kMagic, "ustar\0", 6) == 0) {
        std::string prefix = get_string(block, kPrefix, kPrefixLen);
        if (!prefix.empty()) out->name = prefix + "/" + out->name;
    }
    out->linkname = get_string(block, kLinkname, kLinknameLen);
    out->type = block[kType];
    int64_t mode, uid, gid, size, mtime;
    if (!parse_number(block + kMode, kModeLen, &mode) ||
        !parse_number(block + kUid, kUidLen, &uid) || !parse_number(block + kGid, kGidLen, &gid) ||
        !parse_number(block + kSize, kSizeLen, &size) ||
        !parse_number(block + kMtime, kMtimeLen, &mtime) || size < 0)
        return DecodeResult::bad_number;
    out->mode = static_cast<uint32_t>(mode & 07777);
    out->uid = uid;
    out->gid = gid;
    out->size = size;
    out->mtime = mtime;
    // Device numbers: only character and block devices use them (other entries may hold
    // anything there, even non-octal bytes from old writers).
    if (out->type == '3' || out->type == '4') {
        int64_t major, minor;
        if (!parse_number(block + kDevMajor, kDevLen, &major) ||
            !parse_number(block + kDevMinor, kDevLen, &minor) || major < 0 || minor < 0 ||
            major > 0xfffff || minor > 0xfffff)
            return DecodeResult::bad_number;
        out->devmajor = static_cast<uint32_t>(major);
        out->devminor = static_cast<uint32_t>(minor);
    }
    return DecodeResult::ok;
}

bool parse_decimal(std::string_view s, uint64_t* out) {
    if (s.empty() || s.size() > 19) return false;
    uint64_t v = 0;
    for (char c : s) {
        if (c < '0' || c > '9') return false;
        v = v * 10 + static_cast<uint64_t>(c - '0');
    }
    *out = v;
    return true;
}

bool parse_pax_time(std::string_view s, int64_t* ns) {
    bool neg = !s.empty() && s[0] == '-';
    if (neg) s.remove_prefix(1);
    size_t dot = s.find('.');
    uint64_t sec;
    if (!parse_decimal(s.substr(0, dot), &sec) || sec > 9000000000ULL) return false;
    uint64_t frac = 0;
    if (dot != std::string_view::npos) {
        std::string_view f = s.substr(dot + 1);
        for (size_t i = 0; i < 9; ++i) {
            char c = i < f.size() ? f[i] : '0';
            if (c < '0' || c > '9') return false;
            frac = frac * 10 + static_cast<uint64_t>(c - '0');
        }
        for (size_t i = 9; i < f.size(); ++i)
            if (f[i] < '0' || f[i] > '9') return false;
    }
    int64_t v = static_cast<int64_t>(sec * 1000000000 + frac);
    *ns = neg ? -v : v;
    return true;
}

bool parse_pax(std::string_view data, std::vector<PaxRecord>* out) {
    while (!data.empty()) {
        size_t sp = data.find(' ');
        if (sp == std::string_view::npos || sp == 0) {
            // GNU tar pads nothing, but tolerate trailing NULs.
            return data.find_first_not_of('\0') == std::string_view::npos;
        }
        uint64_t len;
        if (!parse_decimal(data.substr(0, sp), &len) || len <= sp + 1 || len > data.size())
            return false;
        std::string_view rec = data.substr(sp + 1, len - sp - 1);
        if (rec.empty() || rec.back() != '\n') return false;
        rec.remove_suffix(1);
        size_t eq = rec.find('=');
        if (eq == std::string_view::npos || eq == 0) return false;
        out->push_back({rec.substr(0, eq), rec.substr(eq + 1)});
        data.remove_prefix(len);
    }
    return true;
}

}  // namespace berth::transfer::tar
