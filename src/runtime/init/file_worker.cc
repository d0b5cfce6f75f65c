#include "runtime/init/file_worker.h"

#include <sys/stat.h>

#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#include "base/cancel.h"
#include "base/error.h"
#include "berth.pb.h"
#include "runtime/init/users.h"
#include "runtime/wire/error_codes.h"
#include "runtime/wire/frame.h"
#include "transfer/archive.h"
#include "transfer/file_ops.h"
#include "transfer/root.h"

namespace berth::init {

namespace {

constexpr v1::ErrorCode kInvalidArgument = v1::INVALID_ARGUMENT, kNotFound = v1::NOT_FOUND,
                        kPermissionDenied = v1::PERMISSION_DENIED,
                        kResourceExhausted = v1::RESOURCE_EXHAUSTED, kUnavailable = v1::UNAVAILABLE,
                        kInternal = v1::INTERNAL, kAlreadyExists = v1::ALREADY_EXISTS,
                        kCanceled = v1::CANCELED;

// The resolver to use: BERTH_TRANSFER_RESOLVER (automatic, openat2, walk) from berthd's
// environment lets tests run both on one kernel.
transfer::Resolver configured_resolver() {
    const char* v = std::getenv("BERTH_TRANSFER_RESOLVER");
    if (!v || !*v || std::strcmp(v, "automatic") == 0) return transfer::Resolver::automatic;
    if (std::strcmp(v, "walk") == 0) return transfer::Resolver::walk;
    if (std::strcmp(v, "openat2") == 0) return transfer::Resolver::openat2;
    throw SysError("BERTH_TRANSFER_RESOLVER", v, EINVAL);
}

// A failure that is not a system call's: its message stands alone.
struct OperationError : Error {
    OperationError(v1::ErrorCode code, const std::string& message)
        : Error(wire::error_kind(code), message) {}
};

// An owner spec ("" = root, name, uid, name:group, uid:gid) as uid/gid in the sandbox.
transfer::Ownership owner_for(const std::string& spec) {
    std::string error;
    auto user = resolve_sandbox_user(spec, &error);
    if (!user) throw OperationError(kNotFound, error);
    if (error = check_mapped_here(*user); !error.empty())
        throw OperationError(kInvalidArgument, error);
    return transfer::Ownership{user->uid, user->gid};
}

v1::PathStat to_proto(const transfer::EntryStat& st) {
    v1::PathStat out;
    using Type = transfer::EntryStat::Type;
    switch (st.type) {
        case Type::missing:
            out.set_type(v1::PathStat::MISSING);
            return out;
        case Type::regular:
            out.set_type(v1::PathStat::REGULAR);
            break;
        case Type::directory:
            out.set_type(v1::PathStat::DIRECTORY);
            break;
        case Type::symlink:
            out.set_type(v1::PathStat::SYMLINK);
            break;
        case Type::other:
            out.set_type(v1::PathStat::OTHER);
            break;
    }
    out.set_mode(st.mode);
    out.set_size(st.size);
    out.set_uid(st.uid);
    out.set_gid(st.gid);
    out.set_mtime_ns(st.mtime_ns);
    out.set_link_target(st.link_target);
    return out;
}

void copy_summary(const transfer::Summary& s, v1::CopyReply* out) {
    out->set_entries(s.entries);
    out->set_bytes(s.bytes);
    for (const auto& w : s.warnings) out->add_warnings(w);
}

v1::init::FileResult perform(int connection, const v1::init::FileOp& op,
                             std::vector<UniqueFd>& fds) {
    v1::init::FileResult result;
    // The sandbox's root is our root: every path is resolved inside it.
    transfer::Root root = transfer::Root::open("/", configured_resolver());
    // berthd closing the connection (or sending anything on it) cancels a copy.
    const CancelToken cancel = CancelToken::watching(connection);
    switch (op.op_case()) {
        case v1::init::FileOp::kCopyIn: {
            const auto& req = op.copy_in();
            transfer::ExtractOptions options;
            options.cancel = &cancel;
            options.owner = owner_for(req.user());
            if (req.preserve_owners())
                options.owners = transfer::ExtractOptions::Owners::from_archive;
            for (size_t i = 1; i < fds.size(); ++i) options.side_data.push_back(fds[i].get());
            copy_summary(transfer::extract_archive(fds.at(0).get(), root, req.path(), options),
                         result.mutable_copy());
            break;
        }
        case v1::init::FileOp::kCopyOut: {
            const auto& req = op.copy_out();
            transfer::WriteOptions options;
            options.name = req.name();
            options.contents_only = req.contents_only();
            options.cancel = &cancel;
            if (req.side_file() && fds.size() > 1) options.side_data_out = fds[1].get();
            copy_summary(transfer::write_archive(root, req.path(), fds.at(0).get(), options),
                         result.mutable_copy());
            break;
        }
        case v1::init::FileOp::kStat:
            *result.mutable_stat() =
                to_proto(transfer::stat_path(root, op.stat().path(), op.stat().follow()));
            break;
        case v1::init::FileOp::kMakeDirs: {
            const auto& req = op.make_dirs();
            result.set_created(transfer::make_dirs(root, req.path(), req.mode() ? req.mode() : 0755,
                                                   owner_for(req.user())));
            break;
        }
        case v1::init::FileOp::kRemove:
            transfer::remove_path(root, op.remove().path(), op.remove().recursive());
            break;
        default:
            throw SysError("file operation", "empty request", EINVAL);
    }
    return result;
}

}  // namespace

void run_file_op(int connection, const v1::init::FileOp& op, std::vector<UniqueFd> fds) {
    v1::init::FileResult result;
    try {
        result = perform(connection, op, fds);
    } catch (const Error& e) {  // a SysError's kind is its errno's
        result.mutable_failed()->set_code(wire::error_code(e.kind()));
        result.mutable_failed()->set_message(e.what());
    } catch (const std::exception& e) {
        result.mutable_failed()->set_code(kInternal);
        result.mutable_failed()->set_message(e.what());
    }
    // The stream ends before the answer: a client reading a download sees EOF first.
    fds.clear();
    v1::init::FromSandbox msg;
    *msg.mutable_file_result() = std::move(result);
    try {
        wire::write_frame(connection, msg);
    } catch (const std::exception&) {
        // The daemon went away; nobody is waiting for the answer.
    }
}

}  // namespace berth::init
