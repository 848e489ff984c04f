// Proves the key layout of docs/design.md §2 (cluster:16 | node:16 | epoch:32, big-endian on the
// wire), that the cluster id derivation is stable, and that parsing accepts what users type and
// rejects what is not a key (0, overlong, non-hex, node id 0).
#include "blkfence/key.h"

#include <array>

#include <gtest/gtest.h>

namespace blkfence::fence {
namespace {

TEST(Key, PacksFieldsClusterNodeEpoch) {
  const auto key = Key::make(0x6c9d, 0x0001, 0x00000007);
  ASSERT_TRUE(key.has_value());
  EXPECT_EQ(key->value(), 0x6c9d000100000007ULL);
  EXPECT_EQ(key->cluster_id(), 0x6c9d);
  EXPECT_EQ(key->node_id(), 1);
  EXPECT_EQ(key->epoch(), 7U);
  EXPECT_EQ(key->to_string(), "0x6c9d000100000007");
}

TEST(Key, WireFormatIsBigEndian) {
  const auto key = Key::make(0x0102, 0x0304, 0x05060708);
  ASSERT_TRUE(key.has_value());
  std::array<std::uint8_t, 8> wire{};
  key->to_wire(wire);
  EXPECT_EQ(wire, (std::array<std::uint8_t, 8>{1, 2, 3, 4, 5, 6, 7, 8}));
  const auto back = Key::from_wire(wire);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(*back, *key);
}

TEST(Key, RejectsNodeZeroAndKeyZero) {
  EXPECT_EQ(Key::make(1, 0, 1).error().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(Key::from_value(0).error().code(), ErrorCode::kInvalidArgument);
  const std::array<std::uint8_t, 8> zero{};
  EXPECT_FALSE(Key::from_wire(zero).has_value());
  const std::array<std::uint8_t, 7> short_wire{};
  EXPECT_FALSE(Key::from_wire(short_wire).has_value());
}

TEST(Key, EpochOrdersKeysOfOneNode) {
  const auto older = Key::make(7, 2, 41);
  const auto newer = Key::make(7, 2, 42);
  ASSERT_TRUE(older && newer);
  EXPECT_LT(*older, *newer);
}

TEST(Key, ParsesHexWithAndWithoutPrefix) {
  for (const char* text : {"0x6c9d000100000007", "6c9d000100000007", "0X6C9D000100000007"}) {
    const auto key = Key::parse(text);
    ASSERT_TRUE(key.has_value()) << text;
    EXPECT_EQ(key->value(), 0x6c9d000100000007ULL) << text;
  }
  const auto short_key = Key::parse("abc");
  ASSERT_TRUE(short_key.has_value());
  EXPECT_EQ(short_key->value(), 0xabcULL);
}

TEST(Key, ParseRejectsWhatIsNotAKey) {
  for (const char* text : {"", "0x", "0", "0x0000000000000000", "12345678901234567", "0xg1", "-1",
                           " 1", "1 ", "+1", "0x0x1"}) {
    const auto key = Key::parse(text);
    ASSERT_FALSE(key.has_value()) << text;
    EXPECT_EQ(key.error().code(), ErrorCode::kInvalidArgument) << text;
    EXPECT_NE(key.error().where().find(text), std::string::npos) << key.error().message();
  }
}

TEST(ClusterId, IsStableFnv1aFolded) {
  // FNV-1a("") = 0x811c9dc5 -> 0x811c ^ 0x9dc5; FNV-1a("a") = 0xe40c292c -> 0xe40c ^ 0x292c.
  EXPECT_EQ(cluster_id_from_name(""), 0x811c ^ 0x9dc5);
  EXPECT_EQ(cluster_id_from_name("a"), 0xe40c ^ 0x292c);
  EXPECT_NE(cluster_id_from_name("pg-east"), cluster_id_from_name("pg-west"));
}

}  // namespace
}  // namespace blkfence::fence
