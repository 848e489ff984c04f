// The fencing protocol of one resource as a state machine (fence layer). See resource.h.
#include "blkfence/fence/resource.h"

#include <algorithm>
#include <set>

#include "blkfence/assert.h"
#include "blkfence/codec/prin.h"
#include "blkfence/codec/prout.h"
#include "blkfence/pr/client.h"

namespace blkfence::fence {
namespace {

bool all_registrants(codec::PrType type) {
  return type == codec::PrType::kWriteExclusiveAllRegistrants ||
         type == codec::PrType::kExclusiveAccessAllRegistrants;
}

std::string hex(std::uint64_t key) {
  auto made = Key::from_value(key);
  return made ? made->to_string() : "0x0000000000000000";
}

}  // namespace

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

// One read of every LU: READ RESERVATION always, READ KEYS when asked.
struct Resource::Reads {
  struct Lu {
    std::optional<codec::ReadReservation> reservation;
    std::optional<codec::ReadKeys> keys;
    std::string error;
  };
  std::vector<Lu> lus;
  bool unit_attention = false;
  Time started{0};

  bool ok() const {
    return std::all_of(lus.begin(), lus.end(), [](const Lu& lu) { return lu.error.empty(); });
  }
  std::string errors(const std::vector<pr::LogicalUnit>& units) const {
    std::string text;
    for (std::size_t i = 0; i < lus.size(); ++i) {
      if (!lus[i].error.empty()) {
        text += (text.empty() ? "" : "; ") + units[i].name + ": " + lus[i].error;
      }
    }
    return text;
  }
  std::optional<std::uint64_t> holder(std::size_t lu) const {
    const auto& reservation = lus[lu].reservation;
    if (!reservation || !reservation->reservation) {
      return std::nullopt;
    }
    return reservation->reservation->key;
  }
  bool registered(std::size_t lu, std::uint64_t key) const {
    const auto& keys = lus[lu].keys;
    return keys && std::find(keys->keys.begin(), keys->keys.end(), key) != keys->keys.end();
  }
  // Keys other than key registered on the LU, each once.
  std::vector<std::uint64_t> others(std::size_t lu, std::uint64_t key) const {
    std::set<std::uint64_t> found;
    if (lus[lu].keys) {
      for (const std::uint64_t k : lus[lu].keys->keys) {
        if (k != key) {
          found.insert(k);
        }
      }
    }
    return {found.begin(), found.end()};
  }
};

Resource::Resource(ResourceOptions options, pr::Engine& engine, EpochStore& epochs,
                   Observer& observer)
    : options_(std::move(options)), engine_(engine), epochs_(epochs), observer_(observer) {
  BLKFENCE_ASSERT(!options_.lus.empty());
  BLKFENCE_ASSERT(options_.node_id >= Key::kNodeIdMin);
  BLKFENCE_ASSERT(options_.keys_every >= 1 && options_.verify_rounds_max >= 1);
  // Exclusive mode needs one holder key to compare with ours.
  BLKFENCE_ASSERT(options_.mode == Mode::kShared || !all_registrants(options_.type));
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

bool Resource::ours(std::uint64_t key) const {
  return (key >> 32U) ==
         ((static_cast<std::uint64_t>(options_.cluster_id) << 16U) | options_.node_id);
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
  std::vector<pr::Request> requests;
  for (const auto& lu : options_.lus) {
    requests.push_back(pr::read_reservation_request(lu));
    if (with_keys) {
      requests.push_back(pr::read_keys_request(lu));
    }
  }
  run(std::move(requests), now,
      [this, with_keys, started = now, then = std::move(then)](std::vector<pr::Response> responses,
                                                               Time at) {
        Reads reads;
        reads.started = started;
        reads.lus.resize(options_.lus.size());
        std::size_t r = 0;
        for (std::size_t i = 0; i < options_.lus.size(); ++i) {
          Reads::Lu& lu = reads.lus[i];
          for (int part = 0; part < (with_keys ? 2 : 1); ++part, ++r) {
            pr::Response& response = responses[r];
            for (const auto& attempt : response.attempts) {
              if (attempt.sense &&
                  codec::classify(*attempt.sense) == codec::SenseCategory::kUnitAttention) {
                reads.unit_attention = true;
              }
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

void Resource::set_gate(bool open, Time verified_since) {
  if (gate_open_ == open) {
    return;
  }
  gate_open_ = open;
  observer_.on_gate(*this, open, verified_since);
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

// --- start ---------------------------------------------------------------------------------------

void Resource::start(Time now) {
  auto stored = epochs_.load(options_.name);
  if (!stored) {
    set_state(State::kUnknown, "cannot read the stored epoch: " + stored.error().message());
    probe_done_ = true;
    next_check_ = now + options_.check_interval;
    emit(EventKind::kStateKnown, detail_);
    return;  // acquire refuses without a high-water mark (S3); status still reads the LUs
  }
  high_water_ = *stored;
  begin(Op::kProbe, nullptr);
  read_all(true, now, [this](Reads reads, Time at) { probe_read(std::move(reads), at); });
}

void Resource::probe_read(Reads reads, Time now) {
  probe_done_ = true;
  if (reads.ok()) {
    last_read_ok_ = reads.started;
  }
  if (!reads.ok()) {
    set_state(State::kUnknown, "cannot read the LUs: " + reads.errors(options_.lus));
    emit(EventKind::kStateKnown, detail_);
    end(fail(ErrorCode::kIndeterminate, detail_), now);
    return;
  }
  // The epoch of the last key this node registered and did not give up (acquire stores it before
  // registering; release and a failed acquire store one more).
  const std::uint32_t stored = high_water_;
  // S3: no key this node has used on these LUs may be reused.
  for (const auto& lu : reads.lus) {
    for (const std::uint64_t k : lu.keys->keys) {
      if (ours(k)) {
        high_water_ = std::max(high_water_, static_cast<std::uint32_t>(k));
      }
    }
  }
  if (options_.mode == Mode::kExclusive) {
    const std::optional<std::uint64_t> holder = reads.holder(0);
    bool adopt = holder && ours(*holder) && static_cast<std::uint32_t>(*holder) == stored;
    for (std::size_t i = 0; adopt && i < reads.lus.size(); ++i) {
      adopt = reads.holder(i) == holder && reads.others(i, *holder).empty() &&
              reads.registered(i, *holder);
    }
    if (adopt) {
      key_ = *Key::from_value(*holder);
      set_state(State::kHeld, "our key " + key_->to_string() +
                                  " is the holder and only registrant on every LU: adopted");
      last_success_ = reads.started;
      set_gate(true, reads.started);
      emit(EventKind::kStateKnown, detail_);
      emit(EventKind::kAcquired, detail_);
      end(*key_, now);
      return;
    }
  } else {
    std::optional<std::uint64_t> mine;
    bool registered = true;
    for (std::size_t i = 0; registered && i < reads.lus.size(); ++i) {
      registered = false;
      for (const std::uint64_t k : reads.lus[i].keys->keys) {
        if (ours(k) && (!mine || *mine == k)) {
          mine = k;
          registered = true;
        }
      }
      registered = registered && reads.lus[i].reservation->reservation.has_value();
    }
    if (registered && mine) {
      key_ = *Key::from_value(*mine);
      set_state(State::kUnfenced, "our key " + key_->to_string() + " is registered on every LU");
      last_success_ = reads.started;
      set_gate(true, reads.started);
      emit(EventKind::kStateKnown, detail_);
      emit(EventKind::kUnfenced, detail_);
      end(*key_, now);
      return;
    }
  }
  std::string detail = "not held by this node";
  for (std::size_t i = 0; i < reads.lus.size(); ++i) {
    const auto holder = reads.holder(i);
    if (holder && ours(*holder)) {
      // Given up (release, a failed acquire) or never verified: the next acquirer preempts it.
      detail = "key " + hex(*holder) + " of this node holds " + options_.lus[i].name +
               " but is not the current token (stored epoch " + std::to_string(stored) +
               "); left as it is, gate closed";
      break;
    }
    for (const std::uint64_t k : reads.lus[i].keys->keys) {
      if (ours(k)) {
        // S5: whatever it is, it is not ours to repair without being asked.
        detail = "key " + hex(k) + " of this node is still registered on " + options_.lus[i].name +
                 " but does not hold every LU; left as it is";
      }
    }
  }
  set_state(State::kReleased, detail);
  emit(EventKind::kStateKnown, detail_);
  end(fail(ErrorCode::kLost, detail_), now);
}

// --- acquire (exclusive) -------------------------------------------------------------------------

// Answers done and returns true when an operation needing mode cannot start now.
bool Resource::refuse(Mode mode, Time now, Done& done) {
  if (options_.mode != mode) {
    done(fail(ErrorCode::kInvalidArgument,
              "resource " + options_.name + " is in " + std::string(to_string(options_.mode)) +
                  " mode: use " +
                  (options_.mode == Mode::kShared ? "unfence and fence" : "acquire and release")),
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

void Resource::acquire(Time now, Done done) {
  if (options_.mode == Mode::kExclusive &&
      queue_behind_paths([this, done](Time at) mutable { acquire(at, std::move(done)); })) {
    return;
  }
  if (refuse(Mode::kExclusive, now, done)) {
    return;
  }
  if (state_ == State::kHeld && gate_open_) {
    done(*key_, now);  // the monitor keeps verifying it
    return;
  }
  begin(Op::kAcquire, std::move(done));
  uncertain_.assign(options_.lus.size(), false);
  leftover_.reset();   // the new key replaces it on every path
  new_paths_.clear();  // every path is registered
  const State before = state_;
  set_gate(false, now);
  set_state(State::kAcquiring, "reading keys and reservations");
  auto stored = epochs_.load(options_.name);
  if (!stored) {
    set_state(before, detail_);
    end(tl::unexpected(stored.error()), now);
    return;
  }
  high_water_ = std::max(high_water_, *stored);
  after_monitor_prouts(now, [this, before](Time from) {
    read_all(true, from, [this, before](Reads reads, Time at) {
      if (!reads.ok()) {
        set_state(before == State::kFenced ? State::kFenced : State::kReleased,
                  "acquire failed: " + reads.errors(options_.lus));
        end(fail(ErrorCode::kIndeterminate,
                 "acquire of " + options_.name +
                     ": cannot read the LUs: " + reads.errors(options_.lus)),
            at);
        return;
      }
      acquire_draw(std::move(reads), 0, at);
    });
  });
}

// Draws the epoch from what reads showed (S3: above every key of this cluster seen and the stored
// high-water mark), stores it, and registers the new key on every path.
void Resource::acquire_draw(Reads reads, int round, Time at) {
  std::uint32_t epoch = high_water_;
  for (std::size_t i = 0; i < reads.lus.size(); ++i) {
    std::vector<std::uint64_t> seen = reads.lus[i].keys->keys;
    // READ KEYS and READ RESERVATION are two commands: a racer may have registered and taken
    // the LU between them, so its key can be in the reservation only (S3).
    if (const auto holder = reads.holder(i)) {
      seen.push_back(*holder);
    }
    for (const std::uint64_t k : seen) {
      if ((k >> 48U) == options_.cluster_id) {
        epoch = std::max(epoch, static_cast<std::uint32_t>(k));
      }
    }
  }
  if (epoch == UINT32_MAX) {
    set_state(State::kReleased, "the epoch space is exhausted");
    end(fail(ErrorCode::kInvalidArgument,
             "acquire of " + options_.name + ": epoch 0xffffffff reached; CLEAR the LUs"),
        at);
    return;
  }
  const Key key = key_for(epoch + 1);
  // S3: durable before the key exists anywhere, so no restart can reuse it.
  if (auto stored_epoch = epochs_.store(options_.name, key.epoch()); !stored_epoch) {
    set_state(State::kReleased, "cannot store the epoch");
    end(tl::unexpected(stored_epoch.error()), at);
    return;
  }
  high_water_ = key.epoch();
  key_ = key;
  fenced_by_.reset();
  set_state(State::kAcquiring, "registering " + key.to_string());
  acquire_register(key, std::move(reads), round, at);
}

namespace {

std::string first_error(const std::vector<pr::Response>& responses) {
  for (const auto& response : responses) {
    if (!response.data) {
      return response.data.error().message();
    }
  }
  return {};
}

}  // namespace

void Resource::acquire_register(Key key, Reads reads, int round, Time now) {
  std::vector<pr::Request> requests;
  for (const auto& lu : options_.lus) {
    for (auto& request : pr::prout_every_path(lu, codec::prout_register_and_ignore(key.value()),
                                              "REGISTER AND IGNORE EXISTING KEY")) {
      requests.push_back(std::move(request));
    }
  }
  run(std::move(requests), now,
      [this, key, round, reads = std::move(reads)](const std::vector<pr::Response>& responses,
                                                   Time at) mutable {
        if (const std::string error = first_error(responses); !error.empty()) {
          acquire_failed(key, "register: " + error, at);
          return;
        }
        acquire_take(key, std::move(reads), round, at);
      });
}

// A PREEMPT or RESERVE that timed out may still execute, and make our key the holder, at any time
// until the target has answered or aborted it; acquire_failed must not unregister there.
void Resource::note_uncertain(const std::vector<pr::Response>& responses,
                              const std::vector<std::size_t>& lu_of) {
  for (std::size_t r = 0; r < responses.size(); ++r) {
    if (!responses[r].data && responses[r].data.error().code() == ErrorCode::kIndeterminate) {
      uncertain_[lu_of[r]] = true;
    }
  }
}

codec::PrOutCommand Resource::take_command(Key key, std::uint64_t victim) const {
  return options_.preempt_abort ? codec::prout_preempt_and_abort(key.value(), victim, options_.type)
                                : codec::prout_preempt(key.value(), victim, options_.type);
}

void Resource::acquire_take(Key key, Reads reads, int round, Time now) {
  for (std::size_t i = 0; i < options_.lus.size(); ++i) {
    // A key of another node of this cluster with an epoch as high as ours holds: it registered
    // after our read, and it may well have opened its gate already. Taking over with our key
    // would give two tokens the same epoch (BLKFENCE_EPOCH must order them, S3); draw a new one,
    // above it, and register that instead.
    const auto holder = reads.holder(i);
    if (holder && !ours(*holder) && (*holder >> 48U) == options_.cluster_id &&
        static_cast<std::uint32_t>(*holder) >= key.epoch()) {
      if (round + 1 >= options_.verify_rounds_max) {
        acquire_failed(key, "take: " + options_.lus[i].name + " is held by " + hex(*holder), now);
        return;
      }
      acquire_draw(std::move(reads), round + 1, now);
      return;
    }
  }
  set_state(State::kAcquiring, "taking the reservation with " + key.to_string());
  std::vector<pr::Request> requests;
  std::vector<std::size_t> lu_of;
  for (std::size_t i = 0; i < options_.lus.size(); ++i) {
    const auto holder = reads.holder(i);
    if (holder == key.value()) {
      continue;
    }
    lu_of.push_back(i);
    // An older key of our own holds (an acquire after lost contact, or after one that failed past
    // this step): the register step moved our holding nexus to the new key, so there is nothing
    // left to preempt (a PREEMPT of the old key would find no registration and conflict).
    // RESERVE, on the first path as every take, is GOOD for the holder.
    if (holder && !ours(*holder)) {
      requests.push_back(
          pr::prout_first_path(options_.lus[i], take_command(key, *holder),
                               options_.preempt_abort ? "PREEMPT AND ABORT" : "PREEMPT"));
    } else {
      requests.push_back(pr::prout_first_path(
          options_.lus[i], codec::prout_reserve(key.value(), options_.type), "RESERVE"));
    }
  }
  run(std::move(requests), now,
      [this, key, round, reads = std::move(reads), lu_of](
          const std::vector<pr::Response>& responses, Time at) {
        note_uncertain(responses, lu_of);
        if (const std::string error = first_error(responses); !error.empty()) {
          // Someone moved first, or the answer is unknown (S4): the verify reads again and decides
          // whether a racer outranks us (we lost) or not (take those LUs back).
          if (round + 1 >= options_.verify_rounds_max) {
            acquire_failed(key, "take: " + error, at);
            return;
          }
          acquire_verify(key, round + 1, at);
          return;
        }
        acquire_preempt_others(key, reads, round, at);
      });
}

void Resource::acquire_preempt_others(Key key, const Reads& reads, int round, Time now) {
  std::vector<pr::Request> requests;
  std::vector<std::size_t> lu_of;
  for (std::size_t i = 0; i < options_.lus.size(); ++i) {
    const auto holder = reads.holder(i);
    for (const std::uint64_t other : reads.others(i, key.value())) {
      if (holder == other) {
        continue;  // preempted in the take step with its registrations
      }
      lu_of.push_back(i);
      requests.push_back(pr::prout_first_path(options_.lus[i], take_command(key, other),
                                              "PREEMPT (other registrant)"));
    }
  }
  if (requests.empty()) {
    acquire_verify(key, round, now);
    return;
  }
  set_state(State::kAcquiring, "removing other registrations");
  // A conflict here means the key went away meanwhile; the verify read decides (S4).
  run(std::move(requests), now,
      [this, key, round, lu_of](const std::vector<pr::Response>& responses, Time at) {
        note_uncertain(responses, lu_of);
        acquire_verify(key, round, at);
      });
}

void Resource::acquire_verify(Key key, int round, Time now) {
#ifdef BLKFENCE_MUTANT_SKIP_VERIFY
  // A deliberately broken protocol for tests/sim and the lab to catch (never in a release build).
  acquire_succeeded(key, now, now);
  return;
#endif
  set_state(State::kAcquiring, "verifying " + key.to_string());
  read_all(true, now, [this, key, round](Reads reads, Time at) {
    if (!reads.ok()) {
      acquire_failed(key, "verify: " + reads.errors(options_.lus), at);
      return;
    }
    bool others = false;
    bool retake = false;
    for (std::size_t i = 0; i < reads.lus.size(); ++i) {
      const auto holder = reads.holder(i);
      if (!reads.registered(i, key.value())) {
        acquire_failed(key, "verify: our key was removed from " + options_.lus[i].name, at);
        return;
      }
      if (holder != key.value()) {
        if (holder && outranks(*holder, key)) {
          // A racing acquire with a higher (epoch, node) takes precedence (docs/protocol.md).
          acquire_failed(key, "verify: " + options_.lus[i].name + " is held by " + hex(*holder),
                         at);
          return;
        }
        retake = true;  // a racer with a lower key got there between our take and this read
      }
      others = others || !reads.others(i, key.value()).empty();
    }
    if (retake || others) {
      if (round + 1 >= options_.verify_rounds_max) {
        acquire_failed(key, "verify: other keys keep appearing", at);
        return;
      }
      if (retake) {
        acquire_take(key, std::move(reads), round + 1, at);
      } else {
        acquire_preempt_others(key, reads, round + 1, at);
      }
      return;
    }
    if (at - reads.started >= options_.lease) {
      // The verify read is a lease old by now (a slow or stalled target): the gate would open
      // with its lease already over. Read again while rounds remain.
      if (round + 1 >= options_.verify_rounds_max) {
        acquire_failed(key, "verify: the reads take longer than the lease", at);
        return;
      }
      acquire_verify(key, round + 1, at);
      return;
    }
    acquire_succeeded(key, reads.started, at);
  });
}

void Resource::acquire_succeeded(Key key, Time verified_since, Time now) {
  key_ = key;
  ++counters_.acquisitions;
  set_state(State::kHeld, "acquired with " + key.to_string());
  last_success_ = verified_since;
  set_gate(true, verified_since);
  emit(EventKind::kAcquired, detail_);
  next_check_ = now + options_.check_interval;
  round_ = 0;
  end(key, now);
}

void Resource::acquire_failed(Key key, std::string why, Time now) {
  ++counters_.acquire_failures;
  // S4: whatever failed may still have executed; read the state before deciding anything.
  read_all(true, now, [this, key, why = std::move(why)](Reads reads, Time at) {
    std::vector<pr::Request> cleanup;
    std::string left;
    std::optional<std::uint64_t> winner;
    for (std::size_t i = 0; i < reads.lus.size(); ++i) {
      const auto holder = reads.holder(i);
      if (!holder || *holder == key.value()) {
        continue;  // ours, or nobody's: the key keeps it, gate closed, as after a release
      }
      winner = holder;
      // Lost on this LU, and our key is registered there (or its keys could not be read, and a
      // REGISTER of ours may have executed, S4): our registration would let this node write under
      // the winner's reservation, so take it back. Not where a PREEMPT or RESERVE of ours timed
      // out: should it execute before the unregister, we would be the holder, and unregistering
      // the holder drops the reservation, which lets every nexus write (S1). There the key stays
      // registered; the monitor takes it back once that command can no longer execute.
      if (reads.lus[i].keys && !reads.registered(i, key.value())) {
        continue;
      }
      if (uncertain_[i]) {
        left += (left.empty() ? "" : ", ") + options_.lus[i].name;
        continue;
      }
      for (auto& request : pr::prout_every_path(
               options_.lus[i], codec::prout_register(key.value(), 0), "REGISTER (unregister)")) {
        cleanup.push_back(std::move(request));
      }
    }
    std::string detail = "acquire with " + key.to_string() + " failed: " + why;
    if (!reads.ok()) {
      detail += "; and reading back: " + reads.errors(options_.lus);
    }
    const ErrorCode code = winner ? ErrorCode::kLost : ErrorCode::kIndeterminate;
    if (winner) {
      detail += "; " + hex(*winner) + " holds it";
    }
    if (!left.empty()) {
      detail += "; " + key.to_string() + " stays registered on " + left +
                " until a PREEMPT of ours that timed out can no longer execute";
      leftover_ = Leftover{.key = key, .after = at + late_execution_horizon()};
    }
    if (auto given_up = give_up(key); !given_up) {
      detail += "; and storing the epoch failed (a restart could adopt " + key.to_string() +
                "): " + given_up.error().message();
    }
    const auto finish = [this, code, detail](Time when) {
      set_state(State::kReleased, detail);
      end(fail(code, "resource " + options_.name + ": " + detail), when);
    };
    if (cleanup.empty()) {
      finish(at);
      return;
    }
    run(std::move(cleanup), at,
        [finish](const std::vector<pr::Response>&, Time done_at) { finish(done_at); });
  });
}

// How long after an acquire failed a PR OUT of it that timed out is assumed unable to execute any
// more: the initiator aborts a timed-out command (SCSI error handling), so twice its timeout.
Time Resource::late_execution_horizon() const {
  return 2 * std::chrono::duration_cast<Time>(engine_.policy().command_timeout);
}

// --- release -------------------------------------------------------------------------------------

void Resource::release(Time now, Done done) {
  if (op_ == Op::kPaths) {
    set_gate(false, now);  // the writer stops now, whatever waits
  }
  if (queue_behind_paths([this, done](Time at) mutable { release(at, std::move(done)); })) {
    return;
  }
  if (op_ != Op::kNone) {
    done(fail(ErrorCode::kBusy, "resource " + options_.name + ": another operation is running"),
         now);
    return;
  }
  begin(Op::kRelease, std::move(done));
  // The writer stops before anything else happens (docs/protocol.md, Release).
  set_gate(false, now);
  if (!key_) {
    set_state(State::kReleased, "released (this node held no key)");
    emit(EventKind::kReleased, detail_);
    end(fail(ErrorCode::kLost, "resource " + options_.name + ": this node holds no key"), now);
    return;
  }
  const Key key = *key_;
  if (options_.mode == Mode::kShared) {
    release_shared(key, now);
    return;
  }
  const bool held = state_ == State::kHeld || state_ == State::kLostContact;
  // Exclusive: the token is given up here, not on the target. Dropping the reservation would let
  // every nexus write, a node preempted a moment ago that has not noticed yet included (S1), and
  // the LUs would forget the epoch (S3). So the key keeps the reservation, with the gate closed,
  // until the next acquirer preempts it as it preempts any holder; and the store moves one past it
  // so that a restart does not adopt a key that was given up (docs/protocol.md, release).
  if (auto given_up = give_up(key); !given_up) {
    set_state(State::kReleased, "released " + key.to_string() +
                                    ", but the epoch store failed: a restart would adopt it again");
    emit(EventKind::kReleased, detail_);
    end(fail(given_up.error().code(), "release of " + options_.name + ": " + detail_ + " (" +
                                          given_up.error().message() + ")"),
        now);
    return;
  }
  set_state(State::kReleased,
            "released " + key.to_string() +
                (held ? ": gate closed; the key keeps the reservation until another node acquires"
                      : " (it no longer held the LUs)"));
  emit(EventKind::kReleased, detail_);
  key_.reset();
  end(key, now);
}

Result<void> Resource::give_up(Key key) {
  if (key.epoch() == UINT32_MAX || high_water_ > key.epoch()) {
    return {};  // nothing above it can be adopted; the exhausted space refuses acquires anyway
  }
  if (auto stored = epochs_.store(options_.name, key.epoch() + 1); !stored) {
    return stored;
  }
  high_water_ = key.epoch() + 1;
  return {};
}

void Resource::release_shared(Key key, Time now) {
  set_state(State::kReleasing, "releasing " + key.to_string());
  std::vector<pr::Request> releases;
  for (const auto& lu : options_.lus) {
    releases.push_back(
        pr::prout_first_path(lu, codec::prout_release(key.value(), options_.type), "RELEASE"));
  }
  after_monitor_prouts(now, [this, key, releases = std::move(releases)](Time from) mutable {
    run(std::move(releases), from, [this, key](const std::vector<pr::Response>&, Time at) {
      std::vector<pr::Request> unregisters;
      for (const auto& lu : options_.lus) {
        for (auto& request : pr::prout_every_path(lu, codec::prout_register(key.value(), 0),
                                                  "REGISTER (unregister)")) {
          unregisters.push_back(std::move(request));
        }
      }
      run(std::move(unregisters), at, [this, key](const std::vector<pr::Response>&, Time done_at) {
        // RESERVATION CONFLICT means the key was already gone; read back to report the truth.
        read_all(true, done_at, [this, key](Reads reads, Time read_at) {
          std::string left;
          for (std::size_t i = 0; i < reads.lus.size(); ++i) {
            if (!reads.lus[i].error.empty() || reads.registered(i, key.value())) {
              left += (left.empty() ? "" : ", ") + options_.lus[i].name;
            }
          }
          if (left.empty()) {
            set_state(State::kReleased, "released " + key.to_string());
            emit(EventKind::kReleased, detail_);
            key_.reset();
            end(key, read_at);
            return;
          }
          set_state(State::kReleased,
                    "released, but " + key.to_string() + " may still be registered on " + left);
          emit(EventKind::kReleased, detail_);
          end(fail(ErrorCode::kIndeterminate, "release of " + options_.name + ": " + detail_),
              read_at);
        });
      });
    });
  });
}

// --- shared mode ---------------------------------------------------------------------------------

void Resource::unfence(Time now, Done done) {
  if (refuse(Mode::kShared, now, done)) {
    return;
  }
  if (state_ == State::kUnfenced && gate_open_) {
    done(*key_, now);
    return;
  }
  begin(Op::kUnfence, std::move(done));
  new_paths_.clear();          // every path is registered
  const Key key = key_for(0);  // docs/protocol.md, "Shared mode": members register with epoch 0
  key_ = key;
  fenced_by_.reset();
  set_state(State::kUnfencing, "registering " + key.to_string());
  std::vector<pr::Request> requests;
  for (const auto& lu : options_.lus) {
    for (auto& request : pr::prout_every_path(lu, codec::prout_register_and_ignore(key.value()),
                                              "REGISTER AND IGNORE EXISTING KEY")) {
      requests.push_back(std::move(request));
    }
  }
  after_monitor_prouts(now, [this, key, requests = std::move(requests)](Time from) mutable {
    run(std::move(requests), from,
        [this, key](const std::vector<pr::Response>& responses, Time at) {
          if (const std::string error = first_error(responses); !error.empty()) {
            set_state(State::kReleased, "unfence failed: " + error);
            end(fail(ErrorCode::kIndeterminate, "unfence of " + options_.name + ": " + error), at);
            return;
          }
          unfence_reserve(key, at);
        });
  });
}

void Resource::unfence_reserve(Key key, Time now) {
  read_all(false, now, [this, key](Reads reads, Time at) {
    std::vector<pr::Request> reserves;
    for (std::size_t i = 0; i < reads.lus.size(); ++i) {
      if (reads.lus[i].error.empty() && !reads.holder(i) &&
          !reads.lus[i].reservation->reservation) {
        reserves.push_back(pr::prout_first_path(
            options_.lus[i], codec::prout_reserve(key.value(), options_.type), "RESERVE"));
      }
    }
    if (reserves.empty()) {
      unfence_verify(key, at);
      return;
    }
    // A conflict means another member reserved first, which is as good.
    run(std::move(reserves), at, [this, key](const std::vector<pr::Response>&, Time done_at) {
      unfence_verify(key, done_at);
    });
  });
}

void Resource::unfence_verify(Key key, Time now) {
  read_all(true, now, [this, key](Reads reads, Time at) {
    for (std::size_t i = 0; i < reads.lus.size(); ++i) {
      std::string problem;
      if (!reads.lus[i].error.empty()) {
        problem = reads.lus[i].error;
      } else if (!reads.registered(i, key.value())) {
        problem = "our key is not registered";
      } else if (!reads.lus[i].reservation->reservation) {
        problem = "no reservation protects it";
      }
      if (!problem.empty()) {
        set_state(State::kReleased, "unfence failed: " + options_.lus[i].name + ": " + problem);
        end(fail(ErrorCode::kIndeterminate, "unfence of " + options_.name + ": " + detail_), at);
        return;
      }
    }
    set_state(State::kUnfenced, "unfenced with " + key.to_string());
    last_success_ = reads.started;
    set_gate(true, reads.started);
    emit(EventKind::kUnfenced, detail_);
    end(key, at);
  });
}

void Resource::fence_node(std::uint16_t node_id, Time now, Done done) {
  if (refuse(Mode::kShared, now, done)) {
    return;
  }
  if (node_id == options_.node_id) {
    done(fail(ErrorCode::kInvalidArgument, "a node cannot fence itself; use release"), now);
    return;
  }
  if (state_ != State::kUnfenced || !key_) {
    done(fail(ErrorCode::kInvalidArgument,
              "resource " + options_.name + ": this node must be unfenced to fence another"),
         now);
    return;
  }
  begin(Op::kFence, std::move(done));
  after_monitor_prouts(now, [this, node_id](Time from) {
    read_all(true, from, [this, node_id](const Reads& reads, Time at) {
      if (!reads.ok()) {
        end(fail(ErrorCode::kIndeterminate, "fence of node " + std::to_string(node_id) +
                                                ": cannot read " + reads.errors(options_.lus)),
            at);
        return;
      }
      fence_preempt(node_id, reads, at);
    });
  });
}

void Resource::fence_preempt(std::uint16_t victim, const Reads& reads, Time now) {
  const Key key = *key_;
  const auto victims_of = [&](const Reads& r, std::size_t i) {
    std::vector<std::uint64_t> found;
    for (const std::uint64_t k : r.others(i, key.value())) {
      if ((k >> 48U) == options_.cluster_id && static_cast<std::uint16_t>(k >> 32U) == victim) {
        found.push_back(k);
      }
    }
    return found;
  };
  std::vector<pr::Request> requests;
  std::optional<std::uint64_t> victim_key;
  for (std::size_t i = 0; i < reads.lus.size(); ++i) {
    for (const std::uint64_t k : victims_of(reads, i)) {
      victim_key = k;
      requests.push_back(
          pr::prout_first_path(options_.lus[i], take_command(key, k),
                               options_.preempt_abort ? "PREEMPT AND ABORT" : "PREEMPT"));
    }
  }
  if (requests.empty()) {
    end(key, now);  // nothing of that node is registered: already fenced
    return;
  }
  run(std::move(requests), now,
      [this, key, victim, victim_key, victims_of](const std::vector<pr::Response>&, Time at) {
        read_all(true, at, [this, key, victim, victim_key, victims_of](Reads check, Time done_at) {
          for (std::size_t i = 0; i < check.lus.size(); ++i) {
            if (!check.lus[i].error.empty() || !victims_of(check, i).empty()) {
              end(fail(ErrorCode::kIndeterminate,
                       "fence of node " + std::to_string(victim) + " on " + options_.lus[i].name +
                           ": its key is still registered or unreadable" +
                           (check.lus[i].error.empty() ? "" : " (" + check.lus[i].error + ")")),
                  done_at);
              return;
            }
          }
          emit(EventKind::kFencedNode, "fenced node " + std::to_string(victim), victim_key);
          end(key, done_at);
        });
      });
}

// --- path hot-plug -------------------------------------------------------------------------------

bool Resource::holding() const {
  return key_ && ((state_ == State::kHeld && gate_open_) || state_ == State::kUnfenced);
}

// What reads showed: key registered on every LU, and the holder everywhere in exclusive mode.
bool Resource::key_current(const Reads& reads, Key key) const {
  bool current = reads.ok();
  for (std::size_t i = 0; current && i < reads.lus.size(); ++i) {
    current = reads.registered(i, key.value()) &&
              (options_.mode == Mode::kShared || reads.holder(i) == key.value());
  }
  return current;
}

void Resource::update_paths(std::size_t lu, std::vector<pr::Path> paths, Time now) {
  BLKFENCE_ASSERT(lu < options_.lus.size());
  if (paths.empty()) {
    return;
  }
  std::vector<pr::Path>& current = options_.lus[lu].paths;
  const auto known = [](const std::vector<pr::Path>& list, const pr::Path& path) {
    return std::any_of(list.begin(), list.end(),
                       [&](const pr::Path& p) { return p.hctl == path.hctl; });
  };
  std::string added;
  std::string removed;
  for (const pr::Path& path : paths) {
    if (!known(current, path)) {
      added += (added.empty() ? "" : ", ") + pr::command_device(path) + " (" + path.hctl + ")";
      new_paths_.emplace_back(lu, path);
    }
  }
  for (const pr::Path& path : current) {
    if (!known(paths, path)) {
      removed += (removed.empty() ? "" : ", ") + pr::command_device(path) + " (" + path.hctl + ")";
    }
  }
  // A path that went away is not waiting for a registration any more.
  std::erase_if(new_paths_, [&](const auto& pending) {
    return pending.first == lu && !known(paths, pending.second);
  });
  if (added.empty() && removed.empty()) {
    return;
  }
  current = std::move(paths);
  std::string detail = options_.lus[lu].name + ":";
  if (!added.empty()) {
    detail += " new path " + added;
  }
  if (!removed.empty()) {
    detail += std::string(added.empty() ? "" : ";") + " path gone " + removed;
  }
  if (!added.empty() && !holding()) {
    // S5: a path that appears (or comes back) while our key is not the current one stays
    // unregistered; the next acquire or unfence registers every path.
    std::erase_if(new_paths_, [lu](const auto& pending) { return pending.first == lu; });
    detail += "; not registered: this node does not hold the resource";
  }
  emit(EventKind::kPathsChanged, detail, std::nullopt, options_.lus[lu].name);
  if (op_ == Op::kNone && !new_paths_.empty()) {
    register_new_paths(now);
  }
}

// Registers the new paths with the current key: read first (the key must still be current: a key
// preempted meanwhile is never registered again, S5), then REGISTER AND IGNORE EXISTING KEY on each
// new path, then read again. No atomic "register only while key K is registered" exists in SPC-4,
// so a preempt can land between the read and the REGISTER; the read afterwards catches it, and the
// new registrations are then taken back (and the holder's monitor would preempt them too: they rank
// below its key).
void Resource::register_new_paths(Time now) {
  if (!holding()) {
    new_paths_.clear();
    return;
  }
  begin(Op::kPaths, nullptr);
  const Key key = *key_;
  std::vector<std::pair<std::size_t, pr::Path>> paths = std::move(new_paths_);
  new_paths_.clear();
  after_monitor_prouts(now, [this, key, paths = std::move(paths)](Time from) mutable {
    read_all(true, from,
             [this, key, paths = std::move(paths)](const Reads& reads, Time at) mutable {
               if (!key_current(reads, key)) {
                 // The monitor's next round, now, decides what happened to the key.
                 next_check_ = at;
                 keys_next_ = true;
                 end(fail(ErrorCode::kLost, "new paths not registered: " + key.to_string() +
                                                " is not verified as current"),
                     at);
                 return;
               }
               std::vector<pr::Request> requests;
               for (const auto& [lu, path] : paths) {
                 const pr::LogicalUnit one{
                     .wwn = options_.lus[lu].wwn, .name = options_.lus[lu].name, .paths = {path}};
                 for (auto& request :
                      pr::prout_every_path(one, codec::prout_register_and_ignore(key.value()),
                                           "REGISTER AND IGNORE EXISTING KEY (new path)")) {
                   requests.push_back(std::move(request));
                 }
               }
               run(std::move(requests), at,
                   [this, key, paths = std::move(paths)](const std::vector<pr::Response>&,
                                                         Time done_at) mutable {
                     new_paths_registered(key, std::move(paths), done_at);  // the read decides
                   });
             });
  });
}

void Resource::new_paths_registered(Key key, std::vector<std::pair<std::size_t, pr::Path>> paths,
                                    Time now) {
  read_all(true, now, [this, key, paths = std::move(paths)](const Reads& reads, Time at) {
    const bool current = key_current(reads, key);
    std::string names;
    for (const auto& [lu, path] : paths) {
      names += (names.empty() ? "" : ", ") + pr::command_device(path);
    }
    if (current) {
      emit(EventKind::kPathsChanged, "registered " + key.to_string() + " on " + names);
      end(key, at);
      return;
    }
    // Preempted between our read and the REGISTER: the new paths now carry a key that is no
    // longer current. Take them back; the monitor's next round, now, declares the fence.
    std::vector<pr::Request> requests;
    for (const auto& [lu, path] : paths) {
      const pr::LogicalUnit one{
          .wwn = options_.lus[lu].wwn, .name = options_.lus[lu].name, .paths = {path}};
      for (auto& request : pr::prout_every_path(one, codec::prout_register(key.value(), 0),
                                                "REGISTER (unregister new path)")) {
        requests.push_back(std::move(request));
      }
    }
    next_check_ = at;
    keys_next_ = true;
    run(std::move(requests), at,
        [this, key, names](const std::vector<pr::Response>&, Time done_at) {
          end(fail(ErrorCode::kLost, "the key " + key.to_string() +
                                         " was not current after registering " + names +
                                         "; taken back there"),
              done_at);
        });
  });
}

// --- monitor -------------------------------------------------------------------------------------

void Resource::on_time(Time now) {
  if (gate_open_ && last_success_ && now - *last_success_ >= options_.lease) {
    // Fail closed: the storage may have moved on without us being able to see it.
    ++counters_.lost_contact;
    set_gate(false, now);
    set_state(State::kLostContact, "no successful check for the lease (" +
                                       std::to_string(options_.lease.count() / 1'000'000) +
                                       " ms): gate closed");
    emit(EventKind::kLostContact, detail_);
    keys_next_ = true;
  }
  if (op_ == Op::kNone && !check_in_flight_ && state_known() && next_check_ &&
      *next_check_ <= now) {
    check(now);
  }
}

std::optional<Time> Resource::next_wake() const {
  std::optional<Time> wake;
  if (op_ == Op::kNone && !check_in_flight_ && next_check_) {
    wake = next_check_;
  }
  if (gate_open_ && last_success_) {
    const Time expiry = *last_success_ + options_.lease;
    wake = wake ? std::min(*wake, expiry) : expiry;
  }
  return wake;
}

void Resource::check(Time now) {
  const bool with_keys = keys_next_ || leftover_ || options_.mode == Mode::kShared ||
                         state_ == State::kLostContact || state_ == State::kUnknown ||
                         round_ % options_.keys_every == 0;
  ++round_;
  keys_next_ = false;
  check_in_flight_ = true;
  next_check_ = now + options_.check_interval;
  const std::uint64_t generation = generation_;
  read_all(with_keys, now, [this, generation, now](Reads reads, Time at) {
    if (generation != generation_) {
      return;  // an operation started meanwhile; its own reads decide
    }
    check_in_flight_ = false;
    check_done(std::move(reads), now, at);
  });
}

void Resource::check_done(Reads reads, Time started, Time now) {
  ++counters_.checks;
  const auto latency = now - started;
  counters_.check_latency_last = latency;
  counters_.check_latency_sum += latency;
  counters_.check_latency_max = std::max(counters_.check_latency_max, latency);
  if (reads.unit_attention) {
    // Reservations preempted or released, registrations preempted, a reset: look again now,
    // keys included (docs/protocol.md, Monitor).
    keys_next_ = true;
    next_check_ = now;
  }
  if (!reads.ok()) {
    ++counters_.check_failures;
    if (state_ == State::kUnknown) {
      detail_ = "cannot read the LUs: " + reads.errors(options_.lus);
    }
    return;  // the lease decides (on_time)
  }
  last_read_ok_ = started;
  if (state_ == State::kUnknown) {
    // The first read failed at start; decide now, exactly as start() would have.
    begin(Op::kProbe, nullptr);
    probe_read(std::move(reads), now);
    return;
  }
  const bool has_keys = std::all_of(reads.lus.begin(), reads.lus.end(),
                                    [](const Reads::Lu& lu) { return lu.keys.has_value(); });
  if (leftover_ && has_keys && started >= leftover_->after) {
    take_back_leftover(reads, now);
  }
  if (state_ == State::kHeld || state_ == State::kLostContact) {
    BLKFENCE_ASSERT(key_.has_value());
    for (std::size_t i = 0; i < reads.lus.size(); ++i) {
      const auto holder = reads.holder(i);
      const bool key_gone = has_keys && !reads.registered(i, key_->value());
      if (holder != key_->value() || key_gone) {
        // READ RESERVATION may have run before the preempt and READ KEYS after it: the holder
        // read is then our own key, and the one that fenced us is the key registered instead.
        std::optional<std::uint64_t> by = holder;
        if (by == key_->value()) {
          const auto others = reads.others(i, key_->value());
          by = others.empty() ? std::nullopt : std::optional(others.front());
        }
        fenced(by, options_.lus[i].name,
               holder ? "the reservation is held by " + hex(*holder)
                      : (key_gone ? "our key is no longer registered" : "no reservation"),
               now);
        return;
      }
    }
    last_success_ = started;
    if (has_keys) {
      preempt_strays(reads, now);
    }
    if (state_ == State::kLostContact) {
      bool sole = has_keys;
      for (std::size_t i = 0; sole && i < reads.lus.size(); ++i) {
        sole = reads.others(i, key_->value()).empty();
      }
      if (!sole) {
        keys_next_ = true;
        detail_ = "contact is back but other keys are registered; the gate stays closed";
        return;
      }
      set_state(State::kHeld, "contact is back and " + key_->to_string() +
                                  " is still the only holder: gate reopened");
      set_gate(true, started);
      emit(EventKind::kContactRestored, detail_);
    }
    return;
  }
  if (state_ == State::kUnfenced) {
    BLKFENCE_ASSERT(key_.has_value());
    std::vector<pr::Request> reserves;
    for (std::size_t i = 0; i < reads.lus.size(); ++i) {
      if (has_keys && !reads.registered(i, key_->value())) {
        fenced(reads.holder(i), options_.lus[i].name, "our key was removed", now);
        return;
      }
      if (!reads.lus[i].reservation->reservation) {
        // Without a reservation any nexus may write; putting one back registers nothing (S5).
        reserves.push_back(pr::prout_first_path(
            options_.lus[i], codec::prout_reserve(key_->value(), options_.type), "RESERVE"));
      }
    }
    last_success_ = started;
    if (!reserves.empty()) {
      monitor_send(std::move(reserves), now);
    }
  }
}

// The key of a failed acquire, still registered where another node holds, once no PREEMPT of that
// acquire can execute any more (see acquire_failed): unregistered there. Where it became the
// holder after all, it keeps the reservation with the gate closed, as after a release.
void Resource::take_back_leftover(const Reads& reads, Time now) {
  const Key key = leftover_->key;
  leftover_.reset();
  std::vector<pr::Request> requests;
  for (std::size_t i = 0; i < reads.lus.size(); ++i) {
    const auto holder = reads.holder(i);
    if (holder && *holder != key.value() && reads.registered(i, key.value())) {
      for (auto& request : pr::prout_every_path(
               options_.lus[i], codec::prout_register(key.value(), 0), "REGISTER (unregister)")) {
        requests.push_back(std::move(request));
      }
    }
  }
  if (!requests.empty()) {
    monitor_send(std::move(requests), now);
  }
}

// Registrations of this cluster beside our reservation whose keys rank below ours: an acquire
// that failed, or one that will fail at its verify (it reads our key above its own); a REGISTER
// that executed late. They would let their nexuses write under our reservation, so the holder
// preempts them (the reservation stays ours). Keys that outrank ours belong to an acquire in
// progress that is about to take over, and foreign clusters' keys are not ours to judge: both are
// left and shown in the status.
//
// When, per node: a stray is preempted at the first keys round at least one check_interval after
// it was first seen, so that the PR OUTs of an acquire still running on its node are over; and a
// node whose stray comes back after a preempt (it re-registers: S5 broken, or acquires that keep
// failing) waits twice as long each time, up to 64 intervals. Two nodes' PR OUTs
// that meet in the target, one removing the other's registration while the other re-keys,
// reserves, preempts or unregisters through it, can deadlock LIO (docs/operations.md): the holder
// must not run that cycle at the monitor's rate.
void Resource::preempt_strays(const Reads& reads, Time now) {
  const Key key = *key_;
  std::vector<pr::Request> requests;
  std::set<std::uint16_t> seen;
  std::set<std::uint16_t> preempting;
  for (std::size_t i = 0; i < reads.lus.size(); ++i) {
    for (const std::uint64_t other : reads.others(i, key.value())) {
      if ((other >> 48U) != options_.cluster_id || outranks(other, key)) {
        continue;
      }
      const auto node = static_cast<std::uint16_t>(other >> 32U);
      seen.insert(node);
      const auto stray =
          strays_.try_emplace(node, Stray{.next_preempt = now + options_.check_interval}).first;
      if (now < stray->second.next_preempt) {
        keys_next_ = true;  // look again when it is due
        continue;
      }
      preempting.insert(node);
      requests.push_back(pr::prout_first_path(options_.lus[i], take_command(key, other),
                                              "PREEMPT (stray registration)"));
    }
  }
  // A node that stayed away for its whole window is forgotten: its next stray starts afresh.
  std::erase_if(strays_, [&](const auto& entry) {
    return !seen.contains(entry.first) && now >= entry.second.next_preempt;
  });
  for (const std::uint16_t node : preempting) {
    Stray& stray = strays_[node];
    stray.preempts = std::min(stray.preempts + 1, kStrayBackoffShift);
    stray.next_preempt = now + options_.check_interval * (1 << stray.preempts);
  }
  if (requests.empty()) {
    return;
  }
  keys_next_ = true;  // see whether they went
  ++counters_.strays_preempted;
  monitor_send(std::move(requests), now);
}

// The monitor's PR OUTs decide nothing (the next round reads what they did), but an operation that
// starts meanwhile waits for their answers (after_monitor_prouts) so that its first read comes
// after them (S4: a failed or indeterminate PR OUT is followed by a read before the next PR OUT).
void Resource::monitor_send(std::vector<pr::Request> requests, Time now) {
  ++monitor_prouts_;
  std::weak_ptr<bool> alive = alive_;
  engine_.start(std::move(requests), now, [this, alive](const std::vector<pr::Response>&, Time at) {
    if (alive.expired()) {
      return;
    }
    if (--monitor_prouts_ == 0 && waiting_) {
      auto step = std::move(waiting_);
      waiting_ = nullptr;
      step(at);
    }
  });
}

void Resource::after_monitor_prouts(Time now, std::function<void(Time)> step) {
  if (monitor_prouts_ == 0) {
    step(now);
    return;
  }
  BLKFENCE_ASSERT(!waiting_);
  waiting_ = std::move(step);
}

void Resource::fenced(std::optional<std::uint64_t> by, const std::string& lu,
                      const std::string& why, Time now) {
  ++counters_.fenced;
  fenced_by_ = by;
  set_gate(false, now);
  // S5: from here on nothing registers our key again until an explicit acquire or unfence.
  set_state(State::kFenced, "fenced on " + lu + ": " + why);
  emit(EventKind::kFenced, detail_, by, lu);
#ifdef BLKFENCE_MUTANT_REREGISTER
  // A deliberately broken protocol for tests/sim and the lab to catch (never in a release build):
  // "self-healing" after a fence, registering the old key again and reopening the gate (S5, S1).
  std::vector<pr::Request> requests;
  for (const auto& unit : options_.lus) {
    for (auto& request :
         pr::prout_every_path(unit, codec::prout_register_and_ignore(key_->value()), "REGISTER")) {
      requests.push_back(std::move(request));
    }
  }
  run(std::move(requests), now, [this](const std::vector<pr::Response>&, Time at) {
    set_state(State::kHeld, "re-registered after a fence (mutant)");
    last_success_ = at;
    set_gate(true, at);
  });
#endif
}

}  // namespace blkfence::fence
