// blkfenced's core (daemon layer). See daemon.h.
#include "daemon.h"

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstring>
#include <filesystem>
#include <utility>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <systemd/sd-daemon.h>
#include <systemd/sd-device.h>
#include <systemd/sd-event.h>
#include <time.h>
#include <unistd.h>

#include "blkfence/codec/prin.h"
#include "blkfence/pr/client.h"

#include "access.h"
#include "epoch_worker.h"
#include "log.h"

namespace blkfence::daemon {
namespace {

// The daemon's one clock, for the lease, the checks and the callers' deadlines: CLOCK_BOOTTIME
// goes on while the machine is suspended, where CLOCK_MONOTONIC stops. After a resume the lease
// has run for the whole suspend, the checks are due at once, and no gate is reported open on a
// check older than the lease (docs/protocol.md, "Lease").
constexpr clockid_t kClock = CLOCK_BOOTTIME;

LogFields fields_of(const fence::Resource& resource, std::string_view message_id = {},
                    std::string device = {}) {
  const auto key = resource.key();
  return LogFields{.resource = resource.name(),
                   .key = key ? std::optional(key->value()) : std::nullopt,
                   .epoch = key ? std::optional(key->epoch()) : std::nullopt,
                   .device = std::move(device),
                   .message_id = message_id};
}

// The fields of a record about a resource that has no fence::Resource yet (it waits for devices).
LogFields fields_of_name(const std::string& resource) {
  return LogFields{.resource = resource,
                   .key = std::nullopt,
                   .epoch = std::nullopt,
                   .device = {},
                   .message_id = {}};
}

fence::Mode fence_mode(Mode mode) {
  return mode == Mode::kExclusive ? fence::Mode::kExclusive : fence::Mode::kShared;
}

ReplyError reply_error_for(const Error& error) {
  switch (error.code()) {
    case ErrorCode::kBusy: return ReplyError::kBusy;
    case ErrorCode::kLost:
    case ErrorCode::kKeyInUse:
    case ErrorCode::kReservationConflict: return ReplyError::kConflict;
    case ErrorCode::kIndeterminate: return ReplyError::kIndeterminate;
    case ErrorCode::kCancelled: return ReplyError::kTimeout;
    case ErrorCode::kInvalidArgument: return ReplyError::kBadRequest;
    default: return ReplyError::kDevice;
  }
}

Result<std::unique_ptr<transport::Transport>> transport_for(const std::string& kind) {
  if (kind == "uring") {
    return transport::make_transport(transport::TransportKind::kUring);
  }
  if (kind == "sgio") {
    return transport::make_transport(transport::TransportKind::kSgio);
  }
  return transport::make_transport(transport::TransportKind::kAuto);
}

Result<void> make_dir(const std::string& path, mode_t mode) {
  std::error_code ec;
  std::filesystem::create_directories(path, ec);
  if (ec) {
    return fail(ErrorCode::kOs, "create " + path + ": " + ec.message());
  }
  (void)::chmod(path.c_str(), mode);
  return {};
}

// A device the host does not have (yet): a path that does not exist, or a WWN that no SCSI device
// of this host reports. Anything else (a partition, not a SCSI device) is a configuration error.
bool absent(const Error& error) {
  return error.code() == ErrorCode::kOs && error.errno_value() == ENOENT;
}

// What a waiting resource waits for: resolve_devices()'s message without its "resource NAME: ".
std::string missing_device(const Error& error, const std::string& resource) {
  std::string text = error.message();
  const std::string prefix = "resource " + resource + ": ";
  return text.starts_with(prefix) ? text.substr(prefix.size()) : text;
}

// run_dir/blkfenced.lock, locked (flock) for the daemon's lifetime and holding its pid: one daemon
// per run_dir. The lock goes with the process, however it ends.
Result<UniqueFd> lock_run_dir(const std::string& run_dir) {
  const std::string path = run_dir + "/blkfenced.lock";
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644));
  if (!fd.valid()) {
    return tl::unexpected(Error::os(errno, "open " + path));
  }
  if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno != EWOULDBLOCK) {
      return tl::unexpected(Error::os(errno, "lock " + path));
    }
    char text[32] = {};
    const ssize_t got = ::pread(fd.get(), text, sizeof text - 1, 0);
    std::string holder(text, got > 0 ? static_cast<std::size_t>(got) : 0);
    while (!holder.empty() && holder.back() == '\n') {
      holder.pop_back();
    }
    return fail(ErrorCode::kBusy, "another blkfenced" +
                                      (holder.empty() ? "" : " (pid " + holder + ")") +
                                      " already runs on " + run_dir + " (" + path +
                                      " is locked); one daemon per run_dir");
  }
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd.get(), 0) != 0 ||
      ::pwrite(fd.get(), pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
    return tl::unexpected(Error::os(errno, "write " + path));
  }
  return fd;
}

}  // namespace

Result<std::vector<pr::LogicalUnit>> resolve_devices(const ResourceConfig& resource,
                                                     const pr::DiscoveryEnv& env) {
  auto lus = pr::discover(resource.devices, env);
  if (!lus && lus.error().errno_value() != 0) {
    // Keeps the errno: ENOENT is a device this host does not have yet (see absent()).
    return tl::unexpected(Error::os(lus.error().errno_value(),
                                    "resource " + resource.name + ": " + lus.error().where()));
  }
  if (!lus) {
    return fail(lus.error().code(), "resource " + resource.name + ": " + lus.error().message());
  }
  if (lus->size() != resource.devices.size()) {
    return fail(ErrorCode::kInvalidArgument,
                "resource " + resource.name + ": " + std::to_string(resource.devices.size()) +
                    " devices name only " + std::to_string(lus->size()) +
                    " LUs (two of them are paths to one LU; list each LU once, by WWN)");
  }
  return lus;
}

std::optional<std::string> shared_lu(const std::vector<pr::LogicalUnit>& lus,
                                     const std::string& other,
                                     const std::vector<pr::LogicalUnit>& others) {
  for (const pr::LogicalUnit& lu : lus) {
    for (const pr::LogicalUnit& theirs : others) {
      if (lu.wwn == theirs.wwn) {
        return "its device \"" + lu.name + "\" is LU " + lu.wwn + ", which resource " + other +
               " has already (as \"" + theirs.name + "\"): a LU belongs to one resource";
      }
    }
  }
  return std::nullopt;
}

DaemonEnv system_daemon_env() {
  return {
      .transport = transport_for,
      .resolve =
          [](const ResourceConfig& resource) {
            return resolve_devices(resource, pr::system_discovery_env());
          },
      .group_lookup = group_id,
      .epochs =
          [](const std::string& state_dir) { return fence::make_file_epoch_store(state_dir); },
      .writes_in_flight = [env = pr::system_discovery_env()](
                              const pr::LogicalUnit& lu) { return pr::writes_in_flight(lu, env); },
      .check_identity =
          [env = pr::system_discovery_env()](const transport::DeviceNumber& node,
                                             const std::string& device, const std::string& wwn) {
            return pr::check_identity(node, device, wwn, env);
          },
      .host_queues =
          [](const std::string& run_dir) {
            return std::make_unique<HostQueues>(HostQueues::system(run_dir));
          }};
}

std::chrono::milliseconds epoch_store_wait(const Config& config) {
  std::chrono::milliseconds wait = kEpochStoreWaitMax;
  for (const auto& resource : config.resources) {
    wait =
        std::min({wait, resource.check_interval, (resource.lease - resource.check_interval) / 2});
  }
  return std::max(wait, std::chrono::milliseconds(1));
}

Result<std::unique_ptr<Daemon>> Daemon::make(Config config, const DaemonEnv& env) {
  std::unique_ptr<Daemon> daemon(new Daemon());
  daemon->config_ = std::move(config);
  daemon->writes_in_flight_ = env.writes_in_flight;
  if (env.host_queues) {
    daemon->host_queues_ = env.host_queues(daemon->config_.run_dir);
  }
  const Config& c = daemon->config_;
  if (auto made = make_dir(c.state_dir, 0700); !made) {
    return tl::unexpected(made.error());
  }
  if (auto made = make_dir(c.run_dir, 0755); !made) {
    return tl::unexpected(made.error());
  }
  // Before anything in run_dir is touched: a second daemon would remove the first one's tokens and
  // take its control socket.
  auto locked = lock_run_dir(c.run_dir);
  if (!locked) {
    return tl::unexpected(locked.error());
  }
  daemon->run_lock_ = std::move(*locked);
  if (const int r = sd_event_default(&daemon->event_); r < 0) {
    return tl::unexpected(Error::os(-r, "sd_event_default"));
  }
  daemon->resolve_ = env.resolve;
  // Once, here: the loop never waits on the group database (access.h).
  daemon->control_group_ = resolve_control_group(c.control_group, env.group_lookup);
  if (!c.control_group.empty() && !daemon->control_group_.gid) {
    log(Priority::kWarning, "control_group " + c.control_group +
                                " does not exist: only root may change state (a group created "
                                "later counts after a restart of blkfenced)");
  }
  auto made_transport = env.transport(c.transport);
  if (!made_transport) {
    return tl::unexpected(made_transport.error());
  }
  daemon->transport_ = std::move(*made_transport);
  // One engine for every resource (they share the transport's completions); the shortest
  // configured command timeout applies to all.
  pr::RetryPolicy policy;
  policy.command_timeout = std::chrono::milliseconds::max();
  for (const auto& resource : c.resources) {
    policy.command_timeout = std::min(policy.command_timeout, resource.command_timeout);
  }
  daemon->engine_ = std::make_unique<pr::Engine>(*daemon->transport_, policy);
  daemon->engine_->check_identity_with(env.check_identity);
  // Off the loop, waited for at most epoch_store_wait(): a stalled fsync must not stop the
  // monitors (epoch_worker.h).
  daemon->epochs_ = std::make_unique<BoundedEpochStore>(
      env.epochs ? env.epochs(c.state_dir) : fence::make_file_epoch_store(c.state_dir),
      epoch_store_wait(c));
  daemon->gate_ = std::make_unique<Gate>(daemon->event_, c.run_dir);

  for (const auto& resource : c.resources) {
    // The gate is closed until the protocol says otherwise, whatever a previous run left.
    daemon->gate_->close(resource.name);
    auto lus = env.resolve(resource);
    if (!lus && absent(lus.error())) {
      // A LU not visible yet (an iSCSI login still to come): the resource waits with its gate
      // closed, and its devices are resolved again on device events (Daemon::rescan).
      std::string missing = missing_device(lus.error(), resource.name);
      log(Priority::kWarning, "resource " + resource.name + " waits for its devices: " + missing,
          fields_of_name(resource.name));
      daemon->waiting_[resource.name] = std::move(missing);
      continue;
    }
    if (!lus) {
      return tl::unexpected(lus.error());
    }
    if (auto shared = daemon->lu_of_another_resource(*lus)) {
      return fail(ErrorCode::kInvalidArgument,
                  "resource " + resource.name + ": " + *shared + "; name it in one resource only");
    }
    daemon->add_resource(resource, std::move(*lus));
  }

  auto control = ControlServer::make(daemon->event_, c.run_dir + "/control.sock", *daemon);
  if (!control) {
    return tl::unexpected(control.error());
  }
  daemon->control_ = std::move(*control);
  return daemon;
}

void Daemon::add_resource(const ResourceConfig& resource, std::vector<pr::LogicalUnit> lus) {
  fence::ResourceOptions options{
      .name = resource.name,
      .lus = std::move(lus),
      .mode = fence_mode(resource.mode),
      .type = resource.type,
      .preempt_abort = resource.preempt_abort,
      .primary = resource.mode == Mode::kPrimary,
      .cluster_id = fence::cluster_id_from_name(config_.cluster),
      .node_id = config_.node_id,
      .check_interval = resource.check_interval,
      .lease = resource.lease,
      .keys_every = resource.keys_every,
      .verify_rounds_max = 3,
      .writes_in_flight = writes_in_flight_,
      .drain_wait = kDrainWait,
      .host_queueing = {},
  };
  if (host_queues_) {
    options.host_queueing = [this, name = resource.name](const pr::LogicalUnit& lu, bool queue) {
      auto set = host_queues_->set(name, lu, queue);
      if (!set) {
        log(Priority::kErr,
            std::string(queue ? "cannot let " : "cannot stop ") +
                "the host's queues of writes on " + lu.name + (queue ? " queue again: " : ": ") +
                set.error().message(),
            {.resource = name, .key = {}, .epoch = {}, .device = {}, .message_id = {}});
      }
      return set;
    };
  }
  resources_.push_back(
      std::make_unique<fence::Resource>(std::move(options), *engine_, *epochs_, *this));
}

Daemon::~Daemon() {
  // Stopping closes every gate: nothing vouches for the tokens once the daemon is gone.
  for (const auto& resource : resources_) {
    gate_->close(resource->name());
  }
  control_.reset();
  resources_.clear();
  engine_.reset();
  sd_event_source_disable_unref(transport_source_);
  sd_event_source_disable_unref(timer_source_);
  sd_event_source_disable_unref(post_source_);
  sd_device_monitor_unref(device_monitor_);
  for (auto* source : signal_sources_) {
    sd_event_source_disable_unref(source);
  }
  gate_.reset();
  transport_.reset();
  sd_event_unref(event_);
}

pr::Time Daemon::now() const {
  timespec ts{};
  (void)clock_gettime(kClock, &ts);
  return std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec);
}

int Daemon::run() {
  int r = sd_event_add_io(event_, &transport_source_, transport_->poll_fd(), EPOLLIN,
                          &Daemon::on_transport, this);
  if (r >= 0) {
    r = sd_event_add_time(event_, &timer_source_, kClock, UINT64_MAX, 0, &Daemon::on_timer, this);
  }
  if (r >= 0) {
    r = sd_event_add_post(event_, &post_source_, &Daemon::on_post, this);
  }
  for (const int signal : {SIGTERM, SIGINT, SIGHUP}) {
    sd_event_source* source = nullptr;
    if (r >= 0) {
      r = sd_event_add_signal(event_, &source, signal, &Daemon::on_signal, this);
      signal_sources_.push_back(source);
    }
  }
  if (r < 0) {
    log(Priority::kErr, std::string("cannot set up the event loop: ") + std::strerror(-r));
    return 1;
  }
  watch_devices();
  std::uint64_t watchdog = 0;
  if (sd_watchdog_enabled(0, &watchdog) > 0) {
    watchdog_usec_ = watchdog;
  }
  started_ = now();
  log(Priority::kInfo, "blkfenced started: cluster " + config_.cluster + ", node " +
                           std::to_string(config_.node_id) + ", " +
                           std::to_string(resources_.size()) + " resource(s), transport " +
                           std::string(transport_->name()));
  for (const auto& resource : resources_) {
    resource->start(started_);
  }
  if (!waiting_.empty()) {
    rescan_at_ = started_ + kWaitingRetry;
  }
  schedule();
  r = sd_event_loop(event_);
  (void)sd_notify(0, "STOPPING=1");
  if (r < 0) {
    log(Priority::kErr, std::string("event loop failed: ") + std::strerror(-r));
    return 1;
  }
  return 0;
}

int Daemon::on_transport(sd_event_source*, int, std::uint32_t, void* self) {
  auto* daemon = static_cast<Daemon*>(self);
  if (auto pumped = daemon->engine_->pump(daemon->now()); !pumped) {
    log(Priority::kErr, "transport failed: " + pumped.error().message());
    daemon->engine_->fail_all(pumped.error(), daemon->now());
  }
  return 0;
}

int Daemon::on_timer(sd_event_source*, std::uint64_t, void*) {
  return 0;  // on_post does the work after every dispatch
}

int Daemon::on_post(sd_event_source*, void* self) {
  auto* daemon = static_cast<Daemon*>(self);
  daemon->tick();
  daemon->start_keys_reads();
  daemon->schedule();
  return 0;
}

int Daemon::on_signal(sd_event_source* source, const ::signalfd_siginfo* info, void*) {
  if (info->ssi_signo == SIGHUP) {
    // Conventionally "reload"; a fencing daemon must not end on it. Nothing is reloaded: a
    // resource's LUs, mode and key cannot change under a running protocol.
    log(Priority::kNotice,
        "SIGHUP ignored: blkfenced does not reload its configuration; restart it to apply a "
        "change (the gates close for the restart, and the holder adopts its key again)");
    return 0;
  }
  log(Priority::kInfo, std::string("stopping on ") + strsignal(static_cast<int>(info->ssi_signo)) +
                           "; gates close, reservations stay (a restart adopts them)");
  return sd_event_exit(sd_event_source_get_event(source), 0);
}

// Path hot-plug: udev's events for block and scsi_generic devices (after udev has processed them,
// so /dev and the /dev/blkfence links are in place) make every resource resolve its configured
// device names again, a moment later: one LU appearing brings several events (sd, sg, a multipath
// map's change).
void Daemon::watch_devices() {
  sd_device_monitor* monitor = nullptr;
  int r = sd_device_monitor_new(&monitor);
  if (r >= 0) {
    r = sd_device_monitor_filter_add_match_subsystem_devtype(monitor, "block", nullptr);
  }
  if (r >= 0) {
    r = sd_device_monitor_filter_add_match_subsystem_devtype(monitor, "scsi_generic", nullptr);
  }
  if (r >= 0) {
    r = sd_device_monitor_attach_event(monitor, event_);
  }
  if (r >= 0) {
    r = sd_device_monitor_start(monitor, &Daemon::on_device, this);
  }
  if (r < 0) {
    sd_device_monitor_unref(monitor);
    log(Priority::kWarning,
        std::string("path hot-plug is off: cannot watch udev's device events: ") +
            std::strerror(-r));
    return;
  }
  device_monitor_ = monitor;
}

int Daemon::on_device(sd_device_monitor*, sd_device*, void* self) {
  auto* daemon = static_cast<Daemon*>(self);
  if (!daemon->rescan_at_) {
    daemon->rescan_at_ = daemon->now() + kRescanDelay;
  }
  return 0;
}

void Daemon::rescan() {
  rescan_at_.reset();
  const auto env = pr::system_discovery_env();
  const pr::Time t = now();
  for (const auto& resource : resources_) {
    const ResourceConfig* config = config_of(resource->name());
    for (std::size_t i = 0; i < config->devices.size(); ++i) {
      const pr::LogicalUnit& lu = resource->options().lus[i];
      auto found = pr::discover({config->devices[i]}, env);
      if (!found || found->size() != 1 || (*found)[0].wwn != lu.wwn) {
        log(Priority::kDebug, resource->name() + ": " + lu.name + ": " + config->devices[i] +
                                  " does not resolve to its LU now (" +
                                  (found ? std::string("another LU") : found.error().message()) +
                                  "); its paths stay as they were");
        continue;
      }
      resource->update_paths(i, std::move((*found)[0].paths), t);
    }
  }
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    const ResourceConfig* config = config_of(it->first);
    auto lus = resolve_(*config);
    if (!lus) {
      if (std::string missing = missing_device(lus.error(), it->first); missing != it->second) {
        log(Priority::kWarning,
            "resource " + it->first + " still waits for its devices: " + missing,
            fields_of_name(it->first));
        it->second = std::move(missing);
      }
      ++it;
      continue;
    }
    if (auto shared = lu_of_another_resource(*lus)) {
      // Found only now (its devices were missing at start): the daemon runs on, and this resource
      // stays out of it, saying why in status, until the configuration is fixed and blkfenced
      // restarted.
      std::string refused = *shared + "; name it in one resource only and restart blkfenced";
      log(Priority::kErr, "resource " + it->first + " refused: " + refused,
          fields_of_name(it->first));
      refused_[it->first] = std::move(refused);
      it = waiting_.erase(it);
      continue;
    }
    log(Priority::kNotice, "resource " + it->first + ": its devices appeared; reading its LUs",
        fields_of_name(it->first));
    add_resource(*config, std::move(*lus));
    it = waiting_.erase(it);
    // As every resource at start-up: it reads its LUs and decides (adopts its key, or not).
    resources_.back()->start(t);
  }
}

void Daemon::tick() {
  const pr::Time t = now();
  if (rescan_at_ && *rescan_at_ <= t) {
    rescan();
  }
  if (!waiting_.empty() && !rescan_at_) {
    rescan_at_ = t + kWaitingRetry;
  }
  engine_->on_time(t);
  for (const auto& resource : resources_) {
    resource->on_time(t);
  }
  feed_watchdog();
}

void Daemon::schedule() {
  std::optional<pr::Time> wake = engine_->next_wake();
  if (rescan_at_ && (!wake || *rescan_at_ < *wake)) {
    wake = rescan_at_;
  }
  for (const auto& resource : resources_) {
    if (const auto next = resource->next_wake(); next && (!wake || *next < *wake)) {
      wake = next;
    }
  }
  if (watchdog_usec_ != 0) {
    const pr::Time next = last_watchdog_ + std::chrono::microseconds(watchdog_usec_ / 4);
    wake = wake ? std::min(*wake, next) : next;
  }
  if (!wake) {
    (void)sd_event_source_set_enabled(timer_source_, SD_EVENT_OFF);
    return;
  }
  const auto usec = std::chrono::duration_cast<std::chrono::microseconds>(*wake).count();
  (void)sd_event_source_set_time(timer_source_,
                                 static_cast<std::uint64_t>(std::max<long>(usec, 1)));
  (void)sd_event_source_set_time_accuracy(timer_source_, 1);
  (void)sd_event_source_set_enabled(timer_source_, SD_EVENT_ONESHOT);
}

void Daemon::feed_watchdog() {
  if (watchdog_usec_ == 0) {
    return;
  }
  // WATCHDOG=1 whenever the loop turns, at least every quarter of WatchdogSec: it proves the event
  // loop alive, nothing more. Storage that does not answer is not a reason to restart: the
  // resource reports lost contact with its gate closed, and a restart loop would end in systemd
  // giving up on the daemon altogether (systemd/README.md).
  const pr::Time t = now();
  if (t - last_watchdog_ < std::chrono::microseconds(watchdog_usec_ / 4)) {
    return;
  }
  last_watchdog_ = t;
  (void)sd_notify(0, "WATCHDOG=1");
}

void Daemon::notify_status() {
  std::string line;
  for (const auto& resource : resources_) {
    line += (line.empty() ? "" : "; ") + resource->name() + ": " +
            std::string(fence::to_string(resource->state()));
    if (resource->gate_open() && resource->key()) {
      line += " " + resource->key()->to_string();
    }
  }
  for (const auto& [name, why] : waiting_) {
    line += (line.empty() ? "" : "; ") + name + ": waiting for its devices";
  }
  for (const auto& [name, why] : refused_) {
    line += (line.empty() ? "" : "; ") + name + ": refused (a LU of another resource)";
  }
  (void)sd_notify(0, ("STATUS=" + line).c_str());
  // A waiting resource does not hold READY back: its LU may come hours later (or never), and its
  // gate is closed meanwhile, which is what units ordered after blkfenced need to know.
  if (!ready_sent_ && std::all_of(resources_.begin(), resources_.end(),
                                  [](const auto& r) { return r->state_known(); })) {
    ready_sent_ = true;
    (void)sd_notify(0, "READY=1");
    log(Priority::kInfo, "ready: the initial state of every resource is known");
  }
}

// --- the protocol's decisions -------------------------------------------------------------------

const ResourceConfig* Daemon::config_of(const std::string& name) const {
  for (const auto& resource : config_.resources) {
    if (resource.name == name) {
      return &resource;
    }
  }
  return nullptr;
}

std::optional<std::string> Daemon::lu_of_another_resource(
    const std::vector<pr::LogicalUnit>& lus) const {
  for (const auto& resource : resources_) {
    if (auto shared = shared_lu(lus, resource->name(), resource->options().lus)) {
      return shared;
    }
  }
  return std::nullopt;
}

ResourceStatus Daemon::waiting_status(const std::string& name) const {
  ResourceStatus status;
  status.name = name;
  const ResourceConfig* config = config_of(name);
  status.mode = std::string(to_string(config->mode));
  status.state = "unknown";
  const auto refused = refused_.find(name);
  status.detail = refused != refused_.end() ? "refused: " + refused->second
                                            : "waiting for its devices: " + waiting_.at(name);
  return status;
}

fence::Resource* Daemon::find(const std::string& name) {
  for (const auto& resource : resources_) {
    if (resource->name() == name) {
      return resource.get();
    }
  }
  return nullptr;
}

void Daemon::on_gate(const fence::Resource& resource, bool open, pr::Time) {
  if (open) {
    if (auto written = gate_->open(resource.name(), *resource.key()); !written) {
      log(Priority::kErr, "gate open but the token file failed: " + written.error().message(),
          fields_of(resource));
    }
  } else {
    gate_->close(resource.name());
  }
  log(Priority::kInfo, std::string("gate ") + (open ? "open" : "closed"), fields_of(resource));
  broadcast(Event::kGate, resource);
}

void Daemon::on_event(const fence::Resource& resource, const fence::Event& event) {
  const ResourceConfig* config = config_of(resource.name());
  std::string_view id;
  Priority priority = Priority::kInfo;
  std::optional<Event> wire;
  std::string message = resource.name() + ": " + std::string(fence::to_string(event.kind));
  if (!event.detail.empty()) {
    message += ": " + event.detail;
  }
  switch (event.kind) {
    case fence::EventKind::kAcquired:
      id = kMessageAcquired;
      priority = Priority::kNotice;
      wire = Event::kAcquired;
      // A member's promote changes the token of a gate that stays open (on_gate is not called).
      if (resource.gate_open() && resource.key()) {
        if (auto written = gate_->open(resource.name(), *resource.key()); !written) {
          log(Priority::kErr, "the token file failed: " + written.error().message(),
              fields_of(resource));
        }
      }
      break;
    case fence::EventKind::kReleased:
      id = kMessageReleased;
      priority = Priority::kNotice;
      wire = Event::kReleased;
      gate_->act(*config, event.key, Gate::Reason::kReleased);
      break;
    case fence::EventKind::kFenced:
      id = kMessageFenced;
      priority = Priority::kErr;
      wire = Event::kFenced;
      gate_->act(*config, event.key, Gate::Reason::kFenced);
      break;
    case fence::EventKind::kLostContact:
      id = kMessageLostContact;
      priority = Priority::kErr;
      wire = Event::kLostContact;
      gate_->act(*config, event.key, Gate::Reason::kLostContact);
      break;
    case fence::EventKind::kContactRestored: id = kMessageContactRestored; break;
    case fence::EventKind::kUnfenced: id = kMessageUnfenced; break;
    case fence::EventKind::kFencedNode: id = kMessageFencedNode; break;
    case fence::EventKind::kOperationFailed: priority = Priority::kWarning; break;
    case fence::EventKind::kPathsChanged: priority = Priority::kNotice; break;
    case fence::EventKind::kStateKnown: break;
  }
  log(priority, message, fields_of(resource, id, event.device));
  broadcast(wire.value_or(Event::kState), resource);
  notify_status();
}

// --- control requests ---------------------------------------------------------------------------

ResourceStatus Daemon::status_of(const fence::Resource& resource) const {
  ResourceStatus status;
  status.name = resource.name();
  status.mode = std::string(fence::mode_name(resource.options()));
  status.state = std::string(fence::to_string(resource.state()));
  status.gate_open = resource.gate_open_at(now());
  if (const auto key = resource.key()) {
    status.key = key->value();
    status.epoch = key->epoch();
  } else {
    status.epoch = resource.epoch_high_water();
  }
  status.fenced_by = resource.fenced_by();
  if (const auto read = resource.last_read_ok()) {
    status.last_check_age_ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(now() - *read).count();
  }
  status.detail = resource.detail();
  for (std::size_t i = 0; i < resource.lus().size(); ++i) {
    const auto& view = resource.lus()[i];
    LuStatus lu{.wwn = view.wwn,
                .devices = {},
                .holder = view.holder,
                .keys = view.keys,
                .error = view.error};
    for (const auto& path : resource.options().lus[i].paths) {
      lu.devices.push_back(pr::command_device(path));
    }
    status.lus.push_back(std::move(lu));
  }
  return status;
}

std::string Daemon::metrics_text() const {
  std::string text;
  const auto family = [&](const char* name, const char* type, const char* help) {
    text += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
  };
  const auto sample = [&](const char* name, const fence::Resource& r, double value) {
    char line[256];
    (void)std::snprintf(line, sizeof line, "%s{resource=\"%s\"} %.9g\n", name, r.name().c_str(),
                        value);
    text += line;
  };
  const auto each = [&](const char* name, const char* type, const char* help, auto value) {
    family(name, type, help);
    for (const auto& r : resources_) {
      sample(name, *r, value(*r));
    }
  };
  const auto seconds = [](std::chrono::nanoseconds ns) {
    return static_cast<double>(ns.count()) / 1e9;
  };
  each("blkfence_gate_open", "gauge", "1 while the writer gate is open.",
       [](const fence::Resource& r) { return r.gate_open() ? 1.0 : 0.0; });
  each("blkfence_epoch", "gauge", "Epoch of the key this node holds, else its high-water mark.",
       [](const fence::Resource& r) {
         return static_cast<double>(r.key() ? r.key()->epoch() : r.epoch_high_water());
       });
  each("blkfence_acquisitions_total", "counter", "Acquisitions that opened the gate.",
       [](const fence::Resource& r) { return static_cast<double>(r.counters().acquisitions); });
  each("blkfence_acquire_failures_total", "counter", "Acquisitions that failed.",
       [](const fence::Resource& r) { return static_cast<double>(r.counters().acquire_failures); });
  each("blkfence_fenced_total", "counter", "Times this node found its key preempted.",
       [](const fence::Resource& r) { return static_cast<double>(r.counters().fenced); });
  each("blkfence_lost_contact_total", "counter", "Times the lease ran out without a check.",
       [](const fence::Resource& r) { return static_cast<double>(r.counters().lost_contact); });
  each("blkfence_unit_attentions_total", "counter", "Unit attentions met by monitor reads.",
       [](const fence::Resource& r) { return static_cast<double>(r.counters().unit_attentions); });
  each("blkfence_strays_preempted_total", "counter",
       "Monitor rounds that preempted lower-ranked keys of this cluster beside our reservation.",
       [](const fence::Resource& r) { return static_cast<double>(r.counters().strays_preempted); });
  each("blkfence_check_failures_total", "counter", "Monitor rounds that could not read every LU.",
       [](const fence::Resource& r) { return static_cast<double>(r.counters().check_failures); });
  family("blkfence_check_latency_seconds", "summary", "Monitor round latency (all LUs at once).");
  for (const auto& r : resources_) {
    char line[512];
    (void)std::snprintf(line, sizeof line,
                        "blkfence_check_latency_seconds_sum{resource=\"%s\"} %.9g\n"
                        "blkfence_check_latency_seconds_count{resource=\"%s\"} %" PRIu64 "\n",
                        r->name().c_str(), seconds(r->counters().check_latency_sum),
                        r->name().c_str(), r->counters().checks);
    text += line;
  }
  each("blkfence_check_latency_seconds_max", "gauge", "Slowest monitor round so far.",
       [&](const fence::Resource& r) { return seconds(r.counters().check_latency_max); });
  each("blkfence_check_latency_seconds_last", "gauge", "Latest monitor round.",
       [&](const fence::Resource& r) { return seconds(r.counters().check_latency_last); });
  // The control socket's limits at work (docs/control-protocol.md, "Limits"): not per resource.
  const ControlCounters& control = control_->counters();
  const auto counter = [&](const char* name, const char* help, std::uint64_t value) {
    family(name, "counter", help);
    text += std::string(name) + " " + std::to_string(value) + "\n";
  };
  counter("blkfence_control_refused_total",
          "Control connections refused busy (every place the peer may take was taken, or its "
          "uid's share).",
          control.refused_busy + control.refused_per_uid);
  counter("blkfence_control_dropped_total",
          "Control clients dropped: a partial line or silence past its timeout, or output unread.",
          control.dropped_partial_line + control.dropped_idle + control.dropped_unread);
  counter("blkfence_control_accept_failures_total",
          "accept(2) calls on the control socket that failed for want of descriptors or memory.",
          control.accept_failures);
  counter("blkfence_log_dropped_total",
          "Log records dropped because the journal or stderr did not take them fast enough.",
          log_dropped());
  return text;
}

void Daemon::broadcast(Event event, const fence::Resource& resource) {
  if (watchers_.empty()) {
    return;
  }
  const std::string line = encode_event(event, status_of(resource));
  // send() may drop a client (and erase it from watchers_ via on_disconnect): copy the ids.
  std::vector<ClientId> ids;
  for (const auto& [client, name] : watchers_) {
    if (name.empty() || name == resource.name()) {
      ids.push_back(client);
    }
  }
  for (const ClientId client : ids) {
    control_->send(client, line);
  }
}

void Daemon::reply_error(ClientId client, std::optional<std::uint64_t> id, ReplyError code,
                         std::string message) {
  control_->send(
      client, encode_error(ProtocolError{.id = id, .code = code, .message = std::move(message)}));
}

void Daemon::on_line(ClientId client, const Peer& peer, std::string_view line, bool too_large) {
  if (too_large) {
    reply_error(client, std::nullopt, ReplyError::kTooLarge,
                "request longer than " + std::to_string(ControlServer::kMaxLineSize) + " bytes");
    control_->close_after_send(client);
    return;
  }
  auto request = parse_request(line);
  if (!request) {
    control_->send(client, encode_error(request.error()));
    return;
  }
  handle(client, peer, *request);
}

// A control request waiting for an operation: answered once, by the operation or its timeout.
struct Daemon::Pending {
  Daemon* daemon = nullptr;
  ClientId client = 0;
  std::uint64_t id = 0;
  std::string resource;
  bool answered = false;
  sd_event_source* timer = nullptr;
  ~Pending() { sd_event_source_disable_unref(timer); }
};

bool Daemon::privileged(const Peer& peer) {
  return daemon::privileged(peer, control_group_);
}

void Daemon::on_disconnect(ClientId client) {
  watchers_.erase(client);
  for (auto& [name, read] : keys_reads_) {
    std::erase_if(read.waiting, [&](const auto& waiting) { return waiting.first == client; });
  }
  // An acquire or promote whose caller went away stops before its next PR OUT that could take a
  // LU: a pre_promote that Patroni killed must never preempt the primary that came after it.
  for (const auto& [name, weak] : cancellable_) {
    if (const auto pending = weak.lock();
        pending && pending->client == client && !pending->answered) {
      pending->answered = true;
      log(Priority::kWarning, "the caller of the running operation went away: cancelled", {});
      if (fence::Resource* resource = find(name)) {
        resource->cancel();
      }
    }
  }
}

void Daemon::handle(ClientId client, const Peer& peer, const Request& request) {
  if (!may_run(request.op, peer, control_group_)) {
    reply_error(
        client, request.id, ReplyError::kPermissionDenied,
        std::string(to_string(request.op)) + " needs root" +
            (config_.control_group.empty() ? std::string()
                                           : " or membership of group " + config_.control_group) +
            " (uid " + std::to_string(peer.uid) + ")");
    return;
  }
  fence::Resource* resource = nullptr;
  if (!request.resource.empty()) {
    resource = find(request.resource);
    const auto waiting = waiting_.find(request.resource);
    const auto refused = refused_.find(request.resource);
    if ((waiting != waiting_.end() || refused != refused_.end()) && request.op != Op::kStatus &&
        request.op != Op::kWatch) {
      if (request.op == Op::kGate) {
        // Closed, like any gate without a verified key (`gate check` exits 1, not 3).
        control_->send(
            client,
            encode_ok(request.id, {{"open", false},
                                   {"token", nullptr},
                                   {"epoch", 0U},
                                   {"lease_ms", config_of(request.resource)->lease.count()}}));
        return;
      }
      reply_error(client, request.id, ReplyError::kDevice,
                  "resource " + request.resource +
                      (refused != refused_.end() ? " is refused: " + refused->second
                                                 : " waits for its devices: " + waiting->second));
      return;
    }
    if (resource == nullptr && !waiting_.contains(request.resource) &&
        !refused_.contains(request.resource)) {
      std::string names;
      for (const auto& r : config_.resources) {
        names += (names.empty() ? "" : ", ") + r.name;
      }
      reply_error(client, request.id, ReplyError::kUnknownResource,
                  "no resource named \"" + request.resource + "\" (configured: " + names + ")");
      return;
    }
  }
  // In the configuration's order, waiting resources included.
  const auto statuses = [&] {
    nlohmann::json list = nlohmann::json::array();
    for (const auto& configured : config_.resources) {
      if (!request.resource.empty() && request.resource != configured.name) {
        continue;
      }
      if (const fence::Resource* r = find(configured.name)) {
        list.push_back(to_json(status_of(*r)));
      } else if (waiting_.contains(configured.name) || refused_.contains(configured.name)) {
        list.push_back(to_json(waiting_status(configured.name)));
      }
    }
    return list;
  };
  switch (request.op) {
    case Op::kStatus:
      control_->send(client, encode_ok(request.id, {{"resources", statuses()},
                                                    {"cluster", config_.cluster},
                                                    {"node", config_.node_id}}));
      return;
    case Op::kWatch:
      if (!watchers_.contains(client)) {
        control_->hold(client);  // a stream, silent between events: never idle
      }
      watchers_[client] = request.resource;
      control_->send(client, encode_ok(request.id, {{"resources", statuses()}}));
      return;
    case Op::kMetrics:
      control_->send(client, encode_ok(request.id, {{"text", metrics_text()}}));
      return;
    default: break;
  }
  if (resource == nullptr) {  // parse_request() refuses these without one; defence in depth
    reply_error(client, request.id, ReplyError::kBadRequest,
                std::string(to_string(request.op)) + " needs a resource");
    return;
  }
  handle_resource(client, request, *resource);
}

void Daemon::handle_resource(ClientId client, const Request& request, fence::Resource& resource) {
  switch (request.op) {
    case Op::kGate: {
      const auto key = resource.key();
      const bool open = resource.gate_open_at(now());
      control_->send(
          client,
          encode_ok(
              request.id,
              {{"open", open},
               {"token", open && key ? nlohmann::json(key->to_string()) : nlohmann::json(nullptr)},
               {"epoch", key ? key->epoch() : 0U},
               {"lease_ms",
                std::chrono::duration_cast<std::chrono::milliseconds>(resource.options().lease)
                    .count()}}));
      return;
    }
    case Op::kKeys: read_keys(client, request, resource); return;
    case Op::kAcquire:
    case Op::kRelease:
    case Op::kUnfence:
    case Op::kPromote:
    case Op::kFence: run_operation(client, request, resource); return;
    default: BLKFENCE_ASSERT(false);
  }
}

void Daemon::run_operation(ClientId client, const Request& request, fence::Resource& resource) {
  auto pending = std::make_shared<Pending>();
  pending->daemon = this;
  pending->client = client;
  pending->id = request.id;
  pending->resource = resource.name();
  control_->hold(client);
  if (request.timeout) {
    std::uint64_t now_usec = 0;
    (void)sd_event_now(event_, kClock, &now_usec);
    const auto usec = std::chrono::duration_cast<std::chrono::microseconds>(*request.timeout);
    // The timer holds a reference to pending until it fires or the operation answers.
    auto* holder = new std::shared_ptr<Pending>(pending);
    const int r = sd_event_add_time(
        event_, &pending->timer, kClock, now_usec + static_cast<std::uint64_t>(usec.count()), 0,
        [](sd_event_source*, std::uint64_t, void* userdata) -> int {
          auto* p = static_cast<std::shared_ptr<Pending>*>(userdata);
          Pending& waiting = **p;
          // The timer holds the pending operation and the operation its timer: once fired, the
          // timer lets go (its destroy callback runs after this returns), or neither would ever
          // be freed.
          sd_event_source* const fired = std::exchange(waiting.timer, nullptr);
          if (!waiting.answered) {
            waiting.answered = true;
            waiting.daemon->control_->release_hold(waiting.client);
            fence::Resource* running = waiting.daemon->find(waiting.resource);
            const bool cancellable = waiting.daemon->cancellable_.contains(waiting.resource) &&
                                     waiting.daemon->cancellable_[waiting.resource].lock() == *p;
            if (cancellable && running != nullptr) {
              running->cancel();
            }
            waiting.daemon->reply_error(
                waiting.client, waiting.id, ReplyError::kTimeout,
                cancellable ? "timed out; the operation was cancelled before its next PR OUT "
                              "that could take a LU: see 'blkfencectl status " +
                                  waiting.resource + "'"
                            : "timed out; the operation goes on in the daemon: see "
                              "'blkfencectl status " +
                                  waiting.resource + "'");
          }
          sd_event_source_disable_unref(fired);
          return 0;
        },
        holder);
    if (r < 0) {
      delete holder;
    } else {
      (void)sd_event_source_set_destroy_callback(pending->timer, [](void* userdata) {
        delete static_cast<std::shared_ptr<Pending>*>(userdata);
      });
    }
  }
  const pr::Time started = now();
  const auto done = [this, pending, started](Result<fence::Key> result, pr::Time finished) {
    if (pending->answered) {
      return;
    }
    pending->answered = true;
    control_->release_hold(pending->client);
    sd_event_source_disable_unref(pending->timer);
    pending->timer = nullptr;
    fence::Resource* r = find(pending->resource);
    if (!result) {
      reply_error(pending->client, pending->id, reply_error_for(result.error()),
                  result.error().message());
      return;
    }
    control_->send(
        pending->client,
        encode_ok(pending->id,
                  {{"key", result->to_string()},
                   {"epoch", result->epoch()},
                   {"elapsed_ms", static_cast<double>((finished - started).count()) / 1e6},
                   {"status", to_json(status_of(*r))}}));
  };
  const pr::Time t = now();
  const bool cancellable = request.op == Op::kAcquire || request.op == Op::kPromote;
  std::weak_ptr<Pending> previous;
  if (cancellable) {
    previous = std::exchange(cancellable_[resource.name()], pending);
  }
  switch (request.op) {
    case Op::kAcquire: resource.acquire(t, done); break;
    case Op::kRelease: resource.release(t, done); break;
    case Op::kUnfence: resource.unfence(t, done); break;
    case Op::kPromote: resource.promote(t, done); break;
    case Op::kFence: resource.fence_node(*request.node, t, done); break;
    default: BLKFENCE_ASSERT(false);
  }
  if (cancellable && pending->answered) {
    cancellable_[resource.name()] =
        previous;  // refused (busy) or done at once: not the running one
  }
}

void Daemon::read_keys(ClientId client, const Request& request, fence::Resource& resource) {
  KeysRead& read = keys_reads_[resource.name()];
  if (read.waiting.size() >= kKeysWaitingMax) {
    reply_error(client, request.id, ReplyError::kBusy,
                std::to_string(kKeysWaitingMax) + " keys requests of " + resource.name() +
                    " are already waiting for its read; ask again");
    return;
  }
  read.waiting.emplace_back(client, request.id);
  control_->hold(client);
  start_keys_reads();
}

// Client reads come after the protocol's: none starts while a batch of a monitor round or an
// operation is open on the engine (they share the transport, and each LU's task set at the
// target), and one read per resource answers every `keys` request that arrived before it ended, so
// a flood of requests costs the LUs one READ KEYS and one READ RESERVATION at a time. Called after
// every dispatch of the loop.
void Daemon::start_keys_reads() {
  for (auto& [name, read] : keys_reads_) {
    if (engine_->open_batches() > keys_reads_in_flight_) {
      return;
    }
    if (read.in_flight || read.waiting.empty()) {
      continue;
    }
    const fence::Resource* resource = find(name);
    std::vector<pr::Request> requests;
    for (const auto& lu : resource->options().lus) {
      requests.push_back(pr::read_keys_request(lu));
      requests.push_back(pr::read_reservation_request(lu));
    }
    read.in_flight = true;
    ++keys_reads_in_flight_;
    engine_->start(
        std::move(requests), now(),
        [this, resource_name = name](const std::vector<pr::Response>& responses, pr::Time) {
          answer_keys(resource_name, responses);
        });
  }
}

void Daemon::answer_keys(const std::string& name, const std::vector<pr::Response>& responses) {
  KeysRead& read = keys_reads_[name];
  read.in_flight = false;
  --keys_reads_in_flight_;
  const auto waiting = std::exchange(read.waiting, {});
  ResourceStatus status = status_of(*find(name));
  for (std::size_t i = 0; i < status.lus.size(); ++i) {
    LuStatus& lu = status.lus[i];
    lu.keys.clear();
    lu.holder.reset();
    lu.error.clear();
    const auto& keys = responses[2 * i].data;
    const auto& reservation = responses[2 * i + 1].data;
    if (!keys || !reservation) {
      lu.error = (!keys ? keys.error() : reservation.error()).message();
      continue;
    }
    if (auto decoded = codec::decode_read_keys(*keys)) {
      lu.keys = decoded->keys;
    }
    if (auto decoded = codec::decode_read_reservation(*reservation);
        decoded && decoded->reservation) {
      lu.holder = decoded->reservation->key;
    }
  }
  const nlohmann::json body = {{"status", to_json(status)}};
  for (const auto& [client, id] : waiting) {
    control_->release_hold(client);
    control_->send(client, encode_ok(id, body));
  }
}

}  // namespace blkfence::daemon
