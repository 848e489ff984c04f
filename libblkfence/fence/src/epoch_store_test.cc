// The file epoch store under every fault its persistence path can meet (S3, docs/protocol.md): a
// full disk, a failing fsync of the file or of the directory, a read-only directory, a truncated,
// empty or missing file. Each error names the path and the operation, and a failed store leaves
// the old value readable (the temporary-and-rename protocol). Faults are injected through
// EpochFileCalls, so the tests need neither root nor special mounts.
#include "blkfence/fence/epoch_store.h"

#include <cerrno>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "epoch_faults.h"

namespace blkfence::fence::test {
namespace {

StoredEpochs same(std::uint32_t epoch) {
  return StoredEpochs{.used = epoch, .seen = epoch};
}

class EpochStoreTest : public ::testing::Test {
 protected:
  EpochStoreTest()
      : faults(std::make_shared<EpochFaults>()),
        store(make_file_epoch_store(dir.path(), faulty_calls(faults))) {}

  std::string path() const { return dir.file("pgdata.epoch"); }

  // Stores 41 without faults, then arms the fault and stores 42: the store fails naming the path
  // and the operation, and 41 is still what the file holds and what load() returns.
  void expect_store_fails_keeping_the_old_value(const std::function<void(EpochFaults&)>& arm,
                                                const std::string& operation,
                                                const std::string& failed_path, int error) {
    ASSERT_TRUE(store->store("pgdata", same(41)).has_value());
    arm(*faults);
    const auto stored = store->store("pgdata", same(42));
    ASSERT_FALSE(stored.has_value());
    EXPECT_EQ(stored.error().code(), ErrorCode::kOs);
    EXPECT_EQ(stored.error().errno_value(), error);
    const std::string message = stored.error().message();
    EXPECT_NE(message.find(operation + " " + failed_path), std::string::npos) << message;
    EXPECT_EQ(slurp(path()), "41\n");
    EXPECT_EQ(slurp(path() + ".new"), std::nullopt) << "the temporary is removed";
    *faults = EpochFaults{};
    const auto loaded = store->load("pgdata");
    ASSERT_TRUE(loaded.has_value()) << loaded.error().message();
    EXPECT_EQ(*loaded, same(41));
  }

  TempDir dir;
  std::shared_ptr<EpochFaults> faults;
  std::unique_ptr<EpochStore> store;
};

TEST_F(EpochStoreTest, StoresAndLoadsDecimalWithANewline) {
  ASSERT_TRUE(store->store("pgdata", same(4294967295U)).has_value());
  EXPECT_EQ(slurp(path()), "4294967295\n");
  EXPECT_EQ(store->load("pgdata").value(), same(4294967295U));
  EXPECT_EQ(store->where("pgdata"), path());
}

// Used and seen apart are two numbers; equal, one (the format earlier releases wrote and read).
TEST_F(EpochStoreTest, UsedAndSeenApartAreTwoNumbers) {
  ASSERT_TRUE(store->store("pgdata", StoredEpochs{.used = 7, .seen = 12}).has_value());
  EXPECT_EQ(slurp(path()), "7 12\n");
  EXPECT_EQ(store->load("pgdata").value(), (StoredEpochs{.used = 7, .seen = 12}));
  ASSERT_TRUE(store->store("pgdata", same(12)).has_value());
  EXPECT_EQ(slurp(path()), "12\n");
}

// A REGISTER whose outcome is not known yet is a word after the two numbers, even when they are
// equal, and goes away with the next store that clears it.
TEST_F(EpochStoreTest, ARegisterUnderWayIsAWordAfterTwoNumbers) {
  ASSERT_TRUE(
      store->store("pgdata", StoredEpochs{.used = 9, .seen = 9, .registering = true}).has_value());
  EXPECT_EQ(slurp(path()), "9 9 registering\n");
  EXPECT_EQ(store->load("pgdata").value(),
            (StoredEpochs{.used = 9, .seen = 9, .registering = true}));
  ASSERT_TRUE(store->store("pgdata", same(9)).has_value());
  EXPECT_EQ(slurp(path()), "9\n");
  EXPECT_FALSE(store->load("pgdata").value()->registering);
}

// A short write is a slow disk, not a failure: the store finishes the line.
TEST_F(EpochStoreTest, ShortWritesAreCompleted) {
  faults->short_writes = true;
  ASSERT_TRUE(store->store("pgdata", same(123456)).has_value());
  EXPECT_EQ(slurp(path()), "123456\n");
}

// No file is not an epoch of 0: the caller must see the difference (docs/protocol.md, S3).
TEST_F(EpochStoreTest, AMissingFileIsNotZero) {
  const auto loaded = store->load("pgdata");
  ASSERT_TRUE(loaded.has_value());
  EXPECT_EQ(*loaded, std::nullopt);
  ASSERT_TRUE(store->store("pgdata", same(0)).has_value());
  EXPECT_EQ(store->load("pgdata").value(), same(0));
}

TEST_F(EpochStoreTest, FullDiskOnWrite) {
  expect_store_fails_keeping_the_old_value([](EpochFaults& f) { f.write = ENOSPC; }, "write",
                                           path() + ".new", ENOSPC);
}

TEST_F(EpochStoreTest, EioOnFsyncOfTheFile) {
  expect_store_fails_keeping_the_old_value([](EpochFaults& f) { f.fsync_file = EIO; }, "fsync",
                                           path() + ".new", EIO);
}

TEST_F(EpochStoreTest, ReadOnlyDirectoryOnCreate) {
  expect_store_fails_keeping_the_old_value([](EpochFaults& f) { f.create = EROFS; }, "create",
                                           path() + ".new", EROFS);
}

TEST_F(EpochStoreTest, PermissionDeniedOnCreate) {
  expect_store_fails_keeping_the_old_value([](EpochFaults& f) { f.create = EACCES; }, "create",
                                           path() + ".new", EACCES);
}

TEST_F(EpochStoreTest, RenameFails) {
  expect_store_fails_keeping_the_old_value([](EpochFaults& f) { f.rename = EIO; }, "rename",
                                           path() + ".new", EIO);
}

// The directory's fsync comes after the rename: the new value is in place but may not survive a
// crash, so the store fails and the caller must not use the epoch. Either value is safe to read
// afterwards (42 was never used; S3 only needs the stored value not to go down).
TEST_F(EpochStoreTest, EioOnFsyncOfTheDirectory) {
  ASSERT_TRUE(store->store("pgdata", same(41)).has_value());
  faults->fsync_dir = EIO;
  const auto stored = store->store("pgdata", same(42));
  ASSERT_FALSE(stored.has_value());
  EXPECT_EQ(stored.error().errno_value(), EIO);
  EXPECT_NE(stored.error().message().find("fsync directory " + dir.path()), std::string::npos)
      << stored.error().message();
  const auto loaded = store->load("pgdata");
  ASSERT_TRUE(loaded.has_value());
  EXPECT_TRUE(*loaded == same(41) || *loaded == same(42));
}

TEST_F(EpochStoreTest, AnUnreadableFileNamesItself) {
  ASSERT_TRUE(store->store("pgdata", same(5)).has_value());
  faults->open_read = EACCES;
  const auto loaded = store->load("pgdata");
  ASSERT_FALSE(loaded.has_value());
  EXPECT_EQ(loaded.error().errno_value(), EACCES);
  EXPECT_NE(loaded.error().message().find("open " + path()), std::string::npos);
}

// A truncated or garbage file is an error naming the file and what to do, never a number.
TEST_F(EpochStoreTest, TruncatedEmptyOrGarbageFilesAreErrors) {
  for (const std::string& text :
       std::vector<std::string>{"", "\n", "12a\n", "-1\n", "4294967296\n", "0x10\n", "7 \n",
                                "7  8\n", "8 7\n", "1 2 3\n", "7 registering\n",
                                "7 8 registering 1\n", "7 8registering\n", std::string(60, '9')}) {
    write_file(path(), text);
    const auto loaded = store->load("pgdata");
    ASSERT_FALSE(loaded.has_value()) << "'" << text << "' read as a number";
    EXPECT_EQ(loaded.error().code(), ErrorCode::kInvalidArgument);
    const std::string message = loaded.error().message();
    EXPECT_NE(message.find(path()), std::string::npos) << message;
    EXPECT_NE(message.find("remove it while the LUs still carry"), std::string::npos) << message;
  }
  write_file(path(), "17");  // no newline: an older writer, still a number
  EXPECT_EQ(store->load("pgdata").value(), same(17));
}

}  // namespace
}  // namespace blkfence::fence::test
