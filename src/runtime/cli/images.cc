#include "runtime/cli/images.h"

#include <fcntl.h>
#include <google/protobuf/util/json_util.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <iostream>
#include <map>
#include <thread>

#include "base/error.h"
#include "base/files.h"
#include "base/pipe.h"
#include "base/unique_fd.h"
#include "transfer/archive.h"
#include "transfer/root.h"

namespace berth::cli {

using client::Client;

std::string to_json(const google::protobuf::Message& msg, bool pretty) {
    std::string out;
    google::protobuf::util::JsonPrintOptions options;
    options.add_whitespace = pretty;
    options.always_print_primitive_fields = true;
    options.preserve_proto_field_names = true;
    google::protobuf::util::MessageToJsonString(msg, &out, options);
    return out;
}

namespace {

std::string short_digest(const std::string& digest) {
    const size_t colon = digest.find(':');
    return digest.substr(colon == std::string::npos ? 0 : colon + 1, 12);
}

// "2026-11-30T02:01:12.14Z" -> "2026-11-30 02:01:12"
std::string short_time(const std::string& rfc3339) {
    std::string t = rfc3339.substr(0, 19);
    if (t.size() > 10 && t[10] == 'T') t[10] = ' ';
    return t;
}

// A pull's progress on stderr. On a terminal: one line per layer, redrawn in place;
// otherwise a plain line whenever a layer changes state (not for every chunk).
class PullDisplay {
  public:
    PullDisplay() : tty_(::isatty(STDERR_FILENO)) {}

    void on(const v1::ImageProgress& p) {
        using K = v1::ImageProgress;
        if (p.kind() == K::RESOLVED) {
            clear();
            std::fprintf(stderr, "Resolved to %s%s%s\n", p.digest().c_str(),
                         p.message().empty() ? "" : " at ", p.message().c_str());
            redraw(true);
            return;
        }
        if (p.digest().empty()) return;
        if (!lines_.count(p.digest())) order_.push_back(p.digest());
        std::string& text = lines_[p.digest()];
        switch (p.kind()) {
            case K::BLOB_PRESENT:
                text = "Already present";
                break;
            case K::BLOB_PROGRESS:
                text = "Downloading " + human_size(p.done()) + " / " + human_size(p.total());
                if (!tty_) return;  // too many for a log
                break;
            case K::BLOB_DONE:
                text = "Downloaded " + human_size(p.total());
                break;
            case K::LAYER_UNPACKED:
                text = "Unpacked";
                break;
            case K::RETRYING:
                text = "Retrying: " + p.message();
                break;
            default:
                text = p.message();
        }
        if (!tty_) {
            std::fprintf(stderr, "%s: %s\n", short_digest(p.digest()).c_str(), text.c_str());
            return;
        }
        redraw(p.kind() != K::BLOB_PROGRESS);
    }

  private:
    // Moves the cursor back over the layer lines drawn so far.
    void clear() {
        if (tty_ && drawn_) std::fprintf(stderr, "\033[%zuA", drawn_);
        drawn_ = 0;
    }
    void redraw(bool now) {
        if (!tty_) return;
        const auto t = std::chrono::steady_clock::now();
        if (!now && t - last_ < std::chrono::milliseconds(100)) return;
        last_ = t;
        clear();
        for (const auto& d : order_) {
            std::fprintf(stderr, "\r\033[2K%s: %s\n", short_digest(d).c_str(), lines_[d].c_str());
        }
        drawn_ = order_.size();
        std::fflush(stderr);
    }

    bool tty_;
    std::vector<std::string> order_;
    std::map<std::string, std::string> lines_;
    size_t drawn_ = 0;
    std::chrono::steady_clock::time_point last_{};
};

void print_image_line(const char* what, const v1::ImageInfo& image) {
    std::cout << what << " " << image.name() << " (" << image.manifest_digest() << ")" << std::endl;
}

}  // namespace

std::string human_size(uint64_t bytes) {
    const char* units[] = {"B", "kB", "MB", "GB", "TB"};
    double v = static_cast<double>(bytes);
    size_t u = 0;
    while (v >= 1000 && u + 1 < std::size(units)) {
        v /= 1000;
        ++u;
    }
    char buf[32];
    std::snprintf(buf, sizeof buf, u == 0 ? "%.0f%s" : "%.3g%s", v, units[u]);
    return buf;
}

std::string read_auth_config(const std::string& authfile) {
    if (!authfile.empty()) return read_file(authfile);
    const char* env = std::getenv("REGISTRY_AUTH_FILE");
    if (env && *env) return read_file(env);
    const char* home = std::getenv("HOME");
    if (!home || !*home) return "";
    const std::string docker = std::string(home) + "/.docker/config.json";
    struct stat st;
    if (::stat(docker.c_str(), &st) != 0) return "";
    return read_file(docker);
}

ImageCommands::ImageCommands(CLI::App& app) {
    pull_ = app.add_subcommand("pull", "pull an image from a registry");
    pull_->add_option("--authfile", authfile_,
                      "registry credentials (docker's config.json format; default "
                      "$REGISTRY_AUTH_FILE, else ~/.docker/config.json if present)");
    pull_->add_option("--platform", platform_, "os/arch[/variant] (default: this host's)");
    pull_->add_flag("-q,--quiet", quiet_, "no progress; print the image's name only");
    pull_->add_option("reference", reference_, "e.g. debian:bookworm, ghcr.io/org/app@sha256:...")
        ->required();

    images_ = app.add_subcommand("images", "list images");
    images_->add_flag("--json", json_, "JSON output");
    images_->add_flag("--digests", digests_, "full manifest digests");

    rmi_ = app.add_subcommand("rmi", "remove images (their layers go unless something uses them)");
    rmi_->add_flag("-f,--force", force_,
                   "remove the name even if a sandbox uses the image (its layers stay while it "
                   "lives)");
    rmi_->add_option("reference", references_, "name, digest or digest prefix")->required();

    auto* image = app.add_subcommand("image", "manage images");
    image->require_subcommand(1);
    prune_ = image->add_subcommand("prune", "remove layers and blobs no image or sandbox uses");
    import_ = image->add_subcommand(
        "import", "import an OCI image layout (directory or tar) or a docker-archive tar");
    import_->add_option("path", path_, "FILE or DIR")->required();
    import_->add_option("--name", name_, "the name to give it (default: the one it carries)");
    export_ = image->add_subcommand(
        "export",
        "write an image as an OCI image layout (a tar FILE, or a DIR with a slash or "
        "that exists)");
    export_->add_option("reference", reference_)->required();
    export_->add_option("path", path_, "FILE or DIR")->required();
    bootstrap_ = image->add_subcommand(
        "bootstrap",
        "build a base image locally: debian:SUITE (debootstrap from the host's mirror)");
    bootstrap_->add_option("source", reference_, "debian:SUITE, e.g. debian:bookworm")->required();
    bootstrap_->add_option("--name", name_, "record it as (default localhost/debian:SUITE)");
    inspect_ = image->add_subcommand("inspect", "show an image: digest, config, layers");
    inspect_->add_option("reference", reference_)->required();
    inspect_->add_flag("--json", json_, "JSON output");
}

bool ImageCommands::parsed() const {
    for (const CLI::App* c : {pull_, images_, rmi_, prune_, import_, export_, bootstrap_, inspect_})
        if (c->parsed()) return true;
    return false;
}

int ImageCommands::run(Client& c) {
    if (pull_->parsed()) return pull(c);
    if (images_->parsed()) return images(c);
    if (rmi_->parsed()) return rmi(c);
    if (prune_->parsed()) return prune(c);
    if (import_->parsed()) return import(c);
    if (export_->parsed()) return export_image(c);
    if (bootstrap_->parsed()) return bootstrap(c);
    return inspect(c);
}

int ImageCommands::pull(Client& c) {
    v1::ClientMessage m;
    auto* p = m.mutable_pull_image();
    p->set_reference(reference_);
    p->set_platform(platform_);
    p->set_auth_config(read_auth_config(authfile_));
    PullDisplay display;
    const auto reply = c.call_with_progress(std::move(m), [&](const v1::ImageProgress& e) {
        if (!quiet_) display.on(e);
    });
    const auto& image = reply.pull_image().image();
    if (quiet_) {
        std::cout << image.name() << std::endl;
    } else {
        std::cout << "Digest: " << image.manifest_digest() << "\n" << image.name() << std::endl;
    }
    return 0;
}

int ImageCommands::images(Client& c) {
    v1::ClientMessage m;
    m.mutable_list_images();
    const auto list = c.call(std::move(m)).list_images();
    if (json_) {
        std::cout << "[";
        for (int i = 0; i < list.images_size(); ++i)
            std::cout << (i ? ",\n " : "") << to_json(list.images(i), false);
        std::cout << "]" << std::endl;
        return 0;
    }
    const int digest_width = digests_ ? 71 : 12;
    std::printf("%-50s %-*s %-19s %s\n", "NAME", digest_width, "DIGEST", "CREATED", "SIZE");
    for (const auto& im : list.images()) {
        const std::string digest =
            digests_ ? im.manifest_digest() : short_digest(im.manifest_digest());
        std::printf("%-50s %-*s %-19s %s\n", im.name().c_str(), digest_width, digest.c_str(),
                    short_time(im.created()).c_str(), human_size(im.size()).c_str());
    }
    return 0;
}

int ImageCommands::rmi(Client& c) {
    int code = 0;
    for (const auto& ref : references_) {
        v1::ClientMessage m;
        m.mutable_remove_image()->set_reference(ref);
        m.mutable_remove_image()->set_force(force_);
        try {
            const auto r = c.call(std::move(m)).remove_image();
            for (const auto& n : r.untagged()) std::cout << "Untagged: " << n << "\n";
            for (const auto& d : r.deleted()) std::cout << "Deleted: " << d << "\n";
            std::cout.flush();
        } catch (const client::ClientError& e) {
            std::cerr << "berth: " << ref << ": " << e.what() << std::endl;
            code = 1;
        }
    }
    return code;
}

int ImageCommands::prune(Client& c) {
    v1::ClientMessage m;
    m.mutable_prune_images();
    const auto r = c.call(std::move(m)).prune_images();
    for (const auto& d : r.deleted()) std::cout << "Deleted: " << d << "\n";
    std::cout << "Total reclaimed space: " << human_size(r.freed_bytes()) << std::endl;
    return 0;
}

int ImageCommands::import(Client& c) {
    // Opened with our own rights; the daemon's side reads only through this fd.
    struct stat st;
    if (::stat(path_.c_str(), &st) != 0) throw_sys("stat", path_);
    const bool dir = S_ISDIR(st.st_mode);
    UniqueFd fd(::open(path_.c_str(), O_RDONLY | O_CLOEXEC | (dir ? O_DIRECTORY : 0)));
    if (!fd) throw_sys("open", path_);
    v1::ClientMessage m;
    m.mutable_import_image()->set_name(name_);
    with_context("importing " + path_, [&] {
        print_image_line("Imported", c.call(std::move(m), {fd.get()}).import_image().image());
    });
    return 0;
}

int ImageCommands::export_image(Client& c) {
    v1::ClientMessage m;
    m.mutable_export_image()->set_reference(reference_);
    struct stat st;
    const bool exists = ::stat(path_.c_str(), &st) == 0;
    const bool dir = (exists && S_ISDIR(st.st_mode)) || (!path_.empty() && path_.back() == '/');
    if (!dir) {
        // A tar file: written under a temporary name beside it, renamed when complete.
        std::string temp = path_ + ".XXXXXX";
        UniqueFd fd(::mkostemp(temp.data(), O_CLOEXEC));
        if (!fd) throw_sys("create", path_ + ".XXXXXX");
        struct Temp {
            std::string path;
            bool keep = false;
            ~Temp() {
                if (!keep) ::unlink(path.c_str());
            }
        } guard{temp};
        if (::fchmod(fd.get(), 0644) != 0) throw_sys("chmod", temp);
        c.call(std::move(m), {fd.get()});
        if (::fsync(fd.get()) != 0) throw_sys("fsync", temp);
        if (::rename(temp.c_str(), path_.c_str()) != 0) throw_sys("rename", path_);
        guard.keep = true;
        return 0;
    }
    // A directory: the layout's tar arrives on a pipe and is unpacked here, with our
    // rights, never following a symlink below the directory.
    if (!exists) make_dirs(path_, 0755);
    const transfer::Root root = transfer::Root::open(path_);
    {
        UniqueFd probe(::openat(root.fd(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
        if (!probe) throw_sys("open", path_);
        struct stat dst;
        if (::fstatat(root.fd(), "index.json", &dst, AT_SYMLINK_NOFOLLOW) == 0 ||
            ::fstatat(root.fd(), "oci-layout", &dst, AT_SYMLINK_NOFOLLOW) == 0)
            throw std::runtime_error(path_ + " holds an image layout already");
    }
    auto [read_end, write_end] = make_pipe("export");
    std::exception_ptr extract_error;
    std::thread extractor([&] {
        try {
            transfer::extract_archive(read_end.get(), root, ".", {});
        } catch (...) {
            extract_error = std::current_exception();
        }
        read_end.reset();  // a writer still going gets EPIPE
    });
    std::exception_ptr daemon_error;
    try {
        // (Our write end stays open until the reply: the stream's end is its end-of-archive
        // blocks, and a daemon that fails early answers first, then we close it.)
        c.call(std::move(m), {write_end.get()});
    } catch (...) {
        daemon_error = std::current_exception();
    }
    write_end.reset();
    extractor.join();
    if (daemon_error) std::rethrow_exception(daemon_error);
    if (extract_error) std::rethrow_exception(extract_error);
    return 0;
}

int ImageCommands::bootstrap(Client& c) {
    v1::ClientMessage m;
    m.mutable_bootstrap_image()->set_source(reference_);
    m.mutable_bootstrap_image()->set_name(name_);
    const auto reply = c.call_with_progress(
        std::move(m), [](const v1::ImageProgress& e) { std::cerr << e.message() << std::endl; });
    print_image_line("Bootstrapped", reply.bootstrap_image().image());
    return 0;
}

int ImageCommands::inspect(Client& c) {
    v1::ClientMessage m;
    m.mutable_inspect_image()->set_reference(reference_);
    const auto r = c.call(std::move(m)).inspect_image();
    if (json_) {
        std::cout << to_json(r) << std::endl;
        return 0;
    }
    auto list = [](const auto& items) {
        std::string out;
        for (const auto& i : items) out += (out.empty() ? "" : " ") + i;
        return out;
    };
    const auto& im = r.image();
    std::cout << "Name:        " << im.name() << "\n"
              << "Digest:      " << im.manifest_digest() << "\n"
              << "Config:      " << im.config_digest() << "\n"
              << "Created:     " << im.created() << "\n"
              << "Platform:    " << r.platform() << "\n"
              << "Size:        " << human_size(im.size()) << "\n"
              << "Env:         " << list(r.config().env()) << "\n"
              << "Entrypoint:  " << list(r.config().entrypoint()) << "\n"
              << "Cmd:         " << list(r.config().cmd()) << "\n"
              << "WorkingDir:  " << r.config().working_dir() << "\n"
              << "User:        " << r.config().user() << "\n"
              << "Layers (diff_ids, bottom first):\n";
    for (const auto& l : im.layers()) std::cout << "  " << l << "\n";
    std::cout << "Lower dirs (top first):\n";
    for (const auto& d : r.lower_dirs()) std::cout << "  " << d << "\n";
    std::cout.flush();
    return 0;
}

}  // namespace berth::cli
