// blkfencectl: the command-line tool of blkfence (cli). This file parses the command line and hands
// over to the mode that runs it; today that is the direct device mode (device.h).
#include <functional>
#include <iostream>
#include <map>

#include <CLI/CLI.hpp>

#include "blkfence/control/duration.h"
#include "blkfence/control/protocol.h"
#include "blkfence/key.h"

#include "daemon_commands.h"
#include "device.h"
#include "device_guard.h"

namespace {

using blkfence::cli::DeviceAction;
using blkfence::cli::Exit;

constexpr const char* kExitCodes = R"(
Exit status (device commands):
  0  success on every LU
  1  a LU answered with a SCSI error other than a conflict
  2  bad arguments
  3  a device is missing, not SCSI, or not accessible (or the transport could not start)
  4  RESERVATION CONFLICT on a LU
  5  a command got no answer in time: it may still execute; read the state again
  10  refused, nothing sent: a local blkfenced manages a LU (or its socket did not say
      whether it does); --force sends anyway
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
The actions that send a PR OUT (register, unregister, reserve, release, preempt, preempt-abort,
clear) first ask the local blkfenced (--socket, $BLKFENCE_SOCKET or /run/blkfence/control.sock)
which LUs it manages, and refuse (exit 10) when it manages one of the LUs, has a resource still
waiting for its devices, or does not answer within 2 s: this host's paths are the daemon's own
I_T nexuses, and a PR OUT through them would act on its key and reservation behind its back.
No socket, or nobody listening on it: they go ahead. --force sends without asking.

Examples:
  blkfencectl device keys /dev/sdb /dev/sdc
  blkfencectl device register --key 0x6c9d000100000007 /dev/mapper/pgdata
  blkfencectl device reserve --key 0x6c9d000100000007 /dev/mapper/pgdata
  blkfencectl device preempt-abort --key 0x6c9d000200000008 --victim 0x6c9d000100000007 \
      /dev/sdb /dev/sdc --json
)";

struct Args {
  blkfence::cli::DeviceOptions options;
  std::string key, old_key, victim, type = "we-ro", transport = "auto", timeout = "10s";
};

// --timeout's value, in 1 ms .. max, or an error message. Every command reads it with the same
// syntax as blkfence.toml's durations (blkfence/control/duration.h).
std::optional<std::chrono::milliseconds> parse_timeout(const std::string& text,
                                                       std::chrono::milliseconds max,
                                                       std::string& error) {
  const auto value = blkfence::control::parse_duration(text);
  if (!value || value->count() < 1 || *value > max) {
    error = "--timeout '" + text + "': expected " +
            std::string(blkfence::control::kDurationSyntax) + ", from 1ms to " +
            blkfence::control::format_duration(max);
    return std::nullopt;
  }
  return value;
}

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
  const auto timeout = parse_timeout(args.timeout, std::chrono::hours(1), error);
  if (!timeout) {
    return error;
  }
  o.timeout = *timeout;
  return "";
}

constexpr const char* kDaemonExitCodes = R"(
Exit status (commands that talk to blkfenced):
  0  success (gate check: the gate is open)
  1  gate check / run: the gate is closed
  2  bad arguments, or no such resource
  3  blkfenced could not reach or use a device
  4  another node holds the resource or has registered this node's key (a node_id used twice),
     or this node was fenced (run: the gate closed and the command was killed)
  5  the outcome is unknown (a command timed out): read 'blkfencectl status' before deciding
  6  blkfenced is not running or its socket is not reachable (run: the daemon went away and
     the command was killed)
  7  permission denied: changes need root or the configured control_group
  8  --timeout passed first (an acquire or release goes on in the daemon)
  9  any other error the daemon reported
run exits with the command's own status when the command ends by itself.
--timeout takes a number and a unit, as blkfence.toml's durations do: 500ms, 30s, 2.5s, 2m. The
socket is /run/blkfence/control.sock, or $BLKFENCE_SOCKET, or --socket.
)";

int run(int argc, char** argv) {
  CLI::App app{"blkfencectl: SCSI persistent reservation fencing for shared LUs", "blkfencectl"};
  app.require_subcommand(1);
  app.footer(std::string(kExitCodes) + kDaemonExitCodes);
  Args args;

  CLI::App* device =
      app.add_subcommand("device",
                         "Persistent reservation commands on devices directly, many at once (like "
                         "sg_persist, without the daemon)");
  device->require_subcommand(1);
  device->footer(std::string(kDeviceFooter) + "\n" + kExitCodes);

  // What each device action takes besides DEVICE, --json, --verbose, --transport and --timeout.
  // Each subcommand is named by action_name(), the name device_guard's refusals use too.
  struct Spec {  // NOLINT(clang-analyzer-optin.performance.Padding): a table of eleven
    DeviceAction action = DeviceAction::kKeys;
    const char* help = nullptr;
    bool key = false;
    bool victim = false;
    bool type = false;
    bool old_key = false;
    bool aptpl = false;
  };
  static constexpr Spec kSpecs[] = {
      {.action = DeviceAction::kKeys, .help = "READ KEYS: the registered keys (one per I_T nexus)"},
      {.action = DeviceAction::kReservation, .help = "READ RESERVATION: the holder and the type"},
      {.action = DeviceAction::kStatus,
       .help = "READ FULL STATUS: every registration with its holder flag and TransportID"},
      {.action = DeviceAction::kCapabilities,
       .help = "REPORT CAPABILITIES: the types and flags the LU supports"},
      {.action = DeviceAction::kRegister,
       .help = "Register --key on every path (REGISTER AND IGNORE EXISTING KEY, or REGISTER "
               "with --old-key)",
       .key = true,
       .old_key = true,
       .aptpl = true},
      {.action = DeviceAction::kUnregister,
       .help = "Remove this host's registration from every path (releases a reservation it "
               "holds)"},
      {.action = DeviceAction::kReserve,
       .help = "RESERVE with --key and --type",
       .key = true,
       .type = true},
      {.action = DeviceAction::kRelease,
       .help = "RELEASE with --key and --type (registrations stay)",
       .key = true,
       .type = true},
      {.action = DeviceAction::kPreempt,
       .help = "PREEMPT --victim's registrations (and its reservation) with --key",
       .key = true,
       .victim = true,
       .type = true},
      {.action = DeviceAction::kPreemptAbort,
       .help = "PREEMPT AND ABORT: preempt and abort the victim's commands in flight",
       .key = true,
       .victim = true,
       .type = true},
      {.action = DeviceAction::kClear,
       .help = "CLEAR: remove the reservation and every registration",
       .key = true},
  };
  // The chosen command, set by its subcommand's callback once the command line parsed; run after.
  std::function<int()> chosen;
  for (const Spec& spec : kSpecs) {
    CLI::App* sub = device->add_subcommand(std::string(action_name(spec.action)), spec.help);
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
    sub->add_option("--timeout", args.timeout, "Per-command timeout (default 10s, at most 1h)");
    if (blkfence::cli::changes_reservations(spec.action)) {
      sub->add_option("--socket", args.options.socket,
                      "The control socket of the blkfenced to ask whether it manages the LUs");
      sub->add_flag("--force", args.options.force,
                    "Send without asking the local blkfenced: on a LU it manages, this can "
                    "remove or replace its key and reservation, or register a fenced node again");
    }
    sub->callback([&args, &chosen, &spec] {
      chosen = [&args, &spec] {
        args.options.action = spec.action;
        if (const std::string error = finish(args, spec.key, spec.victim); !error.empty()) {
          std::cerr << "blkfencectl: device " << action_name(spec.action) << ": " << error << '\n';
          return static_cast<int>(Exit::kUsage);
        }
        return static_cast<int>(blkfence::cli::run_device(args.options));
      };
    });
  }

  // Commands that talk to blkfenced.
  blkfence::cli::DaemonOptions daemon_options;
  std::string timeout_text;
  int fence_node = 0;
  std::vector<std::string> command;
  const auto daemon_command = [&](const char* name, const char* help, bool resource_required,
                                  bool resource_allowed = true) {
    CLI::App* sub = app.add_subcommand(name, help);
    sub->footer(kDaemonExitCodes);
    if (resource_allowed) {
      auto* option = sub->add_option("RESOURCE", daemon_options.resource,
                                     "The resource, as named in blkfence.toml");
      if (resource_required) {
        option->required();
      }
    }
    sub->add_flag("--json", daemon_options.json, "Print the daemon's JSON reply");
    sub->add_option("--timeout", timeout_text, "Give up waiting after this long (e.g. 30s)");
    sub->add_option("--socket", daemon_options.socket, "blkfenced's control socket");
    return sub;
  };
  using namespace blkfence::cli;
  // Each command, once parsed: the checks CLI11 cannot make, then the command.
  const auto on_parse = [&chosen, &daemon_options, &timeout_text](CLI::App* sub,
                                                                  std::function<int()> then) {
    sub->callback([&chosen, &daemon_options, &timeout_text, then = std::move(then)] {
      chosen = [&daemon_options, &timeout_text, then] {
        if (!timeout_text.empty()) {
          std::string error;
          daemon_options.timeout =
              parse_timeout(timeout_text, blkfence::control::kMaxTimeout, error);
          if (!daemon_options.timeout) {
            std::cerr << "blkfencectl: " << error << '\n';
            return static_cast<int>(Exit::kUsage);
          }
        }
        return then();
      };
    });
  };
  on_parse(
      daemon_command("status",
                     "The state of every resource (or one): gate, key, epoch, and each LU's holder",
                     false),
      [&] { return status_command(daemon_options); });
  on_parse(daemon_command("acquire",
                          "Take the resource for this node (exclusive mode): preempt the holder "
                          "with a higher epoch, verify every LU, open the gate. With --timeout, "
                          "or when this command is killed, the daemon sends no further PREEMPT",
                          true),
           [&] { return operation_command("acquire", daemon_options); });
  on_parse(daemon_command("release",
                          "Close the gate (stopping the gated units) and give the token up; in "
                          "exclusive mode the key keeps the reservation until the next acquire "
                          "elsewhere preempts it; in shared mode the node's paths move to its "
                          "departed key (epoch 1), which keeps the LUs reserved and opens no gate",
                          true),
           [&] { return operation_command("release", daemon_options); });
  on_parse(daemon_command("unfence",
                          "Shared mode: register this node on every LU (and reserve if nobody "
                          "has). Primary mode: join as a member (register, never reserve)",
                          true),
           [&] { return operation_command("unfence", daemon_options); });
  on_parse(daemon_command("promote",
                          "Primary mode: make this node the primary. Draw a higher epoch, preempt "
                          "the old primary's key on every LU (the other members stay registered), "
                          "verify, and exit 0 only then. Patroni's pre_promote runs this, with "
                          "--timeout: when the timeout passes or this command is killed, the "
                          "daemon sends no further PREEMPT",
                          true),
           [&] { return operation_command("promote", daemon_options); });
  CLI::App* fence = daemon_command(
      "fence", "Shared mode: remove another node's key from every LU (preempt)", true);
  fence->add_option("-n,--node", fence_node, "The node id to fence (1-65535)")->required();
  on_parse(fence, [&] {
    if (fence_node < 1 || fence_node > 65535) {
      std::cerr << "blkfencectl: fence: --node must be 1 to 65535\n";
      return static_cast<int>(Exit::kUsage);
    }
    daemon_options.node = static_cast<std::uint16_t>(fence_node);
    return operation_command("fence", daemon_options);
  });
  on_parse(daemon_command(
               "keys", "Read the registered keys and the holder of every LU now, through blkfenced",
               true),
           [&] { return keys_command(daemon_options); });
  on_parse(
      daemon_command("watch",
                     "Print the state, then every change (gate, fenced, acquired...) as it happens",
                     false),
      [&] { return watch_command(daemon_options); });
  on_parse(daemon_command("metrics", "Print blkfenced's metrics in the Prometheus text format",
                          false, false),
           [&] { return metrics_command(daemon_options); });
  CLI::App* gate = app.add_subcommand("gate", "The writer gate: check it or wait for it");
  gate->require_subcommand(1);
  CLI::App* gate_check = gate->add_subcommand(
      "check", "Exit 0 when the gate is open, 1 when closed (for ExecCondition=)");
  CLI::App* gate_wait =
      gate->add_subcommand("wait", "Wait until the gate is open and print the token");
  for (CLI::App* sub : {gate_check, gate_wait}) {
    sub->footer(kDaemonExitCodes);
    sub->add_option("RESOURCE", daemon_options.resource, "The resource")->required();
    sub->add_flag("--json", daemon_options.json, "Print the daemon's JSON reply");
    sub->add_option("--timeout", timeout_text, "Give up waiting after this long (e.g. 30s)");
    sub->add_option("--socket", daemon_options.socket, "blkfenced's control socket");
  }
  on_parse(gate_check, [&] { return gate_check_command(daemon_options); });
  on_parse(gate_wait, [&] { return gate_wait_command(daemon_options); });
  CLI::App* run_sub = daemon_command(
      "run",
      "Run a command while the gate is open: it gets BLKFENCE_TOKEN, BLKFENCE_EPOCH and "
      "BLKFENCE_RESOURCE, and it is killed (SIGKILL), with every process it started, even those "
      "that left its process group, the moment the gate closes, blkfenced goes away or does not "
      "confirm the gate for a whole lease, or run itself is killed. Without --timeout the gate "
      "must be open already; with it, run waits that long for it to open",
      true);
  run_sub->add_option("COMMAND", command, "The command and its arguments, after --")->required();
  run_sub->footer(std::string("Example:\n  blkfencectl run pgdata --timeout 30s -- "
                              "/usr/local/bin/writer --epoch-from-env\n") +
                  kDaemonExitCodes);
  on_parse(run_sub, [&] { return run_command(daemon_options, command); });

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& help) {
    return app.exit(help);
  } catch (const CLI::ParseError& error) {
    std::cerr << "blkfencectl: " << error.what()
              << "\nRun 'blkfencectl --help' or 'blkfencectl device --help'.\n";
    return static_cast<int>(Exit::kUsage);
  }

  return chosen ? chosen() : static_cast<int>(Exit::kUsage);
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
