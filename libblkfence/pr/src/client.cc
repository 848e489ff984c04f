// The persistent reservation client: batch engine and typed operations (pr layer). See client.h.
#include "blkfence/pr/client.h"

#include <algorithm>
#include <cstdio>
#include <thread>

#include "blkfence/codec/prout.h"

namespace blkfence::pr {
namespace {

using Clock = std::chrono::steady_clock;

// READ KEYS: 8 bytes a registration, room for 1023 of them. READ FULL STATUS: LIO drops the
// descriptors that do not fit without counting them (docs/reference/lio.md §1), so ask for a lot.
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

Client::Client(transport::Transport& transport, RetryPolicy policy) : engine_(transport, policy) {}

std::vector<Client::Response> Client::run(std::vector<Request> requests) {
  const auto now = [] { return Clock::now().time_since_epoch(); };
  std::optional<std::vector<Response>> responses;
  engine_.start(std::move(requests), now(),
                [&](std::vector<Response> done, Time) { responses = std::move(done); });
  transport::Transport& transport = engine_.transport();
  std::vector<transport::Completion> completions;
  while (!responses) {
    engine_.on_time(now());
    if (responses) {
      break;
    }
    const std::optional<Time> wake = engine_.next_wake();
    if (transport.in_flight() == 0) {
      BLKFENCE_ASSERT(wake.has_value());  // an open request waits for a retry
      std::this_thread::sleep_until(
          Clock::time_point(std::chrono::duration_cast<Clock::duration>(*wake)));
      continue;
    }
    auto wait = engine_.policy().command_timeout + std::chrono::seconds(1);
    if (wake) {
      wait = std::chrono::ceil<std::chrono::milliseconds>(std::max(*wake - now(), Time{0}));
    }
    completions.clear();
    if (auto reaped = transport.reap(wait, completions); !reaped) {
      engine_.fail_all(reaped.error(), now());
      break;
    }
    for (auto& completion : completions) {
      engine_.on_completion(std::move(completion), now());
    }
  }
  BLKFENCE_ASSERT(responses.has_value());
  return std::move(*responses);
}

Request read_keys_request(const LogicalUnit& lu) {
  return Request{.devices = devices_of(lu),
                 .command = prin_command(codec::PrInAction::kReadKeys, kReadKeysAllocation),
                 .is_read = true,
                 .what = "READ KEYS",
                 .wwn = lu.wwn};
}

Request read_full_status_request(const LogicalUnit& lu) {
  return Request{.devices = devices_of(lu),
                 .command = prin_command(codec::PrInAction::kReadFullStatus, kFullStatusAllocation),
                 .is_read = true,
                 .what = "READ FULL STATUS",
                 .wwn = lu.wwn};
}

Request report_capabilities_request(const LogicalUnit& lu) {
  return Request{
      .devices = devices_of(lu),
      .command = prin_command(codec::PrInAction::kReportCapabilities, kCapabilitiesAllocation),
      .is_read = true,
      .what = "REPORT CAPABILITIES",
      .wwn = lu.wwn};
}

Request read_reservation_request(const LogicalUnit& lu) {
  return Request{
      .devices = devices_of(lu),
      .command = prin_command(codec::PrInAction::kReadReservation, codec::kPrInAllocationLengthMin),
      .is_read = true,
      .what = "READ RESERVATION",
      .wwn = lu.wwn};
}

std::vector<Request> prout_every_path(const LogicalUnit& lu, const codec::PrOutCommand& prout,
                                      const std::string& what) {
  std::vector<Request> requests;
  for (const auto& path : lu.paths) {
    requests.push_back(Request{.devices = {command_device(path)},
                               .command = prout_command(prout),
                               .is_read = false,
                               .what = what,
                               .wwn = lu.wwn});
  }
  return requests;
}

Request prout_first_path(const LogicalUnit& lu, const codec::PrOutCommand& prout,
                         const std::string& what) {
  std::vector<std::string> devices;
  if (!lu.paths.empty()) {
    devices.push_back(command_device(lu.paths.front()));
  }
  return Request{.devices = devices,
                 .command = prout_command(prout),
                 .is_read = false,
                 .what = what,
                 .wwn = lu.wwn};
}

std::vector<LuResult<codec::ReadKeys>> Client::read_keys(const std::vector<LogicalUnit>& lus) {
  std::vector<Request> requests;
  requests.reserve(lus.size());
  for (const auto& lu : lus) {
    requests.push_back(read_keys_request(lu));
  }
  return decode_each<codec::ReadKeys>(
      run(std::move(requests)), [](const auto& data) { return codec::decode_read_keys(data); });
}

std::vector<LuResult<codec::ReadReservation>> Client::read_reservation(
    const std::vector<LogicalUnit>& lus) {
  std::vector<Request> requests;
  requests.reserve(lus.size());
  for (const auto& lu : lus) {
    requests.push_back(read_reservation_request(lu));
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
    requests.push_back(report_capabilities_request(lu));
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
    requests.push_back(read_full_status_request(lu));
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
    for (auto& request : prout_every_path(lus[l], prout, what)) {
      requests.push_back(std::move(request));
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
    requests.push_back(prout_first_path(lu, prout, what));
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
