#include "rootfs-tools/decompress.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>

#include "base/error.h"
#include "base/unique_fd.h"

namespace fs = std::filesystem;
using namespace berth;
using namespace berth::images;

namespace {

class DecompressTest : public ::testing::Test {
  protected:
    void SetUp() override {
        char tmpl[] = "/var/tmp/berth-decompress-test.XXXXXX";
        ASSERT_NE(::mkdtemp(tmpl), nullptr);
        dir_ = tmpl;
        // 3 MiB that compresses, but not to nothing.
        data_.resize(3 << 20);
        uint32_t x = 12345;
        for (size_t i = 0; i < data_.size(); ++i) {
            x = x * 1103515245 + 12345;
            data_[i] = static_cast<char>((i % 97) < 60 ? 'a' + (i % 7) : (x >> 16));
        }
        write(dir_ + "/data", data_);
    }
    void TearDown() override { fs::remove_all(dir_); }

    void write(const std::string& path, const std::string& bytes) {
        std::ofstream(path, std::ios::binary) << bytes;
    }
    std::string read(const std::string& path) {
        std::ifstream in(path, std::ios::binary);
        return std::string(std::istreambuf_iterator<char>(in), {});
    }
    void sh(const std::string& cmd) { ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd; }

    // Decompresses `file` into dir_/out; returns the result.
    DecompressResult run(const std::string& file, Compression c) {
        UniqueFd in(::open(file.c_str(), O_RDONLY | O_CLOEXEC));
        UniqueFd out(
            ::open((dir_ + "/out").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
        return decompress(in.get(), c, out.get(), file);
    }

    std::string dir_, data_;
};

}  // namespace

TEST_F(DecompressTest, GzipZstdAndPlainGiveTheTarBackWithItsDigest) {
    sh("gzip -6 -c " + dir_ + "/data > " + dir_ + "/data.gz");
    sh("zstd -q -3 -c " + dir_ + "/data > " + dir_ + "/data.zst");
    const Digest want = sha256_of(data_);
    for (auto [file, c] : {std::pair{dir_ + "/data.gz", Compression::gzip},
                           std::pair{dir_ + "/data.zst", Compression::zstd},
                           std::pair{dir_ + "/data", Compression::none}}) {
        DecompressResult r = run(file, c);
        EXPECT_EQ(r.uncompressed_digest, want) << file;
        EXPECT_EQ(r.uncompressed_bytes, data_.size()) << file;
        EXPECT_EQ(r.compressed_bytes, fs::file_size(file)) << file;
        EXPECT_EQ(read(dir_ + "/out"), data_) << file;
    }
}

TEST_F(DecompressTest, SeveralMembersAndFramesFollowOneAnother) {
    write(dir_ + "/a", data_.substr(0, 1000000));
    write(dir_ + "/b", data_.substr(1000000));
    sh("cd " + dir_ + " && gzip -c a > ab.gz && gzip -c b >> ab.gz");
    sh("cd " + dir_ + " && zstd -q -c a > ab.zst && zstd -q -c b >> ab.zst");
    EXPECT_EQ(run(dir_ + "/ab.gz", Compression::gzip).uncompressed_digest, sha256_of(data_));
    EXPECT_EQ(run(dir_ + "/ab.zst", Compression::zstd).uncompressed_digest, sha256_of(data_));
}

TEST_F(DecompressTest, CorruptTruncatedOrEmptyInputIsAnError) {
    sh("gzip -c " + dir_ + "/data > " + dir_ + "/data.gz");
    sh("zstd -q -c " + dir_ + "/data > " + dir_ + "/data.zst");
    for (auto [name, c] : {std::pair{std::string("data.gz"), Compression::gzip},
                           std::pair{std::string("data.zst"), Compression::zstd}}) {
        const std::string good = read(dir_ + "/" + name);
        std::string flipped = good;
        flipped[good.size() / 2] ^= 0x55;
        write(dir_ + "/flipped", flipped);
        write(dir_ + "/truncated", good.substr(0, good.size() - 100));
        write(dir_ + "/trailing", good + "garbage after the end");
        write(dir_ + "/empty", "");
        for (const char* bad : {"flipped", "truncated", "trailing", "empty"}) {
            try {
                run(dir_ + "/" + bad, c);
                ADD_FAILURE() << name << " " << bad << " was accepted";
            } catch (const DecompressError& e) {
                EXPECT_NE(std::string(e.what()).find(dir_ + "/" + bad), std::string::npos)
                    << e.what();
            }
        }
    }
}

TEST_F(DecompressTest, AReaderThatStopsIsAnIoErrorNotCorruption) {
    sh("gzip -c " + dir_ + "/data > " + dir_ + "/data.gz");
    int p[2];
    ASSERT_EQ(::pipe2(p, O_CLOEXEC), 0);
    ::close(p[0]);
    UniqueFd w(p[1]);
    UniqueFd in(::open((dir_ + "/data.gz").c_str(), O_RDONLY | O_CLOEXEC));
    ::signal(SIGPIPE, SIG_IGN);
    EXPECT_THROW(decompress(in.get(), Compression::gzip, w.get(), "data.gz"), SysError);
}
