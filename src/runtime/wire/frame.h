// Framing shared by every berth channel: a 4-byte big-endian length, then a protobuf.
// Blocking helpers for the synchronous sides (helper, init, CLI); berthd frames the same
// bytes with asio.
#pragma once

#include <google/protobuf/message_lite.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/unique_fd.h"

namespace berth::wire {

inline constexpr uint32_t kDefaultMaxFrame = 4u << 20;  // client protocol
inline constexpr uint32_t kInitMaxFrame = 1u << 20;     // daemon <-> init
inline constexpr uint32_t kProtocolVersion = 1;

// Header + payload, ready to write.
std::string encode_frame(const google::protobuf::MessageLite& msg);
uint32_t decode_length(const unsigned char header[4]);

// Why reading a frame stopped.
enum class ReadStatus { ok, eof, too_large, malformed };

// Reads one frame from a blocking fd into `msg`. Fds that arrive with it (SCM_RIGHTS) are
// appended to `fds` when given, otherwise closed. Throws SysError on I/O errors.
ReadStatus read_frame(int fd, google::protobuf::MessageLite& msg, uint32_t max_bytes,
                      std::vector<UniqueFd>* fds = nullptr);

// Writes one frame to a blocking fd, with `fds` attached to its first byte.
// Throws SysError (EPIPE included) on failure.
void write_frame(int fd, const google::protobuf::MessageLite& msg,
                 const std::vector<int>& fds = {});

}  // namespace berth::wire
