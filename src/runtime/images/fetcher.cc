#include "runtime/images/fetcher.h"

#include <fcntl.h>
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

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <thread>

#include "base/error.h"
#include "base/files.h"
#include "base/unique_fd.h"
#include "fetch.pb.h"
#include "ns/security.h"
#include "rootfs-tools/document_parser.h"
#include "rootfs-tools/puller.h"
#include "runtime/images/worker_root.h"
#include "runtime/wire/frame.h"

namespace berth::images_service {

namespace fetch = v1::fetch;

namespace {

constexpr int kChannelFd = 3;
// Configs may have 16 MiB (RegistryClient::small_blob), manifests 4 MiB; chunks are less.
constexpr uint32_t kMaxFrame = 40u << 20;
constexpr size_t kChunkBytes = 256u << 10;

// ---- The documents on the wire (both sides) ----

fetch::Platform to_wire(const images::Platform& p) {
    fetch::Platform w;
    w.set_os(p.os);
    w.set_architecture(p.architecture);
    w.set_variant(p.variant);
    return w;
}

images::Platform from_wire(const fetch::Platform& w) {
    return {w.os(), w.architecture(), w.variant()};
}

fetch::Descriptor to_wire(const images::Descriptor& d) {
    fetch::Descriptor w;
    w.set_media_type(d.media_type);
    w.set_digest(d.digest.str());
    w.set_size(d.size);
    if (d.platform) *w.mutable_platform() = to_wire(*d.platform);
    return w;
}

// What the fetcher says is checked for form: a malformed answer is the fetcher's failure.
images::Digest digest_from_wire(const std::string& s) {
    try {
        return images::Digest::parse(s);
    } catch (const std::exception& e) {
        throw images::ManifestError("the registry fetcher sent a malformed digest: " +
                                    std::string(e.what()));
    }
}

images::Descriptor from_wire(const fetch::Descriptor& w) {
    images::Descriptor d{w.media_type(), digest_from_wire(w.digest()), w.size(), std::nullopt};
    if (w.has_platform()) d.platform = from_wire(w.platform());
    return d;
}

fetch::Document to_wire(const images::Document& doc) {
    fetch::Document w;
    if (const auto* m = std::get_if<images::Manifest>(&doc)) {
        auto* out = w.mutable_manifest();
        out->set_media_type(m->media_type);
        *out->mutable_config() = to_wire(m->config);
        for (const auto& l : m->layers) {
            auto* layer = out->add_layers();
            *layer->mutable_blob() = to_wire(l.blob);
            switch (l.compression) {
                case images::Compression::none:
                    layer->set_compression(fetch::NONE);
                    break;
                case images::Compression::gzip:
                    layer->set_compression(fetch::GZIP);
                    break;
                case images::Compression::zstd:
                    layer->set_compression(fetch::ZSTD);
                    break;
            }
        }
    } else {
        const auto& i = std::get<images::Index>(doc);
        auto* out = w.mutable_index();
        out->set_media_type(i.media_type);
        for (const auto& d : i.manifests) *out->add_manifests() = to_wire(d);
    }
    return w;
}

images::Document from_wire(const fetch::Document& w) {
    if (w.has_manifest()) {
        images::Manifest m{w.manifest().media_type(), from_wire(w.manifest().config()), {}};
        for (const auto& l : w.manifest().layers()) {
            images::Layer layer{from_wire(l.blob()), images::Compression::none};
            switch (l.compression()) {
                case fetch::NONE:
                    layer.compression = images::Compression::none;
                    break;
                case fetch::GZIP:
                    layer.compression = images::Compression::gzip;
                    break;
                case fetch::ZSTD:
                    layer.compression = images::Compression::zstd;
                    break;
                default:
                    throw images::ManifestError(
                        "the registry fetcher sent a layer of no known "
                        "compression");
            }
            m.layers.push_back(std::move(layer));
        }
        return m;
    }
    if (w.has_index()) {
        images::Index i;
        i.media_type = w.index().media_type();
        for (const auto& d : w.index().manifests()) i.manifests.push_back(from_wire(d));
        return i;
    }
    throw images::ManifestError("the registry fetcher sent an empty document");
}

fetch::ImageConfig to_wire(const images::ImageConfig& c) {
    fetch::ImageConfig w;
    *w.mutable_platform() = to_wire(c.platform);
    for (const auto& s : c.env) w.add_env(s);
    for (const auto& s : c.entrypoint) w.add_entrypoint(s);
    for (const auto& s : c.cmd) w.add_cmd(s);
    w.set_working_dir(c.working_dir);
    w.set_user(c.user);
    for (const auto& d : c.diff_ids) w.add_diff_ids(d.str());
    w.set_created(c.created);
    return w;
}

images::ImageConfig from_wire(const fetch::ImageConfig& w) {
    images::ImageConfig c;
    c.platform = from_wire(w.platform());
    c.env.assign(w.env().begin(), w.env().end());
    c.entrypoint.assign(w.entrypoint().begin(), w.entrypoint().end());
    c.cmd.assign(w.cmd().begin(), w.cmd().end());
    c.working_dir = w.working_dir();
    c.user = w.user();
    for (const auto& d : w.diff_ids()) c.diff_ids.push_back(digest_from_wire(d));
    c.created = w.created();
    return c;
}

// ---- The root side: starting a fetcher ----

// The forked child, up to execve. berth-images has threads: what runs here keeps to what
// glibc makes safe after fork (no locks another thread could hold).
[[noreturn]] void exec_fetcher(int binary, int channel, int parent_end, uid_t uid, gid_t gid,
                               const std::vector<const char*>& hidden, const WorkerRoot& root,
                               char** envp, bool network, pid_t parent) {
    ::close(parent_end);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(119);
    // A pid namespace needs one more fork: the fetcher is the first process in it (pid 1),
    // this one waits for it and passes on how it ended.
    if (::unshare(CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC) != 0) ::_exit(120);
    const pid_t pid = ::fork();
    if (pid < 0) ::_exit(121);
    if (pid > 0) {
        // It needs none of berth-images' fds (it holds no copy of anything for anyone).
        ::syscall(SYS_close_range, 3, ~0U, 0);
        int st = 0;
        while (::waitpid(pid, &st, 0) < 0) {
            if (errno != EINTR) ::_exit(122);
        }
        ::_exit(WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
    }
    // Its parent is outside its pid namespace (getppid() says 0): should the parent be gone
    // before the death signal is set, the channel's EOF ends the fetcher as surely.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    // Our mounts are ours only; berth's directories are empty (also where /usr or /etc, which
    // the new root shows, would hold them); then the root of its own.
    if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) ::_exit(124);
    for (const char* dir : hidden) {
        if (::mount("tmpfs", dir, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
                    "size=4k,mode=0555") != 0 &&
            errno != ENOENT)
            ::_exit(125);
    }
    if (const int step = enter_worker_root(root); step != 0) ::_exit(140 + step);
    ns::ProcessIdentity id;
    id.uid = uid;
    id.gid = gid;
    id.capabilities = {};  // none, the bounding set emptied too
    const char* step = nullptr;
    if (ns::apply_identity(id, &step) != 0) ::_exit(127);
    // After the uid change, which clears it.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    constexpr int kBinaryFd = kChannelFd + 1;
    if (::dup2(channel, 100) < 0 || ::dup2(binary, 101) < 0 || ::dup2(100, kChannelFd) < 0 ||
        ::dup2(101, kBinaryFd) < 0 || ::fcntl(kBinaryFd, F_SETFD, FD_CLOEXEC) != 0)
        ::_exit(129);
    ::syscall(SYS_close_range, kBinaryFd + 1, ~0U, 0);
    if (::chdir("/") != 0) ::_exit(130);
    char fetch0[] = "berth-fetch", fetch1[] = "--fetch-worker";
    char parse0[] = "berth-parse", parse1[] = "--parse-worker";
    char* argv_fetch[] = {fetch0, fetch1, nullptr};
    char* argv_parse[] = {parse0, parse1, nullptr};
    char** argv = network ? argv_fetch : argv_parse;
    ::syscall(SYS_execveat, kBinaryFd, "", argv, envp, AT_EMPTY_PATH);
    ::_exit(131);
}

// What of berth-images' environment the fetcher gets: how to reach the network.
std::vector<std::string> fetcher_environment() {
    static const char* const kPassed[] = {
        "http_proxy",    "https_proxy",  "no_proxy",       "all_proxy",
        "HTTP_PROXY",    "HTTPS_PROXY",  "NO_PROXY",       "ALL_PROXY",
        "SSL_CERT_FILE", "SSL_CERT_DIR", "CURL_CA_BUNDLE",
    };
    std::vector<std::string> env;
    for (const char* name : kPassed) {
        if (const char* v = std::getenv(name)) env.push_back(std::string(name) + "=" + v);
    }
    return env;
}

// One started fetcher: its channel, and the process (the pid namespace's parent) ended
// and reaped when this goes.
class FetcherProcess {
  public:
    // `network`: a pull's fetcher; otherwise a parse worker.
    FetcherProcess(const FetcherSpec& spec, bool network) {
        int pair[2];
        check_sys("socketpair", "registry fetcher",
                  [&] { return ::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair); });
        UniqueFd ours(pair[0]), theirs(pair[1]);
        UniqueFd binary(check_sys("open", spec.binary,
                                  [&] { return ::open(spec.binary.c_str(), O_PATH | O_CLOEXEC); }));
        // Deepest first: a directory inside another is hidden before its parent is.
        std::vector<std::string> dirs = spec.hidden_dirs;
        std::sort(dirs.begin(), dirs.end(),
                  [](const auto& a, const auto& b) { return a.size() > b.size(); });
        std::vector<const char*> hidden;
        for (const auto& d : dirs) hidden.push_back(d.c_str());
        const WorkerRoot root = make_worker_root(spec.root_staging, /*proc=*/true);
        const std::vector<std::string> env = fetcher_environment();
        std::vector<char*> envp;
        for (const auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
        envp.push_back(nullptr);
        const pid_t parent = ::getpid();
        pid_ = check_sys("fork", "registry fetcher", [] { return ::fork(); });
        if (pid_ == 0) {
            exec_fetcher(binary.get(), theirs.get(), ours.get(), spec.uid, spec.gid, hidden, root,
                         envp.data(), network, parent);
        }
        channel_ = std::move(ours);
    }
    FetcherProcess(const FetcherProcess&) = delete;
    FetcherProcess& operator=(const FetcherProcess&) = delete;
    ~FetcherProcess() {
        kill();
        wait();
    }

    int channel() const { return channel_.get(); }
    // Closes our end: the fetcher sees EOF (and the reader thread wakes).
    void shut_down() { ::shutdown(channel_.get(), SHUT_RDWR); }
    // Ends it (the fetcher dies with its parent, by its death signal).
    void kill() {
        std::lock_guard lock(mu_);
        if (!reaped_) ::kill(pid_, SIGKILL);  // not reaped: the pid is still its own
    }

    // Waits until it has ended and says how ("exit status N", "killed by signal N").
    std::string wait() {
        siginfo_t info;
        // Without reaping: kill() may run meanwhile and must not hit a reused pid.
        while (::waitid(P_PID, pid_, &info, WEXITED | WNOWAIT) < 0 && errno == EINTR) {
        }
        std::lock_guard lock(mu_);
        if (!reaped_) {
            int st = 0;
            while (::waitpid(pid_, &st, 0) < 0 && errno == EINTR) {
            }
            reaped_ = true;
            status_ = WIFSIGNALED(st) ? "killed by signal " + std::to_string(WTERMSIG(st))
                                      : "exit status " + std::to_string(WEXITSTATUS(st));
        }
        return status_;
    }

  private:
    pid_t pid_ = -1;
    UniqueFd channel_;
    std::mutex mu_;
    bool reaped_ = false;
    std::string status_;
};

// The worker died (or its channel broke) before it answered.
// (Kind internal: what berth-images has always answered when the second one died too.)
class WorkerGone : public Error {
  public:
    explicit WorkerGone(const std::string& what) : Error(Kind::internal, what) {}
};

// One fetcher or parse worker and its channel: each call is a Request; a reader thread hands
// each Reply to the call of its id. Thread-safe.
class Link {
  public:
    Link(const FetcherSpec& spec, bool network, std::function<bool()> cancelled)
        : name_(network ? "the registry fetcher" : "the parse worker"),
          cancelled_(std::move(cancelled)),
          process_(spec, network) {
        reader_ = std::thread([this] { read_replies(); });
    }
    ~Link() {
        process_.kill();
        process_.shut_down();
        reader_.join();
    }
    Link(const Link&) = delete;
    Link& operator=(const Link&) = delete;

    bool dead() {
        std::lock_guard lock(mu_);
        return dead_;
    }

    // Sends `request` and waits for its last reply, giving the others to `partial` (on the
    // reader thread, while this waits). Throws what the fetcher's failure says, PullCancelled
    // once the pull is cancelled.
    fetch::Reply call(fetch::Request& request,
                      std::function<void(const fetch::Reply&)> partial = {}) {
        Call c;
        c.partial = std::move(partial);
        std::unique_lock lock(mu_);
        const uint64_t id = ++last_id_;
        request.set_id(id);
        calls_[id] = &c;
        struct Unregister {
            Link* s;
            uint64_t id;
            ~Unregister() { s->calls_.erase(id); }  // under mu_ (the lock outlives this)
        } unregister{this, id};
        if (dead_) throw died();
        try {
            std::lock_guard write_lock(write_mu_);
            wire::write_frame(process_.channel(), request);
        } catch (const std::exception&) {
            dead_ = true;
            throw died();
        }
        while (!c.done) {
            if (cancelled_ && cancelled_()) throw images::PullCancelled("pull cancelled");
            if (dead_) throw died();
            cv_.wait_for(lock, std::chrono::milliseconds(50));
        }
        if (c.error) std::rethrow_exception(c.error);
        if (c.reply.has_failure()) throw_failure(c.reply.failure());
        return std::move(c.reply);
    }

  private:
    struct Call {
        std::function<void(const fetch::Reply&)> partial;
        bool done = false;
        fetch::Reply reply;
        std::exception_ptr error;
    };

    [[noreturn]] static void throw_failure(const fetch::Failure& f) {
        switch (f.kind()) {
            case fetch::AUTH:
                throw images::RegistryAuthError(f.message(), f.http_status());
            case fetch::REGISTRY:
                throw images::RegistryError(f.message(), f.http_status());
            case fetch::MANIFEST:
                throw images::ManifestError(f.message());
            case fetch::BLOB_MISMATCH:
                throw images::BlobMismatch(f.message());
            case fetch::CONFIG:
                throw images::ConfigError(f.message());
            case fetch::CANCELLED:
                throw images::PullCancelled(f.message());
            default:
                throw std::runtime_error(f.message());
        }
    }

    WorkerGone died() {
        // (mu_ held) The status is known once the reader has seen the channel close.
        return WorkerGone(name_ + " went away (" +
                          (status_.empty() ? std::string("its channel closed") : status_) + ")");
    }

    void read_replies() {
        for (;;) {
            fetch::Reply reply;
            wire::ReadStatus st;
            try {
                st = wire::read_frame(process_.channel(), reply, kMaxFrame);
            } catch (const std::exception&) {
                st = wire::ReadStatus::eof;
            }
            if (st != wire::ReadStatus::ok) {
                // Gone, or speaking garbage: it is ended either way, and every call fails.
                process_.kill();
                const std::string how = process_.wait();
                std::lock_guard lock(mu_);
                dead_ = true;
                status_ = st == wire::ReadStatus::eof ? how : "it sent a malformed reply; " + how;
                cv_.notify_all();
                return;
            }
            std::lock_guard lock(mu_);
            auto it = calls_.find(reply.id());
            if (it == calls_.end() || it->second->done) continue;  // a call given up on
            Call& c = *it->second;
            const bool last = !reply.has_chunk() && !reply.has_retrying();
            if (!last) {
                try {
                    if (c.partial) c.partial(reply);
                } catch (...) {
                    c.error = std::current_exception();
                    c.done = true;
                    cv_.notify_all();
                }
                continue;
            }
            c.reply = std::move(reply);
            c.done = true;
            cv_.notify_all();
        }
    }

    const std::string name_;
    std::function<bool()> cancelled_;
    FetcherProcess process_;
    std::mutex write_mu_;  // frames whole
    std::mutex mu_;        // what follows
    std::condition_variable cv_;
    std::map<uint64_t, Call*> calls_;
    uint64_t last_id_ = 0;
    bool dead_ = false;
    std::string status_;
    std::thread reader_;
};

std::runtime_error unexpected(const char* request) {
    return std::runtime_error(std::string("the registry fetcher answered ") + request +
                              " with something else");
}

// A stored document parsed by a fetcher or parse worker, through `call` (a Link's, or the
// parser's with its retry): what RemoteSession and RemoteParser both ask.
template <typename Call>
images::Document parse_document_with(Call&& call, const std::string& bytes,
                                     const std::string& media_type) {
    fetch::Request r;
    r.mutable_parse_document()->set_bytes(bytes);
    r.mutable_parse_document()->set_media_type(media_type);
    const fetch::Reply reply = call(r);
    if (!reply.has_document()) throw unexpected("ParseDocument");
    return from_wire(reply.document());
}

template <typename Call>
images::ImageConfig parse_config_with(Call&& call, const std::string& bytes) {
    fetch::Request r;
    r.mutable_parse_config()->set_bytes(bytes);
    const fetch::Reply reply = call(r);
    if (!reply.has_config()) throw unexpected("ParseConfig");
    return from_wire(reply.config().config());
}

// A pull's registry session through its fetcher.
class RemoteSession : public images::RegistrySession {
  public:
    RemoteSession(const FetcherSpec& spec, const std::string& client_auth,
                  const images::PullOptions& options, std::function<bool()> cancelled)
        : spec_(spec),
          client_auth_(client_auth),
          timings_(options.timings),
          link_(spec, /*network=*/true, std::move(cancelled)) {}
    Resolved resolve(const images::Reference& ref,
                     const std::function<void(const std::string&)>& retrying) override {
        fetch::Request r;
        auto* q = r.mutable_resolve();
        q->set_reference(ref.str());
        if (auto text = read_file_if_exists(spec_.registries_conf)) {
            q->set_registries_conf(*text);
            q->set_has_registries_conf(true);
        }
        q->set_registries_conf_path(spec_.registries_conf);
        if (auto text = read_file_if_exists(spec_.auth_file)) {
            q->set_system_auth(*text);
            q->set_has_system_auth(true);
        }
        q->set_system_auth_path(spec_.auth_file);
        q->set_client_auth(client_auth_);
        auto* t = q->mutable_timings();
        t->set_connect_ms(timings_.connect.count());
        t->set_low_speed_bytes(timings_.low_speed_bytes);
        t->set_low_speed_time_s(timings_.low_speed_time.count());
        t->set_max_attempts(timings_.max_attempts);
        t->set_retry_base_ms(timings_.retry_base.count());
        const fetch::Reply reply = link_.call(r, [&](const fetch::Reply& partial) {
            if (partial.has_retrying() && retrying) retrying(partial.retrying());
        });
        if (!reply.has_resolved()) throw unexpected("Resolve");
        Resolved out;
        out.digest = digest_from_wire(reply.resolved().digest());
        out.bytes = reply.resolved().bytes();
        out.document = from_wire(reply.resolved().document());
        out.endpoint = reply.resolved().endpoint();
        return out;
    }

    Fetched manifest(const images::Descriptor& d) override {
        fetch::Request r;
        *r.mutable_manifest()->mutable_target() = to_wire(d);
        const fetch::Reply reply = link_.call(r);
        if (!reply.has_manifest()) throw unexpected("GetManifest");
        return {reply.manifest().bytes(), from_wire(reply.manifest().document())};
    }

    std::pair<std::string, images::ImageConfig> config(const images::Descriptor& d) override {
        fetch::Request r;
        *r.mutable_config()->mutable_target() = to_wire(d);
        const fetch::Reply reply = link_.call(r);
        if (!reply.has_config()) throw unexpected("GetConfig");
        return {reply.config().bytes(), from_wire(reply.config().config())};
    }

    images::Document parse_document(const std::string& bytes,
                                    const std::string& media_type) override {
        return parse_document_with([this](fetch::Request& r) { return link_.call(r); }, bytes,
                                   media_type);
    }

    images::ImageConfig parse_config(const std::string& bytes) override {
        return parse_config_with([this](fetch::Request& r) { return link_.call(r); }, bytes);
    }

    void fetch_blob(const images::Descriptor& blob, images::BlobStore& store,
                    const images::RegistryClient::BlobCallbacks& callbacks) override {
        // Hashed and written here as the chunks come; named only if it is the blob.
        std::optional<images::BlobWriter> writer(store.writer(blob.digest, blob.size));
        fetch::Request r;
        *r.mutable_blob()->mutable_target() = to_wire(blob);
        const fetch::Reply reply = link_.call(r, [&](const fetch::Reply& partial) {
            if (partial.has_chunk()) {
                if (partial.chunk().restart()) writer.emplace(store.writer(blob.digest, blob.size));
                writer->write(partial.chunk().data().data(), partial.chunk().data().size());
                if (callbacks.progress) callbacks.progress(writer->written(), blob.size);
            } else if (partial.has_retrying() && callbacks.retrying) {
                callbacks.retrying(partial.retrying());
            }
        });
        if (!reply.has_blob_done()) throw unexpected("FetchBlob");
        writer->commit();
    }

  private:
    const FetcherSpec spec_;
    std::string client_auth_;
    images::RegistryTimings timings_;
    Link link_;
};

// The store's DocumentParser: a long-lived parse worker, started when first needed and again
// after it died (a document that crashed it fails; the next one gets a new worker). Workers
// are started by a thread of the parser's own: a child's death signal follows the thread
// that forked it, and the import or inspect thread that first needs one ends soon.
class RemoteParser : public images::DocumentParser {
  public:
    // (The thread starts with the first document: berth-images makes this before it confines
    // itself, and a thread started then would keep every capability.)
    explicit RemoteParser(FetcherSpec spec) : spec_(std::move(spec)) {}
    ~RemoteParser() override {
        {
            std::lock_guard lock(mu_);
            stop_ = true;
        }
        cv_.notify_all();
        if (spawner_.joinable()) spawner_.join();
    }

    images::Document document(const std::string& bytes, const std::string& media_type) override {
        return parse_document_with([this](fetch::Request& r) { return call(r); }, bytes,
                                   media_type);
    }
    images::ImageConfig config(const std::string& bytes) override {
        return parse_config_with([this](fetch::Request& r) { return call(r); }, bytes);
    }
    void check_oci_layout(const std::string& bytes, const std::string& where) override {
        fetch::Request r;
        r.mutable_oci_layout()->set_bytes(bytes);
        r.mutable_oci_layout()->set_where(where);
        if (!call(r).oci_layout_ok()) throw unexpected("CheckOciLayout");
    }
    images::LayoutIndex layout_index(const std::string& bytes, const std::string& where) override {
        fetch::Request r;
        r.mutable_layout_index()->set_bytes(bytes);
        r.mutable_layout_index()->set_where(where);
        const fetch::Reply reply = call(r);
        if (!reply.has_layout_index()) throw unexpected("ParseLayoutIndex");
        images::LayoutIndex out;
        const images::Document doc = from_wire([&] {
            fetch::Document d;
            *d.mutable_index() = reply.layout_index().index();
            return d;
        }());
        out.index = std::get<images::Index>(doc);
        for (const auto& n : reply.layout_index().names())
            out.names.push_back({n.ref_name(), n.image_name()});
        return out;
    }
    std::vector<images::DockerArchiveEntry> docker_manifest(const std::string& bytes,
                                                            const std::string& where) override {
        fetch::Request r;
        r.mutable_docker_manifest()->set_bytes(bytes);
        r.mutable_docker_manifest()->set_where(where);
        const fetch::Reply reply = call(r);
        if (!reply.has_docker_manifest()) throw unexpected("ParseDockerManifest");
        std::vector<images::DockerArchiveEntry> out;
        for (const auto& e : reply.docker_manifest().entries()) {
            out.push_back({e.config(),
                           {e.layers().begin(), e.layers().end()},
                           {e.repo_tags().begin(), e.repo_tags().end()}});
        }
        return out;
    }

  private:
    // A worker found dead (killed, or it crashed on an earlier document, perhaps before the
    // reader noticed) costs one retry on a new one; a document that kills that one too fails.
    fetch::Reply call(fetch::Request& r) {
        for (int attempt = 0;; ++attempt) {
            std::shared_ptr<Link> link = live_link();
            try {
                return link->call(r);
            } catch (const WorkerGone&) {
                if (attempt > 0) throw;
                std::lock_guard lock(mu_);
                if (link_ == link) link_.reset();  // (another caller may have replaced it)
            }
        }
    }

    std::shared_ptr<Link> live_link() {
        std::unique_lock lock(mu_);
        if (!spawner_.joinable()) spawner_ = std::thread([this] { spawn_loop(); });
        if (!link_ || link_->dead()) {
            const uint64_t asked = ++wanted_;
            cv_.notify_all();
            cv_.wait(lock, [&] { return made_ >= asked; });
            if (spawn_error_) std::rethrow_exception(spawn_error_);
        }
        return link_;
    }

    void spawn_loop() {
        std::unique_lock lock(mu_);
        for (;;) {
            cv_.wait(lock, [&] { return stop_ || made_ < wanted_; });
            if (stop_) return;
            const uint64_t target = wanted_;
            spawn_error_ = nullptr;
            if (!link_ || link_->dead()) {
                lock.unlock();
                std::shared_ptr<Link> fresh;
                std::exception_ptr error;
                try {
                    fresh = std::make_shared<Link>(spec_, /*network=*/false, nullptr);
                } catch (...) {
                    error = std::current_exception();
                }
                lock.lock();
                if (fresh) link_ = std::move(fresh);
                spawn_error_ = error;
            }
            made_ = target;
            cv_.notify_all();
        }
    }

    const FetcherSpec spec_;
    std::mutex mu_;  // what follows
    std::condition_variable cv_;
    std::shared_ptr<Link> link_;
    uint64_t wanted_ = 0, made_ = 0;  // requests for a worker, and how many are answered
    std::exception_ptr spawn_error_;
    bool stop_ = false;
    std::thread spawner_;
};

// ---- The fetcher ----

class Fetcher {
  public:
    void serve() {
        for (;;) {
            fetch::Request request;
            const wire::ReadStatus st = wire::read_frame(kChannelFd, request, kMaxFrame);
            if (st != wire::ReadStatus::ok) break;
            // Resolve first, alone: it makes the session the others use.
            if (request.has_resolve()) {
                handle(request);
                continue;
            }
            std::thread([this, request = std::move(request)] { handle(request); }).detach();
        }
        // berth-images is done with us (or gone): whatever runs is cut short.
        ::_exit(0);
    }

  private:
    void send(const fetch::Reply& reply) {
        std::lock_guard lock(write_mu_);
        try {
            wire::write_frame(kChannelFd, reply);
        } catch (const std::exception&) {
            ::_exit(0);  // berth-images went away
        }
    }

    void handle(const fetch::Request& request) {
        fetch::Reply reply;
        reply.set_id(request.id());
        auto fail = [&](fetch::FailureKind kind, const char* what, long status = 0) {
            auto* f = reply.mutable_failure();
            f->set_kind(kind);
            f->set_message(what);
            f->set_http_status(status);
        };
        try {
            answer(request, reply);
        } catch (const images::RegistryAuthError& e) {
            fail(fetch::AUTH, e.what(), e.status());
        } catch (const images::RegistryError& e) {
            fail(fetch::REGISTRY, e.what(), e.status());
        } catch (const images::ManifestError& e) {
            fail(fetch::MANIFEST, e.what());
        } catch (const images::BlobMismatch& e) {
            fail(fetch::BLOB_MISMATCH, e.what());
        } catch (const images::ConfigError& e) {
            fail(fetch::CONFIG, e.what());
        } catch (const images::PullCancelled& e) {
            fail(fetch::CANCELLED, e.what());
        } catch (const std::exception& e) {
            fail(fetch::OTHER, e.what());
        }
        send(reply);
    }

    images::LocalRegistrySession& session() {
        std::lock_guard lock(session_mu_);
        if (!session_) throw std::runtime_error("a request before Resolve");
        return *session_;
    }

    void answer(const fetch::Request& request, fetch::Reply& reply) {
        const uint64_t id = request.id();
        auto retrying = [this, id](const std::string& why) {
            fetch::Reply r;
            r.set_id(id);
            r.set_retrying(why);
            send(r);
        };
        if (request.has_resolve()) {
            const auto& q = request.resolve();
            images::RegistriesConfig registries =
                q.has_registries_conf()
                    ? images::RegistriesConfig::parse(q.registries_conf(), q.registries_conf_path())
                    : images::RegistriesConfig{};
            images::AuthConfig auth;
            if (!q.client_auth().empty())
                auth = images::AuthConfig::parse(q.client_auth(), "the client's credentials");
            if (q.has_system_auth())
                auth.merge_over(images::AuthConfig::parse(q.system_auth(), q.system_auth_path()));
            images::RegistryTimings timings;
            timings.connect = std::chrono::milliseconds(q.timings().connect_ms());
            timings.low_speed_bytes = q.timings().low_speed_bytes();
            timings.low_speed_time = std::chrono::seconds(q.timings().low_speed_time_s());
            timings.max_attempts = q.timings().max_attempts();
            timings.retry_base = std::chrono::milliseconds(q.timings().retry_base_ms());
            auto s = std::make_unique<images::LocalRegistrySession>(
                std::move(registries), std::move(auth), timings, [] { return false; });
            const images::Reference ref = images::parse_reference(q.reference());
            images::RegistrySession::Resolved r = s->resolve(ref, retrying);
            {
                std::lock_guard lock(session_mu_);
                session_ = std::move(s);
            }
            auto* out = reply.mutable_resolved();
            out->set_digest(r.digest.str());
            out->set_bytes(std::move(r.bytes));
            *out->mutable_document() = to_wire(r.document);
            out->set_endpoint(r.endpoint);
        } else if (request.has_manifest()) {
            auto f = session().manifest(from_wire(request.manifest().target()));
            reply.mutable_manifest()->set_bytes(std::move(f.bytes));
            *reply.mutable_manifest()->mutable_document() = to_wire(f.document);
        } else if (request.has_config()) {
            auto [bytes, config] = session().config(from_wire(request.config().target()));
            reply.mutable_config()->set_bytes(std::move(bytes));
            *reply.mutable_config()->mutable_config() = to_wire(config);
        } else if (request.has_parse_document()) {
            const auto& q = request.parse_document();
            *reply.mutable_document() =
                to_wire(images::parse_manifest_or_index(q.bytes(), q.media_type()));
        } else if (request.has_parse_config()) {
            *reply.mutable_config()->mutable_config() =
                to_wire(images::parse_config(request.parse_config().bytes()));
        } else if (request.has_oci_layout()) {
            images::parse_oci_layout(request.oci_layout().bytes(), request.oci_layout().where());
            reply.set_oci_layout_ok(true);
        } else if (request.has_layout_index()) {
            const images::LayoutIndex x = images::parse_layout_index(
                request.layout_index().bytes(), request.layout_index().where());
            auto* out = reply.mutable_layout_index();
            *out->mutable_index() = to_wire(images::Document(x.index)).index();
            for (const auto& n : x.names) {
                auto* w = out->add_names();
                w->set_ref_name(n.ref_name);
                w->set_image_name(n.image_name);
            }
        } else if (request.has_docker_manifest()) {
            auto* out = reply.mutable_docker_manifest();
            for (const auto& e : images::parse_docker_manifest(request.docker_manifest().bytes(),
                                                               request.docker_manifest().where())) {
                auto* w = out->add_entries();
                w->set_config(e.config);
                for (const auto& l : e.layers) w->add_layers(l);
                for (const auto& t : e.repo_tags) w->add_repo_tags(t);
            }
        } else if (request.has_blob()) {
            ChannelSink sink(*this, id);
            images::RegistryClient::BlobCallbacks callbacks;
            callbacks.retrying = [&](const std::string& why) {
                sink.flush();
                retrying(why);
            };
            session().fetch_blob(from_wire(request.blob().target()), sink, callbacks);
            sink.flush();
            reply.set_blob_done(true);
        } else {
            throw std::runtime_error("a request of no known kind");
        }
    }

    // A blob's bytes to berth-images, in chunks of kChunkBytes.
    class ChannelSink : public images::RegistryClient::BlobSink {
      public:
        ChannelSink(Fetcher& f, uint64_t id) : fetcher_(f), id_(id) {}
        void write(std::string_view data) override {
            pending_.append(data);
            written_ += data.size();
            if (pending_.size() >= kChunkBytes) flush();
        }
        uint64_t written() const override { return written_; }
        void restart() override {
            pending_.clear();
            written_ = 0;
            restart_ = true;
        }
        void flush() {
            if (pending_.empty() && !restart_) return;
            fetch::Reply r;
            r.set_id(id_);
            r.mutable_chunk()->set_data(pending_);
            r.mutable_chunk()->set_restart(restart_);
            fetcher_.send(r);
            pending_.clear();
            restart_ = false;
        }

      private:
        Fetcher& fetcher_;
        uint64_t id_;
        std::string pending_;
        uint64_t written_ = 0;
        bool restart_ = false;
    };

    std::mutex write_mu_;
    std::mutex session_mu_;
    std::unique_ptr<images::LocalRegistrySession> session_;
};

}  // namespace

images::SessionFactory fetcher_sessions(FetcherSpec spec, std::string client_auth) {
    auto shared = std::make_shared<const FetcherSpec>(std::move(spec));
    return [shared, client_auth = std::move(client_auth)](
               const images::PullOptions& options,
               std::function<bool()> cancelled) -> std::unique_ptr<images::RegistrySession> {
        return std::make_unique<RemoteSession>(*shared, client_auth, options, std::move(cancelled));
    };
}

std::shared_ptr<images::DocumentParser> remote_parser(FetcherSpec spec) {
    return std::make_shared<RemoteParser>(std::move(spec));
}

int fetcher_main(bool network) {
    // Started by exec_fetcher: berthd's uid, no capability, no_new_privs already set (the
    // filter needs it: without it, the install fails and so do we).
    if (::prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) != 1) return 2;
    if (ns::SeccompProgram::worker_profile(network).install() != 0) return 2;
    // Named once confined (a test that finds it by name sees the confined process).
    ::prctl(PR_SET_NAME, network ? "berth-fetch" : "berth-parse");
    ::signal(SIGPIPE, SIG_IGN);
    Fetcher().serve();
    return 0;
}

}  // namespace berth::images_service
