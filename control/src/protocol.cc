// Encoding and parsing of control-socket lines, version 1 (control layer). Every parse goes through
// parse_line(), which never throws, bounds the nesting (so that nothing recursive runs over a
// hostile depth later: dumps, copies, comparisons) and refuses duplicate members. Every encode
// goes through dump_line(), which replaces invalid UTF-8 instead of throwing. Pure, thread-safe.
#include "blkfence/control/protocol.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <cstdio>
#include <utility>

#include "blkfence/control/text.h"

namespace blkfence::control {
namespace {

using nlohmann::json;

constexpr std::size_t kMaxQuoted = 48;  // how much of a bad value a message repeats

constexpr std::array<std::string_view, 10> kOpNames{"status",  "acquire", "release", "fence",
                                                    "unfence", "keys",    "watch",   "gate",
                                                    "metrics", "promote"};
constexpr std::array<std::string_view, 11> kErrorNames{
    "bad-request", "unsupported-version", "too-large", "unknown-resource", "permission-denied",
    "conflict",    "indeterminate",       "device",    "timeout",          "busy",
    "internal"};
constexpr std::array<std::string_view, 6> kEventNames{"gate",     "fenced",       "acquired",
                                                      "released", "lost-contact", "state"};
constexpr std::array<std::string_view, 6> kRequestMembers{"v",        "id",   "op",
                                                          "resource", "node", "timeout_ms"};
constexpr std::array<std::string_view, 5> kEnvelope{"v", "id", "ok", "error", "event"};

std::string dump_line(const json& value) {
  return value.dump(-1, ' ', false, json::error_handler_t::replace);
}

// A JSON string literal of text, cut to kMaxQuoted bytes: how messages repeat names and values.
std::string quote(std::string_view text) {
  const std::size_t cut = utf8_cut(text, kMaxQuoted);
  std::string quoted = dump_line(json(std::string(text.substr(0, cut))));
  if (cut < text.size()) {
    quoted += "...";
  }
  return quoted;
}

// A value as a message repeats it: scalars as written (strings cut), else the kind.
std::string describe(const json& value) {
  switch (value.type()) {
    case json::value_t::string: return quote(value.get_ref<const std::string&>());
    case json::value_t::array: return "an array";
    case json::value_t::object: return "an object";
    case json::value_t::binary: return "binary data";
    case json::value_t::discarded: return "nothing";
    case json::value_t::null:
    case json::value_t::boolean:
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
    case json::value_t::number_float: return dump_line(value);
  }
  return "nothing";
}

std::optional<std::uint64_t> as_uint(const json& value) {
  if (value.is_number_unsigned()) {
    return value.get<std::uint64_t>();
  }
  if (value.is_number_integer() && value.get<std::int64_t>() >= 0) {
    return static_cast<std::uint64_t>(value.get<std::int64_t>());
  }
  return std::nullopt;
}

// What parse_line() noticed besides the value.
struct LineFlags {
  bool too_deep = false;
  std::optional<std::string> duplicate;  // a member named twice in the top-level object
};

// json::parse() with exceptions off (a discarded value when the line is not JSON), its nesting
// bounded by kMaxJsonDepth and duplicate top-level members noted: JSON parsers disagree on which
// of two wins, so neither does.
json parse_line(std::string_view line, LineFlags& flags) {
  std::vector<std::string> members;
  const json::parser_callback_t callback = [&flags, &members](int depth, json::parse_event_t event,
                                                              json& value) {
    if (depth >= kMaxJsonDepth) {
      flags.too_deep = true;
      return false;  // keep nothing of what is too deep
    }
    if (event == json::parse_event_t::key && depth == 1 && value.is_string()) {
      const auto& name = value.get_ref<const std::string&>();
      if (std::find(members.begin(), members.end(), name) != members.end()) {
        if (!flags.duplicate) {
          flags.duplicate = name;
        }
      } else {
        members.push_back(name);
      }
    }
    return true;
  };
  return json::parse(line.begin(), line.end(), callback, false);
}

// Why a parsed line is not a JSON object, or nullopt.
std::optional<std::string> object_problem(const json& value, const LineFlags& flags,
                                          std::string_view what) {
  if (flags.too_deep) {
    return std::string(what) + " is nested deeper than " + std::to_string(kMaxJsonDepth) +
           " levels";
  }
  if (value.is_discarded()) {
    return std::string(what) + " is not valid JSON (one UTF-8 JSON object per line)";
  }
  if (!value.is_object()) {
    return std::string(what) + " is a JSON object, got " + describe(value);
  }
  if (flags.duplicate) {
    return std::string(what) + " names the member " + quote(*flags.duplicate) + " twice";
  }
  return std::nullopt;
}

// Appends `,"name":value` (without the comma for the first member) to a line being written by
// hand, so that the envelope leads in a fixed order.
void append_member(std::string& line, std::string_view name, const json& value) {
  line += line.size() > 1 ? "," : "";
  line += dump_line(json(std::string(name)));
  line += ':';
  line += dump_line(value);
}

json key_or_null(const std::optional<std::uint64_t>& key) {
  return key ? json(format_key(*key)) : json(nullptr);
}

json keys_array(const std::vector<std::uint64_t>& keys) {
  json array = json::array();
  for (const std::uint64_t key : keys) {
    array.push_back(format_key(key));
  }
  return array;
}

// Reading a status object: each accessor names the member it failed on, with its path.
class Fields {
 public:
  Fields(const json& object, std::string path) : object_(object), path_(std::move(path)) {}

  const json* find(std::string_view name) const {
    const auto it = object_.find(name);
    return it == object_.end() ? nullptr : &*it;
  }
  std::string problem(std::string_view name, std::string_view expected, const json* value) const {
    return path_ + "." + std::string(name) + ": expected " + std::string(expected) + ", got " +
           (value == nullptr ? std::string("nothing") : describe(*value));
  }

  tl::expected<std::string, std::string> string(std::string_view name, bool required) const {
    const json* value = find(name);
    if (value == nullptr && !required) {
      return std::string();
    }
    if (value == nullptr || !value->is_string()) {
      return tl::unexpected(problem(name, "a string", value));
    }
    return value->get<std::string>();
  }
  // A string or null (or absent): null reads as "".
  tl::expected<std::string, std::string> nullable_string(std::string_view name) const {
    const json* value = find(name);
    if (value == nullptr || value->is_null()) {
      return std::string();
    }
    if (!value->is_string()) {
      return tl::unexpected(problem(name, "a string or null", value));
    }
    return value->get<std::string>();
  }
  tl::expected<std::optional<std::uint64_t>, std::string> nullable_key(
      std::string_view name) const {
    const json* value = find(name);
    if (value == nullptr || value->is_null()) {
      return std::optional<std::uint64_t>();
    }
    const auto key =
        value->is_string() ? parse_key(value->get_ref<const std::string&>()) : std::nullopt;
    if (!key) {
      return tl::unexpected(problem(name, "a key \"0x...\" or null", value));
    }
    return std::optional<std::uint64_t>(*key);
  }
  tl::expected<std::vector<std::string>, std::string> strings(std::string_view name) const {
    const json* value = find(name);
    if (value == nullptr || !value->is_array()) {
      return tl::unexpected(problem(name, "an array of strings", value));
    }
    std::vector<std::string> out;
    for (const json& element : *value) {
      if (!element.is_string()) {
        return tl::unexpected(problem(name, "an array of strings", &element));
      }
      out.push_back(element.get<std::string>());
    }
    return out;
  }
  tl::expected<std::vector<std::uint64_t>, std::string> keys(std::string_view name) const {
    const json* value = find(name);
    if (value == nullptr || !value->is_array()) {
      return tl::unexpected(problem(name, "an array of keys \"0x...\"", value));
    }
    std::vector<std::uint64_t> out;
    for (const json& element : *value) {
      const auto key =
          element.is_string() ? parse_key(element.get_ref<const std::string&>()) : std::nullopt;
      if (!key) {
        return tl::unexpected(problem(name, "an array of keys \"0x...\"", &element));
      }
      out.push_back(*key);
    }
    return out;
  }

 private:
  const json& object_;
  std::string path_;
};

tl::expected<LuStatus, std::string> lu_status_from_json(const json& value, std::string path) {
  if (!value.is_object()) {
    return tl::unexpected(path + ": expected an object, got " + describe(value));
  }
  const Fields fields(value, std::move(path));
  LuStatus lu;
  auto wwn = fields.string("wwn", true);
  auto devices = fields.strings("devices");
  auto holder = fields.nullable_key("holder");
  auto keys = fields.keys("keys");
  auto error = fields.nullable_string("error");
  if (!wwn || !devices || !holder || !keys || !error) {
    return tl::unexpected(!wwn       ? wwn.error()
                          : !devices ? devices.error()
                          : !holder  ? holder.error()
                          : !keys    ? keys.error()
                                     : error.error());
  }
  lu.wwn = std::move(*wwn);
  lu.devices = std::move(*devices);
  lu.holder = *holder;
  lu.keys = std::move(*keys);
  lu.error = std::move(*error);
  return lu;
}

ProtocolError request_error(std::optional<std::uint64_t> id, ReplyError code, std::string message) {
  return ProtocolError{id, code, std::move(message)};
}

std::string ops_list() {
  std::string list;
  for (const std::string_view name : kOpNames) {
    list += list.empty() ? "" : ", ";
    list += name;
  }
  return list;
}

}  // namespace

bool changes_state(Op op) {
  return op == Op::kAcquire || op == Op::kRelease || op == Op::kFence || op == Op::kUnfence ||
         op == Op::kPromote;
}

bool needs_resource(Op op) {
  return op != Op::kStatus && op != Op::kWatch && op != Op::kMetrics;
}

std::string_view to_string(Op op) {
  const auto index = static_cast<std::size_t>(op);
  return index < kOpNames.size() ? kOpNames[index] : "unknown";
}

std::string_view to_string(ReplyError code) {
  const auto index = static_cast<std::size_t>(code);
  return index < kErrorNames.size() ? kErrorNames[index] : "internal";
}

std::string_view to_string(Event event) {
  const auto index = static_cast<std::size_t>(event);
  return index < kEventNames.size() ? kEventNames[index] : "state";
}

std::optional<Op> op_from_string(std::string_view name) {
  const auto* found = std::find(kOpNames.begin(), kOpNames.end(), name);
  if (found == kOpNames.end()) {
    return std::nullopt;
  }
  return static_cast<Op>(found - kOpNames.begin());
}

std::optional<ReplyError> reply_error_from_string(std::string_view name) {
  const auto* found = std::find(kErrorNames.begin(), kErrorNames.end(), name);
  if (found == kErrorNames.end()) {
    return std::nullopt;
  }
  return static_cast<ReplyError>(found - kErrorNames.begin());
}

std::string format_key(std::uint64_t key) {
  char text[19];  // "0x" + 16 digits + NUL: snprintf cannot truncate
  (void)std::snprintf(text, sizeof text, "0x%016llx", static_cast<unsigned long long>(key));
  return text;
}

std::optional<std::uint64_t> parse_key(std::string_view text) {
  if (!text.starts_with("0x")) {
    return std::nullopt;
  }
  text.remove_prefix(2);
  std::uint64_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value, 16);
  // from_chars takes upper-case digits too, and nothing else: no sign, no second "0x".
  if (text.empty() || text.size() > 16 || ec != std::errc() || end != text.data() + text.size()) {
    return std::nullopt;
  }
  return value;
}

tl::expected<Request, ProtocolError> parse_request(std::string_view line) {
  if (line.size() > kMaxRequestSize) {
    return tl::unexpected(request_error(std::nullopt, ReplyError::kTooLarge,
                                        "the request line has " + std::to_string(line.size()) +
                                            " bytes; the limit is " +
                                            std::to_string(kMaxRequestSize)));
  }
  LineFlags flags;
  const json object = parse_line(line, flags);
  // The id first, so that every later error can echo it.
  std::optional<std::uint64_t> id;
  if (object.is_object() && !flags.too_deep) {
    if (const auto it = object.find("id"); it != object.end()) {
      id = as_uint(*it);
    }
  }
  const auto bad = [&id](std::string message) {
    return tl::unexpected(request_error(id, ReplyError::kBadRequest, std::move(message)));
  };
  if (auto problem = object_problem(object, flags, "a request")) {
    return bad(std::move(*problem));
  }

  const auto version = object.find("v");
  if (version == object.end()) {
    return bad("v: missing (the protocol version, " + std::to_string(kProtocolVersion) + ")");
  }
  if (!version->is_number_integer()) {  // unsigned numbers are integers too
    return bad("v: expected an integer, got " + describe(*version));
  }
  if (*version != kProtocolVersion) {
    return tl::unexpected(request_error(id, ReplyError::kUnsupportedVersion,
                                        "version " + dump_line(*version) +
                                            " is not supported; this daemon speaks version " +
                                            std::to_string(kProtocolVersion)));
  }
  const auto id_member = object.find("id");
  if (id_member == object.end()) {
    return bad("id: missing (an unsigned integer that the reply echoes)");
  }
  if (!id) {
    return bad("id: expected an unsigned integer, got " + describe(*id_member));
  }
  for (const auto& [name, value] : object.items()) {
    if (std::find(kRequestMembers.begin(), kRequestMembers.end(), name) == kRequestMembers.end()) {
      return bad("unknown member " + quote(name) +
                 " (a version 1 request has v, id, op, resource, node and timeout_ms)");
    }
  }

  Request request;
  request.id = *id;
  const auto op_member = object.find("op");
  if (op_member == object.end()) {
    return bad("op: missing (one of " + ops_list() + ")");
  }
  const auto op = op_member->is_string() ? op_from_string(op_member->get_ref<const std::string&>())
                                         : std::nullopt;
  if (!op) {
    return bad("op: expected one of " + ops_list() + ", got " + describe(*op_member));
  }
  request.op = *op;

  if (const auto resource = object.find("resource"); resource != object.end()) {
    if (!resource->is_string() ||
        !is_valid_resource_name(resource->get_ref<const std::string&>())) {
      return bad("resource: expected a resource name (1..64 characters A-Z a-z 0-9 _ . -), got " +
                 describe(*resource));
    }
    request.resource = resource->get<std::string>();
  } else if (needs_resource(request.op)) {
    return bad("resource: missing (" + std::string(to_string(request.op)) +
               " needs the resource's name)");
  }

  const auto node = object.find("node");
  if (request.op == Op::kFence) {
    if (node == object.end()) {
      return bad("node: missing (fence needs the id of the node to fence, 1..65535)");
    }
    const auto value = as_uint(*node);
    if (!value || *value < 1 || *value > 65535) {
      return bad("node: expected a node id 1..65535, got " + describe(*node));
    }
    request.node = static_cast<std::uint16_t>(*value);
  } else if (node != object.end()) {
    return bad("node: only fence takes a node, not " + std::string(to_string(request.op)));
  }

  if (const auto timeout = object.find("timeout_ms"); timeout != object.end()) {
    const auto value = as_uint(*timeout);
    if (!value || *value < 1 || *value > static_cast<std::uint64_t>(kMaxTimeout.count())) {
      return bad("timeout_ms: expected milliseconds 1.." + std::to_string(kMaxTimeout.count()) +
                 ", got " + describe(*timeout));
    }
    request.timeout = std::chrono::milliseconds(*value);
  }
  return request;
}

std::string encode_request(const Request& request) {
  std::string line = "{";
  append_member(line, "v", kProtocolVersion);
  append_member(line, "id", request.id);
  append_member(line, "op", std::string(to_string(request.op)));
  if (!request.resource.empty()) {
    append_member(line, "resource", request.resource);
  }
  if (request.node) {
    append_member(line, "node", *request.node);
  }
  if (request.timeout) {
    append_member(line, "timeout_ms", request.timeout->count());
  }
  line += "}\n";
  return line;
}

std::string encode_ok(std::uint64_t id, const json& payload) {
  std::string line = "{";
  append_member(line, "v", kProtocolVersion);
  append_member(line, "id", id);
  append_member(line, "ok", true);
  if (payload.is_object()) {
    for (const auto& [name, value] : payload.items()) {
      if (std::find(kEnvelope.begin(), kEnvelope.end(), name) == kEnvelope.end()) {
        append_member(line, name, value);
      }
    }
  }
  line += "}\n";
  return line;
}

std::string encode_error(const ProtocolError& error) {
  std::string line = "{";
  append_member(line, "v", kProtocolVersion);
  append_member(line, "id", error.id ? json(*error.id) : json(nullptr));
  append_member(line, "ok", false);
  append_member(line, "error",
                json{{"code", std::string(to_string(error.code))}, {"message", error.message}});
  line += "}\n";
  return line;
}

std::string encode_event(Event event, const ResourceStatus& status) {
  std::string line = "{";
  append_member(line, "v", kProtocolVersion);
  append_member(line, "event", std::string(to_string(event)));
  append_member(line, "resource", status.name);
  append_member(line, "status", to_json(status));
  line += "}\n";
  return line;
}

json to_json(const ResourceStatus& status) {
  json lus = json::array();
  for (const LuStatus& lu : status.lus) {
    lus.push_back(json{{"wwn", lu.wwn},
                       {"devices", lu.devices},
                       {"holder", key_or_null(lu.holder)},
                       {"keys", keys_array(lu.keys)},
                       {"error", lu.error.empty() ? json(nullptr) : json(lu.error)}});
  }
  return json{
      {"name", status.name},
      {"mode", status.mode},
      {"state", status.state},
      {"gate_open", status.gate_open},
      {"key", key_or_null(status.key)},
      {"epoch", status.epoch},
      {"fenced_by", key_or_null(status.fenced_by)},
      {"last_check_age_ms",
       status.last_check_age_ms ? json(*status.last_check_age_ms) : json(nullptr)},
      {"detail", status.detail},
      {"lus", std::move(lus)},
  };
}

tl::expected<ResourceStatus, std::string> resource_status_from_json(const json& value) {
  if (!value.is_object()) {
    return tl::unexpected("status: expected an object, got " + describe(value));
  }
  const Fields fields(value, "status");
  ResourceStatus status;
  auto name = fields.string("name", true);
  auto mode = fields.string("mode", true);
  auto state = fields.string("state", true);
  auto key = fields.nullable_key("key");
  auto fenced_by = fields.nullable_key("fenced_by");
  auto detail = fields.string("detail", false);
  if (!name || !mode || !state || !key || !fenced_by || !detail) {
    return tl::unexpected(!name        ? name.error()
                          : !mode      ? mode.error()
                          : !state     ? state.error()
                          : !key       ? key.error()
                          : !fenced_by ? fenced_by.error()
                                       : detail.error());
  }
  status.name = std::move(*name);
  status.mode = std::move(*mode);
  status.state = std::move(*state);
  status.key = *key;
  status.fenced_by = *fenced_by;
  status.detail = std::move(*detail);

  const json* gate_open = fields.find("gate_open");
  if (gate_open == nullptr || !gate_open->is_boolean()) {
    return tl::unexpected(fields.problem("gate_open", "true or false", gate_open));
  }
  status.gate_open = gate_open->get<bool>();

  const json* epoch = fields.find("epoch");
  const auto epoch_value = epoch == nullptr ? std::nullopt : as_uint(*epoch);
  if (!epoch_value || *epoch_value > 0xffffffffU) {
    return tl::unexpected(fields.problem("epoch", "an integer 0..4294967295", epoch));
  }
  status.epoch = static_cast<std::uint32_t>(*epoch_value);

  const json* age = fields.find("last_check_age_ms");
  if (age != nullptr && !age->is_null()) {
    if (!age->is_number_integer() ||
        (age->is_number_unsigned() &&
         age->get<std::uint64_t>() > static_cast<std::uint64_t>(INT64_MAX))) {
      return tl::unexpected(fields.problem("last_check_age_ms", "an integer or null", age));
    }
    status.last_check_age_ms = age->get<std::int64_t>();
  }

  const json* lus = fields.find("lus");
  if (lus == nullptr || !lus->is_array()) {
    return tl::unexpected(fields.problem("lus", "an array of objects", lus));
  }
  for (std::size_t i = 0; i < lus->size(); ++i) {
    auto lu = lu_status_from_json((*lus)[i], "status.lus[" + std::to_string(i) + "]");
    if (!lu) {
      return tl::unexpected(std::move(lu.error()));
    }
    status.lus.push_back(std::move(*lu));
  }
  return status;
}

tl::expected<Reply, std::string> parse_reply(std::string_view line) {
  if (line.size() > kMaxReplySize) {
    return tl::unexpected("the reply line has " + std::to_string(line.size()) +
                          " bytes; the limit is " + std::to_string(kMaxReplySize));
  }
  LineFlags flags;
  json object = parse_line(line, flags);
  if (auto problem = object_problem(object, flags, "a reply")) {
    return tl::unexpected(std::move(*problem));
  }
  const auto version = object.find("v");
  if (version == object.end() || !version->is_number_integer() || *version != kProtocolVersion) {
    return tl::unexpected("v: expected " + std::to_string(kProtocolVersion) + ", got " +
                          (version == object.end() ? std::string("nothing") : describe(*version)));
  }
  object.erase("v");

  Reply reply;
  if (const auto event = object.find("event"); event != object.end()) {
    if (!event->is_string()) {
      return tl::unexpected("event: expected a string, got " + describe(*event));
    }
    reply.ok = true;
    reply.is_event = true;
    reply.body = std::move(object);
    return reply;
  }

  const auto ok = object.find("ok");
  if (ok == object.end() || !ok->is_boolean()) {
    return tl::unexpected("ok: expected true or false, got " +
                          (ok == object.end() ? std::string("nothing") : describe(*ok)));
  }
  reply.ok = ok->get<bool>();
  const auto id = object.find("id");
  if (id != object.end() && !id->is_null()) {
    reply.id = as_uint(*id);
    if (!reply.id) {
      return tl::unexpected("id: expected an unsigned integer or null, got " + describe(*id));
    }
  }
  if (reply.ok && !reply.id) {
    return tl::unexpected("id: a successful reply carries its request's id, got " +
                          (id == object.end() ? std::string("nothing") : describe(*id)));
  }
  const auto error = object.find("error");
  if (!reply.ok) {
    if (error == object.end() || !error->is_object()) {
      return tl::unexpected("error: expected an object with code and message, got " +
                            (error == object.end() ? std::string("nothing") : describe(*error)));
    }
    const auto code = error->find("code");
    const auto message = error->find("message");
    if (code == error->end() || !code->is_string()) {
      return tl::unexpected("error.code: expected a string, got " +
                            (code == error->end() ? std::string("nothing") : describe(*code)));
    }
    if (message == error->end() || !message->is_string()) {
      return tl::unexpected("error.message: expected a string, got " + (message == error->end()
                                                                            ? std::string("nothing")
                                                                            : describe(*message)));
    }
    ProtocolError protocol_error;
    protocol_error.id = reply.id;
    protocol_error.message = message->get<std::string>();
    if (const auto known = reply_error_from_string(code->get_ref<const std::string&>())) {
      protocol_error.code = *known;
    } else {
      // A newer daemon's code: keep it readable rather than refuse the reply.
      protocol_error.code = ReplyError::kInternal;
      protocol_error.message = code->get<std::string>() + ": " + protocol_error.message;
    }
    reply.error = std::move(protocol_error);
  }
  for (const std::string_view name : kEnvelope) {
    object.erase(std::string(name));
  }
  reply.body = std::move(object);
  return reply;
}

}  // namespace blkfence::control
