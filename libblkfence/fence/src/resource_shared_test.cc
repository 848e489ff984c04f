// Proves fence::Resource's shared mode (docs/protocol.md, "Shared mode") on the bench of
// resource_test_bench.h: both nodes unfence, and one fences the other.
#include <gtest/gtest.h>

#include "resource_test_bench.h"

namespace blkfence::fence::test {
namespace {

// Shared mode (fence_scsi style): each node's unfence registers epoch 0 on every path and the first
// reserves; both gates open. fence_node removes the other's key on every LU, and the fenced node's
// monitor closes its gate. Exclusive-only calls are refused.
TEST_F(ResourceTest, SharedModeUnfencesBothAndFencesOne) {
  a->boot(a->options(Mode::kShared));
  b->boot(b->options(Mode::kShared));
  Outcome* unfenced_a = a->unfence();
  ASSERT_TRUE(run_until([&] { return unfenced_a->done(); }));
  ASSERT_TRUE(unfenced_a->result->has_value()) << unfenced_a->result->error().message();
  Outcome* unfenced_b = b->unfence();
  ASSERT_TRUE(run_until([&] { return unfenced_b->done(); }));
  ASSERT_TRUE(unfenced_b->result->has_value()) << unfenced_b->result->error().message();
  const Key key_a = key_of(kNodeA, 0);
  const Key key_b = key_of(kNodeB, 0);
  EXPECT_EQ(**unfenced_a->result, key_a);
  EXPECT_EQ(**unfenced_b->result, key_b);
  for (std::size_t lu = 0; lu < kLus; ++lu) {
    EXPECT_EQ(keys_on(lu),
              (std::vector<std::uint64_t>{key_a.value(), key_a.value(), key_b.value()}));
    EXPECT_EQ(holder_of(lu), key_a.value()) << "the first to unfence reserves";
  }
  EXPECT_TRUE(a->resource->gate_open());
  EXPECT_TRUE(b->resource->gate_open());
  EXPECT_EQ(a->resource->state(), State::kUnfenced);
  EXPECT_EQ(b->resource->state(), State::kUnfenced);

  Outcome* refused = a->acquire();
  ASSERT_TRUE(refused->done());
  EXPECT_EQ(refused->result->error().code(), ErrorCode::kInvalidArgument);
  Outcome* self = a->fence_node(kNodeA);
  ASSERT_TRUE(self->done());
  EXPECT_EQ(self->result->error().code(), ErrorCode::kInvalidArgument);

  Outcome* fenced = a->fence_node(kNodeB);
  ASSERT_TRUE(run_until([&] { return fenced->done(); }));
  ASSERT_TRUE(fenced->result->has_value()) << fenced->result->error().message();
  for (std::size_t lu = 0; lu < kLus; ++lu) {
    EXPECT_EQ(keys_on(lu), (std::vector<std::uint64_t>{key_a.value(), key_a.value()}));
  }
  ASSERT_TRUE(a->recorder.last(EventKind::kFencedNode).has_value());
  EXPECT_EQ(a->recorder.last(EventKind::kFencedNode)->second.other_key, key_b.value());
  ASSERT_TRUE(run_until([&] { return b->resource->state() == State::kFenced; },
                        kCheckInterval + 4 * kLatencyMax));
  EXPECT_FALSE(b->resource->gate_open());
  EXPECT_TRUE(a->resource->gate_open());
}

}  // namespace
}  // namespace blkfence::fence::test
