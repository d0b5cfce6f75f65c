// berthd's request handling: client sessions, sandbox lifecycle, execs, leases.
#pragma once

#include <boost/asio.hpp>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "base/unique_fd.h"
#include "berth.pb.h"
#include "runtime/daemon/framed_socket.h"
#include "runtime/daemon/helper_client.h"
#include "runtime/daemon/host_budget.h"
#include "runtime/daemon/sandboxes.h"
#include "runtime/daemon/validate.h"

namespace berth::daemon {

class ExecOperation;
class FileOperation;
class ImageClient;

struct ServerConfig {
    std::string socket_path;
    std::string runtime_dir;
    uint32_t max_frame = 4u << 20;
    std::chrono::milliseconds lease{60'000};
    uid_t daemon_uid = 0;
    gid_t allowed_gid = 0;  // members of this group may connect (and root, and us)
    std::string allowed_group_name = "berth";
    std::string cgroup_driver;           // "v1" | "v2", as the helper reported
    std::string network;                 // the helper's account of the public network
    std::string pool;                    // and of its pool of sandbox shells
    uint64_t default_storage_bytes = 0;  // for creates that give none; 0 = no limit
    // What all sandboxes may use together (set on the parent cgroup by the helper) and the
    // memory and pids limits of a create that gives none.
    HostBudget budget{0, 0, 0, 4096};
    // Client connections berthd keeps open, in all and per uid other than root's (each
    // costs an fd and up to one read of buffer; main.cc sizes them from RLIMIT_NOFILE).
    size_t max_connections = 1024;
    size_t max_connections_per_user = 256;
    // Bytes of unfinished frames all clients together may hold beyond one read each.
    size_t read_budget_bytes = 64u << 20;
    std::chrono::milliseconds frame_timeout{30'000};
};

// An image reference resolved for a create: the name it has in the store, the manifest it
// points at, its layers (diff_id hex, top first) and its run settings.
struct ResolvedImage {
    std::string name;
    std::string manifest_digest;
    std::vector<std::string> layers;
    v1::ImageRunConfig config;
};
// Resolves a reference asynchronously; `done` gets ERROR_CODE_UNSPECIFIED on success, else
// the code and a message that names the reference. Called on the io thread.
using ImageResolver = std::function<void(
    const std::string& reference,
    std::function<void(v1::ErrorCode, const std::string&, const ResolvedImage&)> done)>;

// One client connection.
class Session : public std::enable_shared_from_this<Session> {
  public:
    Session(uint64_t id, std::shared_ptr<FramedSocket> socket, uid_t uid)
        : id(id), socket(std::move(socket)), uid(uid) {}
    void send(const v1::ServerMessage& msg);
    void send_error(uint64_t request_id, v1::ErrorCode code, const std::string& message);

    const uint64_t id;
    std::shared_ptr<FramedSocket> socket;
    // The peer's uid (SO_PEERCRED at connect): what sandboxes it creates are recorded as
    // owned by, and what it may reach (its own sandboxes; root reaches all).
    const uid_t uid;
    bool root() const { return uid == 0; }
    bool said_hello = false;
    std::map<uint64_t, std::shared_ptr<ExecOperation>> execs;
    std::map<uint64_t, std::shared_ptr<FileOperation>> file_ops;
};

// berthd's exit status when berth-helper or berth-images died: the service must be started
// again (docs/architecture.md, "Children's deaths").
inline constexpr int kExitChildLost = 3;

class Server {
  public:
    Server(asio::io_context& io, ServerConfig config, std::shared_ptr<FramedSocket> helper_channel,
           std::unique_ptr<cgroup::Driver> driver);
    // Binds the client socket, reattaches to existing sandboxes and starts serving.
    void start();
    void stop();
    // Serves a client connected by other means than the listening socket (the fuzz target
    // of request dispatch; socket activation later): as if just accepted.
    void serve(UnixSocket socket) { on_connection(std::move(socket)); }
    // What main returns once the io loop ends: 0 after a signal, kExitChildLost when a
    // child service died.
    int exit_code() const { return exit_code_; }
    // How creates from an image find it (the image service); without one they fail.
    void set_image_resolver(ImageResolver resolver) { resolve_image_ = std::move(resolver); }
    // The image service (berth-images): image requests are forwarded to it, and creates
    // resolve their image with it (this sets the image resolver). image_handlers.cc.
    void set_images(std::shared_ptr<ImageClient> images);

  private:
    void accept_next();
    void on_connection(UnixSocket socket);
    void on_frame(const std::shared_ptr<Session>& session, std::string&& payload);
    void on_closed(const std::shared_ptr<Session>& session);

    void handle_hello(const std::shared_ptr<Session>&, uint64_t id, const v1::Hello&);
    void handle_create(const std::shared_ptr<Session>&, uint64_t id, const v1::CreateSandbox&);
    void handle_exec(const std::shared_ptr<Session>&, uint64_t id, const v1::Exec&);
    void handle_file_op(const std::shared_ptr<Session>&, const v1::ClientMessage&,
                        std::vector<UniqueFd> fds);
    // The part of a create after its image (if any) is resolved.
    void create_sandbox(const std::weak_ptr<Session>& session, uint64_t session_id, uid_t owner,
                        uint64_t id, const v1::CreateSandbox& req, const ResolvedImage* image);
    void handle_delete(const std::shared_ptr<Session>&, uint64_t id, const v1::DeleteSandbox&);
    void handle_list(const std::shared_ptr<Session>&, uint64_t id);
    void handle_inspect(const std::shared_ptr<Session>&, uint64_t id, const v1::InspectSandbox&);
    void handle_set_persistent(const std::shared_ptr<Session>&, uint64_t id,
                               const v1::SetPersistent&);
    void handle_set_network(const std::shared_ptr<Session>&, uint64_t id, const v1::SetNetwork&);

    // The sandbox named by `key`, or nullptr after replying NOT_FOUND to request `id`.
    // Finds the sandbox `key` names and checks that the session may use it (its owner or
    // root); otherwise replies NOT_FOUND or PERMISSION_DENIED and returns null.
    Sandbox* find_or_reply(const std::shared_ptr<Session>& session, uint64_t id,
                           const std::string& key);
    // False after replying UNAVAILABLE when the sandbox is being deleted or is dead.
    bool usable_or_reply(const std::shared_ptr<Session>& session, uint64_t id,
                         const Sandbox& sandbox);
    // Deletes through the helper; `done(error)` gets "" on success.
    void delete_sandbox(const std::string& id,
                        std::function<void(v1::ErrorCode, std::string)> done);
    void reattach();
    void check_leases();
    bool liveness_unknown_logged_ = false;
    int exit_code_ = 0;
    bool peer_allowed(int fd, uid_t* uid, std::string* who);

    asio::io_context& io_;
    ServerConfig config_;
    std::unique_ptr<cgroup::Driver> driver_;
    HelperClient helper_;
    SandboxRegistry registry_;
    asio::local::stream_protocol::acceptor acceptor_;
    asio::steady_timer lease_timer_;
    // After accept() fails for want of fds or memory: wait a moment instead of spinning on
    // a backlog that cannot be taken.
    asio::steady_timer accept_backoff_;
    bool accept_failure_logged_ = false;
    std::shared_ptr<ReadBudget> read_budget_;
    std::map<uid_t, size_t> connections_by_uid_;
    std::map<uint64_t, std::shared_ptr<Session>> sessions_;
    uint64_t next_session_ = 1;
    std::set<std::string> pending_names_;
    // Manifest digests of images whose sandboxes are being created (resolved, not yet in
    // the registry): in use, for remove and prune, like those of live sandboxes.
    std::multiset<std::string> creating_images_;
    UniqueFd dev_null_;  // stdin of an exec that has none (borrowed by each ExecOperation)
    ImageResolver resolve_image_;

    // Image requests (image_handlers.cc): checked here, forwarded to berth-images with the
    // client's fd, its progress and reply passed back.
    void handle_image(const std::shared_ptr<Session>&, const v1::ClientMessage&,
                      std::vector<UniqueFd> fds);
    // Cancel of an image request of the session: false if `id` is none.
    bool cancel_image(const std::shared_ptr<Session>&, uint64_t id);
    // The session is gone: its image requests are abandoned (and cancelled).
    void abandon_images(uint64_t session_id);
    std::shared_ptr<ImageClient> images_;
    // (session id, request id) -> the berth-images call carrying it.
    std::map<std::pair<uint64_t, uint64_t>, uint64_t> image_calls_;
};

}  // namespace berth::daemon
