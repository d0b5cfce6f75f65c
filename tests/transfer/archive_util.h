// Helpers for the archive tests: tree manifests, hand-made streams, pipes with a writer.
#pragma once

#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>

#include <functional>
#include <map>
#include <string>
#include <thread>

#include "tests/transfer/test_util.h"
#include "transfer/archive.h"
#include "transfer/tar_format.h"

namespace berth::transfer::testing {

struct ManifestOptions {
    enum class Mtime { ns, us, sec, none } mtime = Mtime::ns;
    bool dir_mtime = true;
    bool symlink_mtime = true;
    bool owner = true;
    bool top = true;  // include the top directory itself
    std::vector<std::string> exclude;

    ManifestOptions& no_dir_mtime() {
        dir_mtime = false;
        return *this;
    }
    ManifestOptions& no_owner() {
        owner = false;
        return *this;
    }
    ManifestOptions& mtime_sec() {
        mtime = Mtime::sec;
        return *this;
    }
    ManifestOptions& excluding(std::vector<std::string> names) {
        exclude = std::move(names);
        return *this;
    }
};

inline uint64_t fnv(const std::string& path) {
    UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd) throw_sys("open", path);
    uint64_t h = 1469598103934665603ULL;
    static thread_local std::string buf(1 << 20, '\0');
    ssize_t n;
    while ((n = ::read(fd.get(), buf.data(), buf.size())) > 0)
        for (ssize_t i = 0; i < n; ++i)
            h = (h ^ static_cast<unsigned char>(buf[i])) * 1099511628211ULL;
    return h;
}

// One line per entry: type, mode, owner, size, content hash, link target, mtime, hardlink
// group (the smallest name of the inode's names).
inline std::map<std::string, std::string> manifest(const std::string& dir,
                                                   const ManifestOptions& o = {}) {
    std::map<std::string, std::string> out;
    std::map<std::pair<dev_t, ino_t>, std::vector<std::string>> inodes;
    std::function<void(const std::string&)> walk = [&](const std::string& rel) {
        for (auto& ex : o.exclude)
            if (rel == ex) return;
        std::string path = rel == "." ? dir : dir + "/" + rel;
        struct stat st;
        if (::lstat(path.c_str(), &st) != 0) throw_sys("lstat", path);
        std::string d;
        char type = S_ISDIR(st.st_mode)   ? 'd'
                    : S_ISREG(st.st_mode) ? 'f'
                    : S_ISLNK(st.st_mode) ? 'l'
                                          : 'o';
        d += std::string("type=") + type;
        char mode[16];
        snprintf(mode, sizeof mode, " mode=%04o", st.st_mode & 07777);
        if (type != 'l') d += mode;
        if (o.owner) d += " owner=" + std::to_string(st.st_uid) + ":" + std::to_string(st.st_gid);
        if (type == 'f')
            d += " size=" + std::to_string(st.st_size) + " hash=" + std::to_string(fnv(path));
        if (type == 'l') {
            char buf[8192];
            ssize_t n = ::readlink(path.c_str(), buf, sizeof buf);
            d += " -> " + std::string(buf, static_cast<size_t>(n));
        }
        bool mt = o.mtime != ManifestOptions::Mtime::none && (type != 'd' || o.dir_mtime) &&
                  (type != 'l' || o.symlink_mtime);
        if (mt) {
            int64_t ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
            if (o.mtime == ManifestOptions::Mtime::us) ns -= ns % 1000;
            if (o.mtime == ManifestOptions::Mtime::sec) ns = st.st_mtim.tv_sec;
            d += " mtime=" + std::to_string(ns);
        }
        if (type == 'f' && st.st_nlink > 1) inodes[{st.st_dev, st.st_ino}].push_back(rel);
        if (rel != "." || o.top) out[rel] = d;
        if (type == 'd') {
            DIR* dd = ::opendir(path.c_str());
            if (!dd) throw_sys("opendir", path);
            std::vector<std::string> names;
            while (dirent* e = ::readdir(dd)) {
                std::string n = e->d_name;
                if (n != "." && n != "..") names.push_back(n);
            }
            ::closedir(dd);
            for (auto& n : names) walk(rel == "." ? n : rel + "/" + n);
        }
    };
    walk(".");
    for (auto& [ino, names] : inodes) {
        if (names.size() < 2) continue;  // other names outside the tree
        std::string first = *std::min_element(names.begin(), names.end());
        for (auto& n : names) out[n] += " hardlink-group=" + first;
    }
    return out;
}

inline std::string diff(const std::map<std::string, std::string>& a,
                        const std::map<std::string, std::string>& b) {
    std::string s;
    for (auto& [k, v] : a) {
        auto it = b.find(k);
        if (it == b.end())
            s += "only in first: " + k + " " + v + "\n";
        else if (it->second != v)
            s += "differs: " + k + "\n  " + v + "\n  " + it->second + "\n";
    }
    for (auto& [k, v] : b)
        if (!a.count(k)) s += "only in second: " + k + " " + v + "\n";
    return s;
}

// Writes `produce(write_fd)` into a pipe from a thread while `consume(read_fd)` reads it.
template <typename P, typename C>
auto through_pipe(P&& produce, C&& consume) {
    int p[2];
    if (::pipe2(p, O_CLOEXEC) != 0) throw_sys("pipe2", "");
    enlarge_pipe(p[1]);
    UniqueFd r(p[0]), w(p[1]);
    std::exception_ptr writer_error;
    std::thread t([&] {
        try {
            produce(w.get());
        } catch (...) {
            writer_error = std::current_exception();
        }
        w.reset();
    });
    try {
        auto result = consume(r.get());
        r.reset();
        t.join();
        if (writer_error) std::rethrow_exception(writer_error);
        return result;
    } catch (...) {
        r.reset();  // a writer still writing gets EPIPE
        if (t.joinable()) t.join();
        throw;
    }
}

inline void write_all(int fd, const std::string& s) {
    size_t off = 0;
    while (off < s.size()) {
        ssize_t n = ::write(fd, s.data() + off, s.size() - off);
        if (n < 0) throw_sys("write", "pipe");
        off += static_cast<size_t>(n);
    }
}

// A tar stream made by hand, for hostile and corner cases.
class StreamBuilder {
  public:
    StreamBuilder& header(const std::string& name, char type, uint64_t size,
                          const std::string& linkname = {}, uint32_t mode = 0644) {
        char b[tar::kBlock];
        tar::HeaderFields f;
        f.name = name;
        f.type = type;
        f.size = size;
        f.linkname = linkname;
        f.mode = mode;
        f.mtime = 1600000000;
        tar::encode_header(b, f);
        s.append(b, sizeof b);
        return *this;
    }
    StreamBuilder& data(const std::string& d) {
        s += d;
        s.append(tar::padding(d.size()), '\0');
        return *this;
    }
    StreamBuilder& pax(const std::vector<std::pair<std::string, std::string>>& recs) {
        std::string r;
        for (auto& [k, v] : recs) tar::append_pax_record(r, k, v);
        return header("././@PaxHeader", 'x', r.size()).data(r);
    }
    StreamBuilder& file(const std::string& name, const std::string& content, uint32_t mode = 0644) {
        return header(name, '0', content.size(), {}, mode).data(content);
    }
    StreamBuilder& dir(const std::string& name, uint32_t mode = 0755) {
        return header(name, '5', 0, {}, mode);
    }
    StreamBuilder& symlink(const std::string& name, const std::string& target) {
        return header(name, '2', 0, target, 0777);
    }
    StreamBuilder& hardlink(const std::string& name, const std::string& target) {
        return header(name, '1', 0, target);
    }
    StreamBuilder& end() {
        s.append(2 * tar::kBlock, '\0');
        return *this;
    }
    std::string s;
};

inline Summary extract_string(const std::string& stream, const Root& root, std::string_view dest,
                              const ExtractOptions& options = {}) {
    return through_pipe([&](int w) { write_all(w, stream); },
                        [&](int r) { return extract_archive(r, root, dest, options); });
}

inline Summary roundtrip(const Root& src, std::string_view path, const WriteOptions& wo,
                         const Root& dst, std::string_view dest, const ExtractOptions& eo,
                         Summary* written = nullptr) {
    Summary w;
    Summary r = through_pipe([&](int fd) { w = write_archive(src, path, fd, wo); },
                             [&](int fd) { return extract_archive(fd, dst, dest, eo); });
    if (written) *written = w;
    return r;
}

inline int run(const std::string& cmd) {
    int rc = std::system(cmd.c_str());
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

inline std::string output_of(const std::string& cmd) {
    std::string out;
    FILE* f = ::popen(cmd.c_str(), "r");
    if (!f) return out;
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
    ::pclose(f);
    return out;
}

}  // namespace berth::transfer::testing
