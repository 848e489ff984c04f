// Token files and on_fenced actions (daemon layer). See gate.h.
#include "gate.h"

#include <cerrno>
#include <csignal>
#include <cstring>
#include <memory>
#include <string>
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
namespace {

std::string_view reason_name(Gate::Reason reason) {
  switch (reason) {
    case Gate::Reason::kFenced: return "fenced";
    case Gate::Reason::kLostContact: return "lost-contact";
    case Gate::Reason::kReleased: return "released";
  }
  return "?";
}

int on_unit_reply(sd_bus_message* reply, void* userdata, sd_bus_error*) {
  const auto* what = static_cast<std::string*>(userdata);
  if (sd_bus_message_is_method_error(reply, nullptr) != 0) {
    const sd_bus_error* error = sd_bus_message_get_error(reply);
    log(Priority::kErr, *what + " failed: " + (error && error->message ? error->message : "?"));
  } else {
    log(Priority::kInfo, *what + " done");
  }
  delete what;
  return 0;
}

std::string signal_name(int signal) {
  const char* name = sigabbrev_np(signal);
  return name != nullptr ? "SIG" + std::string(name) : "signal " + std::to_string(signal);
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

Gate::~Gate() {
  sd_bus_flush_close_unref(bus_);
}

std::string Gate::token_path(const std::string& resource) const {
  return run_dir_ + "/" + resource + ".token";
}

Result<void> Gate::open(const std::string& resource, fence::Key key) {
  const std::string path = token_path(resource);
  const std::string temporary = path + ".new";
  {
    const UniqueFd fd(::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (!fd.valid()) {
      return tl::unexpected(Error::os(errno, "create " + temporary));
    }
    const std::string text = key.to_string() + "\n";
    if (::write(fd.get(), text.data(), text.size()) != static_cast<ssize_t>(text.size())) {
      return tl::unexpected(Error::os(errno == 0 ? EIO : errno, "write " + temporary));
    }
  }
  if (::rename(temporary.c_str(), path.c_str()) != 0) {
    return tl::unexpected(Error::os(errno, "rename " + temporary));
  }
  return {};
}

void Gate::close(const std::string& resource) {
  const std::string path = token_path(resource);
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    log(Priority::kErr, "cannot remove the token " + path + ": " + std::strerror(errno),
        {.resource = resource, .key = {}, .epoch = {}, .device = {}, .message_id = {}});
  }
}

sd_bus* Gate::bus() {
  if (bus_ == nullptr) {
    if (const int r = sd_bus_open_system(&bus_); r < 0) {
      log(Priority::kErr, std::string("cannot connect to the system bus: ") + std::strerror(-r));
      bus_ = nullptr;
      return nullptr;
    }
    (void)sd_bus_attach_event(bus_, event_, SD_EVENT_PRIORITY_NORMAL);
  }
  return bus_;
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
  sd_bus* connection = config.units.empty() ? nullptr : bus();
  for (const auto& unit : config.units) {
    if (connection == nullptr) {
      log(Priority::kErr, "cannot stop " + unit + ": no system bus",
          {.resource = config.name, .key = {}, .epoch = {}, .device = {}, .message_id = {}});
      continue;
    }
    if (kill) {
      // SIGKILL to every process of the unit first: a stop runs ExecStop= and waits.
      auto* what = new std::string("KillUnit " + unit);
      if (sd_bus_call_method_async(connection, nullptr, "org.freedesktop.systemd1",
                                   "/org/freedesktop/systemd1", "org.freedesktop.systemd1.Manager",
                                   "KillUnit", on_unit_reply, what, "ssi", unit.c_str(), "all",
                                   SIGKILL) < 0) {
        delete what;
      }
    }
    auto* what = new std::string("StopUnit " + unit);
    if (sd_bus_call_method_async(connection, nullptr, "org.freedesktop.systemd1",
                                 "/org/freedesktop/systemd1", "org.freedesktop.systemd1.Manager",
                                 "StopUnit", on_unit_reply, what, "ss", unit.c_str(),
                                 "replace") < 0) {
      delete what;
      log(Priority::kErr, "cannot ask systemd to stop " + unit,
          {.resource = config.name, .key = {}, .epoch = {}, .device = {}, .message_id = {}});
    }
  }
}

void Gate::reboot(const ResourceConfig& config) {
  log(Priority::kErr, "rebooting: on_fenced = \"reboot\"",
      {.resource = config.name, .key = {}, .epoch = {}, .device = {}, .message_id = {}});
  sd_bus* connection = bus();
  if (connection == nullptr) {
    return;
  }
  auto* what = new std::string("reboot");
  if (sd_bus_call_method_async(connection, nullptr, "org.freedesktop.systemd1",
                               "/org/freedesktop/systemd1", "org.freedesktop.systemd1.Manager",
                               "StartUnit", on_unit_reply, what, "ss", "reboot.target",
                               "replace-irreversibly") < 0) {
    delete what;
  }
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
