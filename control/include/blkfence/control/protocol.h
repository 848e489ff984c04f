// The control-socket protocol, version 1, both ends (control layer; docs/control-protocol.md).
//
// One JSON object per line over a SOCK_STREAM unix socket. blkfenced parses requests and encodes
// replies and events; blkfencectl encodes requests and parses replies. This file only turns lines
// into values and back: framing, permissions and timers belong to the server. Malformed input is
// an error value, never an exception or a crash (nlohmann::json is used with exceptions off on
// every input path, and dumps replace invalid UTF-8). Pure functions, thread-safe.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>
#include <tl/expected.hpp>

namespace blkfence::control {

inline constexpr int kProtocolVersion = 1;
// A request line, not counting its '\n'; longer ones are answered with kTooLarge and the
// connection is closed (the rest of the line cannot be told from the next request).
inline constexpr std::size_t kMaxRequestSize = std::size_t{64} * 1024;
// A reply or event line, not counting its '\n': a status of many resources of 64 LUs each outgrows
// 64 KiB, so the client allows more.
inline constexpr std::size_t kMaxReplySize = std::size_t{16} * 1024 * 1024;
// Nesting of JSON arrays and objects accepted in a line; version 1 nests 6 deep (a status reply).
inline constexpr int kMaxJsonDepth = 32;
// What the server enforces (docs/control-protocol.md, "Limits").
inline constexpr std::size_t kMaxClients = 64;
inline constexpr std::chrono::seconds kPartialLineTimeout{5};
// timeout_ms accepts 1..kMaxTimeout.
inline constexpr std::chrono::milliseconds kMaxTimeout{3'600'000};

enum class Op : std::uint8_t {
  kStatus,
  kAcquire,
  kRelease,
  kFence,
  kUnfence,
  kKeys,
  kWatch,
  kGate,
  kMetrics,
  kPromote
};

struct Request {
  std::uint64_t id = 0;
  Op op = Op::kStatus;
  std::string resource;               // empty: all resources (status, watch, metrics only)
  std::optional<std::uint16_t> node;  // fence only, and required there: the node to fence
  std::optional<std::chrono::milliseconds> timeout;

  friend bool operator==(const Request&, const Request&) = default;
};

enum class ReplyError : std::uint8_t {
  kBadRequest,
  kUnsupportedVersion,
  kTooLarge,
  kUnknownResource,
  kPermissionDenied,
  kConflict,
  kIndeterminate,
  kDevice,
  kTimeout,
  kBusy,
  kInternal
};

struct ProtocolError {
  std::optional<std::uint64_t> id;  // the request's, when it could be read
  ReplyError code = ReplyError::kInternal;
  std::string message;

  friend bool operator==(const ProtocolError&, const ProtocolError&) = default;
};

// Whether the op changes state, so that only root and control_group may send it (SO_PEERCRED).
bool changes_state(Op op);
// Whether the request must name a resource (acquire, release, fence, unfence, keys, gate).
bool needs_resource(Op op);

// line: one line without its '\n'. Every error carries the request's id when it could be read.
[[nodiscard]] tl::expected<Request, ProtocolError> parse_request(std::string_view line);
// One line, with its trailing '\n'.
std::string encode_request(const Request& request);

struct LuStatus {
  std::string wwn;
  std::vector<std::string> devices;
  std::optional<std::uint64_t> holder;  // 0 under an all-registrants type (SPC-4 5.13.10)
  std::vector<std::uint64_t> keys;
  std::string error;  // empty when fine

  friend bool operator==(const LuStatus&, const LuStatus&) = default;
};

struct ResourceStatus {
  std::string name;
  std::string mode;   // "exclusive" | "shared"
  std::string state;  // "released" | "acquiring" | "held" | "fenced" | "lost-contact" |
                      // "releasing" | "unknown" | "unfencing" | "unfenced"
  bool gate_open = false;
  std::optional<std::uint64_t> key;
  std::uint32_t epoch = 0;
  std::optional<std::uint64_t> fenced_by;  // the key that preempted ours, when known
  std::optional<std::int64_t> last_check_age_ms;
  std::string detail;  // a sentence on the last change
  std::vector<LuStatus> lus;

  friend bool operator==(const ResourceStatus&, const ResourceStatus&) = default;
};

// {"v":1,"id":id,"ok":true} and the members of payload (an object, or null for none). The
// envelope's members win over payload members of the same name.
std::string encode_ok(std::uint64_t id, const nlohmann::json& payload);
std::string encode_error(const ProtocolError& error);

enum class Event : std::uint8_t { kGate, kFenced, kAcquired, kReleased, kLostContact, kState };
// {"v":1,"event":...,"resource":status.name,"status":{...}}, a line for `watch` clients.
std::string encode_event(Event event, const ResourceStatus& status);

// Keys as "0x%016x" strings, absent optionals as null, an empty error as null.
nlohmann::json to_json(const ResourceStatus& status);
[[nodiscard]] tl::expected<ResourceStatus, std::string> resource_status_from_json(
    const nlohmann::json& json);

// clang-tidy 14 reports bugprone-exception-escape for the implicit move constructor of structs
// like this one (llvm/llvm-project#54668); the static_assert below shows that it cannot throw.
struct Reply {                      // NOLINT(bugprone-exception-escape)
  std::optional<std::uint64_t> id;  // nullopt for events and for errors about unreadable requests
  bool ok = false;                  // true for events
  nlohmann::json body;              // the line's object without the envelope (v, id, ok, error)
  std::optional<ProtocolError> error;  // when !ok
  bool is_event = false;               // body["event"] names it

  friend bool operator==(const Reply&, const Reply&) = default;
};
static_assert(std::is_nothrow_move_constructible_v<Reply>);

// line: one line without its '\n', up to kMaxReplySize. A message when it is not a version 1
// reply or event. Unknown members are kept in body; an unknown error code reads as kInternal with
// the code in the message.
[[nodiscard]] tl::expected<Reply, std::string> parse_reply(std::string_view line);

// Wire names: "status", "bad-request", "lost-contact", ...
std::string_view to_string(Op op);
std::string_view to_string(ReplyError code);
std::string_view to_string(Event event);
std::optional<Op> op_from_string(std::string_view name);
std::optional<ReplyError> reply_error_from_string(std::string_view name);

// "0x" and 16 lower-case hex digits; and back (also 1 to 16 digits, and 0, which READ
// RESERVATION reports as the holder under all-registrants types).
std::string format_key(std::uint64_t key);
std::optional<std::uint64_t> parse_key(std::string_view text);

}  // namespace blkfence::control
