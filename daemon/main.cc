// blkfenced: the per-node fencing daemon's entry point (daemon layer).
//
// Reads the configuration, refuses to start on any error in it (exit 78, EX_CONFIG, which the unit
// does not restart on), blocks the signals sd-event handles, and runs the daemon until SIGTERM.
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <string>

#include <CLI/CLI.hpp>

#include "blkfence/pr/client.h"

#include "config.h"
#include "daemon.h"
#include "log.h"

namespace {

constexpr int kExitConfig = 78;  // sysexits.h EX_CONFIG
// How long the exit waits for the log records still queued.
constexpr std::chrono::seconds kLogFlushWait{2};

int run(int argc, char** argv) {
  using namespace blkfence::daemon;
  CLI::App app{
      "blkfenced: gates this node's writers on holding a SCSI-3 persistent reservation.\n\n"
      "Runs the fencing protocol for every resource of the configuration: acquires on request\n"
      "(blkfencectl acquire, e.g. from Patroni's pre_promote), checks every check_interval that\n"
      "this node's key still holds every LU, and closes the gate (removes\n"
      "RUN_DIR/RESOURCE.token, runs on_fenced) the moment it does not. Serves\n"
      "RUN_DIR/control.sock for blkfencectl. Normally started by systemd (blkfenced.service).",
      "blkfenced"};
  std::string config_path(kDefaultConfigPath);
  bool check_only = false;
  std::string log_target = "auto";
  bool debug = false;
  app.add_option("-c,--config", config_path, "configuration file")->capture_default_str();
  app.add_flag("--check-config", check_only,
               "parse the configuration and resolve every device, print the result, and exit "
               "(0 when valid, 78 when not)");
  app.add_option("--log", log_target,
                 "where records go: auto (journal under systemd), journal, stderr")
      ->check(CLI::IsMember({"auto", "journal", "stderr"}))
      ->capture_default_str();
  app.add_flag("--debug", debug, "log debug records too");
  app.set_version_flag("--version", "blkfenced 0.1.0");
  app.footer(
      "Exit status: 0 stopped by SIGTERM/SIGINT; 1 runtime failure (devices, sockets, another\n"
      "blkfenced on the same run_dir); 78 bad configuration (the message names the file, line\n"
      "and key). SIGHUP is logged and ignored: nothing is reloaded.\n"
      "Files: /etc/blkfence/blkfence.toml, /run/blkfence/control.sock, /run/blkfence/*.token,\n"
      "/var/lib/blkfence/*.epoch (the highest epoch used per resource; never lower it).\n"
      "See docs/operations.md and docs/protocol.md.");
  CLI11_PARSE(app, argc, argv);
  set_log_target(log_target == "journal"  ? LogTarget::kJournal
                 : log_target == "stderr" ? LogTarget::kStderr
                                          : LogTarget::kAuto);
  set_log_debug(debug);

  auto config = load_config(config_path);
  if (!config) {
    // A configuration error's text names the file, line and key; an OS error needs its errno.
    const auto& error = config.error();
    (void)std::fprintf(
        stderr, "blkfenced: %s\n",
        (error.code() == blkfence::ErrorCode::kInvalidArgument ? error.where() : error.message())
            .c_str());
    return kExitConfig;
  }
  if (check_only) {
    (void)std::fputs(format_config(*config).c_str(), stdout);
    // The devices as this host sees them now: a name that does not resolve is an error here too.
    int status = 0;
    const auto env = blkfence::pr::system_discovery_env();
    std::vector<std::pair<std::string, std::vector<blkfence::pr::LogicalUnit>>> resolved;
    for (const auto& resource : config->resources) {
      auto lus = resolve_devices(resource, env);
      if (!lus) {
        (void)std::fprintf(stderr, "blkfenced: %s\n", lus.error().message().c_str());
        status = kExitConfig;
        continue;
      }
      for (const auto& [other, others] : resolved) {
        if (auto shared = shared_lu(*lus, other, others)) {
          (void)std::fprintf(stderr, "blkfenced: resource %s: %s; name it in one resource only\n",
                             resource.name.c_str(), shared->c_str());
          status = kExitConfig;
        }
      }
      resolved.emplace_back(resource.name, *lus);
      for (const auto& lu : *lus) {
        std::string paths;
        for (const auto& path : lu.paths) {
          paths += " " + blkfence::pr::command_device(path) + " (" + path.hctl + ")";
        }
        (void)std::printf("# %s: %s = %s:%s\n", resource.name.c_str(), lu.name.c_str(),
                          lu.wwn.c_str(), paths.c_str());
      }
    }
    return status;
  }
  // sd-event takes these through signalfd; the transport's threads inherit the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGHUP);
  sigaddset(&signals, SIGCHLD);
  sigprocmask(SIG_BLOCK, &signals, nullptr);
  (void)std::signal(SIGPIPE, SIG_IGN);

  auto daemon = Daemon::make(std::move(*config));
  if (!daemon) {
    log(Priority::kErr, "cannot start: " + daemon.error().message());
    return daemon.error().code() == blkfence::ErrorCode::kInvalidArgument ? kExitConfig : 1;
  }
  return (*daemon)->run();
}

}  // namespace

int main(int argc, char** argv) {
  // CLI11 reports bad arguments by exception (handled by CLI11_PARSE); anything else that escapes,
  // such as std::bad_alloc, ends here with a message instead of std::terminate.
  try {
    const int status = run(argc, argv);
    // The records of the way out, written by the log's thread; a stalled journal does not hold
    // the exit up for long (log.h).
    (void)blkfence::daemon::flush_log(kLogFlushWait);
    return status;
  } catch (const std::exception& error) {
    (void)std::fprintf(stderr, "blkfenced: %s\n", error.what());
    return 1;
  }
}
