// Reading sysfs (pr layer, private to discovery.cc and multipath.cc). Thread-safe.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace blkfence::pr::sysfs {

// A small sysfs file, whole; empty when it cannot be read.
std::string read_file(const std::filesystem::path& path);

// The same without its trailing newlines, NULs and spaces.
std::string read_text(const std::filesystem::path& path);

// Entries of a sysfs directory, sorted; empty when it does not exist.
std::vector<std::string> list_dir(const std::filesystem::path& dir);

}  // namespace blkfence::pr::sysfs
