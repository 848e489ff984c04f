// The checker's own reading of the answers a node's daemon reaped (tests/sim): the SAM status byte,
// the sense data and the PR IN parameter data, decoded here from the raw bytes that history.h
// records, so that a verdict on S2 and S4 never rests on the codec under test. Only what the
// checker needs; the layouts are those of docs/reference/spc4-pr.md. Pure, header-only.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "history.h"

namespace blkfence::sim::answer {

// SAM-5 status codes.
inline constexpr std::uint8_t kGood = 0x00;
inline constexpr std::uint8_t kCheckCondition = 0x02;
inline constexpr std::uint8_t kBusy = 0x08;
inline constexpr std::uint8_t kTaskSetFull = 0x28;
inline constexpr std::uint8_t kTaskAborted = 0x40;

// PR IN service actions (SPC-4 6.16).
inline constexpr std::uint8_t kReadKeys = 0x00;
inline constexpr std::uint8_t kReadReservation = 0x01;
inline constexpr std::uint8_t kReadFullStatus = 0x03;

struct Sense {
  std::uint8_t key = 0;
  std::uint8_t asc = 0;
  std::uint8_t ascq = 0;
};

inline std::uint64_t be64(const std::vector<std::uint8_t>& data, std::size_t at) {
  std::uint64_t value = 0;
  for (std::size_t i = 0; i < 8; ++i) {
    value = (value << 8U) | data[at + i];
  }
  return value;
}

inline std::uint32_t be32(const std::vector<std::uint8_t>& data, std::size_t at) {
  std::uint32_t value = 0;
  for (std::size_t i = 0; i < 4; ++i) {
    value = (value << 8U) | data[at + i];
  }
  return value;
}

// The sense key, ASC and ASCQ of a CHECK CONDITION, in fixed (70h, 71h) or descriptor (72h, 73h)
// format (SPC-4 4.5); nothing for any other answer or sense data too short to tell.
inline std::optional<Sense> sense_of(const Command& command) {
  const std::vector<std::uint8_t>& s = command.sense;
  if (command.outcome == transport::Outcome::kIndeterminate || command.status != kCheckCondition ||
      s.empty()) {
    return std::nullopt;
  }
  const std::uint8_t response = s[0] & 0x7fU;
  if ((response == 0x70 || response == 0x71) && s.size() >= 14) {
    return Sense{static_cast<std::uint8_t>(s[2] & 0x0fU), s[12], s[13]};
  }
  if ((response == 0x72 || response == 0x73) && s.size() >= 4) {
    return Sense{static_cast<std::uint8_t>(s[1] & 0x0fU), s[2], s[3]};
  }
  return std::nullopt;
}

// Whether the command completed with a status the device sent (as opposed to a timeout or an error
// of the host or the transport, after which it may still execute).
inline bool answered(const Command& command) {
  return command.completed && command.outcome != transport::Outcome::kIndeterminate &&
         command.outcome != transport::Outcome::kOsError &&
         command.outcome != transport::Outcome::kTransportError;
}

inline bool good(const Command& command) {
  return answered(command) && command.status == kGood;
}

// Whether the answer says the command did not execute, so that sending the same bytes again is the
// same decision, not a new one: BUSY, TASK SET FULL, TASK ABORTED (SAM-5 5.3), UNIT ATTENTION
// (SAM-5 5.14: the command that reports it is not executed), ABORTED COMMAND, and NOT READY while
// becoming ready (04/01), with an operation in progress (04/07) or in an asymmetric access state
// transition (04/0A).
inline bool did_not_execute(const Command& command) {
  if (!answered(command)) {
    return false;
  }
  if (command.status == kBusy || command.status == kTaskSetFull || command.status == kTaskAborted) {
    return true;
  }
  const std::optional<Sense> sense = sense_of(command);
  if (!sense) {
    return false;
  }
  switch (sense->key) {
    case 0x06:  // UNIT ATTENTION
    case 0x0b:  // ABORTED COMMAND
      return true;
    case 0x02:  // NOT READY
      return sense->asc == 0x04 &&
             (sense->ascq == 0x01 || sense->ascq == 0x07 || sense->ascq == 0x0a);
    default: return false;
  }
}

// What a PR IN that completed GOOD showed, read from its parameter data.
struct PrInView {
  // READ RESERVATION: the holder, or none (an additional length below 16 means no reservation).
  bool shows_reservation = false;
  std::optional<std::uint64_t> holder;
  // READ KEYS: every registered key.
  bool shows_keys = false;
  std::vector<std::uint64_t> keys;
};

// Nothing when the command is not a PR IN that completed GOOD with parameter data the checker can
// read (READ KEYS or READ RESERVATION, SPC-4 6.16.2 and 6.16.3).
inline std::optional<PrInView> view_of(const Command& command) {
  if (!command.is_prin() || !good(command) || command.data_in.size() < 8) {
    return std::nullopt;
  }
  const std::vector<std::uint8_t>& d = command.data_in;
  const std::uint32_t length = be32(d, 4);
  PrInView view;
  if (command.action == kReadReservation) {
    view.shows_reservation = true;
    if (length >= 16) {
      if (d.size() < 16) {
        return std::nullopt;
      }
      view.holder = be64(d, 8);
    }
    return view;
  }
  if (command.action == kReadKeys) {
    view.shows_keys = true;
    for (std::size_t at = 8; at + 8 <= d.size() && at + 8 <= 8 + std::size_t{length}; at += 8) {
      view.keys.push_back(be64(d, at));
    }
    return view;
  }
  return std::nullopt;
}

}  // namespace blkfence::sim::answer
