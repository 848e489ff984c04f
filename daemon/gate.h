// The writer gate's effects on this node: token files and on_fenced actions (daemon layer).
//
// docs/design.md §5: /run/blkfence/RESOURCE.token exists exactly while the gate is open and holds
// the token (the key, "0x" and 16 hex digits, and a newline); it is written to a temporary file and
// renamed, so a reader never sees half a token. When the gate closes because the node was fenced
// or lost contact, the resource's on_fenced action runs: stop or kill its systemd units through
// sd-bus (asynchronously, on the event loop), run a command (BLKFENCE_RESOURCE, BLKFENCE_KEY,
// BLKFENCE_EPOCH and BLKFENCE_REASON in its environment), or reboot (opt-in). An explicit release
// stops the units too: the writer goes before the reservation does. The connection to the system
// bus outlives a restart of the bus daemon: one found closed is replaced before use, and a call
// that could not be sent, or was left unanswered, because it broke is sent once more on a new one.
// Every action that fails is logged with its resource, never silently dropped. One thread.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <systemd/sd-bus.h>

#include "blkfence/error.h"
#include "blkfence/key.h"

#include "config.h"

struct sd_event;
struct sd_event_source;

namespace blkfence::daemon {

struct ManagerCall;  // one method call to systemd's manager, and what to log about it (gate.cc)

// Writes text to path through a temporary file renamed over it (mode 0644), so that a reader sees
// the old text or the new one, never half of one.
[[nodiscard]] Result<void> replace_file(const std::string& path, const std::string& text);

class Gate {
 public:
  Gate(sd_event* event, std::string run_dir);
  ~Gate();
  Gate(const Gate&) = delete;
  Gate& operator=(const Gate&) = delete;

  std::string token_path(const std::string& resource) const;
  [[nodiscard]] Result<void> open(const std::string& resource, fence::Key key);
  void close(const std::string& resource);

  enum class Reason : std::uint8_t { kFenced, kLostContact, kReleased };
  // Runs what the resource's configuration says for reason; errors are logged, never fatal.
  void act(const ResourceConfig& config, std::optional<fence::Key> key, Reason reason);

 private:
  void call_units(const ResourceConfig& config, bool kill);
  void reboot(const ResourceConfig& config);
  void run_command(const ResourceConfig& config, std::optional<fence::Key> key, Reason reason);
  // Sends call on the system bus, on a new connection if the current one broke; logs a failure.
  void call_manager(std::unique_ptr<ManagerCall> call);
  // Sends call on bus_ without waiting; on success the reply's slot owns it.
  [[nodiscard]] int send(std::unique_ptr<ManagerCall>& call);
  static int on_manager_reply(sd_bus_message* reply, void* userdata, sd_bus_error* error);
  // A call that a broken connection left unanswered goes again, from the loop: not from within
  // the broken connection's own dispatch, which must end before that connection can be dropped.
  void resend_later(std::unique_ptr<ManagerCall> call);
  // bus_ open (or opening) on success; -errno when no connection to the system bus can be made.
  [[nodiscard]] int connect_bus();
  // Lets go of bus_, after the calls it still waits for have been answered (by sd-bus, if broken).
  void drop_bus();

  sd_event* event_;
  std::string run_dir_;
  sd_bus* bus_ = nullptr;
  std::vector<std::unique_ptr<ManagerCall>> to_resend_;
  sd_event_source* resend_ = nullptr;  // a defer source, on while to_resend_ is not empty
};

}  // namespace blkfence::daemon
