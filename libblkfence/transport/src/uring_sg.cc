// io_uring over the sg v3 asynchronous interface (transport layer).
//
// One ring serves every path; each path is an /dev/sgN fd opened O_RDWR | O_NONBLOCK | O_CLOEXEC.
// The transport owns every command's Slot (its SgRequest: header, CDB, sense and data buffers) from
// submit() until the kernel has given it back, and every path's fd until the kernel has given back
// the last command written on it. Used from one thread; nothing here is thread-safe, and no thread
// is created (completions are poll-driven task work, docs/design.md §7).
//
// How a command travels. submit() appends it to its path's FIFO; pump() writes it with
// IORING_OP_WRITE of its sg_io_hdr as soon as the fd has one of its 16 slots free (sg.c:
// SG_MAX_QUEUE, the 17th write() fails with EDOM), and keeps one IORING_OP_POLL_ADD(POLLIN) armed
// on the fd while anything is outstanding there. When it fires, drain() reads answers with plain
// non-blocking read() calls in this thread until -EAGAIN; sg's read() returns whichever command
// finished first (SG_SET_FORCE_PACK_ID stays off), and its pack_id (unique in the transport) names
// the slot, whose own sense and data-in buffers sg fills inside that read(). The POLL_ADD is then
// armed again while commands remain.
//
// Why not IORING_OP_READ (docs/reference/linux-sg.md §2). A READ on an O_NONBLOCK sg fd is tried
// inline, gets -EAGAIN and is left to io_uring's internal poll, which serves a request once; in
// the lab (LIO over iSCSI, Debian's 6.1) bare READs lost the answer of 1 command in 10 and of 3
// batches of 8 in 5 — sg had the answer, the READ never came back — and READs linked behind a
// POLL_ADD still lost answers in batches over several fds. A POLL_ADD checks sg_poll() when armed
// and is level-triggered, so an answer that arrives before or while it is armed is never missed;
// the read() that follows is the same call sg3_utils makes. Every wake-up of reap() also drains
// the paths that have commands out, which costs one -EAGAIN read() per such path and keeps an
// answer from waiting on a wake-up that was lost. One POLL_ADD per fd: it fires for any answer.
//
// Deadlines and zombies. A command whose deadline (Command::timeout, counted from its write, plus
// a grace for sg's own timeout handling) passes is reported kIndeterminate; its Slot stays, a
// zombie, with its pack_id and buffers, until a read() brings its answer, which is then dropped.
// close_path() reports what the kernel holds the same way and keeps the fd open until the last
// zombie is read. Only the destructor gives up on zombies: it cancels the armed POLL_ADDs, waits
// for their CQEs (and for any WRITE still in the ring), exits the ring and closes the fds. That is
// safe because sg writes a command's sense and data-in only inside the read() that returns it; a
// command that finishes after its fd is closed is freed by a worker without any copy to user memory
// (block/blk-map.c: bio_uncopy_user(), "the request is orphaned").
//
// The ring is set up plain. Answers arrive as poll wake-ups that run as task work in this thread;
// without IORING_SETUP_DEFER_TASKRUN that task work interrupts the thread's sleep (in sd-event's
// epoll_wait or in reap()), posts the CQE and signals the eventfd. DEFER_TASKRUN would post CQEs
// only inside io_uring_enter(GETEVENTS), which the daemon does not call while it sleeps.
#include <algorithm>
#include <cerrno>
#include <deque>
#include <iterator>
#include <limits>
#include <optional>
#include <unordered_map>

#include <fcntl.h>
#include <liburing.h>
#include <poll.h>

#include "blkfence/assert.h"

#include "transport_impl.h"
#include "wakeup.h"

namespace blkfence::transport {
namespace detail {
namespace {

constexpr unsigned kRingEntries = 256;
constexpr unsigned kCqEntries = 4096;          // WRITE and POLL_ADD CQEs of many paths at once
constexpr std::size_t kPathWaitingMax = 1024;  // commands queued per path behind the 16
constexpr int kWriteAttemptsMax = 3;           // for a WRITE that came back -EAGAIN
constexpr std::chrono::milliseconds kShutdownWaitMax{2000};

// user_data: what the SQE was, and the slot or path it belongs to.
enum class Op : std::uint8_t { kWrite = 1, kPoll = 3, kCancel = 4 };
constexpr unsigned kOpShift = 56;

std::uint64_t user_data(Op op, std::uint64_t id) {
  BLKFENCE_ASSERT(id < (std::uint64_t{1} << kOpShift));
  return (std::uint64_t{static_cast<std::uint8_t>(op)} << kOpShift) | id;
}

__kernel_timespec to_timespec(Clock::duration duration) {
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(duration).count();
  __kernel_timespec ts{};
  ts.tv_sec = ns / 1'000'000'000;
  ts.tv_nsec = ns % 1'000'000'000;
  return ts;
}

// Why io_uring_setup() refused, in terms an operator can act on.
Error setup_error(int error_number) {
  switch (error_number) {
    case EPERM:
      return Error(ErrorCode::kNotSupported,
                   "io_uring_setup: EPERM: io_uring is disabled for this process (sysctl "
                   "kernel.io_uring_disabled on 6.6 and later, or a seccomp filter such as a "
                   "container runtime's default profile)");
    case ENOSYS:
      return Error(ErrorCode::kNotSupported,
                   "io_uring_setup: ENOSYS: the kernel has no io_uring (CONFIG_IO_URING off) or a "
                   "seccomp filter hides it");
    case ENOMEM:
      return Error(ErrorCode::kNotSupported,
                   "io_uring_setup: ENOMEM: the ring does not fit the locked-memory limit "
                   "(RLIMIT_MEMLOCK, kernels before 5.12) or the memory cgroup");
    case EINVAL:
      return Error(ErrorCode::kNotSupported,
                   "io_uring_setup: EINVAL: the kernel's io_uring is too old (IORING_OP_WRITE "
                   "needs 5.6)");
    default: return Error::os(error_number, "io_uring_setup");
  }
}

// The ring, probed for the opcodes the transport uses, and torn down with the object.
class Ring {
 public:
  Ring(const Ring&) = delete;
  Ring& operator=(const Ring&) = delete;
  ~Ring() {
    if (live_) {
      io_uring_queue_exit(&ring_);
    }
  }

  [[nodiscard]] static Result<std::unique_ptr<Ring>> make() {
    std::unique_ptr<Ring> ring(new Ring());
    io_uring_params params{};
    params.flags = IORING_SETUP_CQSIZE | IORING_SETUP_CLAMP;
    params.cq_entries = kCqEntries;
    const int rc = io_uring_queue_init_params(kRingEntries, &ring->ring_, &params);
    if (rc < 0) {
      return tl::unexpected(setup_error(-rc));
    }
    ring->live_ = true;
    std::unique_ptr<io_uring_probe, void (*)(io_uring_probe*)> probe(
        io_uring_get_probe_ring(ring->get()), io_uring_free_probe);
    if (!probe) {
      return fail(ErrorCode::kNotSupported, "io_uring: no opcode probe (kernel before 5.6)");
    }
    for (const int op : {IORING_OP_WRITE, IORING_OP_POLL_ADD, IORING_OP_ASYNC_CANCEL}) {
      if (io_uring_opcode_supported(probe.get(), op) == 0) {
        return fail(ErrorCode::kNotSupported,
                    "io_uring: opcode " + std::to_string(op) + " not supported by this kernel");
      }
    }
    return ring;
  }

  io_uring* get() { return &ring_; }

 private:
  Ring() = default;
  io_uring ring_{};
  bool live_ = false;
};

// One command, from submit() until the kernel has given it back and the caller has its Completion.
struct Slot {
  Slot(Command command, std::int32_t pack_id, Clock::time_point now, std::uint64_t slot_id,
       PathId path_id, Clock::time_point first_deadline)
      : request(std::move(command), pack_id, now),
        id(slot_id),
        path(path_id),
        deadline(first_deadline) {}

  SgRequest request;
  std::uint64_t id;
  PathId path;
  Clock::time_point deadline;
  int write_attempts = 0;
  bool written = false;    // the kernel has it, or a WRITE of it is in the ring
  bool write_done = true;  // no WRITE of it is in the ring (it reads our header, CDB, data-out)
  bool answered = false;   // the kernel gave it back or refused it: its buffers are ours again
  bool reported = false;   // its Completion went to the caller; with !answered, a zombie
};

struct Path {
  Path(PathId path_id, std::string path_name, UniqueFd path_fd)
      : id(path_id), name(std::move(path_name)), fd(std::move(path_fd)) {}

  PathId id;
  std::string name;
  UniqueFd fd;
  std::deque<std::uint64_t> waiting;  // slots not yet written, oldest first
  std::size_t in_kernel = 0;          // written and not yet given back, at most kSgQueueDepth
  bool poll_armed = false;            // a POLL_ADD(POLLIN) is in the ring
  bool cancel_sent = false;
  bool closed = false;   // close_path() was called: kept only until the kernel gives back the rest
  int broken_errno = 0;  // a read() failed for good: this fd will give nothing more back
  sg_io_hdr answer{};    // what the last read() returned
};

class UringTransport final : public TransportImpl {
 public:
  UringTransport(const UringOptions& options, std::unique_ptr<Ring> ring, Wakeup wakeup)
      : options_(options), ring_(std::move(ring)), wakeup_(std::move(wakeup)) {}

  ~UringTransport() override { shut_down(); }

  Result<PathId> open_path(const std::string& device) override {
    auto opened = open_device(device);
    if (!opened) {
      return tl::unexpected(opened.error());
    }
    if (!opened->is_sg) {
      return fail(ErrorCode::kInvalidArgument,
                  device + ": not an sg device (character major 21): the io_uring transport " +
                      "drives /dev/sgN ('lsscsi -g' shows which one a disk has); the SG_IO " +
                      "transport also takes block devices");
    }
    return open_path_fd(std::move(opened->fd), device);
  }

  Result<PathId> open_path_fd(UniqueFd fd, std::string name) override {
    BLKFENCE_ASSERT(fd.valid());
    const PathId id = next_path_id_++;
    paths_.emplace(id, std::make_unique<Path>(id, std::move(name), std::move(fd)));
    return id;
  }

  std::optional<DeviceNumber> device_of(PathId path_id) const override {
    const auto it = paths_.find(path_id);
    if (it == paths_.end() || it->second->closed) {
      return std::nullopt;
    }
    return device_number_of(it->second->fd.get());
  }

  void close_path(PathId path_id) override {
    const auto it = paths_.find(path_id);
    if (it == paths_.end() || it->second->closed) {
      return;
    }
    const auto now = Clock::now();
    drain_cqes(now);  // answers already in the ring complete truthfully
    Path& path = *it->second;
    path.closed = true;
    for (auto slot_it = slots_.begin(); slot_it != slots_.end();) {
      Slot& slot = *slot_it->second;
      if (slot.path != path_id || slot.reported) {
        ++slot_it;
      } else if (!slot.written) {
        report(slot, slot.request.unanswered(Outcome::kOsError, ECANCELED, now));
        by_pack_id_.erase(slot.request.pack_id());
        slot_it = slots_.erase(slot_it);
      } else {
        report(slot, slot.request.unanswered(Outcome::kIndeterminate, 0, now));
        ++slot_it;
      }
    }
    path.waiting.clear();
    retire_if_done(path);  // may destroy path
    (void)flush();
    wakeup_.notify();  // completions are ready without any CQE
    wakeup_.arm(earliest_deadline());
  }

  Result<void> submit(PathId path_id, Command command) override {
    const auto it = paths_.find(path_id);
    if (it == paths_.end() || it->second->closed) {
      return fail(ErrorCode::kInvalidArgument,
                  "submit: path " + std::to_string(path_id) + " is not open");
    }
    Path& path = *it->second;
    if (path.broken_errno != 0) {
      return tl::unexpected(Error::os(
          path.broken_errno, path.name + ": the kernel stopped answering on this fd; reopen it"));
    }
    if (auto checked = check_command(command); !checked) {
      return checked;
    }
    if (path.waiting.size() >= kPathWaitingMax) {
      return tl::unexpected(Error::os(
          EAGAIN, path.name + ": " + std::to_string(kPathWaitingMax) + " commands already queued"));
    }
    const auto now = Clock::now();
    const auto deadline = now + command.timeout + options_.deadline_grace;
    const std::uint64_t id = next_slot_id_++;
    const std::int32_t pack_id = allocate_pack_id();
    slots_.emplace(id,
                   std::make_unique<Slot>(std::move(command), pack_id, now, id, path_id, deadline));
    by_pack_id_.emplace(pack_id, id);
    ++awaiting_;
    path.waiting.push_back(id);
    pump(path, now);
    if (corked_ == 0) {
      // A failed io_uring_submit() leaves the SQEs in the ring for the next reap(), which reports
      // it: the command is accepted either way and will complete exactly once.
      (void)flush();
      wakeup_.arm(earliest_deadline());
    }
    return {};
  }

  void cork() override { ++corked_; }
  void uncork() override {
    BLKFENCE_ASSERT(corked_ > 0);
    if (--corked_ == 0) {
      (void)flush();
      wakeup_.arm(earliest_deadline());
    }
  }

  Result<std::size_t> reap(std::chrono::milliseconds wait, std::vector<Completion>& out) override {
    const auto end = Clock::now() + std::max(wait, std::chrono::milliseconds(0));
    wakeup_.drain();
    for (;;) {
      const auto now = Clock::now();
      drain_cqes(now);
      drain_all(now);
      expire(now);
      if (!ready_.empty() || now >= end) {
        break;
      }
      const auto until = std::min(end, earliest_deadline().value_or(end));
      __kernel_timespec ts = to_timespec(until - now);
      io_uring_cqe* cqe = nullptr;
      // Submits what the handlers prepared (re-armed POLL_ADDs, writes of queued commands) and
      // waits.
      const int rc = io_uring_submit_and_wait_timeout(ring_->get(), &cqe, 1, &ts, nullptr);
      if (rc < 0 && !is_transient(-rc) && rc != -ETIME) {
        wakeup_.arm(earliest_deadline());
        return tl::unexpected(Error::os(-rc, "io_uring_enter"));
      }
    }
    // Handlers may have prepared SQEs since the last wait; they must reach the kernel before the
    // caller goes back to sleep on poll_fd().
    if (const int rc = flush(); rc < 0) {
      return tl::unexpected(Error::os(-rc, "io_uring_submit"));
    }
    const std::size_t count = ready_.size();
    std::move(ready_.begin(), ready_.end(), std::back_inserter(out));
    ready_.clear();
    wakeup_.arm(earliest_deadline());
    return count;
  }

  std::size_t in_flight() const override { return awaiting_ + ready_.size(); }
  int poll_fd() const override { return wakeup_.poll_fd(); }
  std::string_view name() const override { return "io_uring"; }

  std::size_t zombie_count() const override {
    return static_cast<std::size_t>(std::count_if(slots_.begin(), slots_.end(), [](const auto& s) {
      return s.second->reported && s.second->written && !s.second->answered;
    }));
  }

 private:
  static bool is_transient(int error_number) {
    return error_number == EAGAIN || error_number == EBUSY || error_number == EINTR;
  }

  // io_uring_submit(); 0, or -errno for a failure that is not worth retrying later.
  int flush() {
    const int rc = io_uring_submit(ring_->get());
    return rc < 0 && !is_transient(-rc) ? rc : 0;
  }

  // An SQE, with room for count of them in a row (a linked pair must not straddle a submit).
  io_uring_sqe* get_sqe(unsigned count) {
    if (io_uring_sq_space_left(ring_->get()) < count) {
      (void)io_uring_submit(ring_->get());
    }
    io_uring_sqe* sqe = io_uring_get_sqe(ring_->get());
    BLKFENCE_ASSERT(sqe != nullptr);
    return sqe;
  }

  std::int32_t allocate_pack_id() {
    // by_pack_id_ holds every live slot, so this finds a free id within size() + 1 tries.
    for (std::size_t tries = 0; tries <= by_pack_id_.size(); ++tries) {
      const std::int32_t candidate = next_pack_id_;
      next_pack_id_ = candidate == std::numeric_limits<std::int32_t>::max() ? 1 : candidate + 1;
      if (!by_pack_id_.contains(candidate)) {
        return candidate;
      }
    }
    BLKFENCE_ASSERT(false && "no free pack_id");
    return 0;
  }

  std::optional<Clock::time_point> earliest_deadline() const {
    std::optional<Clock::time_point> earliest;
    for (const auto& [id, slot] : slots_) {
      if (!slot->reported && (!earliest || slot->deadline < *earliest)) {
        earliest = slot->deadline;
      }
    }
    return earliest;
  }

  void report(Slot& slot, Completion completion) {
    BLKFENCE_ASSERT(!slot.reported);
    slot.reported = true;
    --awaiting_;
    ready_.push_back(std::move(completion));
  }

  // Frees a slot once nothing refers to its buffers and its caller has been told.
  void maybe_free(const Slot& slot) {
    if (slot.answered && slot.write_done && slot.reported) {
      by_pack_id_.erase(slot.request.pack_id());
      slots_.erase(slot.id);  // slot is gone
    }
  }

  // Writes queued commands while the fd has free slots; keeps one POLL_ADD armed while any is out.
  void pump(Path& path, Clock::time_point now) {
    if (stopping_ || path.broken_errno != 0) {
      return;
    }
    while (!path.waiting.empty() && path.in_kernel < kSgQueueDepth) {
      Slot& slot = *slots_.at(path.waiting.front());
      path.waiting.pop_front();
      io_uring_sqe* sqe = get_sqe(1);
      io_uring_prep_write(sqe, path.fd.get(), &slot.request.header(), sizeof(sg_io_hdr), 0);
      io_uring_sqe_set_data64(sqe, user_data(Op::kWrite, slot.id));
      slot.written = true;
      slot.write_done = false;
      ++slot.write_attempts;
      // sg's own timeout (hdr.timeout) starts now, so the deadline does too.
      slot.deadline = now + slot.request.timeout() + options_.deadline_grace;
      ++path.in_kernel;
    }
    if (path.in_kernel > 0 && !path.poll_armed) {
      arm_read(path);
    }
  }

  // Waits for the next answer on the fd: see the file comment for why no READ goes to the ring.
  void arm_read(Path& path) {
    io_uring_sqe* sqe = get_sqe(1);
    io_uring_prep_poll_add(sqe, path.fd.get(), POLLIN);
    io_uring_sqe_set_data64(sqe, user_data(Op::kPoll, path.id));
    path.poll_armed = true;
    path.cancel_sent = false;
  }

  void cancel_poll(Path& path) {
    io_uring_sqe* sqe = get_sqe(1);
    io_uring_prep_cancel64(sqe, user_data(Op::kPoll, path.id), 0);
    io_uring_sqe_set_data64(sqe, user_data(Op::kCancel, path.id));
    path.cancel_sent = true;
  }

  // Reads every answer sg holds for the fd (non-blocking read() until -EAGAIN), then keeps a
  // POLL_ADD armed while commands remain.
  void drain(Path& path, Clock::time_point now) {
    while (path.in_kernel > 0 && path.broken_errno == 0) {
      const ssize_t n = ::read(path.fd.get(), &path.answer, sizeof path.answer);
      if (n == static_cast<ssize_t>(sizeof(sg_io_hdr))) {
        on_answer(path, now);
        continue;
      }
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
        break;
      }
      // ENODEV (device detached), EPERM (credentials changed after open, sg.c:
      // sg_check_file_access()), 0 (end of file, from a test's fake), a short read...
      break_path(path, n < 0 ? errno : EIO, now);
      return;
    }
    if (path.in_kernel > 0 && !path.poll_armed && !stopping_ && path.broken_errno == 0) {
      arm_read(path);
    }
  }

  // Destroys a closed path once the kernel holds nothing of it; until then the fd stays open.
  void retire_if_done(Path& path) {
    if (!path.closed || path.in_kernel > 0) {
      return;
    }
    if (path.poll_armed) {
      if (!path.cancel_sent) {
        cancel_poll(path);
      }
      return;  // its POLL_ADD's CQE comes back here
    }
    paths_.erase(path.id);  // closes the fd; path is gone
  }

  // Every path with commands out: see the file comment (a lost wake-up must not cost a deadline).
  void drain_all(Clock::time_point now) {
    std::vector<PathId> busy;
    for (const auto& [id, path] : paths_) {
      if (path->in_kernel > 0 && path->broken_errno == 0) {
        busy.push_back(id);
      }
    }
    for (const PathId id : busy) {
      if (const auto it = paths_.find(id); it != paths_.end()) {
        drain(*it->second, now);
        retire_if_done(*it->second);  // may destroy the path
      }
    }
  }

  void drain_cqes(Clock::time_point now) {
    unsigned head = 0;
    unsigned seen = 0;
    io_uring_cqe* cqe = nullptr;
    io_uring_for_each_cqe(ring_->get(), head, cqe) {
      on_cqe(cqe->user_data, cqe->res, now);
      ++seen;
    }
    io_uring_cq_advance(ring_->get(), seen);
  }

  void on_cqe(std::uint64_t data, int res, Clock::time_point now) {
    const std::uint64_t id = data & ((std::uint64_t{1} << kOpShift) - 1);
    switch (static_cast<Op>(data >> kOpShift)) {
      case Op::kWrite: on_write(id, res, now); return;
      case Op::kPoll: on_poll(static_cast<PathId>(id), res, now); return;
      case Op::kCancel: return;  // the cancelled POLL_ADD reports for itself
    }
  }

  void on_write(std::uint64_t slot_id, int res, Clock::time_point now) {
    const auto it = slots_.find(slot_id);
    BLKFENCE_ASSERT(it != slots_.end());  // a slot lives while its WRITE is in the ring
    Slot& slot = *it->second;
    slot.write_done = true;
    if (res == static_cast<int>(sizeof(sg_io_hdr)) || slot.answered) {
      maybe_free(slot);
      return;
    }
    // sg refused it before issuing it (sg_new_write() fails before blk_execute_rq_nowait()), or a
    // short write: it never reached the device.
    const int error_number = res < 0 ? -res : EIO;
    Path& path = *paths_.at(slot.path);  // in_kernel counts slot, so the path is alive
    --path.in_kernel;
    slot.written = false;
    if ((error_number == EAGAIN || error_number == EINTR) &&
        slot.write_attempts < kWriteAttemptsMax && !slot.reported && !path.closed) {
      path.waiting.push_front(slot.id);
    } else {
      slot.answered = true;
      if (!slot.reported) {
        report(slot, slot.request.unanswered(classify(SgAnswer{.os_errno = error_number}),
                                             error_number, now));
      }
      maybe_free(slot);
    }
    pump(path, now);
    retire_if_done(path);
  }

  void on_poll(PathId path_id, int res, Clock::time_point now) {
    const auto it = paths_.find(path_id);
    BLKFENCE_ASSERT(it != paths_.end());  // a path lives while its POLL_ADD is in the ring
    Path& path = *it->second;
    path.poll_armed = false;
    if (res < 0 && res != -ECANCELED) {
      break_path(path, -res, now);  // the fd cannot be waited on: nothing more will come back
    } else if (!stopping_) {
      drain(path, now);
    }
    retire_if_done(path);  // may destroy path
  }

  void on_answer(Path& path, Clock::time_point now) {
    const auto pack = by_pack_id_.find(path.answer.pack_id);
    if (pack == by_pack_id_.end()) {
      return;  // not a command of ours: nothing to match it with
    }
    Slot& slot = *slots_.at(pack->second);
    if (slot.path != path.id || !slot.written || slot.answered) {
      return;
    }
    slot.answered = true;
    --path.in_kernel;
    if (!slot.reported) {
      report(slot, slot.request.answered(path.answer, now));
    }
    maybe_free(slot);  // a zombie's late answer ends here, unseen
    pump(path, now);
  }

  // The fd will give nothing more back: everything on it completes now. Commands the kernel held
  // are indeterminate; their buffers are ours again, since sg writes them only inside a read().
  void break_path(Path& path, int error_number, Clock::time_point now) {
    path.broken_errno = error_number;
    for (auto it = slots_.begin(); it != slots_.end();) {
      Slot& slot = *it->second;
      if (slot.path != path.id || slot.answered) {
        ++it;
        continue;
      }
      const bool sent = slot.written;
      slot.answered = true;
      if (!slot.reported) {
        report(slot, slot.request.unanswered(
                         classify(SgAnswer{.os_errno = error_number, .may_have_executed = sent}),
                         error_number, now));
      }
      ++it;  // maybe_free() below may erase the slot
      maybe_free(slot);
    }
    path.waiting.clear();
    path.in_kernel = 0;
  }

  void expire(Clock::time_point now) {
    for (auto it = slots_.begin(); it != slots_.end();) {
      Slot& slot = *it->second;
      if (slot.reported || slot.deadline > now) {
        ++it;
      } else if (!slot.written) {
        // It never left the queue: the commands ahead of it held the fd's 16 slots all along.
        Path& path = *paths_.at(slot.path);
        path.waiting.erase(std::find(path.waiting.begin(), path.waiting.end(), slot.id));
        report(slot, slot.request.unanswered(Outcome::kOsError, ETIMEDOUT, now));
        by_pack_id_.erase(slot.request.pack_id());
        it = slots_.erase(it);
      } else {
        report(slot, slot.request.unanswered(Outcome::kIndeterminate, 0, now));
        ++it;  // a zombie until the kernel gives it back
      }
    }
  }

  bool kernel_holds_memory() const {
    return std::any_of(paths_.begin(), paths_.end(),
                       [](const auto& p) { return p.second->poll_armed; }) ||
           std::any_of(slots_.begin(), slots_.end(),
                       [](const auto& s) { return !s.second->write_done; });
  }

  // Waits (boundedly) until no SQE in the ring refers to a path's or slot's memory, then exits the
  // ring; the members' destructors then close the fds and free the slots.
  void shut_down() {
    stopping_ = true;
    for (auto& [id, path] : paths_) {
      if (path->poll_armed) {
        cancel_poll(*path);
      }
    }
    (void)io_uring_submit(ring_->get());
    const auto give_up = Clock::now() + kShutdownWaitMax;
    while (kernel_holds_memory() && Clock::now() < give_up) {
      __kernel_timespec ts = to_timespec(std::chrono::milliseconds(10));
      io_uring_cqe* cqe = nullptr;
      (void)io_uring_wait_cqe_timeout(ring_->get(), &cqe, &ts);
      drain_cqes(Clock::now());
    }
    if (kernel_holds_memory()) {
      // A WRITE stuck in io-wq may still read a slot, and a POLL_ADD still names its path:
      // leaking them beats corrupting the heap. Never seen with O_NONBLOCK fds, where neither
      // blocks.
      for (auto& [id, path] : paths_) {
        if (path->poll_armed) {
          (void)path.release();
        }
      }
      for (auto& [id, slot] : slots_) {
        if (!slot->write_done) {
          (void)slot.release();
        }
      }
    }
    ring_.reset();
  }

  UringOptions options_;
  std::unique_ptr<Ring> ring_;
  Wakeup wakeup_;
  std::unordered_map<PathId, std::unique_ptr<Path>> paths_;
  std::unordered_map<std::uint64_t, std::unique_ptr<Slot>> slots_;
  std::unordered_map<std::int32_t, std::uint64_t> by_pack_id_;  // every live slot
  std::vector<Completion> ready_;
  std::size_t awaiting_ = 0;  // slots not yet reported
  PathId next_path_id_ = 1;
  std::uint64_t next_slot_id_ = 1;
  std::int32_t next_pack_id_ = 1;
  int corked_ = 0;  // cork() depth: submit() leaves the SQEs to uncork()
  bool stopping_ = false;
};

}  // namespace

Result<std::unique_ptr<TransportImpl>> make_uring_transport(const UringOptions& options) {
  auto ring = Ring::make();
  if (!ring) {
    return tl::unexpected(ring.error());
  }
  auto wakeup = Wakeup::make();
  if (!wakeup) {
    return tl::unexpected(wakeup.error());
  }
  const int rc = io_uring_register_eventfd((*ring)->get(), wakeup->event_fd());
  if (rc < 0) {
    if (rc == -EPERM || rc == -ENOSYS) {
      return fail(ErrorCode::kNotSupported, "io_uring_register_eventfd: refused (seccomp?)");
    }
    return tl::unexpected(Error::os(-rc, "io_uring_register_eventfd"));
  }
  return std::make_unique<UringTransport>(options, std::move(*ring), std::move(*wakeup));
}

}  // namespace detail

Result<std::unique_ptr<Transport>> make_uring_transport() {
  auto transport = detail::make_uring_transport(detail::UringOptions{});
  if (!transport) {
    return tl::unexpected(transport.error());
  }
  return std::unique_ptr<Transport>(std::move(*transport));
}

}  // namespace blkfence::transport
