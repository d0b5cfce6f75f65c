#include "transfer/file_caps.h"

#include <linux/capability.h>

namespace berth::transfer {

namespace {

// Sizes and offsets of struct vfs_cap_data / vfs_ns_cap_data (all fields little-endian).
constexpr size_t kSize1 = 4 + 8 * VFS_CAP_U32_1;  // magic, one (permitted, inheritable)
constexpr size_t kSize2 = 4 + 8 * VFS_CAP_U32_2;  // magic, two of them
constexpr size_t kSize3 = kSize2 + 4;             // ... and the rootid

uint32_t le32(std::string_view s, size_t at) {
    return static_cast<uint32_t>(static_cast<unsigned char>(s[at])) |
           static_cast<uint32_t>(static_cast<unsigned char>(s[at + 1])) << 8 |
           static_cast<uint32_t>(static_cast<unsigned char>(s[at + 2])) << 16 |
           static_cast<uint32_t>(static_cast<unsigned char>(s[at + 3])) << 24;
}

void put_le32(std::string& s, uint32_t v) {
    for (int i = 0; i < 4; ++i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

}  // namespace

std::optional<std::string> namespaced_file_caps(std::string_view value, uint32_t rootid) {
    if (value.size() < 4) return std::nullopt;
    const uint32_t magic = le32(value, 0);
    const uint32_t revision = magic & VFS_CAP_REVISION_MASK;
    // Only the effective flag is defined beside the revision; the kernel refuses others.
    if (magic & ~(VFS_CAP_REVISION_MASK | VFS_CAP_FLAGS_EFFECTIVE)) return std::nullopt;
    size_t words;
    if (revision == VFS_CAP_REVISION_1 && value.size() == kSize1) {
        words = VFS_CAP_U32_1;
    } else if (revision == VFS_CAP_REVISION_2 && value.size() == kSize2) {
        words = VFS_CAP_U32_2;
    } else if (revision == VFS_CAP_REVISION_3 && value.size() == kSize3) {
        words = VFS_CAP_U32_3;
    } else {
        return std::nullopt;
    }
    std::string out;
    out.reserve(kSize3);
    put_le32(out, VFS_CAP_REVISION_3 | (magic & VFS_CAP_FLAGS_EFFECTIVE));
    for (size_t i = 0; i < VFS_CAP_U32_3; ++i) {
        put_le32(out, i < words ? le32(value, 4 + 8 * i) : 0);      // permitted
        put_le32(out, i < words ? le32(value, 4 + 8 * i + 4) : 0);  // inheritable
    }
    put_le32(out, rootid);
    return out;
}

std::optional<uint32_t> file_caps_rootid(std::string_view value) {
    if (value.size() != kSize3 || (le32(value, 0) & VFS_CAP_REVISION_MASK) != VFS_CAP_REVISION_3)
        return std::nullopt;
    return le32(value, kSize2);
}

}  // namespace berth::transfer
