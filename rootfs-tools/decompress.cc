#include "rootfs-tools/decompress.h"

#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#include <memory>
#include <vector>

#include "base/error.h"
#include "base/files.h"

namespace berth::images {

namespace {

constexpr size_t kChunk = 256 << 10;

// Reads up to len bytes; 0 at the end.
size_t read_some(int fd, char* buf, size_t len, const std::string& what) {
    for (;;) {
        ssize_t n = ::read(fd, buf, len);
        if (n >= 0) return static_cast<size_t>(n);
        if (errno != EINTR) throw_sys("read", what);
    }
}

class Sink {
  public:
    Sink(int fd, const std::string& what) : fd_(fd), what_(what) {}
    void put(const char* p, size_t len) {
        hash_.update(p, len);
        written_ += len;
        write_all(fd_, {p, len}, what_);
    }
    uint64_t written() const { return written_; }
    Digest finish() { return hash_.finish(); }

  private:
    int fd_;
    const std::string& what_;
    Sha256 hash_;
    uint64_t written_ = 0;
};

[[noreturn]] void corrupt(const std::string& what, const char* format, uint64_t offset,
                          const std::string& why) {
    throw DecompressError(what + ": bad " + format + " data at compressed byte " +
                          std::to_string(offset) + " (" + why + ")");
}

uint64_t copy_plain(int in, Sink& sink, const std::string& what) {
    std::vector<char> buf(kChunk);
    uint64_t total = 0;
    while (size_t n = read_some(in, buf.data(), buf.size(), what)) {
        sink.put(buf.data(), n);
        total += n;
    }
    return total;
}

uint64_t gunzip(int in, Sink& sink, const std::string& what) {
    z_stream z{};
    if (inflateInit2(&z, 15 + 16) != Z_OK) throw DecompressError(what + ": inflateInit2 failed");
    std::unique_ptr<z_stream, void (*)(z_stream*)> guard(&z, [](z_stream* s) { inflateEnd(s); });
    std::vector<char> inbuf(kChunk), outbuf(kChunk);
    uint64_t consumed = 0;
    bool in_member = false;  // inside a gzip member that has not ended yet
    for (;;) {
        size_t n = read_some(in, inbuf.data(), inbuf.size(), what);
        if (n == 0) break;
        z.next_in = reinterpret_cast<Bytef*>(inbuf.data());
        z.avail_in = static_cast<uInt>(n);
        while (z.avail_in > 0) {
            in_member = true;  // bytes after a member's end can only start another one
            z.next_out = reinterpret_cast<Bytef*>(outbuf.data());
            z.avail_out = static_cast<uInt>(outbuf.size());
            const uInt before = z.avail_in;
            int rc = inflate(&z, Z_NO_FLUSH);
            consumed += before - z.avail_in;
            if (rc != Z_OK && rc != Z_STREAM_END && rc != Z_BUF_ERROR)
                corrupt(what, "gzip", consumed, z.msg ? z.msg : "inflate " + std::to_string(rc));
            sink.put(outbuf.data(), outbuf.size() - z.avail_out);
            if (rc == Z_STREAM_END) {
                in_member = false;
                if (inflateReset(&z) != Z_OK) throw DecompressError(what + ": inflateReset failed");
            } else if (rc == Z_BUF_ERROR && z.avail_in > 0 && z.avail_out > 0) {
                corrupt(what, "gzip", consumed, "no progress");
            }
        }
    }
    if (consumed == 0) corrupt(what, "gzip", 0, "empty");
    if (in_member) corrupt(what, "gzip", consumed, "truncated");
    return consumed;
}

uint64_t unzstd(int in, Sink& sink, const std::string& what) {
    std::unique_ptr<ZSTD_DCtx, size_t (*)(ZSTD_DCtx*)> ctx(ZSTD_createDCtx(), ZSTD_freeDCtx);
    if (!ctx) throw DecompressError(what + ": ZSTD_createDCtx failed");
    std::vector<char> inbuf(ZSTD_DStreamInSize()), outbuf(ZSTD_DStreamOutSize());
    uint64_t consumed = 0;
    size_t last = 0;  // 0: at a frame boundary
    bool any = false;
    while (size_t n = read_some(in, inbuf.data(), inbuf.size(), what)) {
        any = true;
        ZSTD_inBuffer input{inbuf.data(), n, 0};
        while (input.pos < input.size) {
            ZSTD_outBuffer output{outbuf.data(), outbuf.size(), 0};
            const size_t before = input.pos;
            last = ZSTD_decompressStream(ctx.get(), &output, &input);
            consumed += input.pos - before;
            if (ZSTD_isError(last)) corrupt(what, "zstd", consumed, ZSTD_getErrorName(last));
            sink.put(outbuf.data(), output.pos);
        }
    }
    // Flush what the decoder still holds for a frame whose input is all in.
    for (;;) {
        ZSTD_inBuffer input{nullptr, 0, 0};
        ZSTD_outBuffer output{outbuf.data(), outbuf.size(), 0};
        if (last == 0) break;
        last = ZSTD_decompressStream(ctx.get(), &output, &input);
        if (ZSTD_isError(last)) corrupt(what, "zstd", consumed, ZSTD_getErrorName(last));
        sink.put(outbuf.data(), output.pos);
        if (output.pos == 0) break;
    }
    if (!any) corrupt(what, "zstd", 0, "empty");
    if (last != 0) corrupt(what, "zstd", consumed, "truncated");
    return consumed;
}

}  // namespace

DecompressResult decompress(int in, Compression compression, int out, const std::string& what) {
    Sink sink(out, what);
    DecompressResult r;
    switch (compression) {
        case Compression::none:
            r.compressed_bytes = copy_plain(in, sink, what);
            break;
        case Compression::gzip:
            r.compressed_bytes = gunzip(in, sink, what);
            break;
        case Compression::zstd:
            r.compressed_bytes = unzstd(in, sink, what);
            break;
    }
    r.uncompressed_bytes = sink.written();
    r.uncompressed_digest = sink.finish();
    return r;
}

}  // namespace berth::images
