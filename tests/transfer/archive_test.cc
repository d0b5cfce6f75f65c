// Tar streams: round trips through a pipe, compatibility with GNU tar and Python's tarfile,
// hostile streams, rollback, ENOSPC, cancellation.
#include "transfer/archive.h"

#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <random>

#include "tests/transfer/archive_util.h"

namespace berth::transfer {
namespace {

using namespace testing;

static ::testing::Environment* const kMountNs =
    ::testing::AddGlobalTestEnvironment(new PrivateMountNs);

void set_mtime(const std::string& path, int64_t sec, long nsec) {
    struct timespec ts[2] = {{sec, nsec}, {sec, nsec}};
    if (::utimensat(AT_FDCWD, path.c_str(), ts, AT_SYMLINK_NOFOLLOW) != 0)
        throw_sys("utimensat", path);
}

std::string random_bytes(size_t n, unsigned seed) {
    std::mt19937_64 rng(seed);
    std::string s(n, '\0');
    for (size_t i = 0; i + 8 <= n; i += 8) {
        uint64_t v = rng();
        memcpy(&s[i], &v, 8);
    }
    return s;
}

// A tree with what a stream must carry. Returns the names of what the writer skips.
std::vector<std::string> make_tree(const std::string& d, bool with_sparse = true) {
    mkdir_p(d + "/sub/deeper");
    write_file(d + "/sub/deeper/file.txt", "hello\n");
    write_file(d + "/empty", "");
    mkdir_p(d + "/ro");
    write_file(d + "/ro/child", "c");
    mkdir_p(d + "/sticky");
    write_file(d + "/suid", "s", 0755);
    write_file(d + "/sgid", "g", 0755);
    write_file(d + "/private", "p", 0600);
    mkdir_p(d + "/sgid-dir");
    symlink_("sub/deeper/file.txt", d + "/rel");
    symlink_("/etc/passwd", d + "/abs");
    symlink_("no/such/thing", d + "/dangling");
    symlink_("sub", d + "/dirlink");
    symlink_(std::string(200, 'T') + "/target", d + "/longlink");
    write_file(d + "/hl1", "linked");
    if (::link((d + "/hl1").c_str(), (d + "/sub/hl2").c_str()) != 0) throw_sys("link", d);
    if (::link((d + "/hl1").c_str(), (d + "/hl3").c_str()) != 0) throw_sys("link", d);
    write_file(d + "/big", random_bytes(5 << 20, 1));
    write_file(d + "/medium", random_bytes(100000, 2));
    write_file(d + "/exact64k", random_bytes(65536, 3));
    std::string longdir = d + "/" + std::string(120, 'a') + "/" + std::string(150, 'b');
    mkdir_p(longdir);
    write_file(longdir + "/" + std::string(200, 'c'), "deep");
    write_file(d + "/" + std::string(140, 'n'), "long name");
    write_file(d + "/uid-big", "u");
    if (::chown((d + "/uid-big").c_str(), 3000000, 3000001) != 0) throw_sys("chown", d);
    if (::chown((d + "/sub").c_str(), 1234, 5678) != 0) throw_sys("chown", d);
    if (::lchown((d + "/rel").c_str(), 1234, 5678) != 0) throw_sys("lchown", d);
    if (::chown((d + "/sub/deeper/file.txt").c_str(), 1234, 5678) != 0) throw_sys("chown", d);
    if (with_sparse) {
        UniqueFd fd(
            ::open((d + "/sparse").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
        if (::ftruncate(fd.get(), 32 << 20) != 0) throw_sys("ftruncate", d);
        std::string chunk = random_bytes(8192, 4);
        for (off_t off : {off_t{0}, off_t{1} << 20, (off_t{20} << 20) + 12345})
            if (::pwrite(fd.get(), chunk.data(), chunk.size(), off) != 8192) throw_sys("pwrite", d);
        // sparse2 ends with data, starts with a hole.
        UniqueFd fd2(
            ::open((d + "/sparse2").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
        if (::pwrite(fd2.get(), chunk.data(), 100, 8 << 20) != 100) throw_sys("pwrite", d);
    }
    if (::mkfifo((d + "/fifo").c_str(), 0644) != 0) throw_sys("mkfifo", d);
    // Modes after content (setuid survives only a chmod after the chown).
    ::chmod((d + "/suid").c_str(), 04755);
    ::chmod((d + "/sgid").c_str(), 02711);
    ::chmod((d + "/sgid-dir").c_str(), 02775);
    ::chmod((d + "/sticky").c_str(), 01777);
    // mtimes to the nanosecond, directories last, deepest first.
    int64_t t = 1500000000;
    long ns = 1;
    for (auto p : {"sub/deeper/file.txt", "empty", "ro/child", "suid", "sgid", "private", "rel",
                   "abs", "dangling", "dirlink", "longlink", "hl1", "big", "medium", "exact64k",
                   "uid-big", "sparse", "sparse2"}) {
        if (!with_sparse && std::string(p).rfind("sparse", 0) == 0) continue;
        set_mtime(d + "/" + p, t++, ns = ns * 7 % 999999937);
    }
    set_mtime(d + "/" + std::string(140, 'n'), t++, 5);
    set_mtime(longdir, t++, 6);
    set_mtime(d + "/" + std::string(120, 'a'), t++, 7);
    // (Nanoseconds Python's float mtimes keep, for the tarfile test.)
    for (auto p : {"sub/deeper", "sub", "ro", "sticky", "sgid-dir"})
        set_mtime(d + "/" + p, t++, 999999);
    ::chmod((d + "/ro").c_str(), 0555);
    set_mtime(d, t++, 123456789);
    return {"fifo"};
}

class ArchiveTest : public ::testing::TestWithParam<Resolver> {
  protected:
    void SetUp() override {
        mkdir_p(base / "src");
        mkdir_p(base / "dst");
        mkdir_p(base / "canary-dir");
        write_file(base / "canary-dir/keep", "keep");
        write_file(base / "canary", "canary");
    }
    Root src() const { return Root::open(base / "src", GetParam()); }
    Root dst() const { return Root::open(base / "dst", GetParam()); }
    void expect_canaries() const {
        EXPECT_EQ(read_file_or(base / "canary"), "canary");
        EXPECT_EQ(read_file_or(base / "canary-dir/keep"), "keep");
        EXPECT_EQ(manifest(base / "canary-dir", ManifestOptions().no_dir_mtime()).size(), 2u);
    }
    TempDir base;
};

TEST_P(ArchiveTest, RoundTripThroughAPipe) {
    auto skipped = make_tree(base / "src/d");
    Summary w;
    ExtractOptions eo;
    eo.owners = ExtractOptions::Owners::from_archive;
    Summary r = roundtrip(src(), "d", {}, dst(), "out", eo, &w);
    EXPECT_EQ(w.entries, r.entries);
    EXPECT_EQ(w.bytes, r.bytes);
    ASSERT_EQ(w.warnings.size(), 1u);
    EXPECT_NE(w.warnings[0].find("d/fifo"), std::string::npos) << w.warnings[0];
    EXPECT_TRUE(r.warnings.empty());
    ManifestOptions mo = ManifestOptions().excluding(skipped);
    auto want = manifest(base / "src/d", mo);
    auto got = manifest(base / "dst/out/d", mo);
    EXPECT_EQ(diff(want, got), "");
    EXPECT_GT(want.size(), 25u);
    // Holes stayed holes.
    struct stat st;
    ASSERT_EQ(::stat((base / "dst/out/d/sparse").c_str(), &st), 0);
    EXPECT_EQ(st.st_size, 32 << 20);
    EXPECT_LT(st.st_blocks * 512, 1 << 20);
    ASSERT_EQ(::stat((base / "dst/out/d/sparse2").c_str(), &st), 0);
    EXPECT_LT(st.st_blocks * 512, 1 << 20);
    // No temporaries left anywhere.
    EXPECT_EQ(output_of("find '" + base.path() + "/dst' -name '.berth-tmp*'"), "");
}

TEST_P(ArchiveTest, FixedOwnersAndDefaultOwner) {
    make_tree(base / "src/d", false);
    ExtractOptions eo;
    eo.owner = {4321, 8765};
    roundtrip(src(), "d", {}, dst(), "fixed", eo);
    for (auto& [name, line] : manifest(base / "dst/fixed/d", ManifestOptions().excluding({"fifo"})))
        EXPECT_NE(line.find("owner=4321:8765"), std::string::npos) << name << " " << line;
    roundtrip(src(), "d", {}, dst(), "as-is", {});
    for (auto& [name, line] : manifest(base / "dst/as-is/d", ManifestOptions().excluding({"fifo"})))
        EXPECT_NE(line.find("owner=0:0"), std::string::npos) << name << " " << line;
    // Everything but ownership matches.
    ManifestOptions mo = ManifestOptions().no_owner().excluding({"fifo"});
    EXPECT_EQ(diff(manifest(base / "src/d", mo), manifest(base / "dst/fixed/d", mo)), "");
}

TEST_P(ArchiveTest, ContentsOnlyAppliesDotToDest) {
    make_tree(base / "src/d", false);
    WriteOptions wo;
    wo.contents_only = true;
    ExtractOptions eo;
    eo.owners = ExtractOptions::Owners::from_archive;
    Summary r = roundtrip(src(), "d", wo, dst(), "into/here", eo);
    EXPECT_GT(r.entries, 20u);
    ManifestOptions mo = ManifestOptions().excluding({"fifo"});
    EXPECT_EQ(diff(manifest(base / "src/d", mo), manifest(base / "dst/into/here", mo)), "");
    struct stat st;
    ASSERT_EQ(::stat((base / "dst/into").c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 07777, 0755u);  // parent_mode
}

TEST_P(ArchiveTest, SingleFileAndSymlinkAndRename) {
    write_file(base / "src/f", "data", 0640);
    symlink_("/f", base / "src/l");
    WriteOptions wo;
    wo.name = "renamed";
    roundtrip(src(), "f", wo, dst(), "x", {});
    EXPECT_EQ(read_file_or(base / "dst/x/renamed"), "data");
    // The symlink at `path` itself is not followed.
    roundtrip(src(), "/l", {}, dst(), "x", {});
    char buf[16] = {};
    ASSERT_EQ(::readlink((base / "dst/x/l").c_str(), buf, sizeof buf), 2);
    EXPECT_STREQ(buf, "/f");
    // Existing files and symlinks are replaced.
    write_file(base / "src/f", "new data", 0600);
    wo.name = "l";
    roundtrip(src(), "f", wo, dst(), "x", {});
    EXPECT_EQ(read_file_or(base / "dst/x/l"), "new data");
}

// A large file beside the stream (type 'B'): an upload hands the reader the source file,
// a download has the writer fill an O_TMPFILE the reader then links in.
TEST_P(ArchiveTest, SideFilesCarryALargeFileOutsideTheStream) {
    const std::string content = random_bytes(6 << 20, 9);
    write_file(base / "src/big", content, 0640);
    set_mtime(base / "src/big", 1600000000, 424242);
    const auto want = manifest(base / "src", ManifestOptions().no_dir_mtime());

    // Upload: the reader copies from the file passed beside the stream.
    UniqueFd source(::open((base / "src/big").c_str(), O_RDONLY | O_CLOEXEC));
    WriteOptions wo;
    wo.side_data_passed = true;
    ExtractOptions eo;
    eo.owners = ExtractOptions::Owners::from_archive;
    eo.side_data = {source.get()};
    Summary written;
    Summary r = roundtrip(src(), "big", wo, dst(), "up", eo, &written);
    EXPECT_EQ(r.bytes, content.size());
    EXPECT_EQ(diff(want, manifest(base / "dst/up", ManifestOptions().no_dir_mtime())), "");

    // Download: the writer fills the reader's O_TMPFILE first; the stream has the header.
    mkdir_p(base / "dst/down");
    UniqueFd tmp(::open((base / "dst/down").c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600));
    ASSERT_TRUE(tmp);
    WriteOptions wo2;
    wo2.side_data_out = tmp.get();
    ExtractOptions eo2;
    eo2.owners = ExtractOptions::Owners::from_archive;
    eo2.prefilled = tmp.get();
    roundtrip(src(), "big", wo2, dst(), "down", eo2);
    EXPECT_EQ(diff(want, manifest(base / "dst/down", ManifestOptions().no_dir_mtime())), "");

    // A side entry with no side file, a side file shorter than announced, a side header on
    // a plain entry: errors, nothing left behind.
    auto before = manifest(base / "dst", ManifestOptions().no_dir_mtime());
    std::string what;
    StreamBuilder missing;
    missing.pax({{"BERTH.side_file", "1"}, {"BERTH.side_size", "10"}})
        .header("m", tar::kSideFileType, 0)
        .end();
    EXPECT_EQ(error_of([&] { extract_string(missing.s, dst(), "bad", {}); }, &what), EINVAL);
    EXPECT_NE(what.find("bad/m"), std::string::npos) << what;
    StreamBuilder too_long;
    too_long
        .pax({{"BERTH.side_file", "1"}, {"BERTH.side_size", std::to_string(content.size() + 1)}})
        .header("m", tar::kSideFileType, 0)
        .end();
    ExtractOptions short_side;
    short_side.side_data = {source.get()};
    EXPECT_EQ(error_of([&] { extract_string(too_long.s, dst(), "bad", short_side); }), EIO);
    StreamBuilder plain;
    plain.pax({{"BERTH.side_file", "1"}, {"BERTH.side_size", "10"}}).file("m", "").end();
    EXPECT_EQ(error_of([&] { extract_string(plain.s, dst(), "bad", short_side); }), EBADMSG);
    EXPECT_EQ(diff(before, manifest(base / "dst", ManifestOptions().no_dir_mtime())), "");
}

// Files are created with their final bits and owner where that is already right; a setgid
// directory that hands down its group must not fool that, nor a mode with special bits.
TEST_P(ArchiveTest, OwnerAndModeAreExactWhateverTheDirectoryHandsDown) {
    mkdir_p(base / "dst/sg");
    ASSERT_EQ(::chown((base / "dst/sg").c_str(), 0, 1234), 0);
    ASSERT_EQ(::chmod((base / "dst/sg").c_str(), 02775), 0);
    StreamBuilder b;
    b.file("plain", "p", 0640).file("suid", "s", 04755).file("ro", "r", 0444).end();
    ExtractOptions eo;
    eo.owner = {0, 0};
    const mode_t old = ::umask(027);
    extract_string(b.s, dst(), "sg", eo);
    ::umask(old);
    for (auto [name, mode] : {std::pair{"plain", 0640}, {"suid", 04755}, {"ro", 0444}}) {
        struct stat st;
        ASSERT_EQ(::stat((base / "dst/sg/" + name).c_str(), &st), 0) << name;
        EXPECT_EQ(st.st_mode & 07777, static_cast<mode_t>(mode)) << name;
        EXPECT_EQ(st.st_uid, 0u) << name;
        EXPECT_EQ(st.st_gid, 0u) << name << ": the setgid directory's group leaked through";
    }
}

TEST_P(ArchiveTest, ExistingDirectoryIsMergedInto) {
    make_tree(base / "src/d", false);
    mkdir_p(base / "dst/out/d/sub");
    write_file(base / "dst/out/d/sub/preexisting", "keep");
    ExtractOptions eo;
    eo.owners = ExtractOptions::Owners::from_archive;
    roundtrip(src(), "d", {}, dst(), "out", eo);
    EXPECT_EQ(read_file_or(base / "dst/out/d/sub/preexisting"), "keep");
    EXPECT_EQ(read_file_or(base / "dst/out/d/sub/deeper/file.txt"), "hello\n");
}

TEST_P(ArchiveTest, TypeConflictsAreErrorsNamingThePath) {
    mkdir_p(base / "dst/out/isdir/inner");
    write_file(base / "dst/out/isfile", "x");
    auto before = manifest(base / "dst", ManifestOptions().no_dir_mtime());
    std::string what;
    StreamBuilder a;
    a.file("new1", "n").file("isdir", "file over a dir").end();
    EXPECT_EQ(error_of([&] { extract_string(a.s, dst(), "out"); }, &what), EISDIR);
    EXPECT_NE(what.find("out/isdir"), std::string::npos) << what;
    StreamBuilder b;
    b.dir("new2/").dir("isfile/").end();
    EXPECT_EQ(error_of([&] { extract_string(b.s, dst(), "out"); }, &what), ENOTDIR);
    EXPECT_NE(what.find("out/isfile"), std::string::npos) << what;
    StreamBuilder c;
    c.file("isfile/x", "under a file").end();
    EXPECT_EQ(error_of([&] { extract_string(c.s, dst(), "out"); }, &what), ENOTDIR);
    EXPECT_EQ(diff(before, manifest(base / "dst", ManifestOptions().no_dir_mtime())), "");
}

// ---- compatibility ----

TEST_P(ArchiveTest, ExtractsGnuTarPax) {
    make_tree(base / "src/d");
    ASSERT_EQ(run("tar --format=pax --sparse -cf '" + base / "gnu.tar" + "' -C '" + base / "src" +
                  "' d 2>/dev/null"),
              0);
    UniqueFd in(::open((base / "gnu.tar").c_str(), O_RDONLY | O_CLOEXEC));
    ExtractOptions eo;
    eo.owners = ExtractOptions::Owners::from_archive;
    Summary r = extract_archive(in.get(), dst(), "out", eo);
    EXPECT_GT(r.entries, 25u);
    ManifestOptions mo = ManifestOptions().excluding({"fifo"});
    EXPECT_EQ(diff(manifest(base / "src/d", mo), manifest(base / "dst/out/d", mo)), "");
    struct stat st;
    ASSERT_EQ(::stat((base / "dst/out/d/sparse").c_str(), &st), 0);
    EXPECT_LT(st.st_blocks * 512, 1 << 20);
    // The same archive through a pipe.
    std::string bytes = berth::read_file(base / "gnu.tar");
    extract_string(bytes, dst(), "piped", eo);
    EXPECT_EQ(diff(manifest(base / "src/d", mo), manifest(base / "dst/piped/d", mo)), "");
}

TEST_P(ArchiveTest, ExtractsGnuTarGnuFormatWithLongNames) {
    make_tree(base / "src/d", false);
    ASSERT_EQ(run("tar --format=gnu -cf '" + base / "gnu.tar" + "' -C '" + base / "src" +
                  "' d 2>/dev/null"),
              0);
    ASSERT_EQ(run("tar -tvf '" + base / "gnu.tar" +
                  "' | grep -q '././@LongLink' ; "
                  "grep -q '././@LongLink' '" +
                  base / "gnu.tar" + "'"),
              0)
        << "expected GNU long name headers";
    UniqueFd in(::open((base / "gnu.tar").c_str(), O_RDONLY | O_CLOEXEC));
    ExtractOptions eo;
    eo.owners = ExtractOptions::Owners::from_archive;
    extract_archive(in.get(), dst(), "out", eo);
    ManifestOptions mo = ManifestOptions().mtime_sec().excluding({"fifo"});
    EXPECT_EQ(diff(manifest(base / "src/d", mo), manifest(base / "dst/out/d", mo)), "");
}

TEST_P(ArchiveTest, ExtractsPythonTarfile) {
    make_tree(base / "src/d", false);
    for (std::string format : {"PAX_FORMAT", "GNU_FORMAT"}) {
        std::string tarpath = base / ("py-" + format + ".tar");
        ASSERT_EQ(run("python3 -c 'import tarfile,sys; t=tarfile.open(sys.argv[1], \"w\", "
                      "format=tarfile." +
                      format +
                      "); t.add(sys.argv[2], arcname=\"d\", "
                      "filter=lambda i: None if i.isfifo() else i); t.close()' '" +
                      tarpath + "' '" + base / "src/d" + "'"),
                  0);
        std::string bytes = berth::read_file(tarpath);
        ExtractOptions eo;
        eo.owners = ExtractOptions::Owners::from_archive;
        extract_string(bytes, dst(), format, eo);
        ManifestOptions mo = ManifestOptions().mtime_sec().excluding({"fifo"});
        EXPECT_EQ(diff(manifest(base / "src/d", mo), manifest(base / "dst/" + format + "/d", mo)),
                  "")
            << format;
    }
}

TEST_P(ArchiveTest, GnuTarReadsWhatWeWrite) {
    make_tree(base / "src/d");
    {
        UniqueFd out(
            ::open((base / "ours.tar").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
        write_archive(src(), "d", out.get(), {});
    }
    std::string listing = output_of("tar -tvf '" + base / "ours.tar" + "' 2>&1");
    EXPECT_NE(listing.find("d/sub/deeper/file.txt"), std::string::npos) << listing;
    EXPECT_NE(listing.find("d/rel -> sub/deeper/file.txt"), std::string::npos) << listing;
    EXPECT_NE(listing.find(" link to d/"), std::string::npos) << listing;
    EXPECT_NE(listing.find("d/sparse"), std::string::npos) << listing;
    EXPECT_EQ(listing.find("GNUSparseFile"), std::string::npos) << listing;
    EXPECT_EQ(listing.find("PaxHeader"), std::string::npos) << listing;
    EXPECT_EQ(listing.find("tar:"), std::string::npos) << listing;  // no warnings
    mkdir_p(base / "gnu-out");
    ASSERT_EQ(run("tar --sparse -xpf '" + base / "ours.tar" + "' -C '" + base / "gnu-out" + "'"),
              0);
    ManifestOptions mo = ManifestOptions().excluding({"fifo"});
    EXPECT_EQ(diff(manifest(base / "src/d", mo), manifest(base / "gnu-out/d", mo)), "");
    struct stat st;
    ASSERT_EQ(::stat((base / "gnu-out/d/sparse").c_str(), &st), 0);
    EXPECT_LT(st.st_blocks * 512, 1 << 20);
    // Python's tarfile lists the same names.
    std::string py = output_of(
        "python3 -c 'import tarfile,sys; "
        "print(len(tarfile.open(sys.argv[1]).getnames()))' '" +
        base / "ours.tar" + "'");
    std::string gnu_count = output_of("tar -tf '" + base / "ours.tar" + "' | wc -l");
    EXPECT_EQ(std::stoi(py), std::stoi(gnu_count));
}

// ---- hostile streams ----

struct Hostile {
    const char* name;
    std::function<std::string(const std::string& base)> stream;
    int err;
};

std::string big_pax() {
    StreamBuilder b;
    b.pax({{"comment", std::string(2 << 20, 'x')}}).file("f", "x").end();
    return b.s;
}

std::vector<Hostile> hostile_streams() {
    return {
        {"absolute",
         [](auto&) { return StreamBuilder().file("ok", "1").file("/etc/evil", "x").end().s; },
         EINVAL},
        {"absolute-into-canary",
         [](auto& base) { return StreamBuilder().file(base + "/canary", "x").end().s; }, EINVAL},
        {"dotdot",
         [](auto&) { return StreamBuilder().file("ok", "1").file("../canary", "x").end().s; },
         EINVAL},
        {"dotdot-inner",
         [](auto&) { return StreamBuilder().dir("a/").file("a/../../canary", "x").end().s; },
         EINVAL},
        {"pax-path-dotdot",
         [](auto&) {
             return StreamBuilder().pax({{"path", "../../canary"}}).file("harmless", "x").end().s;
         },
         EINVAL},
        {"gnu-longname-dotdot",
         [](auto&) {
             return StreamBuilder()
                 .header("././@LongLink", 'L', 13)
                 .data("../../canary")
                 .file("harmless", "x")
                 .end()
                 .s;
         },
         EINVAL},
        {"nul-in-pax-path",
         [](auto&) {
             return StreamBuilder()
                 .pax({{"path", std::string("..\0x", 4)}})
                 .file("harmless", "x")
                 .end()
                 .s;
         },
         EINVAL},
        {"through-symlink-to-root",
         [](auto&) {
             return StreamBuilder().file("ok", "1").symlink("a", "/").file("a/x", "x").end().s;
         },
         ELOOP},
        {"through-symlink-outside",
         [](auto& base) {
             return StreamBuilder()
                 .symlink("a", base + "/canary-dir")
                 .file("a/keep", "overwritten")
                 .end()
                 .s;
         },
         ELOOP},
        {"through-relative-symlink",
         [](auto&) {
             return StreamBuilder().symlink("a", "../../../canary-dir").dir("a/sub/").end().s;
         },
         ELOOP},
        {"hardlink-absolute",
         [](auto& base) { return StreamBuilder().hardlink("h", base + "/canary").end().s; },
         EINVAL},
        {"hardlink-dotdot",
         [](auto&) { return StreamBuilder().hardlink("h", "../../canary").end().s; }, EINVAL},
        {"hardlink-not-in-stream",
         [](auto&) { return StreamBuilder().file("ok", "1").hardlink("h", "existing").end().s; },
         EINVAL},
        {"hardlink-to-symlink",
         [](auto&) {
             return StreamBuilder().symlink("s", "/etc/passwd").hardlink("h", "s").end().s;
         },
         EINVAL},
        {"hardlink-to-dir",
         [](auto&) { return StreamBuilder().dir("dd/").hardlink("h", "dd").end().s; }, EINVAL},
        {"bad-checksum",
         [](auto&) {
             StreamBuilder b;
             b.file("ok", "1").file("bad", "2").end();
             b.s[1024 + 10] ^= 1;
             return b.s;
         },
         EBADMSG},
        {"truncated-data",
         [](auto&) {
             auto s = StreamBuilder().file("ok", "1").file("f", std::string(100000, 'x')).end().s;
             return s.substr(0, 1536 + 50000);
         },
         EIO},
        {"truncated-header",
         [](auto&) {
             auto s = StreamBuilder().file("ok", "1").file("f", "x").end().s;
             return s.substr(0, 1024 + 200);
         },
         EIO},
        {"no-end-marker",
         [](auto&) {
             auto s = StreamBuilder().file("ok", "1").s;
             return s;
         },
         EIO},
        {"empty-stream", [](auto&) { return std::string(); }, EIO},
        {"over-long-pax", [](auto&) { return big_pax(); }, EBADMSG},
        {"malformed-pax",
         [](auto&) {
             return StreamBuilder()
                 .header("././@PaxHeader", 'x', 12)
                 .data("99 path=x\n\n\n")
                 .file("f", "x")
                 .end()
                 .s;
         },
         EBADMSG},
        {"over-long-gnu-name",
         [](auto&) {
             return StreamBuilder()
                 .header("././@LongLink", 'L', (1 << 20) + 1)
                 .data(std::string((1 << 20) + 1, 'a'))
                 .file("f", "x")
                 .end()
                 .s;
         },
         EBADMSG},
        {"unknown-type",
         [](auto&) { return StreamBuilder().file("ok", "1").header("v", 'V', 0).end().s; }, EINVAL},
        {"sparse-map-beyond-size",
         [](auto&) {
             std::string map = "1\n5000\n10\n";
             map.resize(512, '\0');
             return StreamBuilder()
                 .pax({{"GNU.sparse.major", "1"},
                       {"GNU.sparse.minor", "0"},
                       {"GNU.sparse.name", "sp"},
                       {"GNU.sparse.realsize", "100"}})
                 .header("GNUSparseFile.0/sp", '0', 512 + 10)
                 .data(map + std::string(10, 'x'))
                 .end()
                 .s;
         },
         EBADMSG},
    };
}

TEST_P(ArchiveTest, HostileStreamsAreRefusedAndLeaveNothing) {
    mkdir_p(base / "dst/out/keepdir");
    write_file(base / "dst/out/existing", "existing");
    ManifestOptions mo = ManifestOptions().no_dir_mtime();
    auto before = manifest(base / "dst", mo);
    for (auto& h : hostile_streams()) {
        std::string what;
        int err = error_of([&] { extract_string(h.stream(base.path()), dst(), "out"); }, &what);
        EXPECT_EQ(err, h.err) << h.name << ": " << what;
        EXPECT_EQ(diff(before, manifest(base / "dst", mo)), "") << h.name;
        expect_canaries();
        // Also into a destination that does not exist yet: it goes too.
        err = error_of([&] { extract_string(h.stream(base.path()), dst(), "new/dest"); });
        EXPECT_EQ(err, h.err) << h.name;
        EXPECT_FALSE(exists(base / "dst/new")) << h.name;
    }
    expect_canaries();
    EXPECT_FALSE(exists("/etc/evil"));
}

TEST_P(ArchiveTest, FailureMidwayRollsBack) {
    mkdir_p(base / "dst/out/existing-dir");
    write_file(base / "dst/out/keep", "keep");
    ManifestOptions mo = ManifestOptions().no_dir_mtime();
    auto before = manifest(base / "dst", mo);
    StreamBuilder b;
    b.dir("newdir/", 0555)
        .file("newdir/f", "f")
        .dir("newdir/sub/")
        .file("newdir/sub/big", random_bytes(300000, 5))
        .file("existing-dir/new", "n")
        .file("top", "t")
        .symlink("sl", "/etc")
        .hardlink("hl", "top")
        .file("implied/parent/file", "x");
    std::string good = b.s;
    b.file("bad", "2").end();
    b.s[good.size() + 100] ^= 0x40;  // corrupt the last header
    EXPECT_EQ(error_of([&] { extract_string(b.s, dst(), "out"); }), EBADMSG);
    EXPECT_EQ(diff(before, manifest(base / "dst", mo)), "");
    EXPECT_EQ(output_of("find '" + base.path() + "/dst' -name '.berth-tmp*'"), "");
    // The good part alone (with an end) extracts, and the read-only dir got its child.
    extract_string(good + std::string(1024, '\0'), dst(), "out");
    EXPECT_EQ(read_file_or(base / "dst/out/newdir/f"), "f");
    struct stat st;
    ASSERT_EQ(::stat((base / "dst/out/newdir").c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 07777, 0555u);
    ASSERT_EQ(::stat((base / "dst/out/hl").c_str(), &st), 0);
    EXPECT_EQ(st.st_nlink, 2u);
}

TEST_P(ArchiveTest, NoSpaceIsENOSPCNamingTheFileAndLeavesNothing) {
    if (!PrivateMountNs::available) GTEST_SKIP() << "no private mount namespace";
    mkdir_p(base / "small");
    ASSERT_EQ(::mount("tmpfs", (base / "small").c_str(), "tmpfs", 0, "size=1m"), 0);
    Root small = Root::open(base / "small", GetParam());
    mkdir_p(base / "src/d/sub");
    write_file(base / "src/d/sub/a", "a");
    write_file(base / "src/d/sub/huge", random_bytes(3 << 20, 6));
    std::string what;
    EXPECT_EQ(error_of([&] { roundtrip(src(), "d", {}, small, "x", {}); }, &what), ENOSPC);
    EXPECT_NE(what.find("x/d/sub/huge"), std::string::npos) << what;
    EXPECT_EQ(output_of("ls -A '" + base / "small" + "'"), "");
    // Many small files (the buffered path) fill it too.
    remove_tree(base / "src/d");
    mkdir_p(base / "src/d");
    for (int i = 0; i < 40; ++i)
        write_file(base / "src/d/f" + std::to_string(i), random_bytes(40000, i));
    EXPECT_EQ(error_of([&] { roundtrip(src(), "d", {}, small, "x", {}); }, &what), ENOSPC);
    EXPECT_NE(what.find("x/d/f"), std::string::npos) << what;
    EXPECT_EQ(output_of("ls -A '" + base / "small" + "'"), "");
    ::umount2((base / "small").c_str(), MNT_DETACH);
}

TEST_P(ArchiveTest, CancelFdStopsABlockedTransfer) {
    write_file(base / "src/big", random_bytes(8 << 20, 7));
    int data[2], cancel[2];
    ASSERT_EQ(::pipe2(data, O_CLOEXEC), 0);
    ASSERT_EQ(::pipe2(cancel, O_CLOEXEC), 0);
    UniqueFd dr(data[0]), dw(data[1]), cr(cancel[0]), cw(cancel[1]);
    std::thread t([&] {
        ::usleep(100000);
        cw.reset();  // hang up
    });
    const CancelToken write_cancel = CancelToken::watching(cr.get());
    WriteOptions wo;
    wo.cancel = &write_cancel;
    EXPECT_EQ(error_of([&] { write_archive(src(), "big", dw.get(), wo); }), ECANCELED);
    t.join();
    EXPECT_EQ(::fcntl(dw.get(), F_GETFL) & O_NONBLOCK, 0);  // flags restored

    // Reading from a pipe where nothing comes.
    ASSERT_EQ(::pipe2(cancel, O_CLOEXEC), 0);
    cr.reset(cancel[0]);
    cw.reset(cancel[1]);
    std::thread t2([&] {
        ::usleep(100000);
        ASSERT_EQ(::write(cw.get(), "x", 1), 1);
    });
    const CancelToken read_cancel = CancelToken::watching(cr.get());
    ExtractOptions eo;
    eo.cancel = &read_cancel;
    EXPECT_EQ(error_of([&] { extract_archive(dr.get(), dst(), "c", eo); }), ECANCELED);
    t2.join();
    EXPECT_FALSE(exists(base / "dst/c"));
}

TEST_P(ArchiveTest, ThroughASocketAndAFile) {
    make_tree(base / "src/d");
    ManifestOptions mo = ManifestOptions().excluding({"fifo"});
    auto want = manifest(base / "src/d", mo);
    // A socket: sendfile on the writer side, read+write on the reader side.
    int sv[2];
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    UniqueFd a(sv[0]), b(sv[1]);
    ExtractOptions eo;
    eo.owners = ExtractOptions::Owners::from_archive;
    std::exception_ptr err;
    std::thread t([&] {
        try {
            write_archive(src(), "d", a.get(), {});
        } catch (...) {
            err = std::current_exception();
        }
        a.reset();
    });
    extract_archive(b.get(), dst(), "sock", eo);
    t.join();
    ASSERT_FALSE(err);
    EXPECT_EQ(diff(want, manifest(base / "dst/sock/d", mo)), "");
    // A regular file: copy_file_range both ways.
    {
        UniqueFd out(
            ::open((base / "s.tar").c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
        write_archive(src(), "d", out.get(), {});
    }
    UniqueFd in(::open((base / "s.tar").c_str(), O_RDONLY | O_CLOEXEC));
    extract_archive(in.get(), dst(), "file", eo);
    EXPECT_EQ(diff(want, manifest(base / "dst/file/d", mo)), "");
}

TEST_P(ArchiveTest, ReaderCornerCases) {
    StreamBuilder b;
    b.header("g", 'g', 20)
        .data(std::string("20 comment=global\n\0", 20))
        .file("./a", "first")
        .file("a", "second", 0600)
        .file("s", "file, then a symlink")
        .symlink("s", "a")
        .header("fifo", '6', 0)
        .header("chr", '3', 0)
        .header("blk", '4', 0)
        .dir("d")         // no trailing slash
        .file("d2/", "")  // a '0' with a trailing slash is a directory
        .file("implied/deep/file", "x")
        .end();
    Summary r = extract_string(b.s, dst(), "out");
    EXPECT_EQ(read_file_or(base / "dst/out/a"), "second");
    char buf[8] = {};
    ASSERT_EQ(::readlink((base / "dst/out/s").c_str(), buf, sizeof buf), 1);
    EXPECT_EQ(r.warnings.size(), 3u);
    EXPECT_FALSE(exists(base / "dst/out/fifo"));
    struct stat st;
    ASSERT_EQ(::stat((base / "dst/out/d2").c_str(), &st), 0);
    EXPECT_TRUE(S_ISDIR(st.st_mode));
    EXPECT_EQ(read_file_or(base / "dst/out/implied/deep/file"), "x");
    EXPECT_EQ(r.entries, 7u);  // a, a, s, s, d, d2, implied/deep/file

    // Names the kernel refuses come out as such.
    StreamBuilder n;
    n.pax({{"path", "ok/" + std::string(300, 'x')}}).file("placeholder", "x").end();
    std::string what;
    EXPECT_EQ(error_of([&] { extract_string(n.s, dst(), "long"); }, &what), ENAMETOOLONG);
    EXPECT_NE(what.find("long/ok/xxxx"), std::string::npos) << what;
    EXPECT_FALSE(exists(base / "dst/long"));
}

INSTANTIATE_TEST_SUITE_P(Resolvers, ArchiveTest, ::testing::ValuesIn(resolvers()), resolver_name);

}  // namespace
}  // namespace berth::transfer
