// The asynchronous batch engine (pr layer). See engine.h.
#include "blkfence/pr/engine.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>

#include "blkfence/assert.h"

namespace blkfence::pr {
namespace {

using transport::Outcome;

// The error a finished attempt leaves, for the caller's message.
Error attempt_error(const Attempt& attempt, const transport::Completion& completion,
                    const std::string& what) {
  const std::string where = what + " on " + attempt.device;
  const codec::Sense sense = attempt.sense.value_or(codec::Sense{});
  const ScsiOutcome scsi{.status = completion.status,
                         .sense_key = static_cast<std::uint8_t>(sense.sense_key),
                         .asc = sense.asc,
                         .ascq = sense.ascq};
  switch (completion.outcome) {
    case Outcome::kReservationConflict:
      return Error::scsi(ErrorCode::kReservationConflict, scsi, where);
    case Outcome::kIndeterminate: return Error(ErrorCode::kIndeterminate, where);
    case Outcome::kOsError: return Error::os(completion.os_errno, where);
    case Outcome::kTransportError: {
      char detail[64];
      (void)std::snprintf(detail, sizeof detail, " (transport error: host status 0x%02x)",
                          completion.host_status);
      return Error::scsi(ErrorCode::kScsi, scsi, where + detail);
    }
    default: return Error::scsi(ErrorCode::kScsi, scsi, where);
  }
}

}  // namespace

struct Engine::Slot {
  std::uint64_t request = 0;  // the request's serial (request_of_tag of its attempts)
  std::uint64_t attempts = 0;
  std::size_t candidate = 0;
  int unit_attentions = 0;
  int not_ready = 0;
  int busy = 0;
  std::chrono::milliseconds backoff{0};
  std::optional<Time> resubmit_at;
  bool done = false;
};

struct Engine::Batch {
  std::uint64_t id = 0;
  std::vector<Request> requests;
  std::vector<Response> responses;
  std::vector<Slot> slots;
  std::size_t open = 0;
  Done done;
};

Engine::Engine(transport::Transport& transport, RetryPolicy policy)
    : transport_(transport), policy_(policy) {}

Engine::~Engine() = default;

// An open path stays checked: its fd pins the device node, which cannot name another device until
// the fd is closed (forget()), after which the name is opened, and checked, again. A name open for
// one LU is not lent to a request for another: a LU's list may still hold a name its device gave up
// and a new path of another LU took (the rescan keeps a LU's paths when its names resolve to
// nothing). That is no sign of a removed device, so the other LU's fd stays open.
Result<transport::PathId> Engine::path_for(const std::string& device, const std::string& wwn) {
  if (const auto it = paths_.find(device); it != paths_.end()) {
    const OpenPath& open = it->second;
    if (check_identity_ && !wwn.empty() && !open.wwn.empty() && open.wwn != wwn) {
      return tl::unexpected(Error::os(ESTALE, device + " is open as a path of LU " + open.wwn +
                                                  ", not LU " + wwn +
                                                  ": nothing of this LU is sent through it"));
    }
    return open.id;
  }
  auto path = transport_.open_path(device);
  if (!path) {
    return path;
  }
  std::string checked;
  if (check_identity_ && !wwn.empty()) {
    if (const auto node = transport_.device_of(*path)) {
      if (auto same = check_identity_(*node, device, wwn); !same) {
        transport_.close_path(*path);
        return tl::unexpected(same.error());
      }
      checked = wwn;
    }
  }
  paths_.emplace(device, OpenPath{.id = *path, .wwn = std::move(checked)});
  return path;
}

void Engine::forget(const std::string& device, const std::string& wwn) {
  if (const auto it = paths_.find(device); it != paths_.end()) {
    if (!wwn.empty() && !it->second.wwn.empty() && it->second.wwn != wwn) {
      return;  // the name is another LU's path now: not this LU's to close
    }
    const transport::PathId path = it->second.id;
    paths_.erase(it);
    transport_.close_path(path);
  }
  standing_.erase(device);
}

// sg.c answers every command on an fd whose device was removed with ENODEV (sdp->detaching), and
// the removed device lives on, with its sg minor, until its last fd is closed: keeping the fd would
// hold a dead device open and fail the path for good even once its H:C:T:L is back.
void Engine::drop_if_detached(const std::string& device, int os_errno) {
  if (os_errno == ENODEV) {
    forget(device);
  }
}

void Engine::order_for_read(std::vector<std::string>& devices) const {
  const auto standing_of = [this](const std::string& device) {
    const auto it = standing_.find(device);
    return it == standing_.end() ? Standing{} : it->second;
  };
  // Stable: paths with nothing learnt keep the caller's order (the first path first).
  std::stable_sort(devices.begin(), devices.end(),
                   [&standing_of](const std::string& a, const std::string& b) {
                     const Standing sa = standing_of(a);
                     const Standing sb = standing_of(b);
                     if (sa.timed_out != sb.timed_out) {
                       return sb.timed_out;
                     }
                     return sa.answered > sb.answered;
                   });
}

void Engine::note_read(const std::string& device, Outcome outcome, int os_errno) {
  Standing& standing = standing_[device];
  switch (outcome) {
    case Outcome::kGood:
      standing = Standing{.answered = next_answer_++, .timed_out = false};
      return;
    case Outcome::kIndeterminate: standing.timed_out = true; return;
    case Outcome::kOsError:
      // The command waited in the transport's queue until its deadline (no worker free for that
      // path): as slow as a timeout.
      if (os_errno == ETIMEDOUT) {
        standing.timed_out = true;
      }
      return;
    case Outcome::kTransportError: return;        // fails at once: costs no time where it stands
    default: standing.timed_out = false; return;  // the LU answered, if not with the data
  }
}

void Engine::start(std::vector<Request> requests, Time now, Done done) {
  const std::uint64_t id = next_batch_++;
  auto batch = std::make_unique<Batch>();
  batch->id = id;
  batch->open = requests.size();
  batch->responses.assign(
      requests.size(),
      Response{.data = fail(ErrorCode::kInvalidArgument, "no attempt was made"), .attempts = {}});
  batch->slots.resize(requests.size());
  for (Slot& slot : batch->slots) {
    slot.request = next_request_++;
  }
  for (Request& request : requests) {
    if (request.is_read) {
      order_for_read(request.devices);
    }
  }
  batch->requests = std::move(requests);
  batch->done = std::move(done);
  Batch& ref = *batch;
  batches_.emplace(id, std::move(batch));
  const transport::Corked corked(transport_);  // one system call for the whole batch
  for (std::size_t i = 0; i < ref.requests.size(); ++i) {
    submit(ref, i, now);
  }
}

void Engine::finish(Batch& batch, std::size_t index, Result<std::vector<std::uint8_t>> data) {
  Slot& slot = batch.slots[index];
  BLKFENCE_ASSERT(!slot.done);
  slot.done = true;
  slot.resubmit_at.reset();
  batch.responses[index].data = std::move(data);
  --batch.open;
}

// Submits request index to its current device, moving on to the next device (reads only) when the
// path cannot be opened or refuses the command.
void Engine::submit(Batch& batch, std::size_t index, Time now) {
  (void)now;
  Request& request = batch.requests[index];
  Slot& slot = batch.slots[index];
  slot.resubmit_at.reset();
  while (slot.candidate < request.devices.size()) {
    const std::string& device = request.devices[slot.candidate];
    auto path = path_for(device, request.wwn);
    Result<void> submitted = path ? Result<void>{} : tl::unexpected(path.error());
    if (path) {
      transport::Command command = request.command;
      command.tag = (slot.request << kTagAttemptBits) |
                    (slot.attempts++ & ((std::uint64_t{1} << kTagAttemptBits) - 1));
      command.timeout = policy_.command_timeout;
      const std::uint64_t tag = command.tag;
      submitted = transport_.submit(*path, std::move(command));
      if (submitted) {
        tags_.emplace(tag, std::make_pair(batch.id, index));
        return;
      }
    }
    drop_if_detached(device, submitted.error().errno_value());
    batch.responses[index].attempts.push_back(Attempt{
        .device = device, .outcome = Outcome::kOsError, .sense = std::nullopt, .latency = {}});
    if (!request.is_read || slot.candidate + 1 == request.devices.size()) {
      const Error& error = submitted.error();
      finish(
          batch, index,
          tl::unexpected(error.errno_value() != 0
                             ? Error::os(error.errno_value(), request.what + " on " + error.where())
                             : Error(error.code(), request.what + " on " + error.message())));
      return;
    }
    ++slot.candidate;
  }
  finish(batch, index, fail(ErrorCode::kInvalidArgument, request.what + ": the LU has no path"));
}

void Engine::on_completion(transport::Completion completion, Time now) {
  const auto tag = tags_.find(completion.tag);
  if (tag == tags_.end()) {
    return;  // an abandoned request's
  }
  const std::uint64_t batch_id = tag->second.first;
  const std::size_t index = tag->second.second;
  tags_.erase(tag);
  const auto found = batches_.find(batch_id);
  if (found == batches_.end()) {
    return;
  }
  Batch& batch = *found->second;
  Request& request = batch.requests[index];
  Slot& slot = batch.slots[index];
  BLKFENCE_ASSERT(!slot.done);
  Attempt attempt{.device = request.devices[slot.candidate],
                  .outcome = completion.outcome,
                  .sense = std::nullopt,
                  .latency = completion.latency};
  if (completion.outcome == Outcome::kCheckCondition) {
    attempt.sense = codec::decode_sense(completion.sense);
  }
  batch.responses[index].attempts.push_back(attempt);
  if (request.is_read) {
    note_read(attempt.device, completion.outcome, completion.os_errno);
  }
  drop_if_detached(attempt.device, completion.os_errno);
  const bool more_paths = request.is_read && slot.candidate + 1 < request.devices.size();
  const auto later = [&] {
    slot.backoff = slot.backoff.count() == 0 ? policy_.backoff_first
                                             : std::min(slot.backoff * 2, policy_.backoff_max);
    slot.resubmit_at = now + slot.backoff;
  };

  const auto decide = [&]() -> bool {  // true: the request goes on
    switch (completion.outcome) {
      case Outcome::kGood: finish(batch, index, std::move(completion.data_in)); return true;
      case Outcome::kBusy:
      case Outcome::kTaskAborted:
        if (completion.outcome == Outcome::kTaskAborted && request.stop_when_preempted) {
          return false;
        }
        if (slot.busy++ < policy_.busy_max) {
          later();
          return true;
        }
        return false;
      case Outcome::kCheckCondition:
        switch (codec::classify(*attempt.sense)) {
          case codec::SenseCategory::kNoSense:
          case codec::SenseCategory::kRecovered:
            finish(batch, index, std::move(completion.data_in));
            return true;
          case codec::SenseCategory::kUnitAttention:
            if (request.stop_when_preempted && attempt.sense->asc == 0x2a) {
              return false;  // reservations or registrations changed (SPC-4 5.13.11)
            }
            // The command did not execute (SAM-5 5.14): repeating it is safe.
            if (slot.unit_attentions++ < policy_.unit_attention_max) {
              submit(batch, index, now);
              return true;
            }
            return false;
          case codec::SenseCategory::kNotReadyBecomingReady:
          case codec::SenseCategory::kNotReadyInProgress:
          case codec::SenseCategory::kNotReadyTransitioning:
            if (slot.not_ready++ < policy_.not_ready_max) {
              later();
              return true;
            }
            return false;
          case codec::SenseCategory::kAbortedCommand:
            if (slot.busy++ < policy_.busy_max) {
              later();
              return true;
            }
            return false;
          default: return false;
        }
      case Outcome::kTransportError:
      case Outcome::kOsError:
      case Outcome::kIndeterminate:
        // A read has no side effect: whatever became of it on this path, asking another path is
        // safe. A PR OUT is never sent twice (S4: it may still execute where it timed out).
        if (more_paths) {
          ++slot.candidate;
          submit(batch, index, now);
          return true;
        }
        return false;
      case Outcome::kReservationConflict: return false;
    }
    return false;
  };
  if (!decide()) {
    finish(batch, index, tl::unexpected(attempt_error(attempt, completion, request.what)));
  }
  deliver_finished(now);
}

void Engine::on_time(Time now) {
  // Resubmitting may finish a request (its path refused it), so walk a snapshot of the ids.
  std::vector<std::uint64_t> ids;
  ids.reserve(batches_.size());
  for (const auto& [id, batch] : batches_) {
    ids.push_back(id);
  }
  const transport::Corked corked(transport_);
  for (const std::uint64_t id : ids) {
    const auto found = batches_.find(id);
    if (found == batches_.end()) {
      continue;
    }
    Batch& batch = *found->second;
    for (std::size_t i = 0; i < batch.slots.size(); ++i) {
      if (!batch.slots[i].done && batch.slots[i].resubmit_at &&
          *batch.slots[i].resubmit_at <= now) {
        submit(batch, i, now);
      }
    }
  }
  deliver_finished(now);
}

std::optional<Time> Engine::next_wake() const {
  std::optional<Time> earliest;
  for (const auto& [id, batch] : batches_) {
    if (batch->open == 0) {
      return Time{0};  // finished without a completion: deliver at once
    }
    for (const Slot& slot : batch->slots) {
      if (!slot.done && slot.resubmit_at && (!earliest || *slot.resubmit_at < *earliest)) {
        earliest = slot.resubmit_at;
      }
    }
  }
  return earliest;
}

Result<void> Engine::pump(Time now) {
  std::vector<transport::Completion> completions;
  auto reaped = transport_.reap(std::chrono::milliseconds(0), completions);
  // What the completions lead to (retries, the batches their callbacks start) goes to the kernel
  // in one system call.
  const transport::Corked corked(transport_);
  for (auto& completion : completions) {
    on_completion(std::move(completion), now);
  }
  on_time(now);
  if (!reaped) {
    return tl::unexpected(reaped.error());
  }
  return {};
}

void Engine::fail_all(const Error& error, Time now) {
  for (auto& [id, batch] : batches_) {
    for (std::size_t i = 0; i < batch->slots.size(); ++i) {
      if (!batch->slots[i].done) {
        finish(*batch, i, tl::unexpected(error));
      }
    }
  }
  tags_.clear();
  deliver_finished(now);
}

void Engine::deliver_finished(Time now) {
  // Callbacks may start batches (which never finish synchronously), so collect first.
  std::vector<std::unique_ptr<Batch>> finished;
  for (auto it = batches_.begin(); it != batches_.end();) {
    if (it->second->open == 0) {
      finished.push_back(std::move(it->second));
      it = batches_.erase(it);
    } else {
      ++it;
    }
  }
  for (auto& batch : finished) {
    batch->done(std::move(batch->responses), now);
  }
}

}  // namespace blkfence::pr
