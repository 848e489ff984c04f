// blkfencectl: the command-line tool of blkfence (cli). This file parses the command line and hands
// over to the mode that runs it; today that is the direct device mode (device.h).
#include <iostream>
#include <map>

#include <CLI/CLI.hpp>

#include "blkfence/key.h"

#include "device.h"

namespace {

using blkfence::cli::DeviceAction;
using blkfence::cli::Exit;

constexpr const char* kExitCodes = R"(
Exit status:
  0  success on every LU
  1  a LU answered with a SCSI error other than a conflict
  2  bad arguments
  3  a device is missing, not SCSI, or not accessible (or the transport could not start)
  4  RESERVATION CONFLICT on a LU
  5  a command got no answer in time: it may still execute; read the state again
When LUs end differently, the highest of 5, 4, 3, 1 wins.
)";

constexpr const char* kDeviceFooter = R"(
Every DEVICE may be /dev/sdX, /dev/sgN, a /dev/disk/by-id link or a dm-multipath map
(/dev/mapper/NAME, /dev/dm-N). Paths are grouped by the LU's WWN; registrations go to every
path (each is its own I_T nexus), the other PR OUT actions to the LU's first path, reads to
the first path that answers. Commands to all LUs go out at once. Unit attentions are retried
(a command that got one did not execute); RESERVATION CONFLICT never is.
Keys are hex, with or without 0x. Types: we (1), ea (3), we-ro (5, default), ea-ro (6),
we-ar (7), ea-ar (8).

Examples:
  blkfencectl device keys /dev/sdb /dev/sdc
  blkfencectl device register --key 0x6c9d000100000007 /dev/mapper/pgdata
  blkfencectl device reserve --key 0x6c9d000100000007 /dev/mapper/pgdata
  blkfencectl device preempt-abort --key 0x6c9d000200000008 --victim 0x6c9d000100000007 \
      /dev/sdb /dev/sdc --json
)";

struct Args {
  blkfence::cli::DeviceOptions options;
  std::string key, old_key, victim, type = "we-ro", transport = "auto";
  long timeout_ms = 10'000;
};

std::optional<std::uint64_t> parse_key(const std::string& text, const char* what,
                                       std::string& error) {
  const auto key = blkfence::fence::Key::parse(text);
  if (!key) {
    error = std::string(what) + ": " + key.error().where();
    return std::nullopt;
  }
  return key->value();
}

// Checks what CLI11 cannot: keys, the type, the transport. Returns an error message or "".
std::string finish(Args& args, bool needs_key, bool needs_victim) {
  std::string error;
  auto& o = args.options;
  if (needs_key) {
    if (args.key.empty()) {
      return "--key is required";
    }
    if (auto key = parse_key(args.key, "--key", error)) {
      o.key = *key;
    } else {
      return error;
    }
  }
  if (!args.old_key.empty()) {
    if (auto key = parse_key(args.old_key, "--old-key", error)) {
      o.old_key = *key;
    } else {
      return error;
    }
  }
  if (needs_victim) {
    if (args.victim.empty()) {
      return "--victim is required (the key to preempt)";
    }
    if (auto key = parse_key(args.victim, "--victim", error)) {
      o.victim = *key;
    } else {
      return error;
    }
  }
  if (auto type = blkfence::cli::parse_pr_type(args.type)) {
    o.type = *type;
  } else {
    return "--type '" + args.type + "': expected we, ea, we-ro, ea-ro, we-ar, ea-ar or 1, 3, 5-8";
  }
  static const std::map<std::string, blkfence::transport::TransportKind> kTransports{
      {"auto", blkfence::transport::TransportKind::kAuto},
      {"uring", blkfence::transport::TransportKind::kUring},
      {"sgio", blkfence::transport::TransportKind::kSgio}};
  const auto transport = kTransports.find(args.transport);
  if (transport == kTransports.end()) {
    return "--transport '" + args.transport + "': expected auto, uring or sgio";
  }
  o.transport = transport->second;
  if (args.timeout_ms < 1 || args.timeout_ms > 3'600'000) {
    return "--timeout must be 1 to 3600000 milliseconds";
  }
  o.timeout = std::chrono::milliseconds(args.timeout_ms);
  return "";
}

int run(int argc, char** argv) {
  CLI::App app{"blkfencectl: SCSI persistent reservation fencing for shared LUs", "blkfencectl"};
  app.require_subcommand(1);
  app.footer(kExitCodes);
  Args args;

  CLI::App* device =
      app.add_subcommand("device",
                         "Persistent reservation commands on devices directly, many at once (like "
                         "sg_persist, without the daemon)");
  device->require_subcommand(1);
  device->footer(std::string(kDeviceFooter) + "\n" + kExitCodes);

  struct Spec {  // NOLINT(clang-analyzer-optin.performance.Padding): a table of eleven
    const char* name;
    DeviceAction action;
    const char* help;
    bool key, victim, type, old_key, aptpl;
  };
  const Spec specs[] = {
      {"keys", DeviceAction::kKeys, "READ KEYS: the registered keys (one per I_T nexus)", false,
       false, false, false, false},
      {"reservation", DeviceAction::kReservation, "READ RESERVATION: the holder and the type",
       false, false, false, false, false},
      {"status", DeviceAction::kStatus,
       "READ FULL STATUS: every registration with its holder flag and TransportID", false, false,
       false, false, false},
      {"capabilities", DeviceAction::kCapabilities,
       "REPORT CAPABILITIES: the types and flags the LU supports", false, false, false, false,
       false},
      {"register", DeviceAction::kRegister,
       "Register --key on every path (REGISTER AND IGNORE EXISTING KEY, or REGISTER with "
       "--old-key)",
       true, false, false, true, true},
      {"unregister", DeviceAction::kUnregister,
       "Remove this host's registration from every path (releases a reservation it holds)", false,
       false, false, false, false},
      {"reserve", DeviceAction::kReserve, "RESERVE with --key and --type", true, false, true, false,
       false},
      {"release", DeviceAction::kRelease, "RELEASE with --key and --type (registrations stay)",
       true, false, true, false, false},
      {"preempt", DeviceAction::kPreempt,
       "PREEMPT --victim's registrations (and its reservation) with --key", true, true, true, false,
       false},
      {"preempt-abort", DeviceAction::kPreemptAbort,
       "PREEMPT AND ABORT: preempt and abort the victim's commands in flight", true, true, true,
       false, false},
      {"clear", DeviceAction::kClear, "CLEAR: remove the reservation and every registration", true,
       false, false, false, false},
  };
  std::map<CLI::App*, const Spec*> by_app;
  for (const auto& spec : specs) {
    CLI::App* sub = device->add_subcommand(spec.name, spec.help);
    sub->footer(kDeviceFooter);
    sub->add_option("DEVICE", args.options.devices, "Devices (several LUs at once)")->required();
    if (spec.key) {
      sub->add_option("-k,--key", args.key, "This host's reservation key (hex)");
    }
    if (spec.old_key) {
      sub->add_option("--old-key", args.old_key,
                      "The key registered now: use REGISTER (fails on a mismatch)");
    }
    if (spec.aptpl) {
      sub->add_flag("--aptpl", args.options.aptpl, "Persist through power loss");
    }
    if (spec.victim) {
      sub->add_option("-v,--victim", args.victim, "The key to preempt (hex)");
    }
    if (spec.type) {
      sub->add_option("-t,--type", args.type, "Reservation type (default we-ro)");
    }
    sub->add_flag("--json", args.options.json, "Print JSON instead of a table");
    sub->add_flag("--verbose", args.options.verbose, "Print every attempt on every path");
    sub->add_option("--transport", args.transport, "auto (default), uring or sgio");
    sub->add_option("--timeout", args.timeout_ms, "Per-command timeout in ms (default 10000)");
    by_app[sub] = &spec;
  }

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& help) {
    return app.exit(help);
  } catch (const CLI::ParseError& error) {
    std::cerr << "blkfencectl: " << error.what()
              << "\nRun 'blkfencectl --help' or 'blkfencectl device --help'.\n";
    return static_cast<int>(Exit::kUsage);
  }

  for (const auto& [sub, spec] : by_app) {
    if (!sub->parsed()) {
      continue;
    }
    args.options.action = spec->action;
    if (const std::string error = finish(args, spec->key, spec->victim); !error.empty()) {
      std::cerr << "blkfencectl: device " << spec->name << ": " << error << '\n';
      return static_cast<int>(Exit::kUsage);
    }
    return static_cast<int>(blkfence::cli::run_device(args.options));
  }
  return static_cast<int>(Exit::kUsage);
}

}  // namespace

int main(int argc, char** argv) {
  // CLI11 reports bad arguments by exception (caught in run()); anything else that escapes, such as
  // std::bad_alloc, ends here with a message instead of std::terminate.
  try {
    return run(argc, argv);
  } catch (const std::exception& error) {
    std::cerr << "blkfencectl: " << error.what() << '\n';
    return 1;
  }
}
