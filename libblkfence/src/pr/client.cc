// The persistent reservation client: batch engine and typed operations (pr layer). See client.h.
#include "blkfence/pr/client.h"

#include <algorithm>
#include <cstdio>
#include <thread>

#include "blkfence/codec/prout.h"

namespace blkfence::pr {
namespace {

using Clock = std::chrono::steady_clock;
using transport::Outcome;

// READ KEYS: 8 bytes a registration, room for 1023 of them. READ FULL STATUS: LIO drops the
// descriptors that do not fit without counting them (kernel-interfaces.md §1.5), so ask for a lot.
constexpr std::uint16_t kReadKeysAllocation = 8192;
constexpr std::uint16_t kFullStatusAllocation = 16384;
constexpr std::uint16_t kCapabilitiesAllocation = 8;

transport::Command prin_command(codec::PrInAction action, std::uint16_t allocation) {
  auto command = transport::Command::from_cdb(codec::encode_prin_cdb(action, allocation));
  command.direction = transport::DataDirection::kFromDevice;
  command.data_in_size = allocation;
  return command;
}

transport::Command prout_command(const codec::PrOutCommand& prout) {
  auto command = transport::Command::from_cdb(prout.cdb);
  command.direction = transport::DataDirection::kToDevice;
  command.data_out = prout.parameters;
  return command;
}

std::vector<std::string> devices_of(const LogicalUnit& lu) {
  std::vector<std::string> devices;
  for (const auto& path : lu.paths) {
    devices.push_back(command_device(path));
  }
  return devices;
}

// The error a finished attempt leaves, for the caller's message.
Error attempt_error(const Attempt& attempt, const transport::Completion& completion,
                    const std::string& what) {
  const std::string where = what + " on " + attempt.device;
  codec::Sense sense = attempt.sense.value_or(codec::Sense{});
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

template <class T, class Decode>
std::vector<LuResult<T>> decode_each(std::vector<Client::Response> responses, Decode decode) {
  std::vector<LuResult<T>> results;
  for (auto& response : responses) {
    LuResult<T> result{.value = fail(ErrorCode::kInvalidArgument, "unset"),
                       .attempts = std::move(response.attempts)};
    if (response.data) {
      result.value = decode(*response.data);
    } else {
      result.value = tl::unexpected(response.data.error());
    }
    results.push_back(std::move(result));
  }
  return results;
}

}  // namespace

std::string command_device(const Path& path) {
  return path.sg.empty() ? path.sd : path.sg;
}

std::string describe(const Attempt& attempt) {
  std::string text = attempt.device + ": " + std::string(transport::to_string(attempt.outcome));
  if (attempt.sense) {
    char detail[64];
    (void)std::snprintf(detail, sizeof detail, ", %s %02x/%02x",
                        std::string(codec::to_string(attempt.sense->sense_key)).c_str(),
                        attempt.sense->asc, attempt.sense->ascq);
    text += detail;
  }
  return text;
}

Client::Client(transport::Transport& transport, RetryPolicy policy)
    : transport_(transport), policy_(policy) {}

Result<transport::PathId> Client::path_for(const std::string& device) {
  if (const auto it = paths_.find(device); it != paths_.end()) {
    return it->second;
  }
  auto path = transport_.open_path(device);
  if (path) {
    paths_.emplace(device, *path);
  }
  return path;
}

std::vector<Client::Response> Client::run(std::vector<Request> requests) {
  struct Slot {
    std::size_t candidate = 0;
    int unit_attentions = 0;
    int not_ready = 0;
    int busy = 0;
    std::chrono::milliseconds backoff{0};
    std::optional<Clock::time_point> resubmit_at;
    bool done = false;
  };
  const std::size_t count = requests.size();
  std::vector<Response> responses(
      count,
      Response{.data = fail(ErrorCode::kInvalidArgument, "no attempt was made"), .attempts = {}});
  std::vector<Slot> slots(count);
  std::size_t open = count;

  const auto finish = [&](std::size_t i, Result<std::vector<std::uint8_t>> data) {
    BLKFENCE_ASSERT(!slots[i].done);
    slots[i].done = true;
    responses[i].data = std::move(data);
    --open;
  };
  const auto later = [&](std::size_t i) {
    Slot& slot = slots[i];
    slot.backoff = slot.backoff.count() == 0 ? policy_.backoff_first
                                             : std::min(slot.backoff * 2, policy_.backoff_max);
    slot.resubmit_at = Clock::now() + slot.backoff;
  };
  // Submits request i to its current device, moving on to the next device (reads only) when the
  // path cannot be opened or refuses the command.
  const auto submit = [&](std::size_t i) {
    Request& request = requests[i];
    Slot& slot = slots[i];
    slot.resubmit_at.reset();
    while (slot.candidate < request.devices.size()) {
      const std::string& device = request.devices[slot.candidate];
      auto path = path_for(device);
      Result<void> submitted = path ? Result<void>{} : tl::unexpected(path.error());
      if (path) {
        transport::Command command = request.command;
        command.tag = i;
        command.timeout = policy_.command_timeout;
        submitted = transport_.submit(*path, std::move(command));
      }
      if (submitted) {
        return;
      }
      responses[i].attempts.push_back(Attempt{
          .device = device, .outcome = Outcome::kOsError, .sense = std::nullopt, .latency = {}});
      if (!request.is_read || slot.candidate + 1 == request.devices.size()) {
        finish(i, tl::unexpected(Error(submitted.error().code(),
                                       request.what + " on " + submitted.error().message())));
        return;
      }
      ++slot.candidate;
    }
    finish(i, fail(ErrorCode::kInvalidArgument, request.what + ": the LU has no path"));
  };

  for (std::size_t i = 0; i < count; ++i) {
    submit(i);
  }
  std::vector<transport::Completion> completions;
  while (open > 0) {
    auto earliest = Clock::time_point::max();
    const auto now = Clock::now();
    for (std::size_t i = 0; i < count; ++i) {
      if (slots[i].done || !slots[i].resubmit_at) {
        continue;
      }
      if (*slots[i].resubmit_at <= now) {
        submit(i);
      } else {
        earliest = std::min(earliest, *slots[i].resubmit_at);
      }
    }
    if (open == 0) {
      break;
    }
    if (transport_.in_flight() == 0) {
      BLKFENCE_ASSERT(earliest != Clock::time_point::max());  // an open slot waits for a retry
      std::this_thread::sleep_until(earliest);
      continue;
    }
    auto wait = policy_.command_timeout + std::chrono::seconds(1);
    if (earliest != Clock::time_point::max()) {
      wait = std::chrono::ceil<std::chrono::milliseconds>(
          std::max(earliest - Clock::now(), Clock::duration::zero()));
    }
    completions.clear();
    if (auto reaped = transport_.reap(wait, completions); !reaped) {
      for (std::size_t i = 0; i < count; ++i) {
        if (!slots[i].done) {
          finish(i, tl::unexpected(reaped.error()));
        }
      }
      break;
    }
    for (auto& completion : completions) {
      const std::size_t i = completion.tag;
      BLKFENCE_ASSERT(i < count && !slots[i].done);
      Request& request = requests[i];
      Slot& slot = slots[i];
      Attempt attempt{.device = request.devices[slot.candidate],
                      .outcome = completion.outcome,
                      .sense = std::nullopt,
                      .latency = completion.latency};
      if (completion.outcome == Outcome::kCheckCondition) {
        attempt.sense = codec::decode_sense(completion.sense);
      }
      responses[i].attempts.push_back(attempt);
      const bool more_paths = request.is_read && slot.candidate + 1 < request.devices.size();

      switch (completion.outcome) {
        case Outcome::kGood: finish(i, std::move(completion.data_in)); continue;
        case Outcome::kBusy:
        case Outcome::kTaskAborted:
          if (slot.busy++ < policy_.busy_max) {
            later(i);
            continue;
          }
          break;
        case Outcome::kCheckCondition:
          switch (codec::classify(*attempt.sense)) {
            case codec::SenseCategory::kNoSense:
            case codec::SenseCategory::kRecovered:
              finish(i, std::move(completion.data_in));
              continue;
            case codec::SenseCategory::kUnitAttention:
              // The command did not execute (SAM-5 5.14): repeating it is safe.
              if (slot.unit_attentions++ < policy_.unit_attention_max) {
                submit(i);
                continue;
              }
              break;
            case codec::SenseCategory::kNotReadyBecomingReady:
            case codec::SenseCategory::kNotReadyInProgress:
            case codec::SenseCategory::kNotReadyTransitioning:
              if (slot.not_ready++ < policy_.not_ready_max) {
                later(i);
                continue;
              }
              break;
            case codec::SenseCategory::kAbortedCommand:
              if (slot.busy++ < policy_.busy_max) {
                later(i);
                continue;
              }
              break;
            default: break;
          }
          break;
        case Outcome::kTransportError:
        case Outcome::kOsError:
          if (more_paths) {
            ++slot.candidate;
            submit(i);
            continue;
          }
          break;
        case Outcome::kReservationConflict:
        case Outcome::kIndeterminate: break;
      }
      finish(i, tl::unexpected(attempt_error(attempt, completion, request.what)));
    }
  }
  return responses;
}

std::vector<LuResult<codec::ReadKeys>> Client::read_keys(const std::vector<LogicalUnit>& lus) {
  std::vector<Request> requests;
  requests.reserve(lus.size());
  for (const auto& lu : lus) {
    requests.push_back(
        Request{.devices = devices_of(lu),
                .command = prin_command(codec::PrInAction::kReadKeys, kReadKeysAllocation),
                .is_read = true,
                .what = "READ KEYS"});
  }
  return decode_each<codec::ReadKeys>(
      run(std::move(requests)), [](const auto& data) { return codec::decode_read_keys(data); });
}

std::vector<LuResult<codec::ReadReservation>> Client::read_reservation(
    const std::vector<LogicalUnit>& lus) {
  std::vector<Request> requests;
  requests.reserve(lus.size());
  for (const auto& lu : lus) {
    requests.push_back(Request{.devices = devices_of(lu),
                               .command = prin_command(codec::PrInAction::kReadReservation,
                                                       codec::kPrInAllocationLengthMin),
                               .is_read = true,
                               .what = "READ RESERVATION"});
  }
  return decode_each<codec::ReadReservation>(run(std::move(requests)), [](const auto& data) {
    return codec::decode_read_reservation(data);
  });
}

std::vector<LuResult<codec::Capabilities>> Client::report_capabilities(
    const std::vector<LogicalUnit>& lus) {
  std::vector<Request> requests;
  requests.reserve(lus.size());
  for (const auto& lu : lus) {
    requests.push_back(Request{
        .devices = devices_of(lu),
        .command = prin_command(codec::PrInAction::kReportCapabilities, kCapabilitiesAllocation),
        .is_read = true,
        .what = "REPORT CAPABILITIES"});
  }
  return decode_each<codec::Capabilities>(run(std::move(requests)), [](const auto& data) {
    return codec::decode_report_capabilities(data);
  });
}

std::vector<LuResult<codec::FullStatus>> Client::read_full_status(
    const std::vector<LogicalUnit>& lus) {
  std::vector<Request> requests;
  requests.reserve(lus.size());
  for (const auto& lu : lus) {
    requests.push_back(
        Request{.devices = devices_of(lu),
                .command = prin_command(codec::PrInAction::kReadFullStatus, kFullStatusAllocation),
                .is_read = true,
                .what = "READ FULL STATUS"});
  }
  return decode_each<codec::FullStatus>(run(std::move(requests)), [](const auto& data) {
    return codec::decode_read_full_status(data);
  });
}

namespace {

// One PR OUT on every path of every LU; a LU's result is its first failure, else success.
std::vector<LuResult<Nothing>> on_every_path(Client& client, const std::vector<LogicalUnit>& lus,
                                             const codec::PrOutCommand& prout,
                                             const std::string& what) {
  std::vector<Client::Request> requests;
  std::vector<std::size_t> owner;
  for (std::size_t l = 0; l < lus.size(); ++l) {
    for (const auto& path : lus[l].paths) {
      requests.push_back(Client::Request{.devices = {command_device(path)},
                                         .command = prout_command(prout),
                                         .is_read = false,
                                         .what = what});
      owner.push_back(l);
    }
  }
  auto responses = client.run(std::move(requests));
  std::vector<LuResult<Nothing>> results(
      lus.size(), LuResult<Nothing>{.value = fail(ErrorCode::kInvalidArgument, what + ": no path"),
                                    .attempts = {}});
  std::vector<bool> failed(lus.size(), false);
  for (std::size_t r = 0; r < responses.size(); ++r) {
    auto& result = results[owner[r]];
    auto& attempts = responses[r].attempts;
    result.attempts.insert(result.attempts.end(), attempts.begin(), attempts.end());
    if (failed[owner[r]]) {
      continue;
    }
    if (responses[r].data) {
      result.value = Nothing{};
    } else {
      result.value = tl::unexpected(responses[r].data.error());
      failed[owner[r]] = true;
    }
  }
  return results;
}

// One PR OUT on the first path of every LU.
std::vector<LuResult<Nothing>> on_first_path(Client& client, const std::vector<LogicalUnit>& lus,
                                             const codec::PrOutCommand& prout,
                                             const std::string& what) {
  std::vector<Client::Request> requests;
  requests.reserve(lus.size());
  for (const auto& lu : lus) {
    std::vector<std::string> devices;
    if (!lu.paths.empty()) {
      devices.push_back(command_device(lu.paths.front()));
    }
    requests.push_back(Client::Request{
        .devices = devices, .command = prout_command(prout), .is_read = false, .what = what});
  }
  return decode_each<Nothing>(client.run(std::move(requests)),
                              [](const auto&) -> Result<Nothing> { return Nothing{}; });
}

}  // namespace

std::vector<LuResult<Nothing>> Client::register_and_ignore(const std::vector<LogicalUnit>& lus,
                                                           std::uint64_t key, bool aptpl) {
  return on_every_path(*this, lus, codec::prout_register_and_ignore(key, {.aptpl = aptpl}),
                       "REGISTER AND IGNORE EXISTING KEY");
}

std::vector<LuResult<Nothing>> Client::register_key(const std::vector<LogicalUnit>& lus,
                                                    std::uint64_t key, std::uint64_t new_key,
                                                    bool aptpl) {
  return on_every_path(*this, lus, codec::prout_register(key, new_key, {.aptpl = aptpl}),
                       "REGISTER");
}

std::vector<LuResult<Nothing>> Client::reserve(const std::vector<LogicalUnit>& lus,
                                               std::uint64_t key, codec::PrType type) {
  return on_first_path(*this, lus, codec::prout_reserve(key, type), "RESERVE");
}

std::vector<LuResult<Nothing>> Client::release(const std::vector<LogicalUnit>& lus,
                                               std::uint64_t key, codec::PrType type) {
  return on_first_path(*this, lus, codec::prout_release(key, type), "RELEASE");
}

std::vector<LuResult<Nothing>> Client::clear(const std::vector<LogicalUnit>& lus,
                                             std::uint64_t key) {
  return on_first_path(*this, lus, codec::prout_clear(key), "CLEAR");
}

std::vector<LuResult<Nothing>> Client::preempt(const std::vector<LogicalUnit>& lus,
                                               std::uint64_t key, std::uint64_t victim_key,
                                               codec::PrType type, bool abort) {
  return on_first_path(*this, lus,
                       abort ? codec::prout_preempt_and_abort(key, victim_key, type)
                             : codec::prout_preempt(key, victim_key, type),
                       abort ? "PREEMPT AND ABORT" : "PREEMPT");
}

}  // namespace blkfence::pr
