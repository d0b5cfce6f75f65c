// Checks of what a client sends, before the daemon acts on it. Unprivileged: runs in berthd.
//
// Every field a client fills is a stranger's input (a member of group berth is not root):
// each check names the field it refuses, so the client gets INVALID_ARGUMENT with a message
// it can act on, and nothing odd (a NUL that would cut a path short, a uid of -1 that
// setresuid reads as "unchanged", a NaN that compares false against every bound) gets
// further. Pure functions, unit-tested without a daemon (tests/runtime/validate_test.cc).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "berth.pb.h"

namespace berth::daemon {

// The smallest storage limit (--storage, --default-storage): below it not even an empty
// layer's metadata fits.
inline constexpr uint64_t kMinStorageBytes = uint64_t{1} << 20;

// Each returns "" when the value is acceptable, else a message that starts with the field.

// [A-Za-z0-9][A-Za-z0-9_.-]{0,63}, and not something that could be read as a sandbox id or
// id prefix (4+ lowercase hex digits): ids resolve before names, so such a name could only
// ever shadow, or be shadowed by, somebody's sandbox.
std::string check_sandbox_name(std::string_view name);

// A user as exec and copy take it: "" (the default), a name or a number, optionally ":"
// and a group name or number. Names are what passwd allows (no ':' or control characters,
// at most 32 bytes); numbers are decimal below 4294967295 ((uid_t)-1 means "leave as is"
// to setresuid). Whether the id is mapped in the sandbox is checked by its init.
std::string check_user_spec(std::string_view field, std::string_view spec);

// A path inside a sandbox: no NUL, at most PATH_MAX bytes; `absolute` requires a leading
// '/'; `allow_empty` lets "" mean the default.
std::string check_sandbox_path(std::string_view field, std::string_view path, bool absolute,
                               bool allow_empty);

// Limits: cpus finite and in [0, 1024]; memory 0 or 4 MiB..16 EiB-ish (at most 1 PiB);
// pids at most 4194304 (the kernel's pid_max ceiling).
std::string check_resources(const v1::Resources& resources);

// A whole create: exactly one of image and rootfs (an absolute host path without NUL),
// name, hostname, workdir and resources.
std::string check_create(const v1::CreateSandbox& req);

// A whole exec: argv non-empty with a non-empty argv[0], no NUL in argv, env entries
// "KEY=value" with a non-empty key and no NUL, cwd, user, timeout at most 30 days.
std::string check_exec(const v1::Exec& req);

}  // namespace berth::daemon
