// Proves the control protocol of docs/control-protocol.md, version 1: every op parses with the
// members it needs and refuses the ones it must not have; every malformed request (oversized,
// not JSON, not an object, too deep, duplicate or unknown members, wrong version, bad id, unknown
// op, out-of-range values) gets the documented error code with the id echoed whenever it could be
// read; requests, replies, errors, events and resource statuses survive encode and parse
// unchanged; and nothing throws on invalid UTF-8.
#include "blkfence/control/protocol.h"

#include <gtest/gtest.h>

namespace blkfence::control {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;

ProtocolError error_of(std::string_view line) {
  const auto request = parse_request(line);
  EXPECT_FALSE(request.has_value()) << line;
  return request ? ProtocolError{} : request.error();
}

Request request_of(std::string_view line) {
  const auto request = parse_request(line);
  EXPECT_TRUE(request.has_value()) << line << ": " << (request ? "" : request.error().message);
  return request ? *request : Request{};
}

ResourceStatus sample_status() {
  ResourceStatus status;
  status.name = "pgdata";
  status.mode = "exclusive";
  status.state = "held";
  status.gate_open = true;
  status.key = 0x6c9d000100000007ULL;
  status.epoch = 7;
  status.last_check_age_ms = 120;
  status.detail = "acquired on 2 LUs";
  status.lus.push_back(LuStatus{"naa.6001405c3f2a4b1e9d7c8a6b5e4f3d21",
                                {"/dev/sdb", "/dev/sdc"},
                                0x6c9d000100000007ULL,
                                {0x6c9d000100000007ULL, 0x6c9d000100000007ULL},
                                ""});
  status.lus.push_back(LuStatus{"naa.6001405aaaaaaaaaaaaaaaaaaaaaaaaa",
                                {"/dev/sdd"},
                                std::nullopt,
                                {},
                                "READ RESERVATION timed out"});
  return status;
}

TEST(ControlProtocol, ParsesEveryOp) {
  EXPECT_EQ(request_of(R"({"v":1,"id":1,"op":"status"})"), (Request{1, Op::kStatus, "", {}, {}}));
  EXPECT_EQ(request_of(R"({"v":1,"id":2,"op":"status","resource":"pgdata"})").resource, "pgdata");
  EXPECT_EQ(request_of(R"({"v":1,"id":3,"op":"acquire","resource":"pgdata","timeout_ms":30000})"),
            (Request{3, Op::kAcquire, "pgdata", {}, milliseconds(30000)}));
  EXPECT_EQ(request_of(R"({"v":1,"id":4,"op":"release","resource":"pgdata"})").op, Op::kRelease);
  EXPECT_EQ(request_of(R"({"v":1,"id":5,"op":"fence","resource":"pgdata","node":2})"),
            (Request{5, Op::kFence, "pgdata", 2, {}}));
  EXPECT_EQ(request_of(R"({"v":1,"id":6,"op":"unfence","resource":"logs"})").op, Op::kUnfence);
  EXPECT_EQ(request_of(R"({"v":1,"id":7,"op":"keys","resource":"pgdata"})").op, Op::kKeys);
  EXPECT_EQ(request_of(R"({"v":1,"id":8,"op":"watch"})").op, Op::kWatch);
  EXPECT_EQ(request_of(R"({"v":1,"id":9,"op":"gate","resource":"pgdata","timeout_ms":1})").op,
            Op::kGate);
  EXPECT_EQ(request_of(R"({"v":1,"id":10,"op":"metrics"})").op, Op::kMetrics);
  // Member order, whitespace and a trailing CR (socat, telnet) do not matter.
  EXPECT_EQ(request_of(" { \"op\" : \"status\" , \"id\" : 11 , \"v\" : 1 } \r").id, 11U);
  EXPECT_EQ(request_of(R"({"v":1,"id":18446744073709551615,"op":"status"})").id,
            18446744073709551615ULL);
}

TEST(ControlProtocol, PermissionsAndResourceNeeds) {
  for (const Op op : {Op::kAcquire, Op::kRelease, Op::kFence, Op::kUnfence}) {
    EXPECT_TRUE(changes_state(op)) << to_string(op);
    EXPECT_TRUE(needs_resource(op)) << to_string(op);
  }
  for (const Op op : {Op::kStatus, Op::kKeys, Op::kWatch, Op::kGate, Op::kMetrics}) {
    EXPECT_FALSE(changes_state(op)) << to_string(op);
  }
  EXPECT_TRUE(needs_resource(Op::kKeys));
  EXPECT_TRUE(needs_resource(Op::kGate));
  EXPECT_FALSE(needs_resource(Op::kStatus));
  EXPECT_FALSE(needs_resource(Op::kWatch));
  EXPECT_FALSE(needs_resource(Op::kMetrics));
}

TEST(ControlProtocol, OversizedLineIsTooLarge) {
  const std::string padding(kMaxRequestSize - 29, ' ');
  const std::string exact = R"({"v":1,"id":1,"op":"status"})" + padding;
  ASSERT_EQ(exact.size(), kMaxRequestSize - 1);
  EXPECT_TRUE(parse_request(exact + " ").has_value());
  const ProtocolError error = error_of(exact + "  ");
  EXPECT_EQ(error.code, ReplyError::kTooLarge);
  EXPECT_EQ(error.id, std::nullopt);
  EXPECT_EQ(error.message, "the request line has 65537 bytes; the limit is 65536");
}

TEST(ControlProtocol, NotAnObjectIsBadRequest) {
  for (const char* line :
       {"", "{", "nonsense", "{\"v\":1,}", "[]", "\"status\"", "1", "null", "{\"v\":1}{\"v\":1}"}) {
    const ProtocolError error = error_of(line);
    EXPECT_EQ(error.code, ReplyError::kBadRequest) << line;
    EXPECT_EQ(error.id, std::nullopt) << line;
  }
  EXPECT_EQ(error_of("nonsense").message,
            "a request is not valid JSON (one UTF-8 JSON object per line)");
  EXPECT_EQ(error_of("[1,2]").message, "a request is a JSON object, got an array");
  EXPECT_EQ(error_of("\"status\"").message, "a request is a JSON object, got \"status\"");
  // nlohmann refuses numbers beyond a double (they could only be written back as null).
  EXPECT_EQ(error_of(R"({"v":1,"id":1,"op":"status","x":1e400})").message,
            "a request is not valid JSON (one UTF-8 JSON object per line)");
  // Invalid UTF-8 is not JSON.
  EXPECT_EQ(error_of("{\"v\":1,\"id\":1,\"op\":\"st\xff\"}").code, ReplyError::kBadRequest);
}

TEST(ControlProtocol, NestingIsBounded) {
  std::string deep = R"({"v":1,"id":3,"op":"status","x":)";
  deep += std::string(40, '[') + std::string(40, ']') + "}";
  const ProtocolError error = error_of(deep);
  EXPECT_EQ(error.code, ReplyError::kBadRequest);
  EXPECT_EQ(error.message, "a request is nested deeper than 32 levels");
  // A depth that would overflow a recursive walk is refused as cheaply.
  const std::string hostile =
      std::string(kMaxRequestSize / 2, '[') + std::string(kMaxRequestSize / 2, ']');
  EXPECT_EQ(error_of(hostile).code, ReplyError::kBadRequest);
}

TEST(ControlProtocol, DuplicateAndUnknownMembers) {
  const ProtocolError duplicate = error_of(R"({"v":1,"id":4,"op":"status","op":"fence"})");
  EXPECT_EQ(duplicate.code, ReplyError::kBadRequest);
  EXPECT_EQ(duplicate.id, 4U);
  EXPECT_EQ(duplicate.message, "a request names the member \"op\" twice");
  const ProtocolError unknown = error_of(R"({"v":1,"id":5,"op":"status","force":true})");
  EXPECT_EQ(unknown.code, ReplyError::kBadRequest);
  EXPECT_EQ(unknown.id, 5U);
  EXPECT_EQ(unknown.message,
            "unknown member \"force\" (a version 1 request has v, id, op, resource, node and "
            "timeout_ms)");
}

TEST(ControlProtocol, VersionIsCheckedAndIdEchoed) {
  const ProtocolError v2 = error_of(R"({"v":2,"id":9,"op":"frobnicate","extra":1})");
  EXPECT_EQ(v2.code, ReplyError::kUnsupportedVersion);
  EXPECT_EQ(v2.id, 9U);
  EXPECT_EQ(v2.message, "version 2 is not supported; this daemon speaks version 1");
  EXPECT_EQ(error_of(R"({"v":0,"id":9,"op":"status"})").code, ReplyError::kUnsupportedVersion);
  EXPECT_EQ(error_of(R"({"v":-1,"id":9,"op":"status"})").code, ReplyError::kUnsupportedVersion);
  const ProtocolError missing = error_of(R"({"id":9,"op":"status"})");
  EXPECT_EQ(missing.code, ReplyError::kBadRequest);
  EXPECT_EQ(missing.id, 9U);
  EXPECT_EQ(missing.message, "v: missing (the protocol version, 1)");
  EXPECT_EQ(error_of(R"({"v":"1","id":9,"op":"status"})").message,
            "v: expected an integer, got \"1\"");
  EXPECT_EQ(error_of(R"({"v":1.0,"id":9,"op":"status"})").message,
            "v: expected an integer, got 1.0");
}

TEST(ControlProtocol, IdMustBeAnUnsignedInteger) {
  const ProtocolError missing = error_of(R"({"v":1,"op":"status"})");
  EXPECT_EQ(missing.code, ReplyError::kBadRequest);
  EXPECT_EQ(missing.id, std::nullopt);
  EXPECT_EQ(missing.message, "id: missing (an unsigned integer that the reply echoes)");
  for (const char* id : {"-1", "\"7\"", "1.5", "null", "18446744073709551616", "[1]"}) {
    const ProtocolError error = error_of(std::string(R"({"v":1,"op":"status","id":)") + id + "}");
    EXPECT_EQ(error.code, ReplyError::kBadRequest) << id;
    EXPECT_EQ(error.id, std::nullopt) << id;
    EXPECT_TRUE(error.message.starts_with("id: expected an unsigned integer, got ")) << id;
  }
  EXPECT_EQ(error_of(R"({"v":1,"op":"status","id":-1})").message,
            "id: expected an unsigned integer, got -1");
}

TEST(ControlProtocol, OpMustBeKnown) {
  const ProtocolError unknown = error_of(R"({"v":1,"id":12,"op":"frobnicate"})");
  EXPECT_EQ(unknown.code, ReplyError::kBadRequest);
  EXPECT_EQ(unknown.id, 12U);
  EXPECT_EQ(unknown.message,
            "op: expected one of status, acquire, release, fence, unfence, keys, watch, gate, "
            "metrics, promote, got \"frobnicate\"");
  EXPECT_EQ(error_of(R"({"v":1,"id":12,"op":"STATUS"})").code, ReplyError::kBadRequest);
  EXPECT_EQ(error_of(R"({"v":1,"id":12,"op":3})").message.substr(0, 20), "op: expected one of ");
  EXPECT_EQ(error_of(R"({"v":1,"id":12})").message,
            "op: missing (one of status, acquire, release, fence, unfence, keys, watch, gate, "
            "metrics, promote)");
}

TEST(ControlProtocol, ResourceRules) {
  for (const char* op : {"acquire", "release", "fence", "unfence", "keys", "gate"}) {
    const ProtocolError error =
        error_of(std::string(R"({"v":1,"id":13,"op":")") + op + R"(","node":1})");
    EXPECT_EQ(error.code, ReplyError::kBadRequest) << op;
    EXPECT_EQ(error.id, 13U);
    EXPECT_EQ(error.message,
              "resource: missing (" + std::string(op) + " needs the resource's name)");
  }
  EXPECT_EQ(error_of(R"({"v":1,"id":13,"op":"status","resource":"pg data"})").message,
            "resource: expected a resource name (1..64 characters A-Z a-z 0-9 _ . -), got \"pg "
            "data\"");
  EXPECT_EQ(error_of(R"({"v":1,"id":13,"op":"status","resource":""})").code,
            ReplyError::kBadRequest);
  EXPECT_EQ(error_of(R"({"v":1,"id":13,"op":"status","resource":null})").code,
            ReplyError::kBadRequest);
  EXPECT_EQ(error_of(R"({"v":1,"id":13,"op":"status","resource":7})").code,
            ReplyError::kBadRequest);
  const std::string long_name(65, 'r');
  EXPECT_EQ(error_of(R"({"v":1,"id":13,"op":"status","resource":")" + long_name + "\"}").message,
            "resource: expected a resource name (1..64 characters A-Z a-z 0-9 _ . -), got \"" +
                std::string(48, 'r') + "\"...");
}

TEST(ControlProtocol, NodeOnlyForFenceAndInRange) {
  EXPECT_EQ(error_of(R"({"v":1,"id":14,"op":"fence","resource":"r"})").message,
            "node: missing (fence needs the id of the node to fence, 1..65535)");
  for (const char* node : {"0", "65536", "-1", "\"2\"", "2.0", "null"}) {
    const ProtocolError error =
        error_of(std::string(R"({"v":1,"id":14,"op":"fence","resource":"r","node":)") + node + "}");
    EXPECT_EQ(error.code, ReplyError::kBadRequest) << node;
    EXPECT_EQ(error.message, std::string("node: expected a node id 1..65535, got ") + node);
  }
  EXPECT_EQ(request_of(R"({"v":1,"id":14,"op":"fence","resource":"r","node":65535})").node, 65535);
  EXPECT_EQ(error_of(R"({"v":1,"id":14,"op":"acquire","resource":"r","node":2})").message,
            "node: only fence takes a node, not acquire");
}

TEST(ControlProtocol, TimeoutRange) {
  EXPECT_EQ(request_of(R"({"v":1,"id":15,"op":"status","timeout_ms":3600000})").timeout,
            milliseconds(3600000));
  for (const char* timeout : {"0", "3600001", "-5", "1.5", "\"10\"", "null"}) {
    const ProtocolError error =
        error_of(std::string(R"({"v":1,"id":15,"op":"status","timeout_ms":)") + timeout + "}");
    EXPECT_EQ(error.code, ReplyError::kBadRequest) << timeout;
    EXPECT_EQ(error.id, 15U);
    EXPECT_EQ(error.message,
              std::string("timeout_ms: expected milliseconds 1..3600000, got ") + timeout);
  }
}

TEST(ControlProtocol, RequestsRoundTrip) {
  const Request requests[] = {
      {0, Op::kStatus, "", {}, {}},
      {1, Op::kStatus, "pgdata", {}, milliseconds(1)},
      {2, Op::kAcquire, "pgdata", {}, milliseconds(30000)},
      {3, Op::kRelease, "a.b-c_d", {}, {}},
      {4, Op::kFence, "logs", 65535, milliseconds(3600000)},
      {5, Op::kUnfence, "logs", {}, {}},
      {6, Op::kKeys, "pgdata", {}, {}},
      {7, Op::kWatch, "", {}, {}},
      {8, Op::kGate, "pgdata", {}, milliseconds(10000)},
      {18446744073709551615ULL, Op::kMetrics, "", {}, {}},
  };
  for (const Request& request : requests) {
    const std::string line = encode_request(request);
    ASSERT_TRUE(line.ends_with("\n"));
    EXPECT_EQ(line.find('\n'), line.size() - 1);
    const auto again = parse_request(std::string_view(line).substr(0, line.size() - 1));
    ASSERT_TRUE(again.has_value()) << line << again.error().message;
    EXPECT_EQ(*again, request) << line;
  }
  EXPECT_EQ(encode_request(requests[4]),
            "{\"v\":1,\"id\":4,\"op\":\"fence\",\"resource\":\"logs\",\"node\":65535,"
            "\"timeout_ms\":3600000}\n");
}

TEST(ControlProtocol, OkRepliesCarryTheirPayload) {
  const json payload = {{"resources", json::array({to_json(sample_status())})}};
  const std::string line = encode_ok(42, payload);
  EXPECT_TRUE(line.starts_with("{\"v\":1,\"id\":42,\"ok\":true,\"resources\":[{")) << line;
  EXPECT_TRUE(line.ends_with("}\n"));
  EXPECT_EQ(line.find('\n'), line.size() - 1);
  const auto reply = parse_reply(std::string_view(line).substr(0, line.size() - 1));
  ASSERT_TRUE(reply.has_value()) << reply.error();
  EXPECT_EQ(reply->id, 42U);
  EXPECT_TRUE(reply->ok);
  EXPECT_FALSE(reply->is_event);
  EXPECT_FALSE(reply->error.has_value());
  EXPECT_EQ(reply->body, payload);
  const auto status = resource_status_from_json(reply->body["resources"][0]);
  ASSERT_TRUE(status.has_value()) << status.error();
  EXPECT_EQ(*status, sample_status());

  // No payload, and a payload cannot overwrite the envelope.
  EXPECT_EQ(encode_ok(1, nullptr), "{\"v\":1,\"id\":1,\"ok\":true}\n");
  EXPECT_EQ(
      encode_ok(
          1, json{{"ok", false}, {"v", 9}, {"id", 2}, {"error", 1}, {"event", 1}, {"open", true}}),
      "{\"v\":1,\"id\":1,\"ok\":true,\"open\":true}\n");
}

TEST(ControlProtocol, ErrorRepliesRoundTrip) {
  for (std::uint8_t code = 0; code <= static_cast<std::uint8_t>(ReplyError::kInternal); ++code) {
    for (const std::optional<std::uint64_t> id : {std::optional<std::uint64_t>(), {77U}}) {
      const ProtocolError error{id, static_cast<ReplyError>(code), "what happened: \"x\"\n\t"};
      const std::string line = encode_error(error);
      EXPECT_EQ(line.find('\n'), line.size() - 1) << line;
      const auto reply = parse_reply(std::string_view(line).substr(0, line.size() - 1));
      ASSERT_TRUE(reply.has_value()) << reply.error();
      EXPECT_FALSE(reply->ok);
      EXPECT_EQ(reply->id, id);
      ASSERT_TRUE(reply->error.has_value());
      EXPECT_EQ(*reply->error, error);
      EXPECT_EQ(reply->body, json::object());
    }
  }
  EXPECT_EQ(encode_error({std::nullopt, ReplyError::kTooLarge, "m"}),
            "{\"v\":1,\"id\":null,\"ok\":false,\"error\":{\"code\":\"too-large\",\"message\":"
            "\"m\"}}\n");
}

TEST(ControlProtocol, EventsRoundTrip) {
  const std::string line = encode_event(Event::kFenced, sample_status());
  EXPECT_TRUE(
      line.starts_with("{\"v\":1,\"event\":\"fenced\",\"resource\":\"pgdata\",\"status\":{"))
      << line;
  const auto reply = parse_reply(std::string_view(line).substr(0, line.size() - 1));
  ASSERT_TRUE(reply.has_value()) << reply.error();
  EXPECT_TRUE(reply->is_event);
  EXPECT_TRUE(reply->ok);
  EXPECT_EQ(reply->id, std::nullopt);
  EXPECT_EQ(reply->body["event"], "fenced");
  EXPECT_EQ(reply->body["resource"], "pgdata");
  const auto status = resource_status_from_json(reply->body["status"]);
  ASSERT_TRUE(status.has_value()) << status.error();
  EXPECT_EQ(*status, sample_status());
}

TEST(ControlProtocol, StatusJsonShape) {
  const json value = to_json(sample_status());
  EXPECT_EQ(value["key"], "0x6c9d000100000007");
  EXPECT_EQ(value["fenced_by"], nullptr);
  EXPECT_EQ(value["epoch"], 7);
  EXPECT_EQ(value["gate_open"], true);
  EXPECT_EQ(value["last_check_age_ms"], 120);
  EXPECT_EQ(value["lus"][0]["keys"][1], "0x6c9d000100000007");
  EXPECT_EQ(value["lus"][0]["error"], nullptr);
  EXPECT_EQ(value["lus"][1]["holder"], nullptr);
  EXPECT_EQ(value["lus"][1]["error"], "READ RESERVATION timed out");

  // Empty and extreme values survive too.
  ResourceStatus empty;
  empty.fenced_by = 0;
  empty.epoch = 0xffffffffU;
  empty.last_check_age_ms = INT64_MIN;
  empty.lus.push_back(LuStatus{"", {}, 0, {0, ~0ULL}, ""});
  const auto again = resource_status_from_json(to_json(empty));
  ASSERT_TRUE(again.has_value()) << again.error();
  EXPECT_EQ(*again, empty);
}

TEST(ControlProtocol, StatusFromJsonNamesTheBadMember) {
  const auto problem = [](const std::function<void(json&)>& edit) {
    json value = to_json(sample_status());
    edit(value);
    const auto status = resource_status_from_json(value);
    return status ? std::string("(accepted)") : status.error();
  };
  EXPECT_EQ(problem([](json& v) { v.erase("name"); }),
            "status.name: expected a string, got nothing");
  EXPECT_EQ(problem([](json& v) { v["state"] = 1; }), "status.state: expected a string, got 1");
  EXPECT_EQ(problem([](json& v) { v["gate_open"] = "yes"; }),
            "status.gate_open: expected true or false, got \"yes\"");
  EXPECT_EQ(problem([](json& v) { v["key"] = 5; }),
            "status.key: expected a key \"0x...\" or null, got 5");
  EXPECT_EQ(problem([](json& v) { v["key"] = "6c9d000100000007"; }),
            "status.key: expected a key \"0x...\" or null, got \"6c9d000100000007\"");
  EXPECT_EQ(problem([](json& v) { v["key"] = "0x16c9d000100000007"; }),
            "status.key: expected a key \"0x...\" or null, got \"0x16c9d000100000007\"");
  EXPECT_EQ(problem([](json& v) { v["fenced_by"] = "0x-1"; }),
            "status.fenced_by: expected a key \"0x...\" or null, got \"0x-1\"");
  EXPECT_EQ(problem([](json& v) { v["epoch"] = 4294967296ULL; }),
            "status.epoch: expected an integer 0..4294967295, got 4294967296");
  EXPECT_EQ(problem([](json& v) { v["epoch"] = -1; }),
            "status.epoch: expected an integer 0..4294967295, got -1");
  EXPECT_EQ(problem([](json& v) { v["last_check_age_ms"] = 1.5; }),
            "status.last_check_age_ms: expected an integer or null, got 1.5");
  EXPECT_EQ(problem([](json& v) { v["last_check_age_ms"] = 9223372036854775808ULL; }),
            "status.last_check_age_ms: expected an integer or null, got 9223372036854775808");
  EXPECT_EQ(problem([](json& v) { v["lus"] = json::object(); }),
            "status.lus: expected an array of objects, got an object");
  EXPECT_EQ(problem([](json& v) { v["lus"][1] = 3; }), "status.lus[1]: expected an object, got 3");
  EXPECT_EQ(problem([](json& v) {
              v["lus"][1]["devices"] = json::array({"a", 1});
            }),
            "status.lus[1].devices: expected an array of strings, got 1");
  EXPECT_EQ(problem([](json& v) {
              v["lus"][0]["keys"] = json::array({"0x1", "x"});
            }),
            "status.lus[0].keys: expected an array of keys \"0x...\", got \"x\"");
  EXPECT_EQ(problem([](json& v) { v["lus"][0]["error"] = false; }),
            "status.lus[0].error: expected a string or null, got false");
  EXPECT_EQ(problem([](json& v) { v["lus"][0].erase("wwn"); }),
            "status.lus[0].wwn: expected a string, got nothing");
  EXPECT_EQ(resource_status_from_json(json::array()).error(),
            "status: expected an object, got an array");
  // Members a newer daemon adds are ignored; optional ones may be left out.
  EXPECT_EQ(problem([](json& v) {
              v["new_member"] = 1;
              v.erase("detail");
              v.erase("fenced_by");
              v.erase("last_check_age_ms");
            }),
            "(accepted)");
}

TEST(ControlProtocol, ParseReplyRefusesWhatIsNotAReply) {
  const auto error = [](std::string_view line) {
    const auto reply = parse_reply(line);
    return reply ? std::string("(accepted)") : reply.error();
  };
  EXPECT_EQ(error("[]"), "a reply is a JSON object, got an array");
  EXPECT_EQ(error("{"), "a reply is not valid JSON (one UTF-8 JSON object per line)");
  EXPECT_EQ(error(R"({"id":1,"ok":true})"), "v: expected 1, got nothing");
  EXPECT_EQ(error(R"({"v":2,"id":1,"ok":true})"), "v: expected 1, got 2");
  EXPECT_EQ(error(R"({"v":1,"id":1})"), "ok: expected true or false, got nothing");
  EXPECT_EQ(error(R"({"v":1,"id":1,"ok":1})"), "ok: expected true or false, got 1");
  EXPECT_EQ(error(R"({"v":1,"ok":true})"),
            "id: a successful reply carries its request's id, got nothing");
  EXPECT_EQ(error(R"({"v":1,"id":"1","ok":true})"),
            "id: expected an unsigned integer or null, got \"1\"");
  EXPECT_EQ(error(R"({"v":1,"id":1,"ok":false})"),
            "error: expected an object with code and message, got nothing");
  EXPECT_EQ(error(R"({"v":1,"id":1,"ok":false,"error":{"message":"m"}})"),
            "error.code: expected a string, got nothing");
  EXPECT_EQ(error(R"({"v":1,"id":1,"ok":false,"error":{"code":"busy"}})"),
            "error.message: expected a string, got nothing");
  EXPECT_EQ(error(R"({"v":1,"event":3})"), "event: expected a string, got 3");
  EXPECT_EQ(error(R"({"v":1,"id":1,"ok":true,"ok":false})"),
            "a reply names the member \"ok\" twice");
  EXPECT_EQ(error(std::string(kMaxReplySize + 1, ' ')),
            "the reply line has 16777217 bytes; the limit is 16777216");
  EXPECT_EQ(
      error(R"({"v":1,"id":1,"ok":true,"x":)" + std::string(40, '[') + std::string(40, ']') + "}"),
      "a reply is nested deeper than 32 levels");
}

TEST(ControlProtocol, UnknownErrorCodesStayReadable) {
  const auto reply =
      parse_reply(R"({"v":1,"id":3,"ok":false,"error":{"code":"quota","message":"too many"}})");
  ASSERT_TRUE(reply.has_value());
  ASSERT_TRUE(reply->error.has_value());
  EXPECT_EQ(reply->error->code, ReplyError::kInternal);
  EXPECT_EQ(reply->error->message, "quota: too many");
  EXPECT_EQ(reply->error->id, 3U);
}

TEST(ControlProtocol, InvalidUtf8IsReplacedNotThrown) {
  ProtocolError error{1U, ReplyError::kDevice, "bad \xff byte"};
  const std::string line = encode_error(error);
  const auto reply = parse_reply(std::string_view(line).substr(0, line.size() - 1));
  ASSERT_TRUE(reply.has_value()) << reply.error();
  EXPECT_EQ(reply->error->message, "bad \xef\xbf\xbd byte");  // U+FFFD
  ResourceStatus status = sample_status();
  status.lus[0].wwn = "t10.\xc3";
  EXPECT_NE(encode_event(Event::kState, status).find("t10.\xef\xbf\xbd"), std::string::npos);
  Request request{1, Op::kAcquire, "\xfe", {}, {}};
  EXPECT_EQ(encode_request(request),
            "{\"v\":1,\"id\":1,\"op\":\"acquire\",\"resource\":\"\xef\xbf\xbd\"}\n");
}

TEST(ControlProtocol, NamesRoundTrip) {
  for (std::uint8_t i = 0; i <= static_cast<std::uint8_t>(Op::kMetrics); ++i) {
    const auto op = static_cast<Op>(i);
    EXPECT_EQ(op_from_string(to_string(op)), op);
  }
  for (std::uint8_t i = 0; i <= static_cast<std::uint8_t>(ReplyError::kInternal); ++i) {
    const auto code = static_cast<ReplyError>(i);
    EXPECT_EQ(reply_error_from_string(to_string(code)), code);
  }
  EXPECT_EQ(to_string(ReplyError::kUnsupportedVersion), "unsupported-version");
  EXPECT_EQ(to_string(ReplyError::kPermissionDenied), "permission-denied");
  EXPECT_EQ(to_string(Event::kLostContact), "lost-contact");
  EXPECT_EQ(op_from_string("Status"), std::nullopt);
  EXPECT_EQ(reply_error_from_string(""), std::nullopt);
}

TEST(ControlProtocol, Keys) {
  EXPECT_EQ(format_key(0x6c9d000100000007ULL), "0x6c9d000100000007");
  EXPECT_EQ(format_key(0), "0x0000000000000000");
  EXPECT_EQ(parse_key("0x6c9d000100000007"), 0x6c9d000100000007ULL);
  EXPECT_EQ(parse_key("0x6C9D000100000007"), 0x6c9d000100000007ULL);
  EXPECT_EQ(parse_key("0x1"), 1U);
  EXPECT_EQ(parse_key("0xffffffffffffffff"), ~0ULL);
  for (const char* bad :
       {"", "0x", "6c9d", "0x10000000000000000", "0x-1", "0x+1", "0x1g", "0X1", " 0x1", "0x0x1"}) {
    EXPECT_EQ(parse_key(bad), std::nullopt) << bad;
  }
}

}  // namespace
}  // namespace blkfence::control
