// blkfenced's core: the resources of this node, their gates, the control socket and systemd
// integration, on one sd-event loop (daemon layer).
//
// One thread. The transport's completions wake the loop through its poll fd; one timer is re-armed
// after every dispatch to the earliest of what the engine (retry back-offs) and the resources
// (monitor rounds, lease expiry) asked for. The protocol itself is fence::Resource; this class
// turns its decisions into effects (token files, on_fenced actions, journal records, sd_notify,
// replies and watch events) and turns control requests into its operations. Nothing on the loop
// waits unbounded (docs/operations.md, "Blocking calls"): control_group is resolved once, at
// start (access.h); the log's own thread writes the records (log.h); and the epoch file is
// written by a worker that the loop waits for at most epoch_store_wait() (epoch_worker.h).
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <sys/types.h>

#include "blkfence/control/protocol.h"
#include "blkfence/fence/epoch_store.h"
#include "blkfence/fence/resource.h"
#include "blkfence/pr/discovery.h"
#include "blkfence/pr/engine.h"
#include "blkfence/transport/transport.h"
#include "blkfence/unique_fd.h"

#include "access.h"
#include "config.h"
#include "control_server.h"
#include "gate.h"
#include "host_queues.h"

struct sd_event;
struct sd_event_source;
struct sd_device;
struct sd_device_monitor;
struct signalfd_siginfo;

namespace blkfence::daemon {

// blkfenced is the server end of the control protocol: its requests, replies and events are used
// unqualified in the daemon.
using namespace control;

// The LUs a resource's configured devices name, with every path of each (one LU per device).
[[nodiscard]] Result<std::vector<pr::LogicalUnit>> resolve_devices(const ResourceConfig& resource,
                                                                   const pr::DiscoveryEnv& env);

// Why a resource whose devices resolved to `lus` cannot have them: a LU that resource `other`
// already has (`others`), compared by WWN however each configuration named it; nothing when they
// share none. Two resources on one LU would reserve it with two keys, and the second acquire would
// fence the first resource's writer. The configuration can compare names only (config.cc).
[[nodiscard]] std::optional<std::string> shared_lu(const std::vector<pr::LogicalUnit>& lus,
                                                   const std::string& other,
                                                   const std::vector<pr::LogicalUnit>& others);

// What Daemon::make() takes from the system: the transport the configuration names and the LUs of
// a resource's devices. The daemon's tests replace both to run it on a simulated target.
struct DaemonEnv {
  std::function<Result<std::unique_ptr<transport::Transport>>(const std::string& kind)> transport;
  std::function<Result<std::vector<pr::LogicalUnit>>(const ResourceConfig& resource)> resolve;
  // control_group's id by name: called once, by make() (access.h).
  GroupLookup group_lookup = group_id;
  // The epoch store in state_dir; the daemon calls it through a BoundedEpochStore
  // (epoch_worker.h).
  std::function<std::unique_ptr<fence::EpochStore>(const std::string& state_dir)> epochs;
  // The writes this host has in flight on a LU (pr::writes_in_flight on /sys): a REGISTER of a
  // node that may have been fenced, and a re-key of its own holding nexus, wait for none
  // (docs/protocol.md, "Writes queued in the initiator", "Re-keying a holding nexus").
  std::function<Result<std::uint64_t>(const pr::LogicalUnit& lu)> writes_in_flight;
  // Whether a path opened (again) reaches its LU (pr::check_identity on /sys); unset, nothing is
  // checked (pr::Engine::check_identity_with()).
  pr::Engine::IdentityCheck check_identity;
  // The host's queues of writes in run_dir (HostQueues::system); unset, the host has none.
  std::function<std::unique_ptr<HostQueues>(const std::string& run_dir)> host_queues;
};
// How long that re-key waits for them: longer than the SCSI midlayer's default command timeout
// (30 s) and one retry, so that a write that will never complete has been failed by the kernel by
// then; an operation's caller can cancel it sooner (--timeout).
inline constexpr std::chrono::seconds kDrainWait{75};
// How long the event loop waits for a load or store of the epoch file: what every resource's
// monitor can afford (one check_interval, and half of what its lease leaves over check_interval),
// and at most this (docs/operations.md, "Blocking calls").
inline constexpr std::chrono::milliseconds kEpochStoreWaitMax{1000};
[[nodiscard]] std::chrono::milliseconds epoch_store_wait(const Config& config);
// io_uring or SG_IO as configured, and resolve_devices() on /sys and /dev, the epochs in files.
DaemonEnv system_daemon_env();

class Daemon final : public fence::Observer, public ControlHandler {
 public:
  // Resolves every resource's devices, opens the transport, binds the control socket. Nothing is
  // sent to a device until run().
  [[nodiscard]] static Result<std::unique_ptr<Daemon>> make(
      Config config, const DaemonEnv& env = system_daemon_env());
  ~Daemon() override;
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  // Runs until SIGTERM or SIGINT; returns the exit status.
  int run();

  // fence::Observer
  void on_gate(const fence::Resource& resource, bool open, pr::Time verified_since) override;
  void on_event(const fence::Resource& resource, const fence::Event& event) override;
  // ControlHandler
  void on_line(ClientId client, const Peer& peer, std::string_view line, bool too_large) override;
  void on_disconnect(ClientId client) override;
  bool privileged(const Peer& peer) override;

 private:
  struct Pending;
  Daemon() = default;

  static int on_transport(sd_event_source* source, int fd, std::uint32_t revents, void* self);
  static int on_timer(sd_event_source* source, std::uint64_t usec, void* self);
  static int on_post(sd_event_source* source, void* self);
  static int on_signal(sd_event_source* source, const ::signalfd_siginfo* info, void* self);
  static int on_device(sd_device_monitor* monitor, sd_device* device, void* self);

  // How long after a device event the configured names are resolved again.
  static constexpr std::chrono::milliseconds kRescanDelay{200};
  // How often the devices of a waiting resource are looked for without a device event (udev's
  // events are the usual trigger; this covers a missed one, or no udev at all).
  static constexpr std::chrono::seconds kWaitingRetry{5};

  pr::Time now() const;
  void tick();
  void schedule();
  void notify_status();
  void feed_watchdog();
  void watch_devices();
  void rescan();

  void add_resource(const ResourceConfig& resource, std::vector<pr::LogicalUnit> lus);
  fence::Resource* find(const std::string& name);
  // shared_lu() against every resource added so far.
  std::optional<std::string> lu_of_another_resource(const std::vector<pr::LogicalUnit>& lus) const;
  // The status of a resource that has no fence::Resource: waiting for its devices, or refused.
  ResourceStatus waiting_status(const std::string& name) const;
  const ResourceConfig* config_of(const std::string& name) const;
  ResourceStatus status_of(const fence::Resource& resource) const;
  std::string metrics_text() const;
  void reply_error(ClientId client, std::optional<std::uint64_t> id, ReplyError code,
                   std::string message);
  void handle(ClientId client, const Peer& peer, const Request& request);
  void handle_resource(ClientId client, const Request& request, fence::Resource& resource);
  void run_operation(ClientId client, const Request& request, fence::Resource& resource);
  void read_keys(ClientId client, const Request& request, fence::Resource& resource);
  void start_keys_reads();
  void answer_keys(const std::string& name, const std::vector<pr::Response>& responses);
  void broadcast(Event event, const fence::Resource& resource);

  Config config_;
  ControlGroup control_group_;  // config_.control_group, resolved once by make()
  UniqueFd run_lock_;           // run_dir/blkfenced.lock, flock()ed: one daemon per run_dir
  sd_event* event_ = nullptr;
  sd_event_source* transport_source_ = nullptr;
  sd_event_source* timer_source_ = nullptr;
  sd_event_source* post_source_ = nullptr;
  std::vector<sd_event_source*> signal_sources_;
  sd_device_monitor* device_monitor_ = nullptr;
  std::optional<pr::Time> rescan_at_;
  std::unique_ptr<transport::Transport> transport_;
  std::unique_ptr<pr::Engine> engine_;
  std::unique_ptr<fence::EpochStore> epochs_;
  std::function<Result<std::uint64_t>(const pr::LogicalUnit& lu)> writes_in_flight_;
  std::unique_ptr<HostQueues> host_queues_;
  std::unique_ptr<Gate> gate_;
  std::vector<std::unique_ptr<fence::Resource>> resources_;
  // Resources whose devices this host does not have yet, and why: no fence::Resource until they
  // resolve (Daemon::rescan), gate closed, state "unknown" in status.
  std::map<std::string, std::string> waiting_;
  // Resources whose devices turned out, once they appeared, to be another resource's LU, and why
  // (shared_lu()): out of the daemon until the configuration is fixed and blkfenced restarted,
  // never looked for again, gate closed, state "unknown" and detail "refused: ..." in status.
  std::map<std::string, std::string> refused_;
  // The environment's resolve (DaemonEnv), for waiting resources.
  std::function<Result<std::vector<pr::LogicalUnit>>(const ResourceConfig&)> resolve_;
  std::unique_ptr<ControlServer> control_;
  std::map<ClientId, std::string> watchers_;  // client -> resource ("" for all)
  // The `keys` requests of each resource, answered together by one read (docs/control-protocol.md,
  // "keys"): at most one in flight per resource, none started while the protocol's batches are
  // open.
  struct KeysRead {
    std::vector<std::pair<ClientId, std::uint64_t>> waiting;  // client, request id
    bool in_flight = false;
  };
  static constexpr std::size_t kKeysWaitingMax = 256;
  std::map<std::string, KeysRead> keys_reads_;
  std::size_t keys_reads_in_flight_ = 0;
  // The running acquire or promote of each resource, and whose: cancelled when its caller
  // disconnects or its --timeout passes (docs/control-protocol.md).
  std::map<std::string, std::weak_ptr<Pending>> cancellable_;
  bool ready_sent_ = false;
  std::uint64_t watchdog_usec_ = 0;
  pr::Time last_watchdog_{0};
  pr::Time started_{0};
};

}  // namespace blkfence::daemon
