#include "runtime/cli/copy.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <stdexcept>

#include "base/error.h"
#include "base/unique_fd.h"
#include "transfer/archive.h"
#include "transfer/root.h"

namespace berth::cli {

using client::Client;
using client::ClientError;

namespace {

// Files from this size on move outside the tar stream, copied in the kernel.
constexpr uint64_t kSideFileMin = 4u << 20;

// The last component of a path, ignoring trailing slashes ("" for "/").
std::string base_name(const std::string& path) {
    size_t end = path.find_last_not_of('/');
    if (end == std::string::npos) return "";
    size_t start = path.find_last_of('/', end);
    return path.substr(start == std::string::npos ? 0 : start + 1,
                       end - (start == std::string::npos ? 0 : start + 1) + 1);
}

// Everything before the last component ("." for a bare name, "/" for "/x").
std::string dir_name(const std::string& path) {
    size_t end = path.find_last_not_of('/');
    if (end == std::string::npos) return "/";
    size_t slash = path.find_last_of('/', end);
    if (slash == std::string::npos) return ".";
    size_t keep = path.find_last_not_of('/', slash);
    return keep == std::string::npos ? "/" : path.substr(0, keep + 1);
}

bool ends_with_dot(const std::string& path) {
    return path == "." || (path.size() >= 2 && path.compare(path.size() - 2, 2, "/.") == 0);
}

bool ends_with_slash(const std::string& path) {
    return !path.empty() && path.back() == '/';
}

std::string absolute(const std::string& host_path) {
    if (!host_path.empty() && host_path[0] == '/') return host_path;
    char cwd[PATH_MAX];
    if (!::getcwd(cwd, sizeof cwd)) throw_sys("getcwd");
    return std::string(cwd) + "/" + host_path;
}

v1::PathStat remote_stat(Client& c, const std::string& sandbox, const std::string& path,
                         bool follow) {
    v1::ClientMessage m;
    auto* s = m.mutable_stat_path();
    s->set_sandbox(sandbox);
    s->set_path(path);
    s->set_follow(follow);
    return c.call(m).stat_path().stat();
}

void print_warnings(const v1::CopyReply& reply) {
    for (const auto& w : reply.warnings()) std::cerr << "berth: warning: " << w << std::endl;
}

void print_warnings(const transfer::Summary& summary) {
    for (const auto& w : summary.warnings) std::cerr << "berth: warning: " << w << std::endl;
}

// Moves everything from `in` to `out` (stdin to a pipe, a pipe to stdout).
void pump(int in, int out) {
    char buf[1 << 16];
    for (;;) {
        ssize_t n = ::read(in, buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) throw_sys("read", "stream");
        if (n == 0) return;
        for (ssize_t off = 0; off < n;) {
            ssize_t w = ::write(out, buf + off, static_cast<size_t>(n - off));
            if (w < 0 && errno == EINTR) continue;
            if (w < 0) throw_sys("write", "stream");
            off += w;
        }
    }
}

bool is_pipe(int fd) {
    struct stat st;
    return ::fstat(fd, &st) == 0 && S_ISFIFO(st.st_mode);
}

int upload(Client& c, const CopyArgs& args, const std::string& sandbox, const std::string& dst) {
    v1::CopyIn req;
    req.set_sandbox(sandbox);
    req.set_user(args.user);
    req.set_preserve_owners(args.archive);

    if (args.source == "-") {  // a tar stream on stdin, extracted into the directory dst
        req.set_path(dst);
        v1::CopyReply reply = is_pipe(STDIN_FILENO)
                                  ? c.copy_in_from_pipe(req, STDIN_FILENO)
                                  : c.copy_in(req, [](int fd) { pump(STDIN_FILENO, fd); });
        print_warnings(reply);
        return 0;
    }

    const std::string src = absolute(args.source);
    struct stat st;
    if (::lstat(src.c_str(), &st) != 0) throw_sys("lstat", args.source);
    const bool src_dir = S_ISDIR(st.st_mode);
    const v1::PathStat target = remote_stat(c, sandbox, dst, true);
    const bool dst_exists = target.type() != v1::PathStat::MISSING;
    const bool dst_dir = target.type() == v1::PathStat::DIRECTORY;

    transfer::WriteOptions options;
    if (src_dir) {
        if (dst_exists && !dst_dir)
            throw std::runtime_error("cannot copy a directory onto a non-directory: " + sandbox +
                                     ":" + dst);
        if (ends_with_dot(args.source) || !dst_exists || base_name(src).empty()) {
            options.contents_only = true;  // dst becomes (or receives) the contents
            req.set_path(dst);
        } else {
            options.name = base_name(src);  // dst/basename(src)
            req.set_path(dst);
        }
    } else if (dst_dir || ends_with_slash(dst)) {
        options.name = base_name(src);
        req.set_path(dst);
    } else {
        options.name = base_name(dst);
        req.set_path(dir_name(dst));
    }
    // A large file skips the stream: the sandbox reads it from the fd we pass and copies it
    // in the kernel. Not for a file others may write: that fd would let the sandbox reopen
    // it for writing through /proc/self/fd.
    std::vector<int> side_files;
    UniqueFd side;
    if (S_ISREG(st.st_mode) && static_cast<uint64_t>(st.st_size) >= kSideFileMin &&
        !(st.st_mode & S_IWOTH)) {
        side.reset(::open(src.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY));
        struct stat fst;
        if (side && ::fstat(side.get(), &fst) == 0 && S_ISREG(fst.st_mode) &&
            !(fst.st_mode & S_IWOTH)) {
            side_files.push_back(side.get());
            options.side_data_passed = true;
        }
    }
    const transfer::Root host = transfer::Root::open("/");
    transfer::Summary sent;
    v1::CopyReply reply = c.copy_in(
        req, [&](int fd) { sent = transfer::write_archive(host, src, fd, options); }, side_files);
    print_warnings(sent);
    print_warnings(reply);
    return 0;
}

int download(Client& c, const CopyArgs& args, const std::string& sandbox, const std::string& src) {
    const v1::PathStat source = remote_stat(c, sandbox, src, false);
    if (source.type() == v1::PathStat::MISSING) {
        throw ClientError(v1::NOT_FOUND,
                          "no such file or directory in sandbox " + sandbox + ": " + src);
    }
    v1::CopyOut req;
    req.set_sandbox(sandbox);
    req.set_path(src);

    if (args.destination == "-") {  // a tar of the entry on stdout
        v1::CopyReply reply = is_pipe(STDOUT_FILENO)
                                  ? c.copy_out_to_pipe(req, STDOUT_FILENO)
                                  : c.copy_out(req, [](int fd) { pump(fd, STDOUT_FILENO); });
        print_warnings(reply);
        return 0;
    }

    const std::string dst = absolute(args.destination);
    struct stat st;
    const bool dst_exists = ::stat(dst.c_str(), &st) == 0;
    if (!dst_exists && errno != ENOENT) throw_sys("stat", args.destination);
    const bool dst_dir = dst_exists && S_ISDIR(st.st_mode);
    std::string into;
    if (source.type() == v1::PathStat::DIRECTORY) {
        if (dst_exists && !dst_dir)
            throw std::runtime_error("cannot copy a directory onto a non-directory: " +
                                     args.destination);
        if (ends_with_dot(src) || !dst_exists) {
            req.set_contents_only(true);
        } else {
            req.set_name(base_name(src));
        }
        into = dst;
    } else if (dst_dir || ends_with_slash(args.destination)) {
        req.set_name(base_name(src));
        into = dst;
    } else {
        req.set_name(base_name(dst));
        into = dir_name(dst);
    }
    transfer::ExtractOptions options;
    // Files belong to the caller; with -a, root keeps the sandbox's numbers.
    if (args.archive && ::geteuid() == 0)
        options.owners = transfer::ExtractOptions::Owners::from_archive;
    // A large file skips the stream: the sandbox copies it in the kernel into an anonymous
    // file we make where it will land, which becomes the file once its header arrives.
    std::vector<int> side_files;
    UniqueFd prefilled;
    if (source.type() == v1::PathStat::REGULAR && source.size() >= kSideFileMin) {
        prefilled.reset(::open(into.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600));
        if (prefilled) {  // else (no such dir yet, no O_TMPFILE there): through the stream
            side_files.push_back(prefilled.get());
            options.prefilled = prefilled.get();
            req.set_side_file(true);
        }
    }
    const transfer::Root host = transfer::Root::open("/");
    transfer::Summary received;
    v1::CopyReply reply;
    try {
        reply = c.copy_out(
            req, [&](int fd) { received = transfer::extract_archive(fd, host, into, options); },
            side_files);
    } catch (ClientError& e) {
        // With a side file the sandbox wrote into our file: running out of space there is
        // the host destination's problem, and the message must name it.
        if (prefilled && e.code == v1::RESOURCE_EXHAUSTED) e.wrap("writing " + args.destination);
        throw;
    }
    print_warnings(reply);
    print_warnings(received);
    return 0;
}

const char* type_name(v1::PathStat::Type t) {
    switch (t) {
        case v1::PathStat::REGULAR:
            return "file";
        case v1::PathStat::DIRECTORY:
            return "directory";
        case v1::PathStat::SYMLINK:
            return "symlink";
        case v1::PathStat::OTHER:
            return "other";
        default:
            return "missing";
    }
}

std::string json_escape(const std::string& text) {
    std::string out;
    for (char ch : text) {
        if (ch == '"' || ch == '\\') {
            out += '\\';
            out += ch;
        } else if (static_cast<unsigned char>(ch) < 0x20) {
            char esc[8];
            std::snprintf(esc, sizeof esc, "\\u%04x", static_cast<unsigned>(ch));
            out += esc;
        } else {
            out += ch;
        }
    }
    return out;
}

void require_remote(const std::string& target, std::string* sandbox, std::string* path) {
    if (!split_remote(target, sandbox, path))
        throw std::invalid_argument("expected SANDBOX:PATH, got '" + target + "'");
}

}  // namespace

bool split_remote(const std::string& arg, std::string* sandbox, std::string* path) {
    const size_t colon = arg.find(':');
    if (colon == std::string::npos || colon == 0) return false;
    if (arg.find('/') < colon) return false;
    *sandbox = arg.substr(0, colon);
    *path = arg.substr(colon + 1);
    if (path->empty()) path->assign(1, '.');  // docker: ID: is the workdir
    return true;
}

int run_copy(Client& c, const CopyArgs& args) {
    std::string src_box, src_path, dst_box, dst_path;
    const bool src_remote = split_remote(args.source, &src_box, &src_path);
    const bool dst_remote = split_remote(args.destination, &dst_box, &dst_path);
    if (src_remote == dst_remote) {
        throw std::invalid_argument(
            "exactly one of SRC and DST must be SANDBOX:PATH (copies between sandboxes, or on "
            "the host, are not berth's to do)");
    }
    return dst_remote ? upload(c, args, dst_box, dst_path) : download(c, args, src_box, src_path);
}

int run_fs_stat(Client& c, const std::string& target, bool follow, bool json) {
    std::string sandbox, path;
    require_remote(target, &sandbox, &path);
    const v1::PathStat st = remote_stat(c, sandbox, path, follow);
    if (st.type() == v1::PathStat::MISSING) {
        std::cerr << "berth: no such file or directory in sandbox " << sandbox << ": " << path
                  << std::endl;
        return 1;
    }
    if (json) {
        std::cout << "{\"type\": \"" << type_name(st.type()) << "\", \"mode\": " << st.mode()
                  << ", \"size\": " << st.size() << ", \"uid\": " << st.uid()
                  << ", \"gid\": " << st.gid() << ", \"mtime_ns\": " << st.mtime_ns()
                  << ", \"link_target\": \"" << json_escape(st.link_target()) << "\"}" << std::endl;
    } else {
        std::printf("%s %04o %llu %u:%u %lld%s%s\n", type_name(st.type()), st.mode(),
                    static_cast<unsigned long long>(st.size()), st.uid(), st.gid(),
                    static_cast<long long>(st.mtime_ns()),
                    st.type() == v1::PathStat::SYMLINK ? " -> " : "", st.link_target().c_str());
    }
    return 0;
}

int run_fs_mkdir(Client& c, const std::string& target, const std::string& user,
                 const std::string& mode) {
    std::string sandbox, path;
    require_remote(target, &sandbox, &path);
    v1::ClientMessage m;
    auto* d = m.mutable_make_dirs();
    d->set_sandbox(sandbox);
    d->set_path(path);
    d->set_user(user);
    if (!mode.empty()) {
        size_t used = 0;
        unsigned long bits = std::stoul(mode, &used, 8);
        if (used != mode.size() || bits > 07777)
            throw std::invalid_argument("mode must be octal, at most 7777: " + mode);
        d->set_mode(static_cast<uint32_t>(bits));
    }
    c.call(m);
    return 0;
}

int run_fs_rm(Client& c, const std::string& target, bool recursive) {
    std::string sandbox, path;
    require_remote(target, &sandbox, &path);
    v1::ClientMessage m;
    m.mutable_remove_path()->set_sandbox(sandbox);
    m.mutable_remove_path()->set_path(path);
    m.mutable_remove_path()->set_recursive(recursive);
    c.call(m);
    return 0;
}

}  // namespace berth::cli
