#include "rootfs-tools/blob_store.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "base/error.h"

namespace fs = std::filesystem;
using namespace berth;
using namespace berth::images;

namespace {

class BlobStoreTest : public ::testing::Test {
  protected:
    void SetUp() override {
        char tmpl[] = "/var/tmp/berth-blob-test.XXXXXX";
        ASSERT_NE(::mkdtemp(tmpl), nullptr);
        dir_ = tmpl;
    }
    void TearDown() override { fs::remove_all(dir_); }

    // Files under the store's blobs and ingest dirs (what a reader could ever find).
    std::vector<std::string> stored_files() const {
        std::vector<std::string> out;
        for (const char* sub : {"/blobs/sha256", "/ingest"}) {
            for (const auto& e : fs::directory_iterator(dir_ + sub))
                out.push_back(e.path().filename().string());
        }
        return out;
    }
    std::string read(const std::string& path) const {
        std::ifstream in(path, std::ios::binary);
        return std::string(std::istreambuf_iterator<char>(in), {});
    }
    std::string dir_;
};

// The digest of "hello\n", as `sha256sum` prints it.
const char* kHello = "sha256:5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03";

}  // namespace

TEST(Digest, ParsesOnlyCanonicalSha256) {
    EXPECT_EQ(Digest::parse(kHello).hex().size(), 64u);
    EXPECT_EQ(sha256_of("hello\n").str(), kHello);
    EXPECT_EQ(sha256_of("").str(),
              "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    for (const char* bad :
         {"", "sha256:", "sha512:5891", "5891b5b522d5df086d0ff0b110fbd9d2",
          "sha256:5891B5B522D5DF086D0FF0B110FBD9D21BB4FC7163AF34D08286A2E846F6BE03",
          "sha256:../../../../etc/passwd000000000000000000000000000000000000000",
          "sha256:5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be0",
          "sha256:5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be033"}) {
        EXPECT_THROW(Digest::parse(bad), std::invalid_argument) << bad;
    }
}

TEST_F(BlobStoreTest, VerifiedBlobGetsItsName) {
    BlobStore store(dir_);
    const Digest d = Digest::parse(kHello);
    EXPECT_FALSE(store.has(d));
    BlobWriter w = store.writer(d, 6);
    w.write("hel", 3);
    w.write("lo\n", 3);
    EXPECT_FALSE(store.has(d)) << "named before commit";
    w.commit();
    EXPECT_TRUE(store.has(d));
    EXPECT_EQ(read(store.path(d)), "hello\n");
    EXPECT_EQ(store.size(d), 6u);
    EXPECT_EQ(store.list(), std::vector<Digest>{d});
    struct stat st;
    ASSERT_EQ(::stat(store.path(d).c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 07777, 0644u);
}

TEST_F(BlobStoreTest, WrongBytesAreRefusedAndLeaveNothing) {
    BlobStore store(dir_);
    const Digest d = Digest::parse(kHello);
    {
        BlobWriter w = store.writer(d);
        w.write("hellO\n", 6);
        try {
            w.commit();
            FAIL() << "a blob with the wrong digest was accepted";
        } catch (const BlobMismatch& e) {
            EXPECT_NE(std::string(e.what()).find(sha256_of("hellO\n").str()), std::string::npos)
                << e.what();
        }
    }
    {
        BlobWriter w = store.writer(d, 6);
        w.write("hello", 5);
        EXPECT_THROW(w.commit(), BlobMismatch);  // short
    }
    {
        BlobWriter w = store.writer(d, 6);
        EXPECT_THROW(w.write("hello\n!", 7), BlobMismatch);  // long
    }
    EXPECT_FALSE(store.has(d));
    EXPECT_TRUE(stored_files().empty());
}

TEST_F(BlobStoreTest, AbandonedWriteLeavesNothing) {
    BlobStore store(dir_);
    {
        BlobWriter w = store.writer(Digest::parse(kHello));
        w.write("hel", 3);
    }  // the connection dropped, say
    EXPECT_TRUE(stored_files().empty());
    // A named leftover of a crashed writer (filesystems without O_TMPFILE) is swept on open.
    std::ofstream(dir_ + "/ingest/ingest-0123456789abcdef") << "half";
    // And a scratch directory of an import that died midway.
    const std::string scratch = store.make_scratch_dir("docker-archive");
    fs::create_directories(scratch + "/sub");
    std::ofstream(scratch + "/sub/layer.tar") << "half";
    BlobStore again(dir_);
    EXPECT_TRUE(stored_files().empty());
}

TEST_F(BlobStoreTest, PutStreamsAFileAndPutBytesNamesItself) {
    BlobStore store(dir_);
    std::string big(5 << 20, '\0');
    for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 7 + (i >> 12));
    const std::string src = dir_ + "/src";
    std::ofstream(src, std::ios::binary) << big;
    UniqueFd fd(::open(src.c_str(), O_RDONLY | O_CLOEXEC));
    const Digest d = sha256_of(big);
    store.put(d, fd.get(), big.size());
    EXPECT_EQ(read(store.path(d)), big);
    EXPECT_EQ(store.put_bytes("hello\n").str(), kHello);
    EXPECT_EQ(store.list().size(), 2u);
    store.remove(d);
    store.remove(d);  // absent: nothing to do
    EXPECT_FALSE(store.has(d));
    EXPECT_THROW(store.open(d), SysError);
}

TEST_F(BlobStoreTest, ConcurrentWritersOfOneBlobBothSucceed) {
    BlobStore store(dir_);
    const std::string data(1 << 20, 'x');
    const Digest d = sha256_of(data);
    std::vector<std::jthread> threads;
    std::atomic<int> ok = 0;
    for (int i = 0; i < 4; ++i) {
        threads.emplace_back([&] {
            BlobWriter w = store.writer(d, data.size());
            for (size_t off = 0; off < data.size(); off += 4096) w.write(data.data() + off, 4096);
            w.commit();
            ++ok;
        });
    }
    threads.clear();
    EXPECT_EQ(ok, 4);
    EXPECT_EQ(read(store.path(d)), data);
    EXPECT_EQ(stored_files().size(), 1u);
}

TEST_F(BlobStoreTest, NewBytesAreNamedByWhatTheyHashTo) {
    BlobStore store(dir_);
    BlobWriter w = store.writer_for_new();
    w.write("hello\n", 6);
    EXPECT_FALSE(w.expected());
    EXPECT_EQ(w.commit().str(), kHello);
    EXPECT_EQ(read(store.path(Digest::parse(kHello))), "hello\n");
    {
        BlobWriter abandoned = store.writer_for_new();
        abandoned.write("x", 1);
    }
    EXPECT_EQ(stored_files().size(), 1u);
}
