// Proves the big-endian helpers put the most significant byte first at the given offset, round-trip
// every width, and refuse (by assertion) an access that would run past the buffer.
#include "blkfence/endian.h"

#include <array>

#include <gtest/gtest.h>

namespace blkfence {
namespace {

TEST(Endian, LoadsMostSignificantByteFirst) {
  const std::array<std::uint8_t, 10> buf{0xaa, 0x01, 0x02, 0x03, 0x04,
                                         0x05, 0x06, 0x07, 0x08, 0xbb};
  EXPECT_EQ(load_be16(buf, 1), 0x0102U);
  EXPECT_EQ(load_be32(buf, 1), 0x01020304U);
  EXPECT_EQ(load_be64(buf, 1), 0x0102030405060708ULL);
  EXPECT_EQ(load_be16(buf, 8), 0x08bbU);
}

TEST(Endian, StoresAtOffsetWithoutTouchingNeighbours) {
  std::array<std::uint8_t, 10> buf{};
  buf.fill(0xee);
  store_be64(buf, 1, 0x4c494f0000000002ULL);
  const std::array<std::uint8_t, 10> want{0xee, 0x4c, 0x49, 0x4f, 0x00,
                                          0x00, 0x00, 0x00, 0x02, 0xee};
  EXPECT_EQ(buf, want);
  store_be32(buf, 0, 0x00000018U);  // PR OUT parameter list length as sd.c writes it
  EXPECT_EQ(buf[3], 0x18);
  EXPECT_EQ(buf[0], 0x00);
  store_be16(buf, 8, 0x2000U);  // PR IN allocation length 8 KiB
  EXPECT_EQ(buf[8], 0x20);
  EXPECT_EQ(buf[9], 0x00);
}

TEST(Endian, RoundTripsExtremes) {
  std::array<std::uint8_t, 8> buf{};
  for (const std::uint64_t v : {0ULL, 1ULL, 0x8000000000000000ULL, ~0ULL}) {
    store_be64(buf, 0, v);
    EXPECT_EQ(load_be64(buf, 0), v);
  }
  for (const std::uint32_t v : {0U, 1U, 0x80000000U, ~0U}) {
    store_be32(buf, 4, v);
    EXPECT_EQ(load_be32(buf, 4), v);
  }
}

TEST(EndianDeathTest, AssertsOnOutOfBoundsAccess) {
  const std::array<std::uint8_t, 4> buf{};
  EXPECT_DEATH((void)load_be32(std::span(buf).subspan(1), 0), "assertion failed");
  EXPECT_DEATH((void)load_be16(buf, 3), "assertion failed");
  EXPECT_DEATH((void)load_be64(buf, 0), "assertion failed");
}

}  // namespace
}  // namespace blkfence
