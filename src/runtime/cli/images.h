// The image commands of the CLI: pull, images, rmi and `image` (import, export, bootstrap,
// inspect, prune). What is read or written on the host (an archive, a layout directory, an
// export's destination, the registry credentials) is opened here with the caller's own
// rights and handed to the daemon as an fd or as bytes; the daemon never opens a path the
// caller named.
#pragma once

#include <google/protobuf/message.h>

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "runtime/client/client.h"

namespace berth::cli {

// A reply as the CLI prints it: JSON with the .proto field names and every field shown.
std::string to_json(const google::protobuf::Message& msg, bool pretty = true);

class ImageCommands {
  public:
    // Adds the subcommands to `app`.
    explicit ImageCommands(CLI::App& app);
    // Whether one of them was given.
    bool parsed() const;
    // Runs it; returns the exit code. Throws ClientError / std::exception for the user.
    int run(client::Client& c);

  private:
    int pull(client::Client& c);
    int images(client::Client& c);
    int rmi(client::Client& c);
    int prune(client::Client& c);
    int import(client::Client& c);
    int export_image(client::Client& c);
    int bootstrap(client::Client& c);
    int inspect(client::Client& c);

    CLI::App *pull_ = nullptr, *images_ = nullptr, *rmi_ = nullptr, *prune_ = nullptr,
             *import_ = nullptr, *export_ = nullptr, *bootstrap_ = nullptr, *inspect_ = nullptr;
    std::string reference_, authfile_, platform_, path_, name_;
    std::vector<std::string> references_;
    bool quiet_ = false, json_ = false, digests_ = false, force_ = false;
};

// "1.2MB", as docker shows sizes (decimal units).
std::string human_size(uint64_t bytes);

// The registry credentials to send with a pull: `authfile` when given (it must exist),
// else $REGISTRY_AUTH_FILE, else ~/.docker/config.json if present; "" for none.
std::string read_auth_config(const std::string& authfile);

}  // namespace berth::cli
