// The test bench of SimTarget's unit tests (sim_target*_test.cc): keys and nexuses with names,
// the six reservation types, and a fixture with a target of one LU on a SimClock and helpers that
// send commands built by the codec's encoders. Test-only.
#pragma once

#include <gtest/gtest.h>

#include "blkfence/codec/sense.h"
#include "blkfence/testing/sim_commands.h"
#include "blkfence/testing/sim_target.h"

namespace blkfence::transport::test {

using codec::PrInAction;
using codec::PrType;
using codec::SenseKey;
using std::chrono::milliseconds;

constexpr std::uint64_t kKeyA = 0x4c494f0000000001ULL;
constexpr std::uint64_t kKeyB = 0x4c494f0000000002ULL;
constexpr std::uint64_t kKeyC = 0x4c494f0000000003ULL;
constexpr std::uint64_t kKeyD = 0x4c494f0000000004ULL;

// Node A has two paths (multipath), B and C one each; the stranger never registers; the observer
// only reads state (unit attentions go to registrants, so it never has one pending).
constexpr NexusId kA1 = 1;
constexpr NexusId kA2 = 2;
constexpr NexusId kB = 3;
constexpr NexusId kC = 4;
constexpr NexusId kStranger = 8;
constexpr NexusId kObserver = 9;

constexpr std::uint8_t kGood = 0x00;
constexpr std::uint8_t kCheckCondition = 0x02;
constexpr std::uint8_t kReservationConflict = 0x18;
constexpr std::uint8_t kTaskAborted = 0x40;

constexpr PrType kAllTypes[] = {
    PrType::kWriteExclusive,
    PrType::kExclusiveAccess,
    PrType::kWriteExclusiveRegistrantsOnly,
    PrType::kExclusiveAccessRegistrantsOnly,
    PrType::kWriteExclusiveAllRegistrants,
    PrType::kExclusiveAccessAllRegistrants,
};

inline ::testing::AssertionResult is_good(const SimAnswer& answer) {
  if (answer.status == kGood) {
    return ::testing::AssertionSuccess();
  }
  const codec::Sense sense = codec::decode_sense(answer.sense);
  return ::testing::AssertionFailure()
         << "status 0x" << std::hex << int{answer.status} << ", sense key 0x"
         << int{static_cast<std::uint8_t>(sense.sense_key)} << " " << int{sense.asc} << "/"
         << int{sense.ascq};
}

inline ::testing::AssertionResult is_conflict(const SimAnswer& answer) {
  if (answer.status == kReservationConflict && answer.sense.empty()) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << "status 0x" << std::hex << int{answer.status};
}

// CHECK CONDITION with fixed-format sense of this key and ASC/ASCQ.
inline ::testing::AssertionResult is_sense(const SimAnswer& answer, SenseKey key, std::uint8_t asc,
                                           std::uint8_t ascq) {
  const codec::Sense sense = codec::decode_sense(answer.sense);
  if (answer.status == kCheckCondition && sense.format == codec::SenseFormat::kFixed &&
      !sense.truncated && sense.sense_key == key && sense.asc == asc && sense.ascq == ascq) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure()
         << "status 0x" << std::hex << int{answer.status} << ", sense key 0x"
         << int{static_cast<std::uint8_t>(sense.sense_key)} << " " << int{sense.asc} << "/"
         << int{sense.ascq};
}

inline ::testing::AssertionResult is_unit_attention(const SimAnswer& answer, UnitAttention ua) {
  return is_sense(answer, SenseKey::kUnitAttention, ua.asc, ua.ascq);
}

class SimTargetTest : public ::testing::Test {
 protected:
  SimAnswer run(NexusId nexus, const Command& command) {
    return target.execute(lu, nexus, command);
  }
  SimAnswer prout(NexusId nexus, const codec::PrOutCommand& command) {
    return run(nexus, prout_command(command));
  }
  SimAnswer register_key(NexusId nexus, std::uint64_t key) {
    return prout(nexus, codec::prout_register_and_ignore(key));
  }
  SimAnswer reserve(NexusId nexus, std::uint64_t key, PrType type) {
    return prout(nexus, codec::prout_reserve(key, type));
  }

  codec::ReadKeys read_keys(NexusId nexus = kObserver) {
    const SimAnswer answer = run(nexus, prin_command(PrInAction::kReadKeys));
    EXPECT_TRUE(is_good(answer));
    auto keys = codec::decode_read_keys(answer.data_in);
    EXPECT_TRUE(keys.has_value());
    return keys.value_or(codec::ReadKeys{});
  }
  std::optional<codec::Reservation> read_reservation(NexusId nexus = kObserver) {
    const SimAnswer answer = run(nexus, prin_command(PrInAction::kReadReservation));
    EXPECT_TRUE(is_good(answer));
    auto reservation = codec::decode_read_reservation(answer.data_in);
    EXPECT_TRUE(reservation.has_value() && !reservation->truncated);
    return reservation ? reservation->reservation : std::nullopt;
  }
  std::uint32_t generation() { return read_keys().generation; }
  std::vector<std::uint64_t> keys() { return read_keys().keys; }

  // A holds the reservation of type through kA1; A2 is A's second path; B and C are registered.
  void set_up_holder(PrType type) {
    ASSERT_TRUE(is_good(register_key(kA1, kKeyA)));
    ASSERT_TRUE(is_good(register_key(kA2, kKeyA)));
    ASSERT_TRUE(is_good(register_key(kB, kKeyB)));
    ASSERT_TRUE(is_good(register_key(kC, kKeyC)));
    ASSERT_TRUE(is_good(reserve(kA1, kKeyA, type)));
  }

  SimClock clock;
  SimTarget target{clock};
  LuId lu = target.add_lu();
};

}  // namespace blkfence::transport::test
