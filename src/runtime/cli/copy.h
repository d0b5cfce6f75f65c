// `berth cp` and `berth fs`: file transfer between the host and a sandbox, docker cp-like.
// The host side of every copy happens here, with the caller's own rights: the daemon only
// passes the pipe the stream flows through.
#pragma once

#include <string>

#include "runtime/client/client.h"

namespace berth::cli {

struct CopyArgs {
    std::string source, destination;
    bool archive = false;  // -a: keep uid/gid numbers
    std::string user;      // owner of uploaded files (default root of the sandbox)
};

// Returns the exit code; throws ClientError / std::exception with a message for the user.
int run_copy(client::Client& c, const CopyArgs& args);

// A "SANDBOX:PATH" argument, split; false if `arg` names a host path (no colon, or a
// slash before the first colon: ./a:b is a host file).
bool split_remote(const std::string& arg, std::string* sandbox, std::string* path);

int run_fs_stat(client::Client& c, const std::string& target, bool follow, bool json);
int run_fs_mkdir(client::Client& c, const std::string& target, const std::string& user,
                 const std::string& mode);
int run_fs_rm(client::Client& c, const std::string& target, bool recursive);

}  // namespace berth::cli
