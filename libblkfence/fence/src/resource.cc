// The fencing protocol of one resource as a state machine (fence layer). See resource.h.
//
// This file holds what every operation shares (reading the LUs, starting and ending an operation,
// the gate and the events) and the start; each operation has a file of its own:
// resource_acquire.cc (acquire, release), resource_shared.cc (unfence, fence another node),
// resource_paths.cc (path hot-plug) and resource_monitor.cc (checks, lease, strays, the fence).
#include "blkfence/fence/resource.h"

#include <algorithm>
#include <cctype>

#include "blkfence/assert.h"
#include "blkfence/codec/prin.h"
#include "blkfence/codec/sense.h"
#include "blkfence/pr/client.h"

#include "mutants.h"
#include "resource_reads.h"

namespace blkfence::fence {

std::string_view to_string(State state) {
  switch (state) {
    case State::kUnknown: return "unknown";
    case State::kReleased: return "released";
    case State::kAcquiring: return "acquiring";
    case State::kHeld: return "held";
    case State::kUnfencing: return "unfencing";
    case State::kUnfenced: return "unfenced";
    case State::kReleasing: return "releasing";
    case State::kFenced: return "fenced";
    case State::kLostContact: return "lost-contact";
  }
  return "?";
}

std::string_view to_string(Mode mode) {
  return mode == Mode::kExclusive ? "exclusive" : "shared";
}

std::string_view mode_name(const ResourceOptions& options) {
  if (options.mode == Mode::kExclusive) {
    return "exclusive";
  }
  return options.primary ? "primary" : "shared";
}

std::string_view to_string(EventKind kind) {
  switch (kind) {
    case EventKind::kStateKnown: return "state-known";
    case EventKind::kAcquired: return "acquired";
    case EventKind::kReleased: return "released";
    case EventKind::kFenced: return "fenced";
    case EventKind::kLostContact: return "lost-contact";
    case EventKind::kContactRestored: return "contact-restored";
    case EventKind::kUnfenced: return "unfenced";
    case EventKind::kFencedNode: return "fenced-node";
    case EventKind::kOperationFailed: return "operation-failed";
    case EventKind::kPathsChanged: return "paths-changed";
  }
  return "?";
}

Resource::Resource(ResourceOptions options, pr::Engine& engine, EpochStore& epochs,
                   Observer& observer)
    : options_(std::move(options)), engine_(engine), epochs_(epochs), observer_(observer) {
  BLKFENCE_ASSERT(!options_.lus.empty());
  BLKFENCE_ASSERT(options_.node_id >= Key::kNodeIdMin);
  BLKFENCE_ASSERT(options_.keys_every >= 1 && options_.verify_rounds_max >= 1);
  // Exclusive and primary mode need one holder key to compare with ours; shared mode needs a
  // reservation that stays while any member is registered (docs/protocol.md, "Shared mode").
  const bool members_hold = options_.mode == Mode::kShared && !options_.primary;
  BLKFENCE_ASSERT(members_hold == codec::is_all_registrants(options_.type));
  for (const auto& lu : options_.lus) {
    views_.push_back(LuView{.name = lu.name,
                            .wwn = lu.wwn,
                            .holder = {},
                            .type = {},
                            .keys = {},
                            .error = "not read yet"});
  }
}

Resource::~Resource() = default;

Key Resource::key_for(std::uint32_t epoch) const {
  auto key = Key::make(options_.cluster_id, options_.node_id, epoch);
  BLKFENCE_ASSERT(key.has_value());
  return *key;
}

// A key of this cluster that wins a race against ours: a higher epoch, or the same epoch and a
// higher node id (two nodes that read the same keys chose the same epoch).
bool Resource::outranks(std::uint64_t other, Key key) const {
  auto theirs = Key::from_value(other);
  if (!theirs || theirs->cluster_id() != options_.cluster_id) {
    return false;
  }
  return std::pair(theirs->epoch(), theirs->node_id()) > std::pair(key.epoch(), key.node_id());
}

// The epoch a new key must exceed (S3): every key of this cluster the reads show, registered or
// holding, and the persisted high-water mark. The reads include READ KEYS on every LU.
std::uint32_t Resource::highest_epoch(const Reads& reads) const {
  std::uint32_t epoch = high_water_;
  for (std::size_t i = 0; i < reads.lus.size(); ++i) {
    std::vector<std::uint64_t> seen = reads.lus[i].keys->keys;
    // READ KEYS and READ RESERVATION are two commands: a racer may have registered and taken
    // the LU between them, so its key can be in the reservation only.
    if (const auto holder = reads.holder(i)) {
      seen.push_back(*holder);
    }
    for (const std::uint64_t k : seen) {
      if (Key::cluster_of(k) == options_.cluster_id && !Key::epoch_reserved(Key::epoch_of(k))) {
        epoch = std::max(epoch, Key::epoch_of(k));
      }
    }
  }
  return epoch;
}

// The keys of this cluster the reads show with an epoch blkfence never draws, as "LU: key".
std::vector<std::string> Resource::stray_keys(const Reads& reads) const {
  std::vector<std::string> strays;
  for (std::size_t i = 0; i < reads.lus.size(); ++i) {
    std::vector<std::uint64_t> keys =
        reads.lus[i].keys ? reads.lus[i].keys->keys : std::vector<std::uint64_t>{};
    if (const auto holder = reads.holder(i)) {
      keys.push_back(*holder);
    }
    std::sort(keys.begin(), keys.end());
    keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
    for (const std::uint64_t k : keys) {
      if (Key::cluster_of(k) == options_.cluster_id && Key::epoch_reserved(Key::epoch_of(k))) {
        strays.push_back(options_.lus[i].name + ": " + Key::format(k));
      }
    }
  }
  return strays;
}

// The epoch of a new key (S3): one above highest_epoch(reads). what names the operation in the
// errors. Refused while a stray key of the cluster is on a LU: its epoch is above every epoch a
// draw may take, so no key drawn could outrank it, and taking a LU from it would hand out a token
// below a key that was there first; it must be removed by hand (docs/protocol.md, "The top of the
// epoch space").
Result<std::uint32_t> Resource::draw_epoch(const Reads& reads, const std::string& what) const {
  if (const std::vector<std::string> strays = stray_keys(reads); !strays.empty()) {
    std::string listed;
    for (const std::string& stray : strays) {
      listed += (listed.empty() ? "" : ", ") + stray;
    }
    return fail(ErrorCode::kInvalidArgument,
                what + " of " + options_.name + ": a key of this cluster with an epoch above " +
                    std::to_string(Key::kEpochDrawMax) +
                    ", which blkfence never draws, is on the LUs (" + listed +
                    "); it is no node's token: remove it (blkfencectl device preempt --victim "
                    "KEY, from a registered host) and try again");
  }
  const std::uint32_t highest = highest_epoch(reads);
  if (highest >= Key::kEpochDrawMax) {
    return fail(ErrorCode::kInvalidArgument,
                what + " of " + options_.name + ": the epoch space is exhausted (epoch " +
                    std::to_string(highest) +
                    " reached); stop every node, CLEAR the LUs and remove every node's " +
                    epochs_.where(options_.name));
  }
  return highest + 1;
}

bool Resource::ours(std::uint64_t key) const {
  return Key::cluster_of(key) == options_.cluster_id && Key::node_of(key) == options_.node_id;
}

// A key of this node with an epoch a draw can give: one in the top of the epoch space is a stray
// that carries our node id, never a key of ours to adopt or account for.
bool Resource::drawn_by_us(std::uint64_t key) const {
  return ours(key) && !Key::epoch_reserved(Key::epoch_of(key));
}

std::vector<codec::TransportId> Resource::own_ports() const {
  std::vector<codec::TransportId> ports;
  for (const pr::LogicalUnit& lu : options_.lus) {
    for (const pr::Path& path : lu.paths) {
      if (!path.initiator) {
        return {};
      }
      if (std::find(ports.begin(), ports.end(), *path.initiator) == ports.end()) {
        ports.push_back(*path.initiator);
      }
    }
  }
  return ports;
}

// docs/protocol.md, "Identical keys". Two nodes with one node_id, or two clusters whose names hash
// to one id, draw the same keys: each would take the other's registrations for its own (adopt
// them, re-key them, count them as registered) and a fence of one would fence both. The target
// says through which initiator port each key is registered; an iSCSI port is compared by its
// name (a session of this host logged in again has another ISID, and its registrations stay).
std::string Resource::key_used_elsewhere(const Reads& reads) const {
  const std::vector<codec::TransportId> mine = own_ports();
  const auto is_mine = [&mine](const codec::TransportId& port) {
    return std::any_of(mine.begin(), mine.end(), [&port](const codec::TransportId& own) {
      if (own.protocol != port.protocol) {
        return false;
      }
      if (own.protocol != codec::ProtocolId::kIscsi) {
        return own.port_name == port.port_name;
      }
      return std::equal(own.iscsi_name.begin(), own.iscsi_name.end(), port.iscsi_name.begin(),
                        port.iscsi_name.end(), [](char a, char b) {
                          return std::tolower(static_cast<unsigned char>(a)) ==
                                 std::tolower(static_cast<unsigned char>(b));
                        });
    });
  };
  for (std::size_t i = 0; i < reads.lus.size() && !mine.empty(); ++i) {
    if (!reads.lus[i].full) {
      continue;
    }
    for (const codec::FullStatusDescriptor& registration : reads.lus[i].full->descriptors) {
      if (ours(registration.key) && registration.transport_id &&
          !is_mine(*registration.transport_id)) {
        return "key " + Key::format(registration.key) + " of this node (cluster id " +
               std::to_string(options_.cluster_id) + ", node_id " +
               std::to_string(options_.node_id) + ") is registered on " + options_.lus[i].name +
               " through initiator port " + codec::to_string(*registration.transport_id) +
               ", which is none of this node's: another node is configured with this node_id, "
               "another cluster's name hashes to this cluster's id, or the port is no longer "
               "this node's; nothing is registered while it is there";
      }
    }
  }
  return {};
}

void Resource::run(std::vector<pr::Request> requests, Time now,
                   std::function<void(std::vector<pr::Response>, Time)> then) {
  std::weak_ptr<bool> alive = alive_;
  engine_.start(std::move(requests), now,
                [alive, then = std::move(then)](std::vector<pr::Response> responses, Time at) {
                  if (!alive.expired()) {
                    then(std::move(responses), at);
                  }
                });
}

void Resource::read_all(bool with_keys, Time now, ReadsDone then) {
  read_all(with_keys ? Keys::kKeys : Keys::kNone, now, std::move(then));
}

void Resource::read_all(Keys keys, Time now, ReadsDone then) {
  const bool with_keys = keys != Keys::kNone;
  const bool full = keys == Keys::kKeysAndPorts && !own_ports().empty();
  std::vector<pr::Request> requests;
  for (const auto& lu : options_.lus) {
    requests.push_back(pr::read_reservation_request(lu));
    if (with_keys) {
      requests.push_back(pr::read_keys_request(lu));
    }
    if (full) {
      requests.push_back(pr::read_full_status_request(lu));
    }
  }
  const int parts = 1 + (with_keys ? 1 : 0) + (full ? 1 : 0);
  run(std::move(requests), now,
      [this, parts, started = now, then = std::move(then)](std::vector<pr::Response> responses,
                                                           Time at) {
        Reads reads;
        reads.started = started;
        reads.lus.resize(options_.lus.size());
        std::size_t r = 0;
        for (std::size_t i = 0; i < options_.lus.size(); ++i) {
          Reads::Lu& lu = reads.lus[i];
          for (int part = 0; part < parts; ++part, ++r) {
            pr::Response& response = responses[r];
            for (const auto& attempt : response.attempts) {
              if (attempt.sense &&
                  codec::classify(*attempt.sense) == codec::SenseCategory::kUnitAttention) {
                reads.unit_attention = true;
              }
            }
            if (part == 2) {
              // A target that does not have READ FULL STATUS (ILLEGAL REQUEST) cannot tell ports
              // apart: the check is off there. Any other failure fails the read, as READ KEYS's
              // would: an answer that did not come proves nothing about whose keys are there.
              if (response.data) {
                if (auto decoded = codec::decode_read_full_status(*response.data)) {
                  lu.full = std::move(*decoded);
                } else {
                  lu.error = "READ FULL STATUS answer malformed";
                }
              } else if (const auto& scsi = response.data.error().scsi();
                         !scsi || scsi->sense_key !=
                                      static_cast<std::uint8_t>(codec::SenseKey::kIllegalRequest)) {
                lu.error = response.data.error().message();
              }
              continue;
            }
            if (!response.data) {
              lu.error = response.data.error().message();
              continue;
            }
            if (part == 0) {
              auto decoded = codec::decode_read_reservation(*response.data);
              if (!decoded || decoded->truncated) {
                lu.error = "READ RESERVATION answer malformed or truncated";
              } else {
                lu.reservation = *decoded;
              }
            } else {
              auto decoded = codec::decode_read_keys(*response.data);
              if (!decoded || decoded->truncated) {
                lu.error = "READ KEYS answer malformed or truncated";
              } else {
                lu.keys = *decoded;
              }
            }
          }
          LuView& view = views_[i];
          view.error = lu.error;
          if (lu.error.empty()) {
            view.holder = reads.holder(i);
            view.type = lu.reservation->reservation
                            ? std::optional(lu.reservation->reservation->type)
                            : std::nullopt;
            if (lu.keys) {
              view.keys = lu.keys->keys;
            }
          }
        }
        if (reads.unit_attention) {
          ++counters_.unit_attentions;
        }
        then(std::move(reads), at);
      });
}

std::vector<pr::Request> Resource::register_everywhere(Key key) const {
  std::vector<pr::Request> requests;
  for (const auto& lu : options_.lus) {
    for (auto& request :
         pr::prout_every_path(lu, codec::prout_register_and_ignore(key.value(), register_options()),
                              "REGISTER AND IGNORE EXISTING KEY")) {
      requests.push_back(std::move(request));
    }
  }
  return requests;
}

// docs/protocol.md, "Re-keying a holding nexus" and "Writes queued in the initiator". A write this
// node issued before the REGISTER must not be executed by the target after it:
// - Through a nexus of ours that holds with an older key, the REGISTER AND IGNORE EXISTING KEY
//   moves the reservation to the new key and leaves a write LIO accepted under the older one marked
//   with it (LIO marks each command it accepts with the holder's key at that moment), where the
//   next holder's PREEMPT AND ABORT of the new key does not reach it.
// - Through a nexus whose key was removed (fenced), a write still on its way to the target, or
//   held by the initiator (a multipath map with queue_if_no_path, a blocked SCSI device), is
//   refused only while the nexus stays unregistered: after the REGISTER it lands.
// So the REGISTER waits until this node has no write in flight on such a LU and no path of it
// holds writes back: the kernel completes a write only once the target is done with it
// (answered, or aborted by the error handler, which the target answers once the command has left
// its backend), so none is left there either. (Aborting them ourselves, a PREEMPT AND ABORT of the
// older key by itself, wedges LIO's iSCSI target when it is sent through the session the writes
// came by: docs/reference/lio.md §6.)
void Resource::drain_before_register(const Reads& reads, Key key, Time now,
                                     std::function<void(const std::string&, Time)> then) {
  // The key the node's writes in flight were issued under is the one its gate last opened with.
  // When the reads show it on every LU, the node was not fenced: what it wrote goes out through
  // nexuses that stay registered (a member that lost contact and promotes, its replica still
  // writing its own LU; a holder that lost contact and acquires again, below).
  bool not_fenced = gate_key_.has_value();
  for (std::size_t i = 0; i < options_.lus.size() && not_fenced; ++i) {
    const auto& keys = reads.lus[i].keys;
    not_fenced =
        keys && std::find(keys->keys.begin(), keys->keys.end(), *gate_key_) != keys->keys.end();
  }
  // Nothing the host held back while the node was fenced may go out through the nexus this
  // REGISTER makes registered again. The queues are stopped now, so that the writes they held
  // fail and the count below sees what is left, and again right before the REGISTER (multipathd
  // may turn queueing back on at any path event). Left alone only for a member whose gate is open
  // and whose key the reads show on every LU (a promote).
  if (!(gate_open_ && not_fenced) && !mutant::kKeepHostQueues) {
    const auto not_stopped = [](const std::string& failed) {
      return "the host's queues of writes could not be stopped (" + failed +
             "): nothing is registered while one may hold a write from before";
    };
    if (const std::string failed = set_host_queueing(false); !failed.empty()) {
      then(not_stopped(failed), now);
      return;
    }
    then = [this, then = std::move(then), not_stopped](const std::string& draining, Time at) {
      const std::string failed = draining.empty() ? set_host_queueing(false) : std::string();
      then(failed.empty() ? draining : not_stopped(failed), at);
    };
  }
  // Every LU unless the node was not fenced; then those an older key of ours holds (a re-key).
  Draining drain{.watched = std::vector<bool>(options_.lus.size(), false),
                 .busy = std::vector<bool>(options_.lus.size(), false)};
  bool wait = false;
  for (std::size_t i = 0; i < options_.lus.size(); ++i) {
    const auto holder = reads.holder(i);
    drain.watched[i] = !not_fenced || (holder && ours(*holder) && *holder != key.value());
    wait = wait || drain.watched[i];
  }
  if (!wait || mutant::kRekeyWithoutDrain) {
    then({}, now);
    return;
  }
  drain_look(drain, now + options_.drain_wait, now, std::move(then));
}

// Every watched LU is looked at, at every look: the REGISTER goes out on them all at once, so a
// LU found clean early could have writes again by the time another one is. The wait ends at a look
// that finds no write in flight and no path holding writes back on any of them, and none busy at
// the look before: a blocked device's queue is started again after its state reads "running", and
// a request the error handler retries waits in a requeue list for a moment, counted nowhere, so
// one more look a check_interval later counts them.
void Resource::drain_look(const Draining& drain, Time deadline, Time now,
                          std::function<void(const std::string&, Time)> then) {
  std::string left;
  Draining next{.watched = drain.watched, .busy = std::vector<bool>(options_.lus.size(), false)};
  for (std::size_t i = 0; i < options_.lus.size(); ++i) {
    if (!drain.watched[i]) {
      continue;
    }
    const auto writes = options_.writes_in_flight
                            ? options_.writes_in_flight(options_.lus[i])
                            : fail(ErrorCode::kNotSupported, "cannot count the writes in flight");
    const bool clean = writes && *writes == 0;
    next.busy[i] = !clean;
    if (clean && !drain.busy[i]) {
      continue;
    }
    left += (left.empty() ? "" : ", ") + options_.lus[i].name + ": " +
            (clean    ? std::string("none now, looking once more")
             : writes ? std::to_string(*writes) + " write(s) in flight"
                      : writes.error().message());
  }
  if (left.empty()) {
    then({}, now);
    return;
  }
  if (cancelled_ || now >= deadline) {
    const auto waited = std::chrono::duration_cast<std::chrono::seconds>(options_.drain_wait);
    const std::string when =
        cancelled_ ? "before the cancel" : "within " + std::to_string(waited.count()) + " s";
    then("this node's earlier writes did not finish " + when + " (" + left +
             "); nothing is registered while they may still land",
         now);
    return;
  }
  detail_ = "waiting for this node's earlier writes to finish before registering (" + left + ")";
  const Time at_next = std::min(deadline, now + options_.check_interval);
  draining_.emplace(
      at_next, [this, next = std::move(next), deadline, then = std::move(then)](Time at) mutable {
        drain_look(next, deadline, at, std::move(then));
      });
}

void Resource::begin(Op op, Done done) {
  BLKFENCE_ASSERT(op_ == Op::kNone);
  op_ = op;
  done_ = std::move(done);
  ++generation_;
  check_in_flight_ = false;
}

void Resource::end(Result<Key> result, Time now) {
  BLKFENCE_ASSERT(op_ != Op::kNone);
  const Op op = op_;
  op_ = Op::kNone;
  if (!queued_) {
    cancelled_ = false;  // a cancel() while queued behind a path's registration holds for it
  }
  Done done = std::move(done_);
  done_ = nullptr;
  if (!result && op != Op::kProbe) {
    emit(EventKind::kOperationFailed, result.error().message());
  }
  if (!next_check_ || *next_check_ < now) {
    next_check_ = now + options_.check_interval;
  }
  if (done) {
    done(std::move(result), now);
  }
  if (op_ == Op::kNone && queued_) {
    auto queued = std::move(queued_);
    queued_ = nullptr;
    queued(now);
  }
  if (op_ == Op::kNone && !new_paths_.empty()) {
    register_new_paths(now);
  }
}

void Resource::cancel() {
  if (op_ == Op::kAcquire || op_ == Op::kPromote || (op_ == Op::kPaths && queued_)) {
    cancelled_ = true;
  }
}

// A new-path registration is the resource's own business, not the caller's: an acquire or release
// asked for meanwhile waits for it (a few round trips) instead of failing as busy. A release
// closes the gate at once all the same.
bool Resource::queue_behind_paths(std::function<void(Time)> op) {
  if (op_ != Op::kPaths || queued_) {
    return false;
  }
  queued_ = std::move(op);
  return true;
}

std::string Resource::set_host_queueing(bool queue) {
  std::string failed;
  if (!options_.host_queueing) {
    return failed;
  }
  for (const pr::LogicalUnit& lu : options_.lus) {
    if (auto set = options_.host_queueing(lu, queue); !set) {
      failed += (failed.empty() ? "" : "; ") + lu.name + ": " + set.error().message();
    }
  }
  return failed;
}

void Resource::set_gate(bool open, Time verified_since) {
  if (open && key_) {
    gate_key_ = key_->value();  // also when it stays open (a member's gate through its promote)
  }
  if (gate_open_ == open) {
    return;
  }
  gate_open_ = open;
  observer_.on_gate(*this, open, verified_since);
  // Closed: the writes the host holds back fail, and none is held from now on; after the token is
  // gone and the writer is being stopped, since telling a map may wait on it. (A failure is the
  // daemon's to log: the next REGISTER stops them again, and refuses.)
  if (!mutant::kKeepHostQueues) {
    (void)set_host_queueing(open);
  }
}

void Resource::set_state(State state, std::string detail) {
  state_ = state;
  detail_ = std::move(detail);
}

void Resource::emit(EventKind kind, std::string detail, std::optional<std::uint64_t> other,
                    std::string device) {
  observer_.on_event(*this, Event{.kind = kind,
                                  .key = key_,
                                  .other_key = other,
                                  .device = std::move(device),
                                  .detail = std::move(detail)});
}

// Answers done and returns true when an operation needing mode cannot start now.
bool Resource::refuse(Mode mode, Time now, Done& done) {
  if (options_.mode != mode) {
    done(fail(ErrorCode::kInvalidArgument,
              "resource " + options_.name + " is in " + std::string(mode_name(options_)) +
                  " mode: use " +
                  (options_.mode == Mode::kExclusive ? "acquire and release"
                   : options_.primary                ? "unfence, promote and release"
                                                     : "unfence and fence")),
         now);
    return true;
  }
  if (op_ != Op::kNone) {
    done(fail(ErrorCode::kBusy, "resource " + options_.name + ": another operation is running"),
         now);
    return true;
  }
  return false;
}

// --- epochs (S3) ---------------------------------------------------------------------------------

Result<void> Resource::load_epochs(Time now) {
  auto loaded = epochs_.load(options_.name);
  epochs_loaded_ = loaded.has_value();
  if (!loaded) {
    return tl::unexpected(loaded.error());
  }
  stored_ = *loaded;
  registering_stored_ = stored_ && stored_->registering;
  if (!previous_run_read_ && stored_ && stored_->registering) {
    // The run before ended with a REGISTER of ours whose outcome it did not learn, sent at the
    // latest just before it ended, now: it may still execute for the command's timeout, and then
    // as long as a command that timed out can (late_execution_end). A transport of this run cannot
    // tell when the kernel gave the old run's commands back.
    previous_run_settles_ = now +
                            std::chrono::duration_cast<Time>(engine_.policy().command_timeout) +
                            late_execution_horizon();
  }
  previous_run_read_ = true;
  if (stored_ && Key::epoch_reserved(stored_->seen)) {
    // Written by a release that stored a stray key's epoch as seen (no node drew it): what the
    // stray hid is lost, the node's own is what is left.
    stored_->seen = stored_->used;
  }
  high_water_ = std::max(high_water_, stored_ ? stored_->high_water() : 0U);
  return {};
}

Result<void> Resource::store_epochs(StoredEpochs epochs) {
  // A store that failed may have reached the disk all the same (one the daemon stopped waiting for
  // completes later; a rename done before the directory's fsync failed): each store writes at
  // least what any before it may have written, so the file never goes down, whatever a store
  // reported (docs/protocol.md, S3); and the next draw is above it, so the epoch last used on disk
  // is never above the key this node registers next. A store refused before it began (the
  // previous one still running) wrote nothing.
  epochs.used = std::max(epochs.used, attempted_.used);
  epochs.seen = std::max(epochs.seen, attempted_.seen);
  auto stored = epochs_.store(options_.name, epochs);
  if (stored || stored.error().code() != ErrorCode::kBusy) {
    attempted_ = epochs;
    high_water_ = std::max(high_water_, epochs.high_water());
    // The disk says a REGISTER is under way only after a store of it succeeded, and may have
    // stopped saying so after any store without it was tried, whatever that one reported.
    registering_stored_ = epochs.registering && stored.has_value();
  }
  if (!stored) {
    return stored;
  }
  stored_ = epochs;
  return {};
}

// A key drawn with epoch: durable before it exists anywhere, so no restart can reuse it. It is
// above everything seen (the draw's floor), so it is the seen mark too.
Result<void> Resource::store_drawn(std::uint32_t epoch) {
  BLKFENCE_ASSERT(epoch > high_water_ || mutant::kNoEpochBump || mutant::kPromoteNoEpochBump);
  return store_epochs(
      StoredEpochs{.used = epoch, .seen = std::max(epoch, high_water_), .registering = true});
}

// Before a REGISTER of the key the node holds (a new path's): the epoch file says one is under way,
// as store_drawn() does for a new key.
Result<void> Resource::mark_registering() {
  if (options_.mode == Mode::kShared && !options_.primary) {
    return {};  // members' keys are all epoch 0: a late REGISTER of one changes nothing
  }
  if (registering_stored_) {
    return {};
  }
  if (!epochs_loaded_ || !stored_) {
    return fail(ErrorCode::kInvalidArgument,
                epochs_.where(options_.name) +
                    (epochs_loaded_ ? " does not exist" : " could not be read at its last load") +
                    ": a REGISTER is sent only once that file says one is under way");
  }
  StoredEpochs marked = *stored_;
  marked.registering = true;
  return store_epochs(marked);
}

// Once no REGISTER of ours can execute any more (none timed out, or those that did are back or past
// their horizon, and the previous run's are past theirs), the epoch file stops saying one may: a
// restart then registers at once. Tried at each monitor round until it is stored.
void Resource::store_registers_settled(Time now) {
  if (!stored_ || !stored_->registering || op_ != Op::kNone || settling_ ||
      (registers_settle_ && *registers_settle_ > now) ||
      (previous_run_settles_ && *previous_run_settles_ > now)) {
    return;
  }
  StoredEpochs settled = *stored_;
  settled.registering = false;
  if (auto stored = store_epochs(settled); !stored) {
    if (!registers_settled_store_failed_) {
      registers_settled_store_failed_ = true;
      emit(EventKind::kOperationFailed,
           "storing that no REGISTER of this node is under way failed (a restart will wait before "
           "it registers): " +
               stored.error().message());
    }
    return;
  }
  registers_settled_store_failed_ = false;
}

// S3: the highest epoch of this cluster a read shows is stored as soon as it rises above the stored
// one, so that a target that forgets its PR state (a power cycle without APTPL, a CLEAR) cannot
// bring a later draw of this node below an epoch any node of the cluster used. A read that shows
// nothing new writes nothing: the monitor's reads stay free of fsyncs. used_floor raises the epoch
// a restart may adopt (a lost file: see probe_read). The reads may lack keys (a monitor round).
Result<void> Resource::remember_epochs(const Reads& reads, std::uint32_t used_floor) {
  const StoredEpochs now_stored = stored_.value_or(StoredEpochs{});
  // A rise kept in memory only (note_epochs_of_failed_read) goes to the disk with this store.
  const std::uint32_t unstored = high_water_ > now_stored.high_water() ? high_water_ : 0U;
  const std::uint32_t seen = std::max({used_floor, seen_epoch(reads), unstored});
  high_water_ = std::max(high_water_, seen);  // in memory at once, whether or not the disk follows
  const StoredEpochs wanted{.used = std::max(now_stored.used, used_floor),
                            .seen = std::max({now_stored.seen, seen, used_floor}),
                            .registering = now_stored.registering};
  if (stored_ ? wanted == *stored_ : wanted.seen == 0) {
    return {};  // nothing new (or a first start on LUs without a key of this cluster)
  }
  return store_epochs(wanted);
}

// The highest epoch of this cluster the reads show, holders included; keys where they were read.
std::uint32_t Resource::seen_epoch(const Reads& reads) const {
  std::uint32_t seen = 0;
  for (std::size_t i = 0; i < reads.lus.size(); ++i) {
    std::vector<std::uint64_t> keys =
        reads.lus[i].keys ? reads.lus[i].keys->keys : std::vector<std::uint64_t>{};
    if (const auto holder = reads.holder(i)) {
      keys.push_back(*holder);
    }
    for (const std::uint64_t k : keys) {
      if (Key::cluster_of(k) == options_.cluster_id && !Key::epoch_reserved(Key::epoch_of(k))) {
        seen = std::max(seen, Key::epoch_of(k));
      }
    }
  }
  return seen;
}

// A monitor round's reads: a rise is stored (rare: a new key of the cluster); a failure to store is
// reported once per epoch, not retried at every check, and the next draw stores above it anyway.
void Resource::note_epochs(const Reads& reads) {
  const std::uint32_t seen = seen_epoch(reads);
  if (!epochs_loaded_) {
    // The last load failed (an acquire's, after the start): the file is never written over while
    // it cannot be read; the next draw is above the rise all the same.
    high_water_ = std::max(high_water_, seen);
    return;
  }
  if (seen <= std::max(stored_ ? stored_->seen : 0U, epoch_store_failed_)) {
    return;
  }
  if (auto remembered = remember_epochs(reads); !remembered) {
    epoch_store_failed_ = seen;
    emit(EventKind::kOperationFailed,
         "storing epoch " + std::to_string(seen) +
             " seen on the LUs failed: " + remembered.error().message());
  }
}

// S3: what did come back of a read that failed counts too. A restarted daemon may read another
// node's key on one LU just before a target that forgets its PR state loses it; without this, its
// next draw could repeat that epoch. Stored as the monitor stores any rise, once the file was read
// and what it means is decided (a file found, or a start that found no key of this node); kept in
// memory otherwise (a file that cannot be read must not be written over; a missing one may be a
// lost file, decided only once every LU answers), and stored with the next store.
void Resource::note_epochs_of_failed_read(const Reads& reads) {
  if (stored_ || state_ != State::kUnknown) {
    note_epochs(reads);
  } else {
    high_water_ = std::max(high_water_, seen_epoch(reads));
  }
}

// --- start ---------------------------------------------------------------------------------------

void Resource::start(Time now) {
  begin(Op::kProbe, nullptr);
  read_capabilities(now, [this](Time from) {
    read_all(Keys::kKeysAndPorts, from,
             [this](const Reads& reads, Time at) { probe_read(reads, at); });
  });
}

// docs/protocol.md, "Power loss and APTPL": where every LU reports PTPL_C, our REGISTERs carry
// APTPL=1 and the target keeps the registrations and the reservation across a power loss (SPC-4
// 5.13.5); where one does not, none does (APTPL=1 to a LU without PTPL_C is an ILLEGAL REQUEST).
// Read at the start (capabilities do not change under a running target), and again before an
// operation registers if a LU did not answer then.
void Resource::read_capabilities(Time now, std::function<void(Time)> then) {
  std::vector<pr::Request> requests;
  for (const auto& lu : options_.lus) {
    requests.push_back(pr::report_capabilities_request(lu));
  }
  run(std::move(requests), now,
      [this, then = std::move(then)](const std::vector<pr::Response>& responses, Time at) {
        bool answered = true;
        bool ptpl_c = true;
        for (const pr::Response& response : responses) {
          std::optional<codec::Capabilities> caps;
          if (response.data) {
            if (auto decoded = codec::decode_report_capabilities(*response.data)) {
              caps = *decoded;
            }
          }
          if (caps && !caps->truncated) {
            ptpl_c = ptpl_c && caps->ptpl_c;
          } else {
            answered = false;
          }
        }
        // A LU that says no PTPL_C settles it; one that did not answer leaves it open.
        aptpl_ = answered || !ptpl_c ? std::optional(answered && ptpl_c) : std::nullopt;
        then(at);
      });
}

void Resource::with_capabilities(Time now, std::function<void(Time)> then) {
  if (aptpl_) {
    then(now);
    return;
  }
  read_capabilities(now, std::move(then));
}

// Every REGISTER of ours, unregisters included: LIO rewrites its APTPL state at each, and one with
// APTPL=0 would make the LU forget every registration at its next power loss.
codec::RegisterOptions Resource::register_options() const {
  return codec::RegisterOptions{.all_tg_pt = false, .aptpl = aptpl_.value_or(false)};
}

namespace {

// The newest of keys and newest.
std::optional<std::uint64_t> newest_of(const std::vector<std::uint64_t>& keys,
                                       std::optional<std::uint64_t> newest) {
  for (const std::uint64_t k : keys) {
    if (!newest || Key::epoch_of(k) > Key::epoch_of(*newest)) {
      newest = k;
    }
  }
  return newest;
}

}  // namespace

void Resource::probe_read(const Reads& reads, Time now) {
  probe_done_ = true;
  // Loaded at each probe (the monitor probes again while the state is unknown): a file an operator
  // restored is heard at the next check, without a restart.
  if (auto loaded = load_epochs(now); !loaded) {
    const std::string detail = "cannot read the stored epoch: " + loaded.error().message();
    if (state_ != State::kUnknown || detail_ != detail) {  // said once, not at every check
      set_state(State::kUnknown, detail);
      emit(EventKind::kStateKnown, detail_);
    }
    end(tl::unexpected(loaded.error()), now);
    return;  // acquire refuses without its epochs (S3); status still reads the LUs
  }
  if (!reads.ok()) {
    note_epochs_of_failed_read(reads);
    std::string detail = "cannot read the LUs: " + reads.errors(options_.lus);
    if (!stored_) {
      // docs/protocol.md, S3: a first start, or a lost file if a key of ours is on the LUs; which
      // one is decided when they answer. An acquire reads every LU's keys before it draws, so it
      // fails rather than draw from 0 while they cannot be read.
      detail += "; and " + epochs_.where(options_.name) +
                " does not exist (a first start, or a lost file if a key of this node is on the "
                "LUs: decided when they can be read)";
    }
    set_state(State::kUnknown, detail);
    emit(EventKind::kStateKnown, detail_);
    end(fail(ErrorCode::kIndeterminate, detail_), now);
    return;
  }
  if (now - reads.started >= options_.lease) {
    // A read that took a lease or more (a hung path it failed over from, a stalled daemon) would
    // adopt a key and open its gate with the lease already over (S2): read again, undecided.
    probe_done_ = state_ != State::kUnknown;
    read_all(Keys::kKeysAndPorts, now,
             [this](const Reads& again, Time at) { probe_read(again, at); });
    return;
  }
  if (const std::string elsewhere = key_used_elsewhere(reads); !elsewhere.empty()) {
    // Neither adopted nor taken for a stale key of ours: undecided until it is gone.
    if (state_ != State::kUnknown || detail_ != elsewhere) {  // said once, not at every check
      set_state(State::kUnknown, elsewhere);
      emit(EventKind::kStateKnown, detail_);
    }
    end(fail(ErrorCode::kKeyInUse, detail_), now);
    return;
  }
  last_read_ok_ = reads.started;
  // The epoch of the last key this node drew and did not give up (acquire stores it before
  // registering; release and a failed acquire store one more).
  const std::uint32_t stored = stored_ ? stored_->used : 0;
  std::string note;
  std::uint32_t used_floor = 0;
  if (!stored_) {
    std::optional<std::uint64_t> mine;
    for (std::size_t i = 0; i < reads.lus.size(); ++i) {
      std::vector<std::uint64_t> keys = reads.lus[i].keys->keys;
      if (const auto holder = reads.holder(i)) {
        keys.push_back(*holder);
      }
      std::erase_if(keys, [this](std::uint64_t k) { return !drawn_by_us(k); });
      mine = newest_of(keys, mine);
    }
    if (mine) {
      // Not a first start: the file was lost. The key found is treated as given up (as after a
      // release): this start does not adopt it as the exclusive or primary token, nor will the
      // next.
      const std::uint32_t epoch = Key::epoch_of(*mine);
      used_floor = epoch + 1;  // at most kEpochDrawMax + 1: the space ends there
      note = epochs_.where(options_.name) + " was missing while key " + Key::format(*mine) +
             " of this node is on the LUs";
    }
  }
  if (auto remembered = remember_epochs(reads, used_floor); !remembered) {
    note += std::string(note.empty() ? "" : "; ") +
            "storing the epochs seen failed: " + remembered.error().message();
  } else if (!note.empty()) {
    note += ": stored " + std::to_string(stored_->used) + " as the epoch last used and " +
            std::to_string(stored_->seen) + " as the highest seen";
  }
  const auto with_note = [&note](const std::string& detail) {
    return note.empty() ? detail : detail + " (" + note + ")";
  };
  if (const std::optional<Key> key = adoptable(reads, stored)) {
    key_ = *key;
    // Primary mode: our key holding every LU with the stored epoch is the primary's token.
    bool holds = options_.primary && key->epoch() == stored && key->epoch() > 0;
    for (std::size_t i = 0; holds && i < reads.lus.size(); ++i) {
      holds = reads.holder(i) == key->value();
    }
    primary_ = holds;
    const bool exclusive = options_.mode == Mode::kExclusive;
    set_state(exclusive || holds ? State::kHeld : State::kUnfenced,
              with_note("our key " + key_->to_string() +
                        (exclusive ? " is the holder and only registrant on every LU: adopted"
                         : holds   ? " is the primary's: it holds every LU"
                                   : " is registered on every LU")));
    last_success_ = reads.started;
    set_gate(true, reads.started);
    emit(EventKind::kStateKnown, detail_);
    emit(exclusive ? EventKind::kAcquired : EventKind::kUnfenced, detail_);
    end(*key_, now);
    return;
  }
  set_state(State::kReleased, with_note(not_held(reads, stored)));
  // docs/protocol.md, "Writes queued in the initiator": the gate is closed, and the daemon before
  // this one may have died before it could stop the host's queues (or, fenced while none ran,
  // never closed a gate): stopped now, not only before the next REGISTER. (A failure is the
  // daemon's to log, as when a gate closes.)
  if (!mutant::kKeepHostQueues) {
    (void)set_host_queueing(false);
  }
  emit(EventKind::kStateKnown, detail_);
  end(fail(ErrorCode::kLost, detail_), now);
}

// Our key as the probe may adopt it: exclusive, the holder and only registrant on every LU with
// the stored epoch (not given up); shared, one key of ours registered on every LU, each under a
// reservation.
std::optional<Key> Resource::adoptable(const Reads& reads, std::uint32_t stored) const {
  if (options_.mode == Mode::kExclusive) {
    const std::optional<std::uint64_t> holder = reads.holder(0);
    bool adopt = holder && drawn_by_us(*holder) && Key::epoch_of(*holder) == stored;
    for (std::size_t i = 0; adopt && i < reads.lus.size(); ++i) {
      adopt = reads.holder(i) == holder && reads.others(i, *holder).empty() &&
              reads.registered(i, *holder);
    }
    return adopt ? std::optional(*Key::from_value(*holder)) : std::nullopt;
  }
  // The newest key of ours anywhere: in primary mode an older one may survive on a nexus whose
  // re-key did not execute, and adopting it would make the writer's token a key the next promote
  // treats as the old primary's leftover.
  std::optional<std::uint64_t> mine;
  for (const auto& lu : reads.lus) {
    for (const std::uint64_t k : lu.keys->keys) {
      // Shared mode: a departed key (a release) is never adopted: only an unfence opens the gate.
      const bool member = options_.primary || Key::epoch_of(k) != Key::kEpochDeparted;
      if (drawn_by_us(k) && member && (!mine || Key::epoch_of(k) > Key::epoch_of(*mine))) {
        mine = k;
      }
    }
  }
  for (std::size_t i = 0; mine && i < reads.lus.size(); ++i) {
    // Primary mode: the members do not reserve; an unreserved LU is the primary's business.
    if (!reads.registered(i, *mine) ||
        (!options_.primary && !reads.lus[i].reservation->reservation)) {
      return std::nullopt;
    }
  }
  return mine ? std::optional(*Key::from_value(*mine)) : std::nullopt;
}

// Why the probe adopted nothing, naming a key of ours it found and left alone (S5).
std::string Resource::not_held(const Reads& reads, std::uint32_t stored) const {
  std::string detail = "not held by this node";
  for (std::size_t i = 0; i < reads.lus.size(); ++i) {
    const auto holder = reads.holder(i);
    if (holder && drawn_by_us(*holder)) {
      // Given up (release, a failed acquire) or never verified: the next acquirer preempts it.
      return "key " + Key::format(*holder) + " of this node holds " + options_.lus[i].name +
             " but is not the current token (stored epoch " + std::to_string(stored) +
             "); left as it is, gate closed";
    }
    for (const std::uint64_t k : reads.lus[i].keys->keys) {
      if (drawn_by_us(k)) {
        // S5: whatever it is, it is not ours to repair without being asked.
        detail = "key " + Key::format(k) + " of this node is still registered on " +
                 options_.lus[i].name + " but does not hold every LU; left as it is";
      }
    }
  }
  return detail;
}

// --- acquire (exclusive) -------------------------------------------------------------------------

}  // namespace blkfence::fence
