// The asynchronous batch engine under the PR client: many batches of requests in flight on one
// transport at once, advanced by whoever owns the event loop (pr layer).
//
// The engine never waits and never reads a clock: its owner feeds it the transport's completions
// and the time, and asks when it next needs to be woken (for a retry after a back-off). That is
// what lets the same protocol code run in blkfenced's sd-event loop (steady clock, io_uring
// completions through an eventfd), in blkfencectl (a blocking loop, Client::run()) and in the
// simulation (the simulated clock of several nodes). The retry policy is the Client's
// (client.h): UNIT ATTENTION at once, NOT READY becoming ready / BUSY / TASK ABORTED after a
// back-off, RESERVATION CONFLICT and timeouts never; reads fail over to the next path, on a
// transport error and on a timeout alike, PR OUT never. A read starts on the path of its LU that
// last answered a read, and a path whose read timed out goes last until it answers again, so that
// a hung path of a multipath LU costs one command_timeout when it hangs, not one every round
// (docs/protocol.md, "Reads and paths").
//
// A batch's callback runs from on_completion(), on_time() or fail_all(), never from start(), and
// may start further batches. One thread; the transport must outlive the engine. Destroying the
// engine abandons open batches without calling their callbacks.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "blkfence/codec/sense.h"
#include "blkfence/error.h"
#include "blkfence/transport/transport.h"

namespace blkfence::pr {

// A point on the owner's monotonic clock (steady_clock, or a SimClock's time).
using Time = std::chrono::nanoseconds;

struct RetryPolicy {
  int unit_attention_max = 5;  // libmpathpersist retries 5 times too
  int not_ready_max = 5;       // NOT READY 04/01, 04/07, 04/0A
  int busy_max = 5;            // BUSY, TASK SET FULL, TASK ABORTED, ABORTED COMMAND
  std::chrono::milliseconds backoff_first{10};
  std::chrono::milliseconds backoff_max{500};
  std::chrono::milliseconds command_timeout{10'000};  // per attempt; then kIndeterminate
};

// One try of one command on one path.
struct Attempt {
  std::string device;
  transport::Outcome outcome = transport::Outcome::kGood;
  std::optional<codec::Sense> sense;  // with kCheckCondition
  std::chrono::nanoseconds latency{0};
};

// One command for one LU: the devices to try (a read moves on to the next after a transport error
// or a timeout, in the order the engine's path history gives them), and the command.
struct Request {
  std::vector<std::string> devices;
  transport::Command command;
  bool is_read = false;  // may fail over to the next device, and is reordered by path history
  std::string what;      // "READ KEYS", for messages
  // A PR OUT that is right only in the state its caller read (the registration of a new path with
  // the current key): an answer saying that another I_T nexus changed the registrations meanwhile
  // (TASK ABORTED, as a PREEMPT AND ABORT aborts our task set; UNIT ATTENTION 2Ah, reservations or
  // registrations preempted or released) ends it with that error instead of a resend, because
  // sent again it would act on a state nobody has read (REGISTER AND IGNORE EXISTING KEY would
  // register a key that was just preempted).
  bool stop_when_preempted = false;
  // The LU the devices must reach (LogicalUnit::wwn); with an identity check set, a device opened
  // (again) is checked against it before anything is sent (Engine::check_identity_with()).
  std::string wwn;
};

// The data-in of the attempt that succeeded, or the error of the last one; and every attempt.
struct Response {
  Result<std::vector<std::uint8_t>> data;
  std::vector<Attempt> attempts;
};

// The tag of a command the engine submits names the request it is an attempt of: every attempt of
// one request (a resubmission after a unit attention, BUSY or TASK ABORTED, or a read on its next
// path) has the same request_of_tag(), and no two requests of one engine share one. A trace of the
// commands can so tell a resubmission from a new request with the same bytes on the same nexus.
inline constexpr unsigned kTagAttemptBits = 16;
constexpr std::uint64_t request_of_tag(std::uint64_t tag) {
  return tag >> kTagAttemptBits;
}

class Engine {
 public:
  // Responses in the order of the batch's requests, and the time of the event that finished it.
  using Done = std::function<void(std::vector<Response>, Time now)>;

  explicit Engine(transport::Transport& transport, RetryPolicy policy = {});
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Submits every request of a batch now. An empty batch, or one whose every submit failed,
  // finishes at the next on_time().
  void start(std::vector<Request> requests, Time now, Done done);

  // One completion reaped from the transport; completions of abandoned requests are ignored.
  void on_completion(transport::Completion completion, Time now);
  // Resubmits the retries that are due and delivers batches that finished without a completion.
  void on_time(Time now);
  // When on_time() next has something to do; nullopt when only completions can move things.
  std::optional<Time> next_wake() const;
  // Reaps what the transport has ready (without waiting) and feeds it, then on_time(now).
  [[nodiscard]] Result<void> pump(Time now);
  // Ends every open request with error (the transport broke), calling the callbacks.
  void fail_all(const Error& error, Time now);

  // Checks every device the engine opens against its request's wwn before sending through it: a
  // device whose identity differs is closed again and the attempt fails as a detached path (ENODEV)
  // would; the next request naming it opens and checks it again. Unset (tests, the simulation) or
  // where the transport has no device node, nothing is checked.
  using IdentityCheck = std::function<Result<void>(
      const transport::DeviceNumber& node, const std::string& device, const std::string& wwn)>;
  void check_identity_with(IdentityCheck check) { check_identity_ = std::move(check); }

  // Closes the path to device, if it is open, and forgets what reads taught about it: the device
  // went away, or its name may now name another device. Its commands still in the kernel complete
  // as Transport::close_path() says. A later request that names the device opens it again. With
  // wwn, a device open as another LU's checked path is left open (the name moved on to it).
  void forget(const std::string& device, const std::string& wwn = {});
  // How many paths are open in the transport (one fd each).
  std::size_t open_paths() const { return paths_.size(); }

  std::size_t open_batches() const { return batches_.size(); }
  transport::Transport& transport() const { return transport_; }
  const RetryPolicy& policy() const { return policy_; }

 private:
  struct Slot;
  struct Batch;
  // What the reads taught about one device.
  struct Standing {
    std::uint64_t answered = 0;  // the serial of its last answer to a read; 0: none yet
    bool timed_out = false;      // its last read timed out, and no read has been answered since
  };

  Result<transport::PathId> path_for(const std::string& device, const std::string& wwn);
  // The read's devices, the last that answered first and those whose last read timed out last;
  // otherwise in the caller's order.
  void order_for_read(std::vector<std::string>& devices) const;
  void note_read(const std::string& device, transport::Outcome outcome, int os_errno);
  // Forgets the device's path when the kernel said its device is gone (ENODEV).
  void drop_if_detached(const std::string& device, int os_errno);
  void submit(Batch& batch, std::size_t index, Time now);
  void finish(Batch& batch, std::size_t index, Result<std::vector<std::uint8_t>> data);
  void deliver_finished(Time now);

  transport::Transport& transport_;
  RetryPolicy policy_;
  // An open fd, and the LU it was checked to reach (empty: not checked).
  struct OpenPath {
    transport::PathId id = 0;
    std::string wwn;
  };
  std::map<std::string, OpenPath> paths_;
  IdentityCheck check_identity_;
  // Every device a read was sent to and not forgotten since, like paths_.
  std::map<std::string, Standing> standing_;
  std::uint64_t next_answer_ = 1;
  std::uint64_t next_batch_ = 1;
  std::uint64_t next_request_ = 1;  // the serial of the next request, in its tags' high bits
  std::map<std::uint64_t, std::unique_ptr<Batch>> batches_;
  // tag of a submitted attempt -> (batch, request index)
  std::map<std::uint64_t, std::pair<std::uint64_t, std::size_t>> tags_;
};

}  // namespace blkfence::pr
