// Token files and on_fenced actions (daemon layer). See gate.h.
#include "gate.h"

#include <cerrno>
#include <csignal>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <systemd/sd-bus.h>
#include <systemd/sd-event.h>
#include <unistd.h>

#include "blkfence/unique_fd.h"

#include "log.h"

extern char** environ;

namespace blkfence::daemon {

struct ManagerCall {
  std::string method;         // "StopUnit", "KillUnit" or "StartUnit"
  std::string unit;           // the unit or target
  std::string mode;           // the job mode; for KillUnit, whom ("all")
  std::optional<int> signal;  // KillUnit's
  std::string action;         // for messages: "stop postgresql@15-main.service"
  LogFields fields;
  Gate* gate;   // which resends it, if a broken connection leaves it unanswered
  bool resent;  // once only
};

namespace {

constexpr const char* kSystemd = "org.freedesktop.systemd1";
constexpr const char* kManagerPath = "/org/freedesktop/systemd1";
constexpr const char* kManagerInterface = "org.freedesktop.systemd1.Manager";
// A broken connection answers each waiting call with an error, one per sd_bus_process(); calls
// wait for at most 2 per unit (64 units, docs/operations.md) times a few fences in a row.
constexpr int kDrainMax = 4096;

std::string_view reason_name(Gate::Reason reason) {
  switch (reason) {
    case Gate::Reason::kFenced: return "fenced";
    case Gate::Reason::kLostContact: return "lost-contact";
    case Gate::Reason::kReleased: return "released";
  }
  return "?";
}

// What sd-bus returns when the connection broke under a call, or was found broken (it maps a
// failed write to ECONNRESET and a closed connection to ENOTCONN; the rest for safety).
bool broken_connection(int error) {
  return error == ENOTCONN || error == ECONNRESET || error == EPIPE || error == ESHUTDOWN ||
         error == ECONNABORTED;
}

std::string signal_name(int signal) {
  const char* name = sigabbrev_np(signal);
  return name != nullptr ? "SIG" + std::string(name) : "signal " + std::to_string(signal);
}

int on_disconnected(sd_bus_message*, void*, sd_bus_error*) {
  log(Priority::kWarning,
      "lost the connection to the system bus (the bus daemon stopped or restarted); the next "
      "on_fenced action connects again");
  return 0;
}

// One on_fenced command, until the event loop reaps it.
struct CommandRun {
  std::string program;
  LogFields fields;
};

int on_child(sd_event_source* source, const siginfo_t* info, void* userdata) {
  const std::unique_ptr<CommandRun> run(static_cast<CommandRun*>(userdata));
  const std::string what = "on_fenced command " + run->program;
  if (info->si_code == CLD_EXITED && info->si_status == 0) {
    log(Priority::kInfo, what + " finished", run->fields);
  } else if (info->si_code == CLD_EXITED) {
    log(Priority::kErr, what + " failed: exit status " + std::to_string(info->si_status),
        run->fields);
  } else {
    // CLD_KILLED or CLD_DUMPED: si_status is the signal (waitid(2)).
    log(Priority::kErr,
        what + " failed: killed by " + signal_name(info->si_status) +
            (info->si_code == CLD_DUMPED ? " (core dumped)" : ""),
        run->fields);
  }
  sd_event_source_disable_unref(source);
  return 0;
}

}  // namespace

// Out of line: ManagerCall is complete only here.
Gate::Gate(sd_event* event, std::string run_dir) : event_(event), run_dir_(std::move(run_dir)) {}

Gate::~Gate() {
  if (bus_ != nullptr) {
    (void)sd_bus_detach_event(bus_);
    sd_bus_flush_close_unref(bus_);
  }
  sd_event_source_disable_unref(resend_);
}

std::string Gate::token_path(const std::string& resource) const {
  return run_dir_ + "/" + resource + ".token";
}

Result<void> replace_file(const std::string& path, const std::string& text) {
  const std::string temporary = path + ".new";
  {
    const UniqueFd fd(::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (!fd.valid()) {
      return tl::unexpected(Error::os(errno, "create " + temporary));
    }
    if (::write(fd.get(), text.data(), text.size()) != static_cast<ssize_t>(text.size())) {
      return tl::unexpected(Error::os(errno == 0 ? EIO : errno, "write " + temporary));
    }
  }
  if (::rename(temporary.c_str(), path.c_str()) != 0) {
    return tl::unexpected(Error::os(errno, "rename " + temporary));
  }
  return {};
}

Result<void> Gate::open(const std::string& resource, fence::Key key) {
  return replace_file(token_path(resource), key.to_string() + "\n");
}

void Gate::close(const std::string& resource) {
  const std::string path = token_path(resource);
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    log(Priority::kErr, "cannot remove the token " + path + ": " + std::strerror(errno),
        {.resource = resource, .key = {}, .epoch = {}, .device = {}, .message_id = {}});
  }
}

int Gate::on_manager_reply(sd_bus_message* reply, void* userdata, sd_bus_error*) {
  const auto& call = *static_cast<const ManagerCall*>(userdata);
  const sd_bus_error* error = sd_bus_message_get_error(reply);
  if (error != nullptr && sd_bus_is_open(sd_bus_message_get_bus(reply)) <= 0 && !call.resent) {
    // The connection broke before the answer came: sd-bus answers for systemd ("Connection
    // terminated"), and the call may never have reached it (a bus daemon that exits drops what it
    // has not read yet). Stops and kills can be repeated; send it once more.
    log(Priority::kWarning,
        "the system bus connection broke before systemd answered; asking again to " + call.action,
        call.fields);
    auto again = std::make_unique<ManagerCall>(call);
    again->resent = true;
    call.gate->resend_later(std::move(again));
    return 0;
  }
  if (error != nullptr) {
    log(Priority::kErr,
        "asking systemd to " + call.action + " failed: " + (error->name ? error->name : "?") +
            ": " + (error->message ? error->message : "?") +
            "; check the unit with 'systemctl status " + call.unit + "'",
        call.fields);
    return 0;
  }
  const char* job = nullptr;
  if (call.method != "KillUnit" && sd_bus_message_read(reply, "o", &job) > 0) {
    log(Priority::kInfo, "systemd accepted: " + call.action + " (job " + job + ")", call.fields);
  } else {
    log(Priority::kInfo, "systemd accepted: " + call.action, call.fields);
  }
  return 0;
}

int Gate::send(std::unique_ptr<ManagerCall>& call) {
  sd_bus_slot* slot = nullptr;
  const int r =
      call->signal
          ? sd_bus_call_method_async(bus_, &slot, kSystemd, kManagerPath, kManagerInterface,
                                     call->method.c_str(), on_manager_reply, call.get(), "ssi",
                                     call->unit.c_str(), call->mode.c_str(), *call->signal)
          : sd_bus_call_method_async(bus_, &slot, kSystemd, kManagerPath, kManagerInterface,
                                     call->method.c_str(), on_manager_reply, call.get(), "ss",
                                     call->unit.c_str(), call->mode.c_str());
  if (r < 0) {
    return r;
  }
  // Freed after on_manager_reply, or with the connection if it goes first.
  (void)sd_bus_slot_set_destroy_callback(
      slot, [](void* userdata) { delete static_cast<ManagerCall*>(userdata); });
  (void)call.release();
  (void)sd_bus_slot_set_floating(slot, 1);  // the connection keeps the slot until the reply
  sd_bus_slot_unref(slot);
  return 0;
}

void Gate::resend_later(std::unique_ptr<ManagerCall> call) {
  to_resend_.push_back(std::move(call));
  if (resend_ == nullptr) {
    const int r = sd_event_add_defer(
        event_, &resend_,
        [](sd_event_source*, void* userdata) {
          auto& gate = *static_cast<Gate*>(userdata);
          auto calls = std::move(gate.to_resend_);
          gate.to_resend_.clear();
          (void)sd_event_source_set_enabled(gate.resend_, SD_EVENT_OFF);
          for (auto& again : calls) {
            gate.call_manager(std::move(again));
          }
          return 0;
        },
        this);
    if (r < 0) {
      resend_ = nullptr;
      log(Priority::kErr,
          "cannot ask systemd to " + to_resend_.back()->action + ": " + std::strerror(-r),
          to_resend_.back()->fields);
      to_resend_.pop_back();
      return;
    }
  }
  (void)sd_event_source_set_enabled(resend_, SD_EVENT_ON);
}

int Gate::connect_bus() {
  // sd-bus does not reconnect: after `systemctl restart dbus` the old connection is closed for
  // good (once the loop has read its end), and every call on it fails with ENOTCONN.
  if (bus_ != nullptr && sd_bus_is_open(bus_) > 0) {
    return 0;
  }
  drop_bus();
  sd_bus* bus = nullptr;
  if (const int r = sd_bus_open_system(&bus); r < 0) {
    return r;
  }
  // The local Disconnected signal: no match is sent to the bus daemon for it (sd-bus keeps local
  // matches to itself), and unlike sd_bus_set_exit_on_disconnect() it does not end the loop.
  if (const int r = sd_bus_match_signal(bus, nullptr, "org.freedesktop.DBus.Local",
                                        "/org/freedesktop/DBus/Local", "org.freedesktop.DBus.Local",
                                        "Disconnected", on_disconnected, nullptr);
      r < 0) {
    sd_bus_unref(bus);
    return r;
  }
  if (const int r = sd_bus_attach_event(bus, event_, SD_EVENT_PRIORITY_NORMAL); r < 0) {
    sd_bus_unref(bus);
    return r;
  }
  bus_ = bus;
  return 0;
}

void Gate::drop_bus() {
  if (bus_ == nullptr) {
    return;
  }
  // Only a closed connection comes here (or one whose write just failed): sd-bus answers each call
  // it still waited for with a NoReply error, "Connection terminated", one per sd_bus_process();
  // on_manager_reply sends them again (later, from the loop) before the connection goes.
  for (int i = 0; i < kDrainMax && sd_bus_process(bus_, nullptr) > 0; ++i) {
  }
  (void)sd_bus_detach_event(bus_);
  bus_ = sd_bus_flush_close_unref(bus_);
}

void Gate::call_manager(std::unique_ptr<ManagerCall> call) {
  int r = connect_bus();
  if (r >= 0) {
    r = send(call);
    if (r < 0 && broken_connection(-r) && !call->resent) {
      // It broke since its last use and the loop has not read that yet (a bus daemon restarted a
      // moment ago): once more, on a new connection.
      log(Priority::kWarning,
          "the system bus connection broke (" + std::string(std::strerror(-r)) +
              "); asking again to " + call->action,
          call->fields);
      call->resent = true;
      drop_bus();
      r = connect_bus();
      if (r >= 0) {
        r = send(call);
      }
    }
  }
  if (r < 0) {
    log(Priority::kErr,
        "cannot ask systemd to " + call->action + ": " + std::strerror(-r) +
            (bus_ == nullptr ? " (no system bus; check 'systemctl status dbus')" : ""),
        call->fields);
  }
}

void Gate::act(const ResourceConfig& config, std::optional<fence::Key> key, Reason reason) {
  if (reason == Reason::kReleased) {
    // The writer goes before the reservation does, whatever on_fenced says.
    if (!config.units.empty()) {
      call_units(config, false);
    }
    return;
  }
  switch (config.on_fenced.action) {
    case OnFencedAction::kNone: return;
    case OnFencedAction::kStopUnits: call_units(config, false); return;
    case OnFencedAction::kKillUnits: call_units(config, true); return;
    case OnFencedAction::kCommand: run_command(config, key, reason); return;
    case OnFencedAction::kReboot:
      call_units(config, true);
      reboot(config);
      return;
  }
}

void Gate::call_units(const ResourceConfig& config, bool kill) {
  const LogFields fields{
      .resource = config.name, .key = {}, .epoch = {}, .device = {}, .message_id = {}};
  for (const auto& unit : config.units) {
    if (kill) {
      // SIGKILL to every process of the unit first: a stop runs ExecStop= and waits.
      call_manager(std::make_unique<ManagerCall>(
          ManagerCall{.method = "KillUnit",
                      .unit = unit,
                      .mode = "all",
                      .signal = SIGKILL,
                      .action = "send SIGKILL to every process of " + unit,
                      .fields = fields,
                      .gate = this,
                      .resent = false}));
    }
    call_manager(std::make_unique<ManagerCall>(ManagerCall{.method = "StopUnit",
                                                           .unit = unit,
                                                           .mode = "replace",
                                                           .signal = std::nullopt,
                                                           .action = "stop " + unit,
                                                           .fields = fields,
                                                           .gate = this,
                                                           .resent = false}));
  }
}

void Gate::reboot(const ResourceConfig& config) {
  const LogFields fields{
      .resource = config.name, .key = {}, .epoch = {}, .device = {}, .message_id = {}};
  log(Priority::kErr, "rebooting: on_fenced = \"reboot\"", fields);
  call_manager(std::make_unique<ManagerCall>(ManagerCall{.method = "StartUnit",
                                                         .unit = "reboot.target",
                                                         .mode = "replace-irreversibly",
                                                         .signal = std::nullopt,
                                                         .action = "start reboot.target",
                                                         .fields = fields,
                                                         .gate = this,
                                                         .resent = false}));
}

void Gate::run_command(const ResourceConfig& config, std::optional<fence::Key> key, Reason reason) {
  if (config.on_fenced.command.empty()) {
    return;
  }
  std::vector<std::string> env_strings{
      "BLKFENCE_RESOURCE=" + config.name, "BLKFENCE_REASON=" + std::string(reason_name(reason)),
      "BLKFENCE_KEY=" + (key ? key->to_string() : std::string()),
      "BLKFENCE_EPOCH=" + (key ? std::to_string(key->epoch()) : std::string())};
  std::vector<char*> env;
  for (char** e = environ; *e != nullptr; ++e) {
    env.push_back(*e);
  }
  for (auto& s : env_strings) {
    env.push_back(s.data());
  }
  env.push_back(nullptr);
  std::vector<std::string> args = config.on_fenced.command;
  std::vector<char*> argv;
  argv.reserve(args.size() + 1);
  for (auto& a : args) {
    argv.push_back(a.data());
  }
  argv.push_back(nullptr);
  // The daemon blocks SIGCHLD, SIGTERM and SIGINT for sd-event; the command gets a clean mask.
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  sigset_t empty;
  sigemptyset(&empty);
  posix_spawnattr_setsigmask(&attributes, &empty);
  posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETPGROUP);
  pid_t pid = 0;
  const int r = posix_spawn(&pid, argv[0], nullptr, &attributes, argv.data(), env.data());
  posix_spawnattr_destroy(&attributes);
  const LogFields fields{.resource = config.name,
                         .key = key ? std::optional(key->value()) : std::nullopt,
                         .epoch = key ? std::optional(key->epoch()) : std::nullopt,
                         .device = {},
                         .message_id = {}};
  if (r != 0) {
    log(Priority::kErr, "on_fenced command " + args[0] + " could not start: " + std::strerror(r),
        fields);
    return;
  }
  log(Priority::kNotice,
      "on_fenced command " + args[0] + " started (pid " + std::to_string(pid) + ")", fields);
  auto run = std::make_unique<CommandRun>(CommandRun{.program = args[0], .fields = fields});
  sd_event_source* source = nullptr;  // released by on_child, which frees run
  if (const int added = sd_event_add_child(event_, &source, pid, WEXITED, on_child, run.get());
      added < 0) {
    log(Priority::kErr,
        "on_fenced command " + args[0] + " (pid " + std::to_string(pid) +
            ") cannot be watched: " + std::strerror(-added),
        fields);
    return;
  }
  (void)run.release();
}

}  // namespace blkfence::daemon
