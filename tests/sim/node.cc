// A node of blkfence_sim (tests/sim, world.h): its daemon (the real pr::Engine and fence::Resource
// over a recording SimTransport), restarted, paused and cut off as the scenario says; its paths,
// which come and go; and its writer, which writes stamped blocks while its gate is open. Also the
// RecordingTransport. Single-threaded.
#include <algorithm>
#include <string>
#include <vector>

#include "blkfence/assert.h"
#include "blkfence/endian.h"
#include "blkfence/key.h"

#include "world.h"

namespace blkfence::sim {

// --- RecordingTransport --------------------------------------------------------------------------

Result<PathId> RecordingTransport::open_path(const std::string& device) {
  auto path = inner_->open_path(device);
  if (path) {
    const auto found = inner_->target().find_path(device);
    BLKFENCE_ASSERT(found.has_value());
    paths_[*path] = *found;
  }
  return path;
}

Result<void> RecordingTransport::submit(PathId path, transport::Command command) {
  const auto where = paths_.find(path);
  BLKFENCE_ASSERT(where != paths_.end());
  Command record;
  record.node = node_.id();
  record.boot = node_.boots();
  record.lu = where->second.lu;
  record.nexus = where->second.nexus;
  record.opcode = command.cdb[0];
  record.action = static_cast<std::uint8_t>(command.cdb[1] & 0x1fU);
  record.type = static_cast<std::uint8_t>(command.cdb[2] & 0x0fU);
  if (record.is_prout() && command.data_out.size() >= 16) {
    record.key = load_be64(command.data_out, 0);
    record.sa_key = load_be64(command.data_out, 8);
  }
  record.bytes.assign(reinterpret_cast<const char*>(command.cdb.data()), command.cdb_size);
  record.bytes.append(reinterpret_cast<const char*>(command.data_out.data()),
                      command.data_out.size());
  record.request = pr::request_of_tag(command.tag);
  const std::uint64_t tag = command.tag;
  const std::size_t index = world_.add_command(std::move(record));
  auto submitted = inner_->submit(path, std::move(command));
  if (submitted) {
    tags_[tag] = index;
  } else {
    Command& failed = world_.command(index);
    failed.completed = true;
    failed.completed_at = world_.now();
    failed.completed_seq = world_.next_seq();
    failed.outcome = transport::Outcome::kOsError;
  }
  node_.submitted(world_.command(index));
  return submitted;
}

Result<std::size_t> RecordingTransport::reap(milliseconds wait,
                                             std::vector<transport::Completion>& out) {
  const std::size_t before = out.size();
  auto reaped = inner_->reap(wait, out);
  for (std::size_t i = before; i < out.size(); ++i) {
    const transport::Completion& completion = out[i];
    const auto found = tags_.find(completion.tag);
    if (found == tags_.end()) {
      continue;
    }
    Command& command = world_.command(found->second);
    command.completed = true;
    command.completed_at = world_.now();
    command.completed_seq = world_.next_seq();
    command.outcome = completion.outcome;
    command.status = completion.status;
    command.sense = completion.sense;
    command.data_in = completion.data_in;
    tags_.erase(found);
  }
  return reaped;
}

// --- Node ----------------------------------------------------------------------------------------

namespace {

pr::Path path_of(const std::string& suffix) {
  return pr::Path{.sg = "/dev/sg-n" + suffix, .sd = {}, .hctl = suffix, .initiator = {}};
}

}  // namespace

Node::Node(World& world, std::uint16_t id, const std::vector<std::size_t>& paths)
    : world_(world), id_(id), writer_rng_(mix(world.seed(), id, 0, 0x77)) {
  transport::SimTarget& target = world.target();
  for (std::size_t lu = 0; lu < paths.size(); ++lu) {
    pr::LogicalUnit unit{.wwn = "naa.60014050000000" + std::to_string(lu),
                         .name = "lu" + std::to_string(lu),
                         .paths = {}};
    std::vector<std::string> writers;
    std::vector<NexusId> nexuses;
    std::vector<std::size_t> present;
    for (std::size_t p = 0; p < kMaxPaths; ++p) {
      const std::string suffix =
          std::to_string(id) + "-lu" + std::to_string(lu) + "-p" + std::to_string(p);
      const NexusId nexus = nexus_of(id, lu, p);
      target.add_path("/dev/sg-n" + suffix, static_cast<LuId>(lu), nexus);
      // The writer reaches the same I_T nexus through its own name (its own block device).
      target.add_path("/dev/sd-n" + suffix, static_cast<LuId>(lu), nexus);
      if (p < paths[lu]) {
        unit.paths.push_back(path_of(suffix));
        present.push_back(p);
      }
      writers.push_back("/dev/sd-n" + suffix);
      nexuses.push_back(nexus);
    }
    lus_.push_back(std::move(unit));
    present_.push_back(std::move(present));
    writer_devices_.push_back(std::move(writers));
    nexuses_.push_back(std::move(nexuses));
  }
  const Config& config = world.config();
  transport::FaultHook writer_faults = transport::random_faults(config.writer_faults);
  auto made = transport::SimTransport::make(
      target, {.seed = mix(world.seed(), id, 0, 0x57),
               .latency_min = config.latency_min,
               .latency_max = config.latency_max,
               .deadline_grace = milliseconds(0),
               .fault =
                   [&world, writer_faults](const transport::FaultContext& context) {
                     return world.faults_on() ? writer_faults(context) : transport::Fault{};
                   },
               .host_queues = host_queues_,
               .queue_at_head = false});
  BLKFENCE_ASSERT(made.has_value());
  writer_transport_ = std::move(*made);
  for (const auto& devices : writer_devices_) {
    std::vector<PathId> opened;
    for (const auto& device : devices) {
      auto path = writer_transport_->open_path(device);
      BLKFENCE_ASSERT(path.has_value());
      opened.push_back(*path);
    }
    writer_paths_.push_back(std::move(opened));
  }
  writer_unreaped_.assign(writer_paths_.size(), 0);
}

Node::~Node() {
  resource_.reset();
  engine_.reset();
  transport_.reset();
}

fence::ResourceOptions Node::options() const {
  const Config& config = world_.config();
  fence::ResourceOptions o;
  o.name = kResourceName;
  o.lus = lus_;
  o.mode = config.shared || config.primary ? fence::Mode::kShared : fence::Mode::kExclusive;
  o.primary = config.primary;
  o.type = config.shared && !config.primary ? codec::PrType::kWriteExclusiveAllRegistrants
                                            : codec::PrType::kWriteExclusiveRegistrantsOnly;
  o.preempt_abort = config.preempt_abort;
  o.cluster_id = fence::cluster_id_from_name("sim");
  o.node_id = id_;
  o.check_interval = config.check_interval;
  o.lease = config.lease;
  o.keys_every = config.keys_every;
  // The kernel's count of the node's writes in flight on a LU (/sys/block/sdX/inflight): those
  // its writer submitted and has not reaped, and those the target still holds from the node's
  // nexuses. A real initiator completes a write it gave up on only once its error handler has
  // aborted it at the target (LIO answers the abort once the command has left its backend) or the
  // session was torn down (LIO lets the next login in once the old session's commands are gone);
  // the simulated writer's transport reaps a timed-out write at once, so the target's own count
  // stands for that wait.
  o.writes_in_flight = [this](const pr::LogicalUnit& unit) -> Result<std::uint64_t> {
    const auto lu = static_cast<std::size_t>(
        std::find_if(lus_.begin(), lus_.end(),
                     [&unit](const pr::LogicalUnit& l) { return l.wwn == unit.wwn; }) -
        lus_.begin());
    BLKFENCE_ASSERT(lu < lus_.size());
    // A path in recovery holds writes back where nothing counts them (pr::writes_in_flight()
    // reads the SCSI device's state for it).
    for (const std::size_t p : present_[lu]) {
      if (host_queues_->held(nexuses_[lu][p])) {
        return tl::unexpected(Error::os(
            EBUSY, writer_devices_[lu][p] + " may hold writes that no count shows: nexus " +
                       std::to_string(nexuses_[lu][p]) + " is in recovery"));
      }
    }
    std::uint64_t writes = writer_unreaped_[lu];
    for (const NexusId nexus : nexuses_[lu]) {
      writes += world_.target().held_count(static_cast<LuId>(lu), nexus);
    }
    return writes;
  };
  return o;
}

void Node::boot() {
  BLKFENCE_ASSERT(!alive());
  ++boots_;
  boot_at_.reset();
  const Config& config = world_.config();
  transport::FaultHook faults = transport::random_faults(config.daemon_faults);
  const Time duplicate_interval_max = config.latency_min;
  World& world = world_;
  auto made = transport::SimTransport::make(
      world_.target(),
      {.seed = mix(world_.seed(), id_, boots_, 0x44),
       .latency_min = config.latency_min,
       .latency_max = config.latency_max,
       .deadline_grace = milliseconds(0),
       .fault =
           [&world, faults, duplicate_interval_max](const transport::FaultContext& context) {
             if (!world.faults_on()) {
               return transport::Fault{};
             }
             transport::Fault fault = faults(context);
             // A retransmitted copy arrives before the first copy's answer gets back: the command
             // executed twice before anyone heard of it (a copy arriving much later is a late
             // execution, which execute_late covers with the deadline semantics it needs).
             fault.duplicate_interval = std::min(fault.duplicate_interval, duplicate_interval_max);
             return fault;
           },
       .host_queues = host_queues_,
       .queue_at_head = true});
  BLKFENCE_ASSERT(made.has_value());
  for (const auto& [lu, state] : links_) {
    (*made)->set_link(lu, state);
  }
  transport_ = std::make_unique<RecordingTransport>(world_, *this, std::move(*made));
  pr::RetryPolicy policy;
  policy.command_timeout = config.command_timeout;
  engine_ = std::make_unique<pr::Engine>(*transport_, policy);
  resource_ = std::make_unique<fence::Resource>(options(), *engine_, store_, *this);
  world_.trace(id_, EntryKind::kBoot);
  resource_->start(world_.now());
  note_busy();
}

void Node::crash() {
  BLKFENCE_ASSERT(alive());
  world_.trace(id_, EntryKind::kCrash);
  resource_.reset();
  engine_.reset();
  transport_.reset();
  note_busy();
  paused_until_.reset();
  writer_frozen_ = false;
  cancellable_ = false;  // the operation dies with the daemon
  cancel_pending_ = false;
  if (writer_gate_) {
    // The daemon's death stops the gated writer (systemd stops the units bound to it).
    Entry& entry = world_.trace(id_, EntryKind::kGate);
    entry.open = false;
    entry.key = writer_key_;
    entry.detail = "daemon died: the writer stops";
  }
  writer_gate_ = false;
  writer_next_.reset();
}

void Node::pump(bool readable) {
  // What blkfenced's event loop does when its fd polls readable or a timer fires: reap only then
  // (each reap costs two eventfd reads), on_time() only when something is due (otherwise it does
  // nothing).
  const Time now = world_.now();
  if (readable) {
    const auto pumped = engine_->pump(now);
    BLKFENCE_ASSERT(pumped.has_value());
  } else if (const auto due = engine_->next_wake(); due && *due <= now) {
    engine_->on_time(now);
  }
  if (const auto due = resource_->next_wake(); due && *due <= now) {
    resource_->on_time(now);
  }
  note_busy();
}

void Node::note_busy() {
  const bool busy = resource_ && resource_->busy();
  if (busy != busy_) {
    busy_ = busy;
    world_.trace(id_, EntryKind::kBusy).open = busy;
  }
  // Primary mode: a promote (or a failed one) changes the key while the member's gate stays open,
  // and Resource::set_gate tells the observer nothing when the gate is already open. The writer
  // follows the resource's key here, as a daemon would that rewrote its token on it; the record
  // shows the change as a gate entry (open again, the new key) and a note.
  if (writer_gate_ && resource_ && resource_->gate_open() && resource_->key() &&
      resource_->key()->value() != writer_key_) {
    Entry& entry = world_.trace(id_, EntryKind::kGate);
    entry.open = true;
    entry.rekeyed = true;
    entry.holds = world_.config().primary && resource_->state() == fence::State::kHeld;
    entry.verified_since = resource_->last_success().value_or(world_.now());
    entry.key = resource_->key()->value();
    entry.detail = std::string(fence::to_string(resource_->state())) +
                   " (the key changed with the gate open: no on_gate)";
    entry.target = world_.snapshot();
    world_.add_note(format_time(world_.now()) + " node " + std::to_string(id_) +
                    ": the key changed from " + format_key(writer_key_) + " to " +
                    format_key(*entry.key) + " with the gate open, and on_gate was not called");
    writer_key_ = *entry.key;
  }
}

std::optional<Time> Node::wake() const {
  if (!running()) {
    return std::nullopt;
  }
  std::optional<Time> wake = engine_->next_wake();
  if (const auto own = resource_->next_wake(); own && (!wake || *own < *wake)) {
    wake = own;
  }
  return wake;
}

// The driver asked for an operation while another runs: recorded as refused (kBusy).
bool Node::refused_while_busy(const std::string& why) {
  if (!resource_->busy()) {
    return false;
  }
  Entry& entry = world_.trace(id_, EntryKind::kRefused);
  entry.ok = false;
  entry.code = ErrorCode::kBusy;
  entry.detail = why + " refused: another operation is running";
  return true;
}

void Node::acquire(const std::string& why) {
  if (!running()) {
    return;
  }
  if (refused_while_busy(why)) {
    return;
  }
  const bool shared = world_.config().shared || world_.config().primary;
  register_pause_armed_ = world_.arm_register_pause();
  world_.trace(id_, EntryKind::kAcquireCalled).detail = why;
  cancellable_ = !shared;  // cancel() stops an acquire or a promote, not an unfence
  fence::Resource::Done done = op_done(why, shared ? ": unfenced" : ": acquired");
  if (shared) {
    resource_->unfence(world_.now(), std::move(done));
  } else {
    resource_->acquire(world_.now(), std::move(done));
  }
  note_busy();
}

void Node::promote(const std::string& why) {
  if (!running()) {
    return;
  }
  if (refused_while_busy(why)) {
    return;
  }
  register_pause_armed_ = world_.arm_register_pause();
  world_.trace(id_, EntryKind::kAcquireCalled).detail = why;
  cancellable_ = true;
  resource_->promote(world_.now(), op_done(why, ": promoted"));
  note_busy();
}

// The end of an acquire, unfence or promote, recorded with what it did (`done`) or its error.
fence::Resource::Done Node::op_done(const std::string& why, const std::string& done) {
  return [this, why, done](Result<fence::Key> result, Time) {
    register_pause_armed_ = false;
    cancellable_ = false;
    cancel_pending_ = false;
    Entry& entry = world_.trace(id_, EntryKind::kOpDone);
    entry.ok = result.has_value();
    if (result) {
      entry.key = result->value();
      entry.detail = why + done;
    } else {
      entry.code = result.error().code();
      entry.detail = why + ": " + result.error().message();
    }
  };
}

void Node::cancel() {
  if (!alive() || !cancellable_) {
    return;
  }
  if (paused()) {
    cancel_pending_ = true;
    return;
  }
  cancel_pending_ = false;
  world_.trace(id_, EntryKind::kCancelCalled).detail = "cancel the running acquire or promote";
  resource_->cancel();
  note_busy();
}

void Node::release() {
  if (!running() || resource_->busy()) {
    return;
  }
  world_.trace(id_, EntryKind::kReleaseCalled);
  resource_->release(world_.now(), [this](Result<fence::Key> result, Time) {
    Entry& entry = world_.trace(id_, EntryKind::kOpDone);
    entry.ok = result.has_value();
    if (!result) {
      entry.code = result.error().code();
      entry.detail = "release: " + result.error().message();
    } else {
      entry.detail = "release: released";
    }
  });
  note_busy();
}

void Node::fence(std::uint16_t victim) {
  if (!running()) {
    return;
  }
  const std::string why = "fence node " + std::to_string(victim);
  if (refused_while_busy(why)) {
    return;
  }
  world_.trace(id_, EntryKind::kFenceCalled).detail = why;
  // The resource refuses at once unless this node is unfenced: a refusal like the busy one.
  calling_ = true;
  resource_->fence_node(victim, world_.now(), [this, why](Result<fence::Key> result, Time) {
    Entry& entry = world_.trace(id_, calling_ ? EntryKind::kRefused : EntryKind::kOpDone);
    entry.ok = result.has_value();
    if (result) {
      entry.detail = why + ": done";
    } else {
      entry.code = result.error().code();
      entry.detail = why + ": " + result.error().message();
    }
  });
  calling_ = false;
  note_busy();
}

void Node::pause(Time until, bool writer_too) {
  paused_until_ = until;
  writer_frozen_ = writer_too;
  world_.trace(id_, EntryKind::kPause).detail =
      "until " + format_time(until) +
      (writer_too ? ", writer frozen too (VM freeze)" : ", writer keeps writing (daemon stall)");
}

void Node::resume() {
  paused_until_.reset();
  writer_frozen_ = false;
  world_.trace(id_, EntryKind::kResume);
  if (writer_gate_ && !writer_next_) {
    writer_next_ = world_.now();
  }
  if (cancel_pending_) {
    cancel();
  }
}

void Node::set_links(const std::vector<LuId>& lus, LinkState state, Time until) {
  std::string detail = state == LinkState::kNoAnswer ? "no answers from LU" : "no connection to LU";
  for (const LuId lu : lus) {
    links_[lu] = state;
    if (transport_) {
      transport_->set_link(lu, state);
    }
    writer_transport_->set_link(lu, state);
    detail += " " + std::to_string(lu);
  }
  links_until_ = links_until_ ? std::max(*links_until_, until) : until;
  world_.trace(id_, EntryKind::kLink).detail = detail + " until " + format_time(*links_until_);
}

void Node::links_up() {
  if (links_.empty()) {
    links_until_.reset();
    return;
  }
  for (const auto& [lu, state] : links_) {
    if (transport_) {
      transport_->set_link(lu, LinkState::kUp);
    }
    writer_transport_->set_link(lu, LinkState::kUp);
  }
  links_.clear();
  links_until_.reset();
  world_.trace(id_, EntryKind::kLink).detail = "every link up";
}

void Node::recover(std::size_t lu, Rng& rng, Time until, bool recovered) {
  const std::size_t p = present_[lu][rng.below(present_[lu].size())];
  const NexusId nexus = nexuses_[lu][p];
  if (recoveries_.contains(nexus)) {
    return;
  }
  host_queues_->hold(nexus);
  recoveries_[nexus] = Recovery{.until = until, .recovered = recovered};
  world_.trace(id_, EntryKind::kLink).detail =
      "nexus " + std::to_string(nexus) + " of LU " + std::to_string(lu) + " in recovery until " +
      format_time(until) + (recovered ? ", then back" : ", then torn down");
}

void Node::recoveries_end(bool all) {
  const Time now = world_.now();
  for (auto it = recoveries_.begin(); it != recoveries_.end();) {
    if (!all && it->second.until > now) {
      ++it;
      continue;
    }
    const NexusId nexus = it->first;
    const bool recovered = all || it->second.recovered;
    it = recoveries_.erase(it);
    world_.trace(id_, EntryKind::kLink).detail =
        "nexus " + std::to_string(nexus) + (recovered ? " back: " : " torn down: ") +
        std::to_string(host_queues_->waiting(nexus)) +
        (recovered ? " waiting commands go out" : " waiting commands fail unsent");
    host_queues_->release(nexus, recovered);
  }
}

void Node::hotplug(std::size_t lu, bool add, Rng& rng) {
  std::vector<std::size_t>& present = present_[lu];
  if (add) {
    if (present.size() >= kMaxPaths) {
      return;
    }
    std::size_t p = 0;
    while (std::find(present.begin(), present.end(), p) != present.end()) {
      ++p;
    }
    present.push_back(p);
  } else {
    if (present.size() <= 1) {
      return;
    }
    const auto gone = present.begin() + static_cast<std::ptrdiff_t>(rng.below(present.size()));
    const NexusId nexus = nexuses_[lu][*gone];
    present.erase(gone);
    // The kernel deletes the path's SCSI device, and with it fails what its queue held, unsent.
    if (recoveries_.erase(nexus) > 0) {
      world_.trace(id_, EntryKind::kLink).detail =
          "nexus " + std::to_string(nexus) +
          " gone in recovery: " + std::to_string(host_queues_->waiting(nexus)) +
          " waiting commands fail unsent";
      host_queues_->release(nexus, false);
    }
  }
  std::string detail =
      "LU " + std::to_string(lu) + (add ? " path added" : " path gone") + ", nexuses now";
  lus_[lu].paths.clear();
  for (const std::size_t p : present) {
    lus_[lu].paths.push_back(
        path_of(std::to_string(id_) + "-lu" + std::to_string(lu) + "-p" + std::to_string(p)));
    detail += " " + std::to_string(nexuses_[lu][p]);
  }
  world_.trace(id_, EntryKind::kPaths).detail = detail;
  if (running()) {
    resource_->update_paths(lu, lus_[lu].paths, world_.now());
    note_busy();
  }
}

void Node::timers() {
  const Time now = world_.now();
  if (paused_until_ && *paused_until_ <= now) {
    resume();
  }
  if (boot_at_ && *boot_at_ <= now) {
    boot();
  }
  if (links_until_ && *links_until_ <= now) {
    links_up();
  }
  recoveries_end(false);
}

std::optional<Time> Node::timer_wake() const {
  std::optional<Time> wake;
  for (const auto& t : {paused_until_, boot_at_, links_until_}) {
    if (t && (!wake || *t < *wake)) {
      wake = t;
    }
  }
  for (const auto& [nexus, recovery] : recoveries_) {
    if (!wake || recovery.until < *wake) {
      wake = recovery.until;
    }
  }
  return wake;
}

std::optional<Time> Node::writer_wake() const {
  if (!writer_gate_ || writer_frozen_) {
    return std::nullopt;
  }
  return writer_next_;
}

void Node::writer_step(bool readable) {
  scratch_.clear();
  if (readable) {
    (void)writer_transport_->reap(milliseconds(0), scratch_);
  }
  for (const auto& completion : scratch_) {
    if (const auto issued = writer_lu_of_.find(completion.tag); issued != writer_lu_of_.end()) {
      --writer_unreaped_[issued->second];
      writer_lu_of_.erase(issued);
    }
    if (completion.outcome == transport::Outcome::kGood) {
      ++writes_landed;
    } else {
      ++writes_refused;
    }
  }
  const Time now = world_.now();
  if (!writer_gate_ || writer_frozen_ || !writer_next_ || *writer_next_ > now) {
    return;
  }
  for (std::size_t lu = 0; lu < writer_paths_.size(); ++lu) {
    const std::size_t p = present_[lu][writer_rng_.below(present_[lu].size())];
    const std::uint64_t id = world_.next_write_id();
    std::vector<std::uint8_t> cdb(16, 0);
    cdb[0] = 0x8a;  // WRITE(16), SBC-3 5.40
    store_be64(cdb, 2, id);
    store_be32(cdb, 10, 1);
    transport::Command command = transport::Command::from_cdb(cdb);
    command.direction = transport::DataDirection::kToDevice;
    command.data_out.assign(kBlockSize, 0);
    store_be16(command.data_out, 0, id_);
    store_be32(command.data_out, 4, static_cast<std::uint32_t>(writer_key_));
    store_be64(command.data_out, 8, id);
    command.timeout = world_.config().command_timeout;
    command.tag = id;
    const auto submitted = writer_transport_->submit(writer_paths_[lu][p], std::move(command));
    BLKFENCE_ASSERT(submitted.has_value());
    writer_lu_of_[id] = lu;
    ++writer_unreaped_[lu];
    world_.add_write(WriteIssue{.id = id,
                                .node = id_,
                                .key = writer_key_,
                                .lu = static_cast<LuId>(lu),
                                .nexus = nexuses_[lu][p],
                                .issued = now});
  }
  const Config& config = world_.config();
  writer_next_ =
      now + writer_rng_.time_between(config.write_interval_min, config.write_interval_max);
}

void Node::submitted(const Command& command) {
  if (register_pause_armed_ && command.is(codec::PrOutAction::kRegisterAndIgnoreExistingKey)) {
    // Freeze right after the REGISTERs go out, before their answers come back: others acquire
    // meanwhile, and this node's take finds the world moved on (or, without a verify, a racer's
    // registration slips in behind its read).
    register_pause_armed_ = false;
    world_.request_pause(*this);
  }
}

void Node::on_gate(const fence::Resource& resource, bool open, Time verified_since) {
  Entry& entry = world_.trace(id_, EntryKind::kGate);
  entry.open = open;
  entry.verified_since = verified_since;
  if (resource.key()) {
    entry.key = resource.key()->value();
  }
  entry.detail = std::string(fence::to_string(resource.state()));
  entry.holds = open && world_.config().primary && resource.state() == fence::State::kHeld;
  if (open) {
    entry.target = world_.snapshot();
  }
  writer_gate_ = open;
  writer_key_ = entry.key.value_or(0);
  if (open) {
    writer_next_ =
        world_.now() + writer_rng_.time_between(Time{0}, world_.config().write_interval_min);
  } else {
    writer_next_.reset();
  }
}

void Node::on_event(const fence::Resource& resource, const fence::Event& event) {
  Entry& entry = world_.trace(id_, EntryKind::kEvent);
  entry.event = event.kind;
  // When the read that justified the resource's last success was issued: for an Acquired event,
  // its verify (a member's promote opens no gate, so no on_gate carries it).
  entry.verified_since = resource.last_success().value_or(Time{0});
  if (event.key) {
    entry.key = event.key->value();
  }
  entry.other_key = event.other_key;
  entry.detail = event.detail;
}

}  // namespace blkfence::sim
