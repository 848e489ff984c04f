// Fault injection for the file epoch store (fence layer, test-only): a temporary state directory
// and EpochFileCalls that fail one chosen system call with one errno, as a full disk (ENOSPC), a
// failing disk (EIO on fsync), or a read-only directory (EROFS, EACCES on create) would, without
// root or special mounts. The faults are shared with the test, which arms and clears them.
#pragma once

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>

#include <fcntl.h>
#include <gtest/gtest.h>

#include "blkfence/fence/epoch_store.h"

namespace blkfence::fence::test {

// A fresh directory under TMPDIR (or /tmp), removed with everything in it.
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string pattern = std::string(base ? base : "/tmp") + "/blkfence-epoch-XXXXXX";
    const char* made = ::mkdtemp(pattern.data());
    EXPECT_NE(made, nullptr);
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// The whole content of a file, or nullopt when it does not exist.
inline std::optional<std::string> slurp(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return std::nullopt;
  }
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

inline void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  out << text;
  ASSERT_TRUE(out.good()) << path;
}

// Which call fails, and with which errno; 0 is no fault.
struct EpochFaults {
  int create = 0;             // open(O_CREAT) of the temporary
  int write = 0;              // write(2) of the temporary
  bool short_writes = false;  // each write(2) takes one byte (a slow, not a full, disk)
  int fsync_file = 0;         // fsync(2) of the temporary
  int rename = 0;
  int fsync_dir = 0;      // fsync(2) of the directory
  int open_read = 0;      // open(O_RDONLY) of RESOURCE.epoch
  std::set<int> dir_fds;  // which descriptors are the directory's (to tell the two fsyncs apart)
};

inline EpochFileCalls faulty_calls(std::shared_ptr<EpochFaults> faults) {
  EpochFileCalls calls = EpochFileCalls::system();
  const EpochFileCalls real = EpochFileCalls::system();
  calls.open = [faults, real](const std::string& path, int flags, mode_t mode) {
    if ((flags & O_CREAT) != 0 && faults->create != 0) {
      return -faults->create;
    }
    if ((flags & O_ACCMODE) == O_RDONLY && (flags & O_DIRECTORY) == 0 && faults->open_read != 0) {
      return -faults->open_read;
    }
    const int fd = real.open(path, flags, mode);
    if (fd >= 0 && (flags & O_DIRECTORY) != 0) {
      faults->dir_fds.insert(fd);
    } else if (fd >= 0) {
      faults->dir_fds.erase(fd);
    }
    return fd;
  };
  calls.write = [faults, real](int fd, const void* buffer, std::size_t size) -> ssize_t {
    if (faults->write != 0) {
      return -faults->write;
    }
    return real.write(fd, buffer, faults->short_writes && size > 1 ? 1 : size);
  };
  calls.fsync = [faults, real](int fd) {
    const int injected = faults->dir_fds.count(fd) != 0 ? faults->fsync_dir : faults->fsync_file;
    return injected != 0 ? -injected : real.fsync(fd);
  };
  calls.rename = [faults, real](const std::string& from, const std::string& to) {
    return faults->rename != 0 ? -faults->rename : real.rename(from, to);
  };
  return calls;
}

}  // namespace blkfence::fence::test
