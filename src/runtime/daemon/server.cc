#include "runtime/daemon/server.h"

#include <fcntl.h>
#include <grp.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <iostream>

#include "base/error.h"
#include "base/size.h"
#include "runtime/daemon/exec_operation.h"
#include "runtime/daemon/file_operation.h"
#include "runtime/daemon/validate.h"
#include "runtime/wire/error_codes.h"
#include "runtime/wire/frame.h"

namespace berth::daemon {

namespace {

std::string new_sandbox_id() {
    unsigned char bytes[16];
    if (::getrandom(bytes, sizeof bytes, 0) != sizeof bytes) throw_sys("getrandom", "sandbox id");
    static const char* hex = "0123456789abcdef";
    std::string id;
    for (unsigned char b : bytes) {
        id += hex[b >> 4];
        id += hex[b & 15];
    }
    return id;
}

void log(const std::string& line) {
    std::cerr << "berthd: " << line << std::endl;
}

}  // namespace

void Session::send(const v1::ServerMessage& msg) {
    socket->send(wire::encode_frame(msg));
}

void Session::send_error(uint64_t request_id, v1::ErrorCode code, const std::string& message) {
    v1::ServerMessage msg;
    msg.set_id(request_id);
    msg.mutable_error()->set_code(code);
    msg.mutable_error()->set_message(message);
    send(msg);
}

Server::Server(asio::io_context& io, ServerConfig config,
               std::shared_ptr<FramedSocket> helper_channel, std::unique_ptr<cgroup::Driver> driver)
    : io_(io),
      config_(std::move(config)),
      driver_(std::move(driver)),
      helper_(std::move(helper_channel),
              [this] {
                  log("lost berth-helper; exiting with status " + std::to_string(kExitChildLost) +
                      " so that the service restarts (sandboxes keep running)");
                  exit_code_ = kExitChildLost;
                  stop();
              }),
      registry_(config_.runtime_dir, driver_.get()),
      acceptor_(io),
      lease_timer_(io),
      accept_backoff_(io),
      read_budget_(std::make_shared<ReadBudget>(config_.read_budget_bytes)) {
    dev_null_.reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    if (!dev_null_) throw_sys("open", "/dev/null");
}

void Server::start() {
    reattach();
    ::unlink(config_.socket_path.c_str());
    acceptor_.open(asio::local::stream_protocol());
    acceptor_.bind(asio::local::stream_protocol::endpoint(config_.socket_path));
    if (::chmod(config_.socket_path.c_str(), 0660) != 0) throw_sys("chmod", config_.socket_path);
    acceptor_.listen(1024);
    accept_next();
    check_leases();
    const HostBudget& b = config_.budget;
    auto or_none = [](uint64_t v, std::string text) { return v ? text : std::string("no limit"); };
    log("listening on " + config_.socket_path + " (cgroup " + config_.cgroup_driver +
        "; all sandboxes: memory " + or_none(b.total_memory, format_size(b.total_memory)) +
        ", pids " + or_none(b.total_pids, std::to_string(b.total_pids)) +
        "; each by default: memory " + or_none(b.default_memory, format_size(b.default_memory)) +
        ", pids " + std::to_string(b.default_pids) + ")");
}

void Server::stop() {
    boost::system::error_code ignored;
    acceptor_.close(ignored);
    lease_timer_.cancel();
    io_.stop();
}

void Server::accept_next() {
    acceptor_.async_accept([this](boost::system::error_code ec, UnixSocket socket) {
        if (ec == asio::error::operation_aborted) return;
        if (!ec) {
            accept_failure_logged_ = false;
            on_connection(std::move(socket));
            accept_next();
            return;
        }
        // EMFILE, ENFILE, ENOBUFS, ENOMEM: the backlog stays where it is, and accepting
        // again at once would spin. Try again shortly; sessions and sandboxes go on.
        if (!accept_failure_logged_) {
            log("accept on " + config_.socket_path + ": " + ec.message() +
                "; retrying every 100 ms until it works");
            accept_failure_logged_ = true;
        }
        accept_backoff_.expires_after(std::chrono::milliseconds(100));
        accept_backoff_.async_wait([this](boost::system::error_code wait_ec) {
            if (!wait_ec) accept_next();
        });
    });
}

bool Server::peer_allowed(int fd, uid_t* uid, std::string* who) {
    ucred cred{};
    socklen_t len = sizeof cred;
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
        *who = "unknown peer";
        return false;
    }
    *who = "uid " + std::to_string(cred.uid);
    *uid = cred.uid;
    if (cred.uid == 0 || cred.uid == config_.daemon_uid || cred.gid == config_.allowed_gid)
        return true;
    // Supplementary groups of the peer process as they were at connect().
    gid_t groups[256];
    socklen_t glen = sizeof groups;
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups, &glen) == 0) {
        for (size_t i = 0; i < glen / sizeof(gid_t); ++i) {
            if (groups[i] == config_.allowed_gid) return true;
        }
    }
    return false;
}

void Server::on_connection(UnixSocket socket) {
    std::string who;
    uid_t uid = static_cast<uid_t>(-1);
    const bool allowed = peer_allowed(socket.native_handle(), &uid, &who);
    ReadLimits limits;
    limits.budget = read_budget_;
    limits.frame_timeout = config_.frame_timeout;
    auto framed = std::make_shared<FramedSocket>(std::move(socket), config_.max_frame, limits);
    auto session = std::make_shared<Session>(next_session_++, framed, uid);
    auto refuse = [&](v1::ErrorCode code, const std::string& message) {
        session->send_error(0, code, message);
        framed->close_after_flush();
    };
    if (!allowed) {
        return refuse(v1::PERMISSION_DENIED,
                      who + " is neither root nor in group '" + config_.allowed_group_name + "'");
    }
    // Caps on connections, so that no uid can take the fds every other client and
    // sandbox needs. Root's connections count in all but have no cap of their own.
    if (sessions_.size() >= config_.max_connections) {
        return refuse(v1::RESOURCE_EXHAUSTED,
                      "berthd has " + std::to_string(sessions_.size()) +
                          " connections open, its limit; close some and try again");
    }
    size_t& mine = connections_by_uid_[uid];
    if (uid != 0 && mine >= config_.max_connections_per_user) {
        return refuse(v1::RESOURCE_EXHAUSTED,
                      who + " has " + std::to_string(mine) +
                          " connections to berthd open, the limit per user; close some");
    }
    ++mine;
    sessions_[session->id] = session;
    std::weak_ptr<Session> weak = session;
    framed->start([this, weak](FramedSocket::Event event, std::string&& payload) {
        auto session = weak.lock();
        if (!session) return;
        switch (event) {
            case FramedSocket::Event::frame:
                on_frame(session, std::move(payload));
                break;
            case FramedSocket::Event::too_large:
                session->send_error(0, v1::RESOURCE_EXHAUSTED,
                                    "frame of " + payload + " bytes exceeds the limit of " +
                                        std::to_string(config_.max_frame) + " bytes");
                session->socket->close_after_flush();
                on_closed(session);
                break;
            case FramedSocket::Event::refused:
                log("closing connection of uid " + std::to_string(session->uid) + ": it " +
                    payload);
                session->send_error(0, v1::RESOURCE_EXHAUSTED, "connection closed: it " + payload);
                session->socket->close_after_flush();
                on_closed(session);
                break;
            case FramedSocket::Event::closed:
                on_closed(session);
                break;
        }
    });
}

void Server::on_closed(const std::shared_ptr<Session>& session) {
    if (!sessions_.erase(session->id)) return;
    if (auto it = connections_by_uid_.find(session->uid); it != connections_by_uid_.end()) {
        if (--it->second == 0) connections_by_uid_.erase(it);
    }
    auto execs = std::move(session->execs);
    for (auto& [id, op] : execs) op->abandon();
    auto file_ops = std::move(session->file_ops);
    for (auto& [id, op] : file_ops) op->abandon();
    abandon_images(session->id);
    // Its sandboxes now run on their lease.
    for (Sandbox* s : registry_.all()) {
        if (s->owner_session == session->id) {
            s->owner_session = 0;
            if (!s->info.persistent()) s->lease_deadline = Clock::now() + config_.lease;
        }
    }
}

void Server::on_frame(const std::shared_ptr<Session>& session, std::string&& payload) {
    std::vector<UniqueFd> fds = session->socket->take_fds();
    v1::ClientMessage msg;
    if (!msg.ParseFromString(payload)) {
        session->send_error(0, v1::INVALID_ARGUMENT,
                            "malformed frame: " + std::to_string(payload.size()) +
                                " bytes that are not a berth.v1.ClientMessage");
        return;
    }
    const uint64_t id = msg.id();
    if (msg.has_hello()) return handle_hello(session, id, msg.hello());
    if (!session->said_hello) {
        session->send_error(id, v1::INVALID_ARGUMENT, "the first request must be Hello");
        return;
    }
    switch (msg.body_case()) {
        case v1::ClientMessage::kCreate:
            return handle_create(session, id, msg.create());
        case v1::ClientMessage::kExec:
            return handle_exec(session, id, msg.exec());
        case v1::ClientMessage::kExecInput: {
            auto it = session->execs.find(id);
            if (it == session->execs.end()) {
                session->send_error(id, v1::NOT_FOUND,
                                    "no running exec with id " + std::to_string(id));
                return;
            }
            it->second->input(msg.exec_input());
            return;
        }
        case v1::ClientMessage::kCancel: {
            if (cancel_image(session, id)) return;
            if (auto op = session->file_ops.find(id); op != session->file_ops.end()) {
                auto keep = op->second;
                keep->cancel();
                return;
            }
            auto it = session->execs.find(id);
            if (it == session->execs.end()) {
                session->send_error(id, v1::NOT_FOUND,
                                    "no running exec with id " + std::to_string(id));
                return;
            }
            it->second->cancel();
            return;
        }
        case v1::ClientMessage::kCopyIn:
        case v1::ClientMessage::kCopyOut:
        case v1::ClientMessage::kStatPath:
        case v1::ClientMessage::kMakeDirs:
        case v1::ClientMessage::kRemovePath:
            return handle_file_op(session, msg, std::move(fds));
        case v1::ClientMessage::kDelete:
            return handle_delete(session, id, msg.delete_());
        case v1::ClientMessage::kList:
            return handle_list(session, id);
        case v1::ClientMessage::kInspect:
            return handle_inspect(session, id, msg.inspect());
        case v1::ClientMessage::kSetPersistent:
            return handle_set_persistent(session, id, msg.set_persistent());
        case v1::ClientMessage::kSetNetwork:
            return handle_set_network(session, id, msg.set_network());
        case v1::ClientMessage::kPullImage:
        case v1::ClientMessage::kImportImage:
        case v1::ClientMessage::kExportImage:
        case v1::ClientMessage::kBootstrapImage:
        case v1::ClientMessage::kListImages:
        case v1::ClientMessage::kInspectImage:
        case v1::ClientMessage::kRemoveImage:
        case v1::ClientMessage::kPruneImages:
            return handle_image(session, msg, std::move(fds));
        default:
            session->send_error(id, v1::INVALID_ARGUMENT, "empty or unknown request");
    }
}

Sandbox* Server::find_or_reply(const std::shared_ptr<Session>& session, uint64_t id,
                               const std::string& key) {
    std::string error;
    Sandbox* sandbox = registry_.find(key, &error);
    if (!sandbox) {
        session->send_error(id, v1::NOT_FOUND, error);
        return nullptr;
    }
    if (!session->root() && sandbox->info.owner_uid() != session->uid) {
        session->send_error(id, v1::PERMISSION_DENIED,
                            "sandbox " + sandbox->info.id().substr(0, 12) +
                                " belongs to another user (uid " +
                                std::to_string(sandbox->info.owner_uid()) + ")");
        return nullptr;
    }
    return sandbox;
}

void Server::handle_hello(const std::shared_ptr<Session>& session, uint64_t id,
                          const v1::Hello& hello) {
    if (hello.protocol_version() != wire::kProtocolVersion) {
        session->send_error(id, v1::INVALID_ARGUMENT,
                            "protocol version " + std::to_string(hello.protocol_version()) +
                                " is not supported; this daemon speaks " +
                                std::to_string(wire::kProtocolVersion));
        session->socket->close_after_flush();
        return;
    }
    session->said_hello = true;
    v1::ServerMessage reply;
    reply.set_id(id);
    auto* h = reply.mutable_hello();
    h->set_protocol_version(wire::kProtocolVersion);
    h->set_server_version(BERTH_VERSION);
    h->set_max_frame_bytes(config_.max_frame);
    h->set_cgroup_driver(config_.cgroup_driver);
    h->set_network(config_.network);
    h->set_pool(config_.pool);
    session->send(reply);
}

void Server::handle_create(const std::shared_ptr<Session>& session, uint64_t id,
                           const v1::CreateSandbox& req) {
    if (std::string error = check_create(req); !error.empty()) {
        session->send_error(id, v1::INVALID_ARGUMENT, error);
        return;
    }
    // A limit past the budget could never be had: the parent cgroup caps it anyway.
    const auto& asked = req.resources();
    if (config_.budget.total_memory && asked.memory_bytes() > config_.budget.total_memory) {
        session->send_error(id, v1::INVALID_ARGUMENT,
                            "memory: " + format_size(asked.memory_bytes()) +
                                " is more than all sandboxes together may use (" +
                                format_size(config_.budget.total_memory) + ", --total-memory)");
        return;
    }
    if (config_.budget.total_pids && asked.pids() > config_.budget.total_pids) {
        session->send_error(id, v1::INVALID_ARGUMENT,
                            "pids: " + std::to_string(asked.pids()) +
                                " is more than all sandboxes together may run (" +
                                std::to_string(config_.budget.total_pids) + ", --total-pids)");
        return;
    }
    // A host directory as a sandbox's root is the host's file system seen with the
    // sandbox's rights (an id-mapped view: files owned by host root look root-owned
    // inside): only root may choose one. Members make sandboxes from images.
    if (!req.rootfs().empty() && !session->root()) {
        session->send_error(id, v1::PERMISSION_DENIED,
                            "rootfs: only root may make a sandbox from a host directory; "
                            "use an image");
        return;
    }
    if (req.has_owner_uid() && !session->root()) {
        session->send_error(id, v1::PERMISSION_DENIED,
                            "owner_uid: only root may create a sandbox for another user");
        return;
    }
    // The host's privileged ports are root's, as for a program on the host (a group member
    // publishing :80 or :443 would take what the host's own services are known by).
    for (const auto& p : req.publish()) {
        if (p.host_port() > 0 && p.host_port() < 1024 && !session->root()) {
            session->send_error(id, v1::PERMISSION_DENIED,
                                "publish: host port " + std::to_string(p.host_port()) +
                                    " is below 1024: only root may publish it");
            return;
        }
    }
    const uid_t owner = req.has_owner_uid() ? req.owner_uid() : session->uid;
    if (!req.name().empty() &&
        (registry_.name_taken(req.name()) || pending_names_.count(req.name()))) {
        session->send_error(id, v1::ALREADY_EXISTS, "a sandbox named '" + req.name() + "' exists");
        return;
    }
    // Held from here on, so that a second create of the name fails while this one waits.
    if (!req.name().empty()) pending_names_.insert(req.name());
    std::weak_ptr<Session> weak = session;
    if (req.rootfs().empty()) {
        if (!resolve_image_) {
            pending_names_.erase(req.name());
            session->send_error(id, v1::UNAVAILABLE, "this daemon has no image store");
            return;
        }
        resolve_image_(req.image(), [this, weak, session_id = session->id, owner, id, req](
                                        v1::ErrorCode code, const std::string& error,
                                        const ResolvedImage& image) {
            if (code != v1::ERROR_CODE_UNSPECIFIED) {
                pending_names_.erase(req.name());
                if (auto session = weak.lock()) session->send_error(id, code, error);
                return;
            }
            create_sandbox(weak, session_id, owner, id, req, &image);
        });
        return;
    }
    create_sandbox(weak, session->id, owner, id, req, nullptr);
}

void Server::create_sandbox(const std::weak_ptr<Session>& weak, uint64_t session_id, uid_t owner,
                            uint64_t id, const v1::CreateSandbox& req, const ResolvedImage* image) {
    const auto& r = req.resources();
    const std::string sandbox_id = new_sandbox_id();
    std::string hostname = req.hostname().empty() ? sandbox_id.substr(0, 12) : req.hostname();

    v1::helper::Request hreq;
    auto* c = hreq.mutable_create();
    c->set_id(sandbox_id);
    if (image) {
        for (const auto& layer : image->layers) c->add_layers(layer);
    } else {
        c->set_rootfs(req.rootfs());
    }
    c->set_hostname(hostname);
    c->set_network(req.network());      // the helper refuses what it does not know
    *c->mutable_allow() = req.allow();  // and parses and checks these
    *c->mutable_host_ports() = req.host_ports();
    *c->mutable_publish() = req.publish();
    // The owner's group: the helper pairs only sandboxes whose keys are equal.
    if (!req.peer_group().empty())
        c->set_peer_group(std::to_string(owner) + ":" + req.peer_group());
    const uint64_t memory = r.memory_bytes() ? r.memory_bytes() : config_.budget.default_memory;
    const uint64_t pids = r.pids() ? r.pids() : config_.budget.default_pids;
    c->mutable_limits()->set_memory_bytes(memory);
    c->mutable_limits()->set_cpus(r.cpus());
    c->mutable_limits()->set_pids(pids);
    const uint64_t storage = r.storage_bytes() ? r.storage_bytes() : config_.default_storage_bytes;
    c->mutable_limits()->set_storage_bytes(storage);

    v1::SandboxInfo info;
    info.set_id(sandbox_id);
    info.set_name(req.name());
    info.set_rootfs(req.rootfs());
    info.set_hostname(hostname);
    info.set_network(req.network() == v1::NETWORK_MODE_UNSPECIFIED ? v1::NETWORK_NONE
                                                                   : req.network());
    std::string workdir = req.workdir();
    if (image) {
        info.set_image(image->name);
        info.set_image_digest(image->manifest_digest);
        *info.mutable_image_config() = image->config;
        if (workdir.empty()) workdir = image->config.working_dir();
    }
    info.set_workdir(workdir.empty() ? "/" : workdir);
    *info.mutable_resources() = req.resources();
    // The limits it got, defaults or not.
    info.mutable_resources()->set_memory_bytes(memory);
    info.mutable_resources()->set_pids(pids);
    info.mutable_resources()->set_storage_bytes(storage);  // the limit it got, default or not
    info.set_persistent(req.persistent());
    info.set_owner_uid(owner);

    if (image) creating_images_.insert(image->manifest_digest);
    helper_.call(std::move(hreq), [this, weak, session_id, id, req,
                                   info = std::move(info)](const v1::helper::Reply& reply) mutable {
        pending_names_.erase(req.name());
        if (!info.image_digest().empty()) {
            creating_images_.erase(creating_images_.find(info.image_digest()));
        }
        auto session = weak.lock();
        if (!reply.error().empty()) {
            if (session)
                session->send_error(id, wire::error_code_from_peer(reply.error_code()),
                                    reply.error());
            return;
        }
        const auto& created = reply.created();
        info.set_created_unix_ms(std::chrono::duration_cast<std::chrono::milliseconds>(
                                     std::chrono::system_clock::now().time_since_epoch())
                                     .count());
        info.set_init_pid(created.init_pid());
        info.set_state("running");
        *info.mutable_cgroup_paths() = created.cgroup_paths();
        info.set_cgroup_driver(config_.cgroup_driver);
        info.set_host_root_uid(created.host_root_uid());
        info.set_address(created.address());
        *info.mutable_allow() = created.allow();
        *info.mutable_host_ports() = req.host_ports();
        info.set_peer_group(req.peer_group());
        for (auto p : req.publish()) {
            if (p.host_ip().empty()) p.set_host_ip("127.0.0.1");
            *info.add_publish() = p;
        }
        const std::string sandbox_id = info.id();
        Sandbox& sandbox = registry_.add(std::move(info), created.init_socket(),
                                         created.init_start_time(), created.cgroup_name());
        if (session && sessions_.count(session_id)) {
            sandbox.owner_session = session_id;
        } else if (!req.persistent()) {
            sandbox.lease_deadline = Clock::now() + config_.lease;
        }
        try {
            registry_.save_meta(sandbox);
        } catch (const std::exception& e) {
            log("saving metadata of " + sandbox_id + ": " + e.what());
        }
        if (session) {
            v1::ServerMessage msg;
            msg.set_id(id);
            *msg.mutable_create()->mutable_sandbox() = sandbox.info;
            session->send(msg);
        }
    });
}

void Server::handle_exec(const std::shared_ptr<Session>& session, uint64_t id,
                         const v1::Exec& req) {
    if (std::string error = check_exec(req); !error.empty()) {
        session->send_error(id, v1::INVALID_ARGUMENT, error);
        return;
    }
    Sandbox* sandbox = find_or_reply(session, id, req.sandbox());
    if (!sandbox || !usable_or_reply(session, id, *sandbox)) return;
    if (session->execs.count(id) || session->file_ops.count(id)) {
        session->send_error(id, v1::INVALID_ARGUMENT,
                            "request id " + std::to_string(id) + " is in use");
        return;
    }
    auto op = std::make_shared<ExecOperation>(io_, session, id, *sandbox, dev_null_.get());
    session->execs[id] = op;
    op->start(req);
}

void Server::handle_file_op(const std::shared_ptr<Session>& session, const v1::ClientMessage& msg,
                            std::vector<UniqueFd> fds) {
    const uint64_t id = msg.id();
    std::string key, user_error;
    switch (msg.body_case()) {
        case v1::ClientMessage::kCopyIn:
            key = msg.copy_in().sandbox();
            user_error = check_user_spec("user", msg.copy_in().user());
            break;
        case v1::ClientMessage::kCopyOut:
            key = msg.copy_out().sandbox();
            break;
        case v1::ClientMessage::kStatPath:
            key = msg.stat_path().sandbox();
            break;
        case v1::ClientMessage::kMakeDirs:
            key = msg.make_dirs().sandbox();
            user_error = check_user_spec("user", msg.make_dirs().user());
            if (msg.make_dirs().mode() > 07777) user_error = "mode: more than 07777";
            break;
        case v1::ClientMessage::kRemovePath:
            key = msg.remove_path().sandbox();
            break;
        default:
            // (Only file operations come here; a new kind must be added above, not run as
            // another.)
            session->send_error(id, v1::INTERNAL, "not a file operation");
            return;
    }
    if (!user_error.empty()) {
        session->send_error(id, v1::INVALID_ARGUMENT, user_error);
        return;
    }
    Sandbox* sandbox = find_or_reply(session, id, key);
    if (!sandbox || !usable_or_reply(session, id, *sandbox)) return;
    if (session->execs.count(id) || session->file_ops.count(id)) {
        session->send_error(id, v1::INVALID_ARGUMENT,
                            "request id " + std::to_string(id) + " is in use");
        return;
    }
    auto op = std::make_shared<FileOperation>(io_, session, id, *sandbox);
    session->file_ops[id] = op;
    op->start(msg, std::move(fds));
}

bool Server::usable_or_reply(const std::shared_ptr<Session>& session, uint64_t id,
                             const Sandbox& sandbox) {
    if (sandbox.deleting) {
        session->send_error(id, v1::UNAVAILABLE,
                            "sandbox " + sandbox.info.id() + " is being deleted");
        return false;
    }
    if (sandbox.info.state() == "dead") {
        session->send_error(
            id, v1::UNAVAILABLE,
            "sandbox " + sandbox.info.id() + " is dead (its init exited); delete it");
        return false;
    }
    return true;
}

void Server::delete_sandbox(const std::string& sandbox_id,
                            std::function<void(v1::ErrorCode, std::string)> done) {
    if (Sandbox* s = registry_.by_id(sandbox_id)) s->deleting = true;
    v1::helper::Request hreq;
    hreq.mutable_delete_()->set_id(sandbox_id);
    helper_.call(std::move(hreq), [this, sandbox_id, done](const v1::helper::Reply& reply) {
        if (!reply.error().empty() && reply.error_code() != v1::NOT_FOUND) {
            if (Sandbox* s = registry_.by_id(sandbox_id)) s->deleting = false;
            done(wire::error_code_from_peer(reply.error_code()), reply.error());
            return;
        }
        registry_.remove(sandbox_id);
        done(v1::ERROR_CODE_UNSPECIFIED, "");
    });
}

void Server::handle_delete(const std::shared_ptr<Session>& session, uint64_t id,
                           const v1::DeleteSandbox& req) {
    Sandbox* sandbox = find_or_reply(session, id, req.sandbox());
    if (!sandbox) return;
    std::weak_ptr<Session> weak = session;
    delete_sandbox(sandbox->info.id(), [weak, id](v1::ErrorCode code, std::string message) {
        auto session = weak.lock();
        if (!session) return;
        if (!message.empty()) {
            session->send_error(id, code, message);
            return;
        }
        v1::ServerMessage msg;
        msg.set_id(id);
        msg.mutable_delete_();
        session->send(msg);
    });
}

void Server::handle_list(const std::shared_ptr<Session>& session, uint64_t id) {
    v1::ServerMessage msg;
    msg.set_id(id);
    auto* list = msg.mutable_list();
    for (Sandbox* s : registry_.all()) {
        if (session->root() || s->info.owner_uid() == session->uid)
            *list->add_sandboxes() = s->info;
    }
    session->send(msg);
}

void Server::handle_inspect(const std::shared_ptr<Session>& session, uint64_t id,
                            const v1::InspectSandbox& req) {
    Sandbox* sandbox = find_or_reply(session, id, req.sandbox());
    if (!sandbox) return;
    v1::ServerMessage msg;
    msg.set_id(id);
    auto* reply = msg.mutable_inspect();
    *reply->mutable_sandbox() = sandbox->info;
    if (sandbox->cgroup) {
        try {
            cgroup::Stats st = sandbox->cgroup->stats();
            auto* out = reply->mutable_stats();
            out->set_cpu_usage_ns(st.cpu_usage_ns);
            out->set_memory_bytes(st.memory_bytes);
            out->set_memory_peak_bytes(st.memory_peak_bytes);
            out->set_pids(st.pids);
            out->set_oom_kills(st.oom_kills);
        } catch (const std::exception& e) {
            session->send_error(id, v1::INTERNAL,
                                "reading stats of " + sandbox->info.id() + ": " + e.what());
            return;
        }
    }
    // How full a bounded writable layer is: only the helper can look (statfs through the
    // sandbox's init). Not on any exec's path; an inspect of an unbounded sandbox skips it.
    if (sandbox->info.resources().storage_bytes() == 0 || sandbox->info.state() != "running") {
        session->send(msg);
        return;
    }
    v1::helper::Request hreq;
    hreq.mutable_get_storage()->set_id(sandbox->info.id());
    std::weak_ptr<Session> weak = session;
    helper_.call(std::move(hreq),
                 [weak, msg = std::move(msg)](const v1::helper::Reply& reply) mutable {
                     auto session = weak.lock();
                     if (!session) return;
                     // A sandbox that died meanwhile still gets its inspect, without the storage
                     // count.
                     if (reply.has_storage()) {
                         auto* stats = msg.mutable_inspect()->mutable_stats();
                         stats->set_storage_used_bytes(reply.storage().used_bytes());
                         stats->set_storage_limit_bytes(reply.storage().limit_bytes());
                     }
                     session->send(msg);
                 });
}

void Server::handle_set_persistent(const std::shared_ptr<Session>& session, uint64_t id,
                                   const v1::SetPersistent& req) {
    Sandbox* sandbox = find_or_reply(session, id, req.sandbox());
    if (!sandbox) return;
    sandbox->info.set_persistent(req.persistent());
    if (req.persistent()) {
        sandbox->lease_deadline.reset();
    } else {
        // The caller takes the lease: it lasts as long as this connection.
        sandbox->owner_session = session->id;
        sandbox->lease_deadline.reset();
    }
    try {
        registry_.save_meta(*sandbox);
    } catch (const std::exception& e) {
        session->send_error(id, v1::INTERNAL, e.what());
        return;
    }
    v1::ServerMessage msg;
    msg.set_id(id);
    msg.mutable_set_persistent();
    session->send(msg);
}

void Server::handle_set_network(const std::shared_ptr<Session>& session, uint64_t id,
                                const v1::SetNetwork& req) {
    Sandbox* sandbox = find_or_reply(session, id, req.sandbox());
    if (!sandbox || !usable_or_reply(session, id, *sandbox)) return;
    v1::helper::Request hreq;
    auto* set = hreq.mutable_set_network();
    set->set_id(sandbox->info.id());
    set->set_network(req.network());  // the helper checks both
    *set->mutable_allow() = req.allow();
    std::weak_ptr<Session> weak = session;
    helper_.call(std::move(hreq), [this, weak, id, sandbox_id = sandbox->info.id(),
                                   mode = req.network()](const v1::helper::Reply& reply) {
        auto session = weak.lock();
        if (!reply.error().empty()) {
            if (session)
                session->send_error(id, wire::error_code_from_peer(reply.error_code()),
                                    reply.error());
            return;
        }
        // The sandbox may have been deleted while the helper worked: then there is nothing
        // to record, and the reply says so.
        std::string error;
        Sandbox* sandbox = registry_.find(sandbox_id, &error);
        if (!sandbox) {
            if (session) session->send_error(id, v1::NOT_FOUND, error);
            return;
        }
        sandbox->info.set_network(mode == v1::NETWORK_MODE_UNSPECIFIED ? v1::NETWORK_NONE : mode);
        sandbox->info.set_address(reply.network_set().address());
        *sandbox->info.mutable_allow() = reply.network_set().allow();
        try {
            registry_.save_meta(*sandbox);
        } catch (const std::exception& e) {
            log("saving metadata of " + sandbox_id + ": " + e.what());
        }
        if (!session) return;
        v1::ServerMessage msg;
        msg.set_id(id);
        *msg.mutable_set_network()->mutable_sandbox() = sandbox->info;
        session->send(msg);
    });
}

void Server::reattach() {
    size_t alive = 0, dead = 0;
    for (auto& found : registry_.scan()) {
        if (!found.alive) {
            ++dead;
            const std::string sid = found.info.id();
            delete_sandbox(sid, [sid](v1::ErrorCode, std::string message) {
                if (!message.empty()) log("cleaning up dead sandbox " + sid + ": " + message);
            });
            continue;
        }
        ++alive;
        found.info.set_state("running");
        Sandbox& s =
            registry_.add(found.info, found.init_socket, found.init_start_time, found.cgroup_name);
        if (!s.info.persistent()) s.lease_deadline = Clock::now() + config_.lease;
    }
    if (alive || dead) {
        log("reattached " + std::to_string(alive) + " sandbox(es); cleaning up " +
            std::to_string(dead) + " dead one(s)");
    }
}

void Server::check_leases() {
    const auto now = Clock::now();
    bool unknown = false;
    for (Sandbox* s : registry_.all()) {
        // A sandbox whose init died (OOM killer, an admin's kill) is dead, whatever it was.
        if (s->info.state() == "running") {
            try {
                if (!registry_.init_alive(*s)) {
                    log("sandbox " + s->info.id() + " is dead: its init (pid " +
                        std::to_string(s->info.init_pid()) + ") exited");
                    s->info.set_state("dead");
                }
            } catch (const std::exception& e) {
                // Out of fds or memory for a moment: that says nothing about the sandbox,
                // whose state is marked only on proof that its init is gone. Said once
                // per spell, not once per sandbox and tick.
                if (!liveness_unknown_logged_) {
                    log("cannot check sandboxes' inits: " + std::string(e.what()) +
                        "; keeping their state until it can");
                    liveness_unknown_logged_ = true;
                }
                unknown = true;
            }
        }
        if (s->deleting || !s->lease_deadline || *s->lease_deadline > now) continue;
        const std::string sid = s->info.id();
        log("lease of sandbox " + sid + " expired; deleting it");
        delete_sandbox(sid, [sid](v1::ErrorCode, std::string message) {
            if (!message.empty()) log("deleting " + sid + " after its lease: " + message);
        });
    }
    if (!unknown) liveness_unknown_logged_ = false;
    auto tick =
        std::min<std::chrono::milliseconds>(config_.lease / 4, std::chrono::milliseconds(1000));
    lease_timer_.expires_after(std::max(tick, std::chrono::milliseconds(50)));
    lease_timer_.async_wait([this](boost::system::error_code ec) {
        if (!ec) check_leases();
    });
}

}  // namespace berth::daemon
