// blkfencectl device ...: see device.h.
#include "device.h"

#include <algorithm>
#include <cstdio>
#include <iostream>

#include <nlohmann/json.hpp>

#include "blkfence/codec/prin.h"
#include "blkfence/codec/sense.h"
#include "blkfence/key.h"
#include "blkfence/pr/client.h"
#include "blkfence/pr/discovery.h"

#include "control_client.h"
#include "device_guard.h"

namespace blkfence::cli {
namespace {

using nlohmann::json;

std::string hex_key(std::uint64_t key) {
  char text[19];  // "0x" + 16 digits + NUL
  (void)std::snprintf(text, sizeof text, "0x%016llx", static_cast<unsigned long long>(key));
  return text;
}

struct TypeName {
  codec::PrType type;
  const char* short_name;
  const char* long_name;
};
constexpr TypeName kTypeNames[] = {
    {codec::PrType::kWriteExclusive, "we", "write-exclusive"},
    {codec::PrType::kExclusiveAccess, "ea", "exclusive-access"},
    {codec::PrType::kWriteExclusiveRegistrantsOnly, "we-ro", "write-exclusive-registrants-only"},
    {codec::PrType::kExclusiveAccessRegistrantsOnly, "ea-ro", "exclusive-access-registrants-only"},
    {codec::PrType::kWriteExclusiveAllRegistrants, "we-ar", "write-exclusive-all-registrants"},
    {codec::PrType::kExclusiveAccessAllRegistrants, "ea-ar", "exclusive-access-all-registrants"},
};

std::string type_short_name(codec::PrType type) {
  for (const auto& name : kTypeNames) {
    if (name.type == type) {
      return name.short_name;
    }
  }
  return "type-" + std::to_string(static_cast<unsigned>(type));
}

Exit exit_for(const Error& error) {
  switch (error.code()) {
    case ErrorCode::kIndeterminate: return Exit::kIndeterminate;
    case ErrorCode::kReservationConflict: return Exit::kConflict;
    case ErrorCode::kOs:
    case ErrorCode::kNotSupported:
    case ErrorCode::kInvalidArgument: return Exit::kDevice;
    default: return Exit::kScsiError;
  }
}

int urgency(Exit exit) {
  switch (exit) {
    case Exit::kIndeterminate: return 5;
    case Exit::kConflict: return 4;
    case Exit::kDevice: return 3;
    case Exit::kScsiError: return 2;
    case Exit::kUsage:
    case Exit::kRefused: return 1;
    case Exit::kOk: return 0;
  }
  return 0;
}

// What to do next, after the error itself.
std::string hint(const Error& error, const std::string& device) {
  switch (error.code()) {
    case ErrorCode::kReservationConflict:
      return "another node holds the reservation or this nexus's key does not match; see "
             "'blkfencectl device keys " +
             device + "'";
    case ErrorCode::kIndeterminate:
      return "the command may still execute on the target; read the state again before "
             "deciding ('blkfencectl device status " +
             device + "')";
    case ErrorCode::kOs:
      if (error.errno_value() == EACCES || error.errno_value() == EPERM) {
        return "run as root, or grant access to the sg node (SG_IO on /dev/sdX also needs "
               "CAP_SYS_RAWIO)";
      }
      return "";
    default: return "";
  }
}

json error_json(const Error& error) {
  json out{{"code", std::string(to_string(error.code()))}, {"message", error.message()}};
  if (error.errno_value() != 0) {
    out["errno"] = error.errno_value();
  }
  if (const auto& scsi = error.scsi()) {
    out["status"] = scsi->status;
    out["sense_key"] = scsi->sense_key;
    out["asc"] = scsi->asc;
    out["ascq"] = scsi->ascq;
  }
  return out;
}

json attempts_json(const std::vector<pr::Attempt>& attempts) {
  json out = json::array();
  for (const auto& attempt : attempts) {
    json a{{"device", attempt.device},
           {"outcome", std::string(transport::to_string(attempt.outcome))},
           {"latency_us",
            std::chrono::duration_cast<std::chrono::microseconds>(attempt.latency).count()}};
    if (attempt.sense) {
      char asc[8];
      (void)std::snprintf(asc, sizeof asc, "%02x/%02x", attempt.sense->asc, attempt.sense->ascq);
      a["sense"] = std::string(codec::to_string(attempt.sense->sense_key)) + " " + asc;
    }
    out.push_back(std::move(a));
  }
  return out;
}

// One LU's line in the report: its identity, what happened, and the action's fields.
struct Row {
  const pr::LogicalUnit* lu;
  std::optional<Error> error;
  std::vector<pr::Attempt> attempts;
  std::vector<std::string> cells;  // action-specific columns, for the table
  json fields = json::object();    // action-specific fields, for JSON
};

template <class T, class Fill>
std::vector<Row> rows_of(const std::vector<pr::LogicalUnit>& lus,
                         std::vector<pr::LuResult<T>> results, Fill fill) {
  std::vector<Row> rows;
  for (std::size_t i = 0; i < lus.size(); ++i) {
    Row row{.lu = &lus[i],
            .error = std::nullopt,
            .attempts = std::move(results[i].attempts),
            .cells = {},
            .fields = json::object()};
    if (results[i].value) {
      fill(row, *results[i].value);
    } else {
      row.error = results[i].value.error();
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

void print_table(const std::vector<std::string>& header, const std::vector<Row>& rows) {
  std::vector<std::vector<std::string>> lines{header};
  for (const auto& row : rows) {
    std::vector<std::string> line{row.lu->name, row.lu->wwn};
    if (row.error) {
      line.push_back("error: " + row.error->message());
    } else {
      line.insert(line.end(), row.cells.begin(), row.cells.end());
    }
    lines.push_back(std::move(line));
  }
  std::vector<std::size_t> widths;
  for (const auto& line : lines) {
    for (std::size_t c = 0; c + 1 < line.size(); ++c) {
      widths.resize(std::max(widths.size(), c + 1));
      widths[c] = std::max(widths[c], line[c].size());
    }
  }
  for (const auto& line : lines) {
    std::string text;
    for (std::size_t c = 0; c < line.size(); ++c) {
      text += line[c];
      if (c + 1 < line.size()) {
        text.append(widths[c] - line[c].size() + 2, ' ');
      }
    }
    std::cout << text << '\n';
  }
}

std::vector<Row> run_action(const DeviceOptions& o, pr::Client& client,
                            const std::vector<pr::LogicalUnit>& lus,
                            std::vector<std::string>& header) {
  const auto done = [](Row& row, const pr::Nothing&) { row.cells.push_back("ok"); };
  switch (o.action) {
    case DeviceAction::kKeys:
      header = {"DEVICE", "WWN", "GENERATION", "KEYS"};
      return rows_of(lus, client.read_keys(lus), [](Row& row, const codec::ReadKeys& keys) {
        std::string text;
        json list = json::array();
        for (const auto key : keys.keys) {
          text += (text.empty() ? "" : " ") + hex_key(key);
          list.push_back(hex_key(key));
        }
        row.cells = {std::to_string(keys.generation), text.empty() ? "none" : text};
        row.fields = {
            {"generation", keys.generation}, {"keys", list}, {"truncated", keys.truncated}};
      });
    case DeviceAction::kReservation:
      header = {"DEVICE", "WWN", "GENERATION", "HOLDER", "TYPE"};
      return rows_of(
          lus, client.read_reservation(lus), [](Row& row, const codec::ReadReservation& r) {
            row.fields = {{"generation", r.generation}, {"truncated", r.truncated}};
            if (!r.reservation) {
              row.cells = {std::to_string(r.generation), "none", "-"};
              row.fields["reservation"] = nullptr;
              return;
            }
            const bool all = codec::is_all_registrants(r.reservation->type);
            row.cells = {std::to_string(r.generation),
                         all ? "all registrants" : hex_key(r.reservation->key),
                         type_short_name(r.reservation->type)};
            row.fields["reservation"] = {{"key", hex_key(r.reservation->key)},
                                         {"type", static_cast<unsigned>(r.reservation->type)},
                                         {"type_name", type_short_name(r.reservation->type)}};
          });
    case DeviceAction::kStatus:
      header = {"DEVICE", "WWN", "GENERATION", "REGISTRATIONS (key holder type rtpi transport-id)"};
      return rows_of(lus, client.read_full_status(lus), [](Row& row, const codec::FullStatus& s) {
        std::string text;
        json list = json::array();
        for (const auto& d : s.descriptors) {
          const std::string tid = d.transport_id ? codec::to_string(*d.transport_id) : "-";
          text += (text.empty() ? "" : "; ") + hex_key(d.key) + (d.holder ? " holder " : " - ") +
                  (d.holder ? type_short_name(d.type) : "-") + " " +
                  (d.all_tg_pt ? "all" : std::to_string(d.relative_target_port_id)) + " " + tid;
          list.push_back({{"key", hex_key(d.key)},
                          {"holder", d.holder},
                          {"type", d.holder ? json(type_short_name(d.type)) : json(nullptr)},
                          {"all_tg_pt", d.all_tg_pt},
                          {"relative_target_port_id", d.relative_target_port_id},
                          {"transport_id", tid}});
        }
        row.cells = {std::to_string(s.generation), text.empty() ? "none" : text};
        row.fields = {
            {"generation", s.generation}, {"registrations", list}, {"truncated", s.truncated}};
      });
    case DeviceAction::kCapabilities:
      header = {"DEVICE", "WWN", "FLAGS", "TYPES"};
      return rows_of(
          lus, client.report_capabilities(lus), [](Row& row, const codec::Capabilities& c) {
            std::string flags;
            const std::pair<bool, const char*> bits[] = {{c.crh, "CRH"},       {c.sip_c, "SIP_C"},
                                                         {c.atp_c, "ATP_C"},   {c.ptpl_c, "PTPL_C"},
                                                         {c.ptpl_a, "PTPL_A"}, {c.rlr_c, "RLR_C"}};
            json set = json::array();
            for (const auto& [on, name] : bits) {
              if (on) {
                flags += (flags.empty() ? "" : " ") + std::string(name);
                set.push_back(name);
              }
            }
            std::string types;
            json type_list = json::array();
            for (const auto& name : kTypeNames) {
              if (c.supports(name.type)) {
                types += (types.empty() ? "" : " ") + std::string(name.short_name);
                type_list.push_back(name.short_name);
              }
            }
            row.cells = {flags.empty() ? "-" : flags, types.empty() ? "-" : types};
            row.fields = {{"flags", set}, {"types", type_list}};
          });
    case DeviceAction::kRegister:
      header = {"DEVICE", "WWN", "RESULT"};
      return rows_of(lus,
                     o.old_key ? client.register_key(lus, *o.old_key, o.key, o.aptpl)
                               : client.register_and_ignore(lus, o.key, o.aptpl),
                     done);
    case DeviceAction::kUnregister:
      header = {"DEVICE", "WWN", "RESULT"};
      return rows_of(lus, client.register_and_ignore(lus, 0), done);
    case DeviceAction::kReserve:
      header = {"DEVICE", "WWN", "RESULT"};
      return rows_of(lus, client.reserve(lus, o.key, o.type), done);
    case DeviceAction::kRelease:
      header = {"DEVICE", "WWN", "RESULT"};
      return rows_of(lus, client.release(lus, o.key, o.type), done);
    case DeviceAction::kPreempt:
    case DeviceAction::kPreemptAbort:
      header = {"DEVICE", "WWN", "RESULT"};
      return rows_of(
          lus,
          client.preempt(lus, o.key, o.victim, o.type, o.action == DeviceAction::kPreemptAbort),
          done);
    case DeviceAction::kClear:
      header = {"DEVICE", "WWN", "RESULT"};
      return rows_of(lus, client.clear(lus, o.key), done);
  }
  return {};
}

}  // namespace

std::optional<codec::PrType> parse_pr_type(const std::string& text) {
  for (const auto& name : kTypeNames) {
    if (text == name.short_name || text == name.long_name ||
        text == std::to_string(static_cast<unsigned>(name.type))) {
      return name.type;
    }
  }
  return std::nullopt;
}

Exit run_device(const DeviceOptions& o) {
  auto lus = pr::discover(o.devices, pr::system_discovery_env());
  if (!lus) {
    std::cerr << "blkfencectl: " << lus.error().message() << '\n';
    return Exit::kDevice;
  }
  if (changes_reservations(o.action) && !o.force) {
    const std::string socket = o.socket.empty() ? default_socket_path() : o.socket;
    const DaemonAnswer daemon = ask_daemon(socket, kDaemonAnswerBound);
    std::vector<Target> targets;
    for (const auto& lu : *lus) {
      targets.push_back({.device = lu.name, .wwn = lu.wwn});
    }
    const Verdict verdict = judge(o.action, o.force, daemon, targets);
    if (verdict.kind != Verdict::Kind::kProceed) {
      std::cerr << "blkfencectl: " << refusal_message(o.action, verdict, daemon, targets, socket)
                << '\n';
      return Exit::kRefused;
    }
  }
  auto transport = transport::make_transport(o.transport);
  if (!transport) {
    std::cerr << "blkfencectl: cannot set up the transport: " << transport.error().message()
              << (o.transport == transport::TransportKind::kUring ? " (try --transport sgio)" : "")
              << '\n';
    return Exit::kDevice;
  }
  pr::RetryPolicy policy;
  policy.command_timeout = o.timeout;
  pr::Client client(**transport, policy);

  std::vector<std::string> header;
  const auto rows = run_action(o, client, *lus, header);

  Exit exit = Exit::kOk;
  for (const auto& row : rows) {
    if (row.error && urgency(exit_for(*row.error)) > urgency(exit)) {
      exit = exit_for(*row.error);
    }
  }
  if (o.json) {
    json out{{"transport", std::string((*transport)->name())}, {"exit", static_cast<int>(exit)}};
    json list = json::array();
    for (const auto& row : rows) {
      json paths = json::array();
      for (const auto& path : row.lu->paths) {
        paths.push_back({{"sd", path.sd}, {"sg", path.sg}, {"hctl", path.hctl}});
      }
      json lu{{"name", row.lu->name},
              {"wwn", row.lu->wwn},
              {"paths", paths},
              {"ok", !row.error},
              {"attempts", attempts_json(row.attempts)}};
      if (row.error) {
        lu["error"] = error_json(*row.error);
      }
      lu.update(row.fields);
      list.push_back(std::move(lu));
    }
    out["lus"] = std::move(list);
    std::cout << out.dump(2) << '\n';
  } else {
    print_table(header, rows);
    for (const auto& row : rows) {
      if (o.verbose) {
        for (const auto& attempt : row.attempts) {
          std::cerr << "  " << pr::describe(attempt) << '\n';
        }
      }
      if (row.error) {
        if (const std::string next = hint(*row.error, row.lu->name); !next.empty()) {
          std::cerr << "blkfencectl: " << row.lu->name << ": " << next << '\n';
        }
      }
    }
  }
  return exit;
}

}  // namespace blkfence::cli
