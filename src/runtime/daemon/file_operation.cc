#include "runtime/daemon/file_operation.h"

#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>

#include <cstring>

#include "base/size.h"
#include "runtime/daemon/init_connection.h"
#include "runtime/daemon/server.h"
#include "runtime/wire/error_codes.h"
#include "runtime/wire/frame.h"

namespace berth::daemon {

namespace {

const char* request_name(v1::ClientMessage::BodyCase kind) {
    switch (kind) {
        case v1::ClientMessage::kCopyIn:
            return "CopyIn";
        case v1::ClientMessage::kCopyOut:
            return "CopyOut";
        case v1::ClientMessage::kStatPath:
            return "StatPath";
        case v1::ClientMessage::kMakeDirs:
            return "MakeDirs";
        case v1::ClientMessage::kRemovePath:
            return "RemovePath";
        default:
            return "request";
    }
}

// The fds a copy may bring. First the stream: a pipe end in the direction the operation
// needs. Then, optionally, side files for a large file's data outside the stream: for an
// upload, regular files open read-only; for a download, one anonymous (O_TMPFILE, no
// name), empty, writable regular file. Anything else (a directory, a named file open for
// writing, a socket) must not reach the sandbox: an fd is a capability, and inside the
// sandbox it could lead back to the host.
constexpr size_t kMaxSideFiles = 4;

std::string check_copy_fds(const std::vector<UniqueFd>& fds, bool upload) {
    const char* end = upload ? "read" : "write";
    if (fds.empty()) {
        return "expected a pipe's " + std::string(end) +
               " end with the request (SCM_RIGHTS), got no fd";
    }
    struct stat st;
    if (::fstat(fds[0].get(), &st) != 0 || !S_ISFIFO(st.st_mode))
        return "the first fd passed with the request is not a pipe";
    int flags = ::fcntl(fds[0].get(), F_GETFL);
    if (flags < 0 || (flags & O_ACCMODE) != (upload ? O_RDONLY : O_WRONLY))
        return "the first fd passed with the request is not the " + std::string(end) +
               " end of a pipe";
    const size_t side = fds.size() - 1;
    if (side > (upload ? kMaxSideFiles : 1)) {
        return "too many fds with the request: " + std::to_string(fds.size()) + " (at most " +
               std::to_string(upload ? kMaxSideFiles + 1 : 2) + ")";
    }
    for (size_t i = 1; i < fds.size(); ++i) {
        flags = ::fcntl(fds[i].get(), F_GETFL);
        if (::fstat(fds[i].get(), &st) != 0 || !S_ISREG(st.st_mode) || flags < 0 ||
            (flags & O_PATH))
            return "side fd " + std::to_string(i) + " is not an open regular file";
        if (upload && (flags & O_ACCMODE) != O_RDONLY)
            return "side fd " + std::to_string(i) + " of an upload must be open read-only";
        if (!upload && ((flags & O_ACCMODE) == O_RDONLY || st.st_nlink != 0 || st.st_size != 0))
            return "the side fd of a download must be an empty, writable O_TMPFILE";
    }
    return "";
}

}  // namespace

std::string sandbox_path(const std::string& path, const std::string& workdir, std::string* error) {
    if (path.empty()) {
        *error = "path: a path in the sandbox is required";
        return "";
    }
    if (path.find('\0') != std::string::npos) {
        *error = "path contains a NUL byte";
        return "";
    }
    std::string full = in_workdir(workdir, path);
    if (full.size() >= PATH_MAX) {
        *error = "path is too long (" + std::to_string(full.size()) + " bytes; the limit is " +
                 std::to_string(PATH_MAX - 1) + "): " + full.substr(0, 64) + "...";
        return "";
    }
    size_t start = 0;
    while (start < full.size()) {
        size_t slash = full.find('/', start);
        if (slash == std::string::npos) slash = full.size();
        if (slash - start > NAME_MAX) {
            *error = "path component is too long (" + std::to_string(slash - start) +
                     " bytes; the limit is " + std::to_string(NAME_MAX) +
                     "): " + full.substr(start, 32) + "...";
            return "";
        }
        start = slash + 1;
    }
    return full;
}

FileOperation::FileOperation(asio::io_context& io, std::shared_ptr<Session> session,
                             uint64_t request_id, const Sandbox& sandbox)
    : io_(io),
      session_(session),
      request_id_(request_id),
      sandbox_id_(sandbox.info.id()),
      init_socket_(sandbox.init_socket),
      workdir_(sandbox.info.workdir()),
      storage_bytes_(sandbox.info.resources().storage_bytes()) {}

void FileOperation::start(const v1::ClientMessage& request, std::vector<UniqueFd> fds) {
    kind_ = request.body_case();
    v1::init::ToSandbox to;
    auto* op = to.mutable_file_op();
    std::string error, path;
    int stream_access = -1;
    switch (kind_) {
        case v1::ClientMessage::kCopyIn:
            *op->mutable_copy_in() = request.copy_in();
            path = sandbox_path(request.copy_in().path(), workdir_, &error);
            op->mutable_copy_in()->set_path(path);
            stream_access = O_RDONLY;
            break;
        case v1::ClientMessage::kCopyOut:
            *op->mutable_copy_out() = request.copy_out();
            path = sandbox_path(request.copy_out().path(), workdir_, &error);
            op->mutable_copy_out()->set_path(path);
            if (request.copy_out().name().find_first_of(std::string("/\0", 2)) !=
                    std::string::npos ||
                request.copy_out().name() == ".." || request.copy_out().name().size() > NAME_MAX)
                error = "name must be a single file name";
            stream_access = O_WRONLY;
            break;
        case v1::ClientMessage::kStatPath:
            *op->mutable_stat() = request.stat_path();
            path = sandbox_path(request.stat_path().path(), workdir_, &error);
            op->mutable_stat()->set_path(path);
            break;
        case v1::ClientMessage::kMakeDirs:
            *op->mutable_make_dirs() = request.make_dirs();
            path = sandbox_path(request.make_dirs().path(), workdir_, &error);
            op->mutable_make_dirs()->set_path(path);
            if (request.make_dirs().mode() > 07777) error = "mode must be at most 07777";
            break;
        case v1::ClientMessage::kRemovePath:
            *op->mutable_remove() = request.remove_path();
            path = sandbox_path(request.remove_path().path(), workdir_, &error);
            op->mutable_remove()->set_path(path);
            break;
        default:
            error = "not a file operation";
    }
    if (error.empty() && stream_access >= 0) error = check_copy_fds(fds, stream_access == O_RDONLY);
    if (error.empty() && stream_access < 0 && !fds.empty())
        error = std::string(request_name(kind_)) + " takes no fds";
    if (!error.empty()) {
        finish_with_error(v1::INVALID_ARGUMENT, std::string(request_name(kind_)) + ": " + error);
        return;
    }

    InitConnection connection = connect_to_init(init_socket_, sandbox_id_);
    if (!connection.fd) {
        finish_with_error(connection.code, connection.message);
        return;
    }
    try {
        std::vector<int> pass;
        for (const auto& fd : fds) pass.push_back(fd.get());
        wire::write_frame(connection.fd.get(), to, pass);
    } catch (const std::exception& e) {
        finish_with_error(v1::UNAVAILABLE, "sandbox " + sandbox_id_ +
                                               ": sending the request to its init: " + e.what());
        return;
    }
    // The worker holds the pipe (and side files) now; the client holds the other end.
    fds.clear();
    init_ = std::make_shared<FramedSocket>(
        UnixSocket(io_, asio::local::stream_protocol(), connection.fd.release()),
        wire::kInitMaxFrame);
    auto self = shared_from_this();
    init_->start([this, self](FramedSocket::Event event, std::string&& payload) {
        on_init_frame(event, std::move(payload));
    });
}

void FileOperation::on_init_frame(FramedSocket::Event event, std::string&& payload) {
    if (finished_) return;
    if (event != FramedSocket::Event::frame) {
        finish_with_error(v1::UNAVAILABLE, "sandbox " + sandbox_id_ +
                                               " ended the file operation without an answer "
                                               "(its init or the worker died)");
        return;
    }
    v1::init::FromSandbox msg;
    if (!msg.ParseFromString(payload)) {
        finish_with_error(v1::INTERNAL, "sandbox " + sandbox_id_ + " sent a malformed reply");
        return;
    }
    if (msg.has_failed()) {  // init could not start the worker
        finish_with_error(wire::error_code_from_peer(msg.failed().code()), msg.failed().message());
        return;
    }
    if (!msg.has_file_result()) {
        finish_with_error(v1::INTERNAL, "sandbox " + sandbox_id_ + " sent an unexpected reply");
        return;
    }
    reply(msg.file_result());
}

void FileOperation::reply(const v1::init::FileResult& result) {
    if (result.has_failed()) {
        const v1::ErrorCode code = wire::error_code_from_peer(result.failed().code());
        std::string message = result.failed().message();
        // What is full when a write inside a bounded sandbox fails for space is its own
        // writable layer (a tmpfs of that size, or its project quota): say so, and how big.
        const bool writes =
            kind_ == v1::ClientMessage::kCopyIn || kind_ == v1::ClientMessage::kMakeDirs;
        if (writes && storage_bytes_ && code == v1::RESOURCE_EXHAUSTED &&
            (message.find("No space left") != std::string::npos ||
             message.find("quota exceeded") != std::string::npos)) {
            message += " (the sandbox's writable layer is full: its storage limit is " +
                       format_size(storage_bytes_) + ")";
        }
        finish_with_error(static_cast<v1::ErrorCode>(code), message);
        return;
    }
    if (auto session = session_.lock()) {
        v1::ServerMessage msg;
        msg.set_id(request_id_);
        switch (kind_) {
            case v1::ClientMessage::kCopyIn:
            case v1::ClientMessage::kCopyOut:
                *msg.mutable_copy() = result.copy();
                break;
            case v1::ClientMessage::kStatPath:
                *msg.mutable_stat_path()->mutable_stat() = result.stat();
                break;
            case v1::ClientMessage::kMakeDirs:
                msg.mutable_make_dirs()->set_created(result.created());
                break;
            default:
                msg.mutable_remove_path();
        }
        session->send(msg);
    }
    done();
}

void FileOperation::cancel() {
    finish_with_error(v1::CANCELED, "canceled by the client");
}

void FileOperation::abandon() {
    session_.reset();
    done();
}

void FileOperation::finish_with_error(v1::ErrorCode code, const std::string& message) {
    if (finished_) return;
    if (auto session = session_.lock()) session->send_error(request_id_, code, message);
    done();
}

void FileOperation::done() {
    if (finished_) return;
    finished_ = true;
    if (init_) init_->close();
    if (auto session = session_.lock()) session->file_ops.erase(request_id_);
}

}  // namespace berth::daemon
