// The tar format, as bytes: ustar headers (encode, decode, checksum), pax records, numbers
// in octal or base-256, GNU sparse maps. No I/O here.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace berth::transfer::tar {

// berth's own entry type (POSIX leaves 'A'-'Z' to vendors): a regular file whose data is
// not in the stream but in a file passed beside it (pax BERTH.side_file, BERTH.side_size).
inline constexpr char kSideFileType = 'B';

constexpr size_t kBlock = 512;
// Limits on what the reader holds in memory for one entry.
constexpr uint64_t kMaxMetaSize = 1 << 20;  // a pax header or GNU long name/link
constexpr uint64_t kMaxSparseSegments = 1 << 20;

inline uint64_t padding(uint64_t n) {
    return (kBlock - n % kBlock) % kBlock;
}
inline uint64_t padded(uint64_t n) {
    return n + padding(n);
}

bool is_zero_block(const char* block);

// What goes into one ustar header.
struct HeaderFields {
    std::string_view name;  // split into prefix/name when it fits; else truncated (use pax)
    char type = '0';
    uint32_t mode = 0;
    uint64_t uid = 0;
    uint64_t gid = 0;
    uint64_t size = 0;
    int64_t mtime = 0;  // seconds
    std::string_view linkname;
};

// Whether `name` can be stored in the ustar name/prefix fields.
bool fits_ustar_name(std::string_view name);
constexpr uint64_t kMaxOctalId = 07777777;           // uid/gid in 7 octal digits
constexpr uint64_t kMaxOctalSize = 077777777777ULL;  // size in 11 octal digits

// Writes a complete 512-byte header (with checksum) into `block`.
void encode_header(char* block, const HeaderFields& fields);

// Appends "LEN key=value\n".
void append_pax_record(std::string& out, std::string_view key, std::string_view value);
// "sec.nsec" for a time in nanoseconds since the epoch (negative times as "-S.N").
std::string format_pax_time(int64_t ns);

// A decoded ustar/GNU header.
struct Header {
    std::string name;  // prefix joined for POSIX ustar
    std::string linkname;
    char type = '0';
    uint32_t mode = 0;
    int64_t uid = 0;
    int64_t gid = 0;
    int64_t size = 0;
    int64_t mtime = 0;
    uint32_t devmajor = 0, devminor = 0;  // types '3' and '4'
};

enum class DecodeResult { ok, bad_checksum, bad_number };
DecodeResult decode_header(const char* block, Header* out);

// Octal (space/NUL terminated) or base-256 (high bit set) numbers.
bool parse_number(const char* field, size_t len, int64_t* out);
// Decimal, non-negative, no sign or junk.
bool parse_decimal(std::string_view s, uint64_t* out);
// pax time "[-]S[.F]" to nanoseconds.
bool parse_pax_time(std::string_view s, int64_t* ns);

struct PaxRecord {
    std::string_view key;
    std::string_view value;
};
// Splits pax header data into records; false if malformed.
bool parse_pax(std::string_view data, std::vector<PaxRecord>* out);

struct SparseSegment {
    uint64_t offset = 0;
    uint64_t size = 0;
};

}  // namespace berth::transfer::tar
