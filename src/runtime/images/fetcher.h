// The registry fetcher: berth-images' pulls read registries through it, so the root process
// parses nothing a registry sends. One fetcher per pull, started by the root side
// (fetcher_sessions) and talked to over a socketpair (proto/berth/v1/fetch.proto):
//  - it runs as berthd's user, with no capability (bounding set included), no_new_privs and
//    SeccompProgram::worker_profile(network=true) (sockets, threads; no new process, no
//    ptrace, no mount);
//  - in a pid namespace of its own (it is pid 1 there: berthd and the sandboxes, which
//    share its uid or not, are out of its sight and reach) and a mount namespace of its own
//    whose root is a read-only tmpfs holding only the host's /usr and /etc (read-only), the
//    resolver's directory, /dev/{null,zero,random,urandom} and its own /proc: no /home,
//    /tmp, /var or /run, no berthd socket, no sandbox's init socket, no store (berth's
//    state and runtime directories are hidden by an empty tmpfs too, should they be under
//    /etc or /usr);
//  - it reads registries.conf and the credentials as bytes berth-images read for it, and
//    the client's credentials as the client sent them; it parses them.
// What it answers is checked by the puller as a registry's answers are: documents by
// digest, blobs by hashing them into the store as they arrive.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "rootfs-tools/document_parser.h"
#include "rootfs-tools/registry_session.h"

namespace berth::images_service {

struct FetcherSpec {
    std::string binary;  // berth-images itself (started again with --fetch-worker)
    uid_t uid = 0;       // berthd's user
    gid_t gid = 0;
    std::vector<std::string> hidden_dirs;  // empty in its mount namespace (state, runtime)
    // An existing directory its new root is mounted over while it is made (berth's state
    // directory: hidden anyway). The root holds /usr, /etc, /dev's four nodes and /proc.
    std::string root_staging;
    std::string registries_conf, auth_file;  // read again for every pull
};

// Sessions that each start a fetcher; `client_auth` is the client's credentials JSON (empty:
// none), handed on unparsed.
images::SessionFactory fetcher_sessions(FetcherSpec spec, std::string client_auth);

// The store's DocumentParser (rootfs-tools/document_parser.h): the same program as a parse
// worker (no network in its filter, named berth-parse), one long-lived process started when
// first needed and again after it died, so berth-images' root part parses no image document
// (an import's, or a stored one's).
std::shared_ptr<images::DocumentParser> remote_parser(FetcherSpec spec);

// The fetcher's main(): berth-images started with --fetch-worker (network) or --parse-worker
// (fd 3: the channel).
int fetcher_main(bool network);

}  // namespace berth::images_service
