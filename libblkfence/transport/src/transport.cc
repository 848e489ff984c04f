// Choosing a transport and running a batch of commands on one (transport layer). Stateless; a
// batch uses the transport from the calling thread, like any other user of it.
#include "blkfence/transport/transport.h"

#include <optional>
#include <string>

#include "blkfence/assert.h"

namespace blkfence::transport {
namespace {

// The same error, said about one command of a batch.
Error about_command(const Error& error, std::size_t index) {
  std::string where = "command " + std::to_string(index) + " of the batch: " + error.where();
  if (error.code() == ErrorCode::kOs) {
    return Error::os(error.errno_value(), std::move(where));
  }
  return Error(error.code(), std::move(where));
}

// Long enough not to spin, short enough that a broken transport is not waited on forever: every
// command completes by its own deadline anyway.
constexpr std::chrono::milliseconds kReapWait{1000};

}  // namespace

Result<std::unique_ptr<Transport>> make_transport(TransportKind kind) {
  switch (kind) {
    case TransportKind::kUring: return make_uring_transport();
    case TransportKind::kSgio: return make_sgio_transport();
    case TransportKind::kAuto: {
      auto uring = make_uring_transport();
      if (uring || uring.error().code() != ErrorCode::kNotSupported) {
        return uring;
      }
      return make_sgio_transport();
    }
  }
  return fail(ErrorCode::kInvalidArgument, "unknown transport kind");
}

Result<std::vector<Completion>> run_batch(Transport& transport, std::vector<PathCommand> commands) {
  if (transport.in_flight() != 0) {
    return fail(ErrorCode::kInvalidArgument,
                "run_batch: the transport already has " + std::to_string(transport.in_flight()) +
                    " commands in flight, whose completions the batch would take");
  }
  // Within the batch a command's tag is its index; the caller's tags go back on at the end.
  std::vector<std::uint64_t> tags;
  tags.reserve(commands.size());
  std::optional<Error> submit_error;
  for (std::size_t i = 0; i < commands.size(); ++i) {
    tags.push_back(commands[i].command.tag);
    commands[i].command.tag = i;
    if (auto submitted = transport.submit(commands[i].path, std::move(commands[i].command));
        !submitted) {
      submit_error = about_command(submitted.error(), i);
      break;
    }
  }
  std::vector<std::optional<Completion>> results(tags.size() - (submit_error ? 1 : 0));
  std::size_t remaining = results.size();
  std::vector<Completion> reaped;
  while (remaining > 0) {
    reaped.clear();
    auto count = transport.reap(kReapWait, reaped);
    if (!count) {
      return tl::unexpected(count.error());
    }
    for (Completion& completion : reaped) {
      const std::uint64_t index = completion.tag;
      BLKFENCE_ASSERT(index < results.size() && !results[index]);
      completion.tag = tags[index];
      results[index] = std::move(completion);
      --remaining;
    }
  }
  if (submit_error) {
    return tl::unexpected(*submit_error);
  }
  std::vector<Completion> completions;
  completions.reserve(results.size());
  for (std::optional<Completion>& result : results) {
    completions.push_back(std::move(*result));
  }
  return completions;
}

}  // namespace blkfence::transport
