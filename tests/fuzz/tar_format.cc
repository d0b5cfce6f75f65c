// The tar format's byte-level decoders, without I/O: many more inputs per second than the
// extraction targets, and checks they cannot make. The input is cut into a 512-byte header
// block (zero-padded when short) and the rest, which is read as pax records and as the
// numbers and times that pax values and header fields hold.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "transfer/tar_format.h"

namespace tar = berth::transfer::tar;

namespace {

void check(bool ok) {
    if (!ok) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    char block[tar::kBlock] = {};
    std::memcpy(block, data, size < tar::kBlock ? size : tar::kBlock);
    tar::Header h;
    if (tar::decode_header(block, &h) == tar::DecodeResult::ok) {
        // What a decoded header says must be representable again: a ustar header the writer
        // encodes from it decodes to the same fields (names that fit ustar, non-negative
        // numbers within the octal fields' range).
        const bool plain = h.name.size() <= 100 && h.linkname.size() <= 100 &&
                           h.name.find('\0') == std::string::npos &&
                           h.linkname.find('\0') == std::string::npos && !h.name.empty() &&
                           h.uid >= 0 && static_cast<uint64_t>(h.uid) <= tar::kMaxOctalId &&
                           h.gid >= 0 && static_cast<uint64_t>(h.gid) <= tar::kMaxOctalId &&
                           h.size >= 0 && static_cast<uint64_t>(h.size) <= tar::kMaxOctalSize &&
                           h.mtime >= 0 && h.mtime <= static_cast<int64_t>(tar::kMaxOctalSize);
        if (plain) {
            char again[tar::kBlock];
            tar::encode_header(again, {h.name, h.type, h.mode, static_cast<uint64_t>(h.uid),
                                       static_cast<uint64_t>(h.gid), static_cast<uint64_t>(h.size),
                                       h.mtime, h.linkname});
            tar::Header h2;
            check(tar::decode_header(again, &h2) == tar::DecodeResult::ok);
            check(h2.name == h.name && h2.linkname == h.linkname && h2.type == h.type &&
                  h2.mode == h.mode && h2.uid == h.uid && h2.gid == h.gid && h2.size == h.size &&
                  h2.mtime == h.mtime);
        }
    }
    const std::string_view rest =
        size > tar::kBlock
            ? std::string_view(reinterpret_cast<const char*>(data) + tar::kBlock,
                               size - tar::kBlock)
            : std::string_view(reinterpret_cast<const char*>(data), size);
    std::vector<tar::PaxRecord> recs;
    if (tar::parse_pax(rest, &recs)) {
        for (const auto& r : recs) {
            // Records point into the data they came from.
            check(r.key.data() >= rest.data() &&
                  r.value.data() + r.value.size() <= rest.data() + rest.size());
            uint64_t n;
            tar::parse_decimal(r.value, &n);
            int64_t ns;
            tar::parse_pax_time(r.value, &ns);
            // What the writer makes of a record, the reader takes back.
            std::string out;
            tar::append_pax_record(out, r.key, r.value);
            std::vector<tar::PaxRecord> back;
            check(tar::parse_pax(out, &back) && back.size() == 1 && back[0].key == r.key &&
                  back[0].value == r.value);
        }
    }
    int64_t ns;
    if (tar::parse_pax_time(rest, &ns) && ns >= 0) {
        int64_t again;
        check(tar::parse_pax_time(tar::format_pax_time(ns), &again) && again == ns);
    }
    int64_t n;
    tar::parse_number(block, 12, &n);  // a size field's width, from the input's start
    return 0;
}
