#include "runtime/images/unpack_worker.h"

#include <fcntl.h>
#include <grp.h>
#include <linux/close_range.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <random>

#include "base/child_process.h"
#include "base/cancel.h"
#include "base/error.h"
#include "base/unique_fd.h"
#include "ns/security.h"
#include "rootfs-tools/decompress.h"
#include "runtime/images/worker_root.h"
#include "runtime/wire/frame.h"
#include "transfer/archive.h"
#include "transfer/root.h"
#include "unpack.pb.h"

namespace berth::images_service {

namespace {

constexpr int kChannelFd = 3, kBlobFd = 4, kScratchFd = 5, kCancelFd = 6;
constexpr uint32_t kMaxResult = 1 << 20;

v1::unpack::Compression to_wire(images::Compression c) {
    switch (c) {
        case images::Compression::none:
            return v1::unpack::NONE;
        case images::Compression::gzip:
            return v1::unpack::GZIP;
        case images::Compression::zstd:
            return v1::unpack::ZSTD;
    }
    return v1::unpack::COMPRESSION_UNSPECIFIED;
}

// Reads exactly one byte (the fork/exec handshake), false at EOF or on error.
bool read_byte(int fd, char* c) {
    for (;;) {
        const ssize_t n = ::read(fd, c, 1);
        if (n == 1) return true;
        if (n < 0 && errno == EINTR) continue;
        return false;
    }
}

// The forked child, up to execve: only async-signal-safe calls (berth-images has threads).
[[noreturn]] void exec_worker(int binary, int channel, int parent_end, int blob, int scratch,
                              int cancel, const WorkerRoot& root, pid_t parent) {
    // (Our copy of berth-images' end, which would keep the handshake from ever seeing it go,
    // is closed already: ChildProcess::fork keeps only what it is told.)
    (void)parent_end;
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(119);
    if (::unshare(CLONE_NEWUSER) != 0) ::_exit(120);
    char c = 'u';
    if (::write(channel, &c, 1) != 1) ::_exit(121);
    if (!read_byte(channel, &c) || c != 'g') ::_exit(122);  // the maps are written
    // Root of the new namespace: the sandboxes' root outside.
    if (::setgroups(0, nullptr) != 0 || ::setresgid(0, 0, 0) != 0 || ::setresuid(0, 0, 0) != 0)
        ::_exit(123);
    // After the uid change, which clears it; dies with berth-images.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(124);
    // A filesystem of its own (worker_root.h): it works through its fds only; the host's
    // files, berth's sockets and other sandboxes' trees (whose owners are its ids) are out
    // of reach. No /proc: the extractor then links files in by name.
    if (::unshare(CLONE_NEWNS) != 0 ||
        ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0)
        ::_exit(126);
    if (const int step = enter_worker_root(root); step != 0) ::_exit(140 + step);
    // Fixed numbers, out of each other's way first.
    constexpr int kBinaryFd = kCancelFd + 1;
    if (::dup2(channel, 100) < 0 || ::dup2(blob, 101) < 0 || ::dup2(scratch, 102) < 0 ||
        ::dup2(binary, 103) < 0 || ::dup2(cancel, 104) < 0 || ::dup2(100, kChannelFd) < 0 ||
        ::dup2(101, kBlobFd) < 0 || ::dup2(102, kScratchFd) < 0 || ::dup2(104, kCancelFd) < 0 ||
        ::dup2(103, kBinaryFd) < 0 || ::fcntl(kBinaryFd, F_SETFD, FD_CLOEXEC) != 0)
        ::_exit(125);
    ::syscall(SYS_close_range, kBinaryFd + 1, ~0U, 0);
    char arg0[] = "berth-unpack", arg1[] = "--unpack-worker";
    char* argv[] = {arg0, arg1, nullptr};
    char* envp[] = {nullptr};
    // By fd: the worker (another uid now) need not reach the binary's directory.
    ::syscall(SYS_execveat, kBinaryFd, "", argv, envp, AT_EMPTY_PATH);
    ::_exit(127);
}

// Runs one worker on `job`: `in_fd` is what it reads (a blob, an archive), `cancel_fd` its
// fd 6 (-1: none). Returns what it unpacked, once its directory is at `dest`.
v1::unpack::Unpacked run_worker(const std::string& binary, const ns::IdMapping& mapping, int in_fd,
                                int cancel_fd, const std::string& dest,
                                const v1::unpack::Job& job) {
    namespace fs = std::filesystem;
    const fs::path final_path(dest);
    const std::string scratch =
        (final_path.parent_path() / ("." + final_path.filename().string() + ".unpacking-" +
                                     std::to_string(std::random_device{}())))
            .string();
    // Named like unpack_layer's temporaries: the store sweeps what a crash leaves.
    check_sys("mkdir", scratch, [&] { return ::mkdir(scratch.c_str(), 0700); });
    struct Cleanup {
        std::string path;
        ~Cleanup() {
            std::error_code ec;
            fs::remove_all(path, ec);
        }
    } cleanup{scratch};
    UniqueFd scratch_fd(check_sys("open", scratch, [&] {
        return ::open(scratch.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    }));
    // Owned by the worker's root; nobody else below root may enter it.
    check_sys("fchown", scratch, [&] {
        return ::fchown(scratch_fd.get(), mapping.uids.host_start, mapping.gids.host_start);
    });

    int pair[2];
    check_sys("socketpair", "unpack worker",
              [&] { return ::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair); });
    UniqueFd ours(pair[0]), theirs(pair[1]);
    UniqueFd binary_fd(
        check_sys("open", binary, [&] { return ::open(binary.c_str(), O_PATH | O_CLOEXEC); }));
    // Without a cancel fd, one that never becomes readable.
    UniqueFd never;
    if (cancel_fd < 0) {
        never.reset(check_sys("open", "/dev/null",
                              [] { return ::open("/dev/null", O_WRONLY | O_CLOEXEC); }));
        cancel_fd = never.get();
    }
    // Its root is made over /tmp (in its mount namespace only; it reaches the scratch
    // directory by fd, through directories it could not search by path).
    static const WorkerRoot root = make_worker_root(worker_root_staging(), /*proc=*/false);
    const pid_t parent = ::getpid();
    ChildProcess worker = ChildProcess::fork(
        "unpack worker", {binary_fd.get(), theirs.get(), in_fd, scratch_fd.get(), cancel_fd},
        [&]() -> int {
            exec_worker(binary_fd.get(), theirs.get(), ours.get(), in_fd, scratch_fd.get(),
                        cancel_fd, root, parent);
        });
    const pid_t pid = worker.pid();
    theirs.reset();
    auto died = [&](const std::string& when) {
        ours.reset();
        const int st = worker.wait();
        return std::runtime_error("the unpack worker for " + dest + " " + when + " (" +
                                  (WIFSIGNALED(st)
                                       ? "killed by signal " + std::to_string(WTERMSIG(st))
                                       : "exit status " + std::to_string(WEXITSTATUS(st))) +
                                  ")");
    };

    char c;
    if (!read_byte(ours.get(), &c) || c != 'u') throw died("did not start");
    ns::write_id_maps(pid, mapping);
    c = 'g';
    if (::write(ours.get(), &c, 1) != 1) throw died("went away");

    try {
        wire::write_frame(ours.get(), job);
    } catch (const std::exception&) {
        throw died("went away");
    }
    v1::unpack::Result result;
    wire::ReadStatus got;
    try {
        got = wire::read_frame(ours.get(), result, kMaxResult);
    } catch (const SysError&) {
        got = wire::ReadStatus::eof;  // (ECONNRESET: it died with our Job unread)
    }
    if (got != wire::ReadStatus::ok) throw died("gave no answer");
    ours.reset();
    const int st = worker.wait();
    if (result.has_failure()) {
        const auto& f = result.failure();
        switch (f.kind()) {
            case v1::unpack::DECOMPRESS:
                throw images::DecompressError(f.message());
            case v1::unpack::DIFF_ID_MISMATCH:
                throw images::ManifestError(f.message());
            case v1::unpack::TOO_LARGE:
                throw images::LayerTooLarge(f.message());
            case v1::unpack::SYSTEM:  // its message names the call, the subject and errno
                if (f.errno_value() > 0) throw SysError::relayed(f.message(), f.errno_value());
                throw std::runtime_error(f.message());
            case v1::unpack::REFUSED:
                throw std::invalid_argument(f.message());
            default:
                throw std::runtime_error(f.message());
        }
    }
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) throw died("failed after answering");
    if (!result.has_unpacked())
        throw std::runtime_error("the unpack worker for " + dest + " answered nothing");
    // The worker is gone and could leave no process behind (its filter allows threads
    // only): what it left cannot change under us. It must be a directory, not a link
    // somewhere else that the overlay would follow.
    struct stat sb;
    check_sys("fstatat", scratch + "/layer",
              [&] { return ::fstatat(scratch_fd.get(), "layer", &sb, AT_SYMLINK_NOFOLLOW); });
    if (!S_ISDIR(sb.st_mode))
        throw std::runtime_error("the unpack worker for " + dest + " left no directory");
    int rc = ::renameat2(scratch_fd.get(), "layer", AT_FDCWD, dest.c_str(), RENAME_NOREPLACE);
    if (rc != 0 && errno == EINVAL)
        rc = ::renameat(scratch_fd.get(), "layer", AT_FDCWD, dest.c_str());
    if (rc != 0) throw_sys("rename", dest);
    return result.unpacked();
}

images::UnpackResult unpack_in_worker(const std::string& binary, const ns::IdMapping& mapping,
                                      int blob_fd, images::Compression compression,
                                      const std::string& dest,
                                      const images::UnpackOptions& options) {
    v1::unpack::Job job;
    job.set_compression(to_wire(compression));
    if (options.diff_id) job.set_diff_id(options.diff_id->str());
    job.set_label(dest);
    job.set_max_bytes(options.max_bytes);
    job.set_max_entries(options.max_entries);
    job.set_limit_hint(options.limit_hint);
    const v1::unpack::Unpacked u = run_worker(binary, mapping, blob_fd, -1, dest, job);
    images::UnpackResult out;
    out.diff_id = images::Digest::parse(u.diff_id());
    if (options.diff_id && out.diff_id != *options.diff_id)
        throw images::ManifestError(dest + ": the unpack worker reports diff_id " + u.diff_id() +
                                    ", the config says " + options.diff_id->str());
    out.entries = u.entries();
    out.bytes = u.bytes();
    out.warnings.assign(u.warnings().begin(), u.warnings().end());
    return out;
}

}  // namespace

const std::vector<std::string>& unpack_worker_capabilities() {
    static const std::vector<std::string> caps = {
        "CHOWN",         // owners from the tar (within the namespace's range)
        "DAC_OVERRIDE",  // writing into directories whose final mode forbids it
        "FOWNER",        // modes and times of files it chowned away
        "FSETID",        // setuid/setgid bits kept across its own chown
        "SETFCAP",       // security.capability (stored in the namespaced v3 form)
    };
    return caps;
}

images::Unpacker isolated_unpacker(std::string binary, ns::IdMapping mapping) {
    return [binary = std::move(binary), mapping](int blob_fd, images::Compression compression,
                                                 const std::string& dest,
                                                 const images::UnpackOptions& options) {
        return unpack_in_worker(binary, mapping, blob_fd, compression, dest, options);
    };
}

images::ArchiveExtractor isolated_archive_extractor(std::string binary, ns::IdMapping mapping) {
    return [binary = std::move(binary), mapping](int in, const CancelToken* cancel,
                                                 const std::string& dest) {
        v1::unpack::Job job;
        job.set_compression(v1::unpack::NONE);
        job.set_label(dest);
        job.set_archive(true);
        // The token's fd goes to the worker, which watches it (its fd 6).
        run_worker(binary, mapping, in, cancel ? cancel->fd() : -1, dest, job);
    };
}

int unpack_worker_main() {
    v1::unpack::Result result;
    auto fail = [&](v1::unpack::FailureKind kind, const std::string& message, int err = 0) {
        auto* f = result.mutable_failure();
        f->set_kind(kind);
        f->set_message(message);
        f->set_errno_value(err);
    };
    try {
        ns::confine_process(unpack_worker_capabilities(),
                            ns::SeccompProgram::worker_profile(/*network=*/false));
        // Named once confined (a test that finds it by name sees the confined process).
        ::prctl(PR_SET_NAME, "berth-unpack");
        v1::unpack::Job job;
        if (wire::read_frame(kChannelFd, job, kMaxResult) != wire::ReadStatus::ok) return 2;
        images::Compression compression;
        switch (job.compression()) {
            case v1::unpack::NONE:
                compression = images::Compression::none;
                break;
            case v1::unpack::GZIP:
                compression = images::Compression::gzip;
                break;
            case v1::unpack::ZSTD:
                compression = images::Compression::zstd;
                break;
            default:
                return 2;
        }
        images::UnpackOptions o;
        o.rootless = true;  // user.overlay.opaque; no devices (a namespace cannot make them)
        if (!job.diff_id().empty()) o.diff_id = images::Digest::parse(job.diff_id());
        o.max_bytes = job.max_bytes();
        o.max_entries = job.max_entries();
        o.limit_hint = job.limit_hint();
        check_sys("fchdir", "scratch", [] { return ::fchdir(kScratchFd); });
        if (job.archive()) {
            // Owners its own (the namespace's root), nothing outside ./layer, no device.
            const CancelToken cancel = CancelToken::watching(kCancelFd);
            transfer::ExtractOptions x;
            x.cancel = &cancel;
            const transfer::Summary s =
                transfer::extract_archive(kBlobFd, transfer::Root::open("."), "layer", x);
            auto* u = result.mutable_unpacked();
            u->set_entries(s.entries);
            u->set_bytes(s.bytes);
            for (const auto& w : s.warnings) u->add_warnings(w);
        } else {
            const images::UnpackResult r = images::unpack_layer(kBlobFd, compression, "./layer", o);
            auto* u = result.mutable_unpacked();
            u->set_diff_id(r.diff_id.str());
            u->set_entries(r.entries);
            u->set_bytes(r.bytes);
            for (const auto& w : r.warnings) u->add_warnings(w);
        }
    } catch (const images::DecompressError& e) {
        fail(v1::unpack::DECOMPRESS, e.what());
    } catch (const images::ManifestError& e) {
        fail(v1::unpack::DIFF_ID_MISMATCH, e.what());
    } catch (const images::LayerTooLarge& e) {
        fail(v1::unpack::TOO_LARGE, e.what());
    } catch (const SysError& e) {
        fail(v1::unpack::SYSTEM, e.what(), e.code());
    } catch (const std::exception& e) {
        fail(v1::unpack::REFUSED, e.what());
    }
    try {
        wire::write_frame(kChannelFd, result);
    } catch (...) {
        return 3;
    }
    return result.has_unpacked() ? 0 : 1;
}

}  // namespace berth::images_service
