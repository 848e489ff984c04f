// libFuzzer harness for the control-socket protocol (control layer, docs/control-protocol.md):
// proves that parse_request() and parse_reply() take any line a peer could send, that an accepted
// request obeys the protocol's rules (a resource where the op needs one, a node for fence and only
// there, timeouts in range) and survives encode_request() and parse_request() unchanged, that a
// refused one gets one of the three codes a parse can give (too-large exactly above the limit),
// whose reply survives encode_error() and parse_reply(), and that an accepted reply or event, and
// every resource status in it, survives being written and read again. Every input goes to both
// parsers: a request that reaches deep into one is a useful seed for the other. Single-threaded,
// as libFuzzer calls it.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "blkfence/assert.h"
#include "blkfence/control/protocol.h"
#include "blkfence/control/text.h"

namespace blkfence::control {
namespace {

using nlohmann::json;

// One line as the peer would read it: exactly one '\n', at the end.
std::string_view without_newline(const std::string& line) {
  BLKFENCE_ASSERT(!line.empty() && line.back() == '\n');
  BLKFENCE_ASSERT(line.find('\n') == line.size() - 1);
  return std::string_view(line).substr(0, line.size() - 1);
}

void check_request(std::string_view line) {
  const auto request = parse_request(line);
  if (!request) {
    const ProtocolError& error = request.error();
    BLKFENCE_ASSERT(!error.message.empty());
    BLKFENCE_ASSERT(error.code == ReplyError::kBadRequest ||
                    error.code == ReplyError::kUnsupportedVersion ||
                    error.code == ReplyError::kTooLarge);
    BLKFENCE_ASSERT((error.code == ReplyError::kTooLarge) == (line.size() > kMaxRequestSize));
    const auto reply = parse_reply(without_newline(encode_error(error)));
    BLKFENCE_ASSERT(reply.has_value());
    BLKFENCE_ASSERT(!reply->ok && !reply->is_event && reply->id == error.id);
    BLKFENCE_ASSERT(reply->error.has_value() && *reply->error == error);
    return;
  }
  BLKFENCE_ASSERT(line.size() <= kMaxRequestSize);
  BLKFENCE_ASSERT(request->resource.empty() ? !needs_resource(request->op)
                                            : is_valid_resource_name(request->resource));
  BLKFENCE_ASSERT(request->node.has_value() == (request->op == Op::kFence));
  BLKFENCE_ASSERT(!request->node || *request->node >= 1);
  BLKFENCE_ASSERT(!request->timeout ||
                  (request->timeout->count() >= 1 && *request->timeout <= kMaxTimeout));
  const std::string encoded = encode_request(*request);
  BLKFENCE_ASSERT(encoded.size() <= kMaxRequestSize);
  const auto again = parse_request(without_newline(encoded));
  BLKFENCE_ASSERT(again.has_value() && *again == *request);
}

// A status the reply carried, if it reads as one, must read the same after to_json().
void check_status(const json& value) {
  const auto status = resource_status_from_json(value);
  if (!status) {
    BLKFENCE_ASSERT(!status.error().empty());
    return;
  }
  const auto again = resource_status_from_json(to_json(*status));
  BLKFENCE_ASSERT(again.has_value() && *again == *status);
}

void check_reply(std::string_view line) {
  const auto reply = parse_reply(line);
  if (!reply) {
    BLKFENCE_ASSERT(!reply.error().empty());
    return;
  }
  BLKFENCE_ASSERT(line.size() <= kMaxReplySize);
  BLKFENCE_ASSERT(reply->body.is_object());
  BLKFENCE_ASSERT(!reply->body.contains("v"));
  if (reply->is_event) {
    BLKFENCE_ASSERT(reply->ok && !reply->id && !reply->error);
    BLKFENCE_ASSERT(reply->body["event"].is_string());
    json line_again = reply->body;
    line_again["v"] = kProtocolVersion;
    const auto again = parse_reply(line_again.dump(-1, ' ', false, json::error_handler_t::replace));
    BLKFENCE_ASSERT(again.has_value() && *again == *reply);
  } else if (reply->ok) {
    BLKFENCE_ASSERT(reply->id.has_value() && !reply->error);
    for (const char* envelope : {"id", "ok", "error", "event"}) {
      BLKFENCE_ASSERT(!reply->body.contains(envelope));
    }
    const auto again = parse_reply(without_newline(encode_ok(*reply->id, reply->body)));
    BLKFENCE_ASSERT(again.has_value() && *again == *reply);
  } else {
    BLKFENCE_ASSERT(reply->error.has_value() && reply->error->id == reply->id);
    const auto again = parse_reply(without_newline(encode_error(*reply->error)));
    BLKFENCE_ASSERT(again.has_value() && !again->ok && again->id == reply->id);
    BLKFENCE_ASSERT(again->error == reply->error);
  }
  if (const auto status = reply->body.find("status"); status != reply->body.end()) {
    check_status(*status);
  }
  if (const auto resources = reply->body.find("resources");
      resources != reply->body.end() && resources->is_array()) {
    for (const json& status : *resources) {
      check_status(status);
    }
  }
}

}  // namespace
}  // namespace blkfence::control

// NOLINTNEXTLINE(readability-identifier-naming): the name libFuzzer calls.
extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view line(reinterpret_cast<const char*>(data), size);
  blkfence::control::check_request(line);
  blkfence::control::check_reply(line);
  return 0;
}
