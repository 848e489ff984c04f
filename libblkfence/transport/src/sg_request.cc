// Command checks and the sg v3 request both transports submit (transport layer). See sg.h for
// ownership; functions are pure apart from the request's own buffers.
#include <algorithm>
#include <cerrno>
#include <string>

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include "blkfence/assert.h"

#include "sg.h"

namespace blkfence::transport::detail {
namespace {

int dxfer_direction(DataDirection direction) {
  switch (direction) {
    case DataDirection::kNone: return SG_DXFER_NONE;
    case DataDirection::kToDevice: return SG_DXFER_TO_DEV;
    case DataDirection::kFromDevice: return SG_DXFER_FROM_DEV;
  }
  BLKFENCE_ASSERT(false && "unknown DataDirection");
  return SG_DXFER_NONE;
}

std::string where(const Command& command) {
  return "command with tag " + std::to_string(command.tag);
}

}  // namespace

Result<void> check_command(const Command& command) {
  if (command.cdb_size < kCdbSizeMin || command.cdb_size > Command::kCdbSizeMax) {
    return fail(ErrorCode::kInvalidArgument, where(command) + ": a CDB of " +
                                                 std::to_string(command.cdb_size) +
                                                 " bytes (sg takes 6 to 16 here)");
  }
  const bool sends = !command.data_out.empty();
  const bool receives = command.data_in_size != 0;
  bool consistent = false;
  switch (command.direction) {
    case DataDirection::kNone: consistent = !sends && !receives; break;
    case DataDirection::kToDevice: consistent = sends && !receives; break;
    case DataDirection::kFromDevice: consistent = receives && !sends; break;
  }
  if (!consistent) {
    return fail(ErrorCode::kInvalidArgument,
                where(command) +
                    ": data direction does not match the buffers (kToDevice needs data_out, "
                    "kFromDevice needs data_in_size, kNone neither)");
  }
  if (command.data_out.size() > kDataSizeMax || command.data_in_size > kDataSizeMax) {
    return fail(ErrorCode::kInvalidArgument,
                where(command) + ": more than " + std::to_string(kDataSizeMax) + " bytes of data");
  }
  if (command.timeout < std::chrono::milliseconds(1) || command.timeout > kTimeoutMax) {
    return fail(ErrorCode::kInvalidArgument, where(command) + ": timeout of " +
                                                 std::to_string(command.timeout.count()) +
                                                 " ms (1 ms to 24 h)");
  }
  return {};
}

SgRequest::SgRequest(Command command, std::int32_t pack_id, Clock::time_point submitted)
    : command_(std::move(command)), submitted_(submitted) {
  BLKFENCE_ASSERT(check_command(command_).has_value());
  if (command_.direction == DataDirection::kFromDevice) {
    data_in_.resize(command_.data_in_size);
  }
  header_.interface_id = 'S';
  header_.dxfer_direction = dxfer_direction(command_.direction);
  header_.cmd_len = command_.cdb_size;
  header_.cmdp = command_.cdb.data();
  header_.mx_sb_len = static_cast<unsigned char>(sense_.size());
  header_.sbp = sense_.data();
  if (command_.direction == DataDirection::kToDevice) {
    header_.dxfer_len = static_cast<unsigned int>(command_.data_out.size());
    header_.dxferp = command_.data_out.data();
  } else if (command_.direction == DataDirection::kFromDevice) {
    header_.dxfer_len = static_cast<unsigned int>(data_in_.size());
    header_.dxferp = data_in_.data();
  }
  header_.timeout = static_cast<unsigned int>(command_.timeout.count());
  header_.pack_id = pack_id;
  // usr_ptr stays null: answers are matched by pack_id, and a pointer that comes back from the
  // kernel (or a fake) is not something to dereference.
}

Completion SgRequest::answered(const sg_io_hdr& answer, Clock::time_point now) const {
  Completion completion;
  completion.tag = command_.tag;
  completion.status = answer.status;
  completion.host_status = answer.host_status;
  completion.driver_status = answer.driver_status;
  completion.outcome = classify(SgAnswer{.status = answer.status,
                                         .host_status = answer.host_status,
                                         .driver_status = answer.driver_status});
  // sb_len_wr and resid are the kernel's word about our buffers: never believe more than they hold.
  const std::size_t sense_size = std::min<std::size_t>(answer.sb_len_wr, sense_.size());
  completion.sense.assign(sense_.begin(), sense_.begin() + static_cast<std::ptrdiff_t>(sense_size));
  if (command_.direction == DataDirection::kFromDevice) {
    const std::size_t resid = answer.resid <= 0 ? 0 : static_cast<std::size_t>(answer.resid);
    const std::size_t received = data_in_.size() - std::min(resid, data_in_.size());
    completion.data_in.assign(data_in_.begin(),
                              data_in_.begin() + static_cast<std::ptrdiff_t>(received));
  }
  completion.latency = now - submitted_;
  return completion;
}

Completion SgRequest::unanswered(Outcome outcome, int os_errno, Clock::time_point now) const {
  Completion completion;
  completion.tag = command_.tag;
  completion.outcome = outcome;
  completion.os_errno = os_errno;
  completion.latency = now - submitted_;
  return completion;
}

Result<OpenedDevice> open_device(const std::string& device) {
  constexpr unsigned kSgMajor = 21;  // include/uapi/linux/major.h: SCSI_GENERIC_MAJOR
  UniqueFd fd(::open(device.c_str(), O_RDWR | O_NONBLOCK | O_CLOEXEC));
  if (!fd.valid()) {
    return tl::unexpected(Error::os(errno, "open " + device + " read-write"));
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) {
    return tl::unexpected(Error::os(errno, "fstat " + device));
  }
  const bool is_sg = S_ISCHR(st.st_mode) && ::major(st.st_rdev) == kSgMajor;
  if (!is_sg && !S_ISBLK(st.st_mode)) {
    return fail(ErrorCode::kInvalidArgument,
                device + ": neither an sg device (character major 21) nor a block device");
  }
  return OpenedDevice{.fd = std::move(fd), .is_sg = is_sg};
}

std::optional<DeviceNumber> device_number_of(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0 || (!S_ISCHR(st.st_mode) && !S_ISBLK(st.st_mode))) {
    return std::nullopt;
  }
  return DeviceNumber{
      .is_char = S_ISCHR(st.st_mode), .major = ::major(st.st_rdev), .minor = ::minor(st.st_rdev)};
}

}  // namespace blkfence::transport::detail
