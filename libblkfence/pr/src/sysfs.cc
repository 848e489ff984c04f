// Reading sysfs (pr layer). See sysfs.h. Thread-safe.
#include "sysfs.h"

#include <algorithm>
#include <cstdio>
#include <system_error>

namespace blkfence::pr::sysfs {

namespace fs = std::filesystem;

std::string read_file(const fs::path& path) {
  std::string bytes;
  std::FILE* file = std::fopen(path.c_str(), "rbe");  // e: O_CLOEXEC
  if (file == nullptr) {
    return bytes;
  }
  char chunk[4096];
  std::size_t n = 0;
  while ((n = std::fread(chunk, 1, sizeof chunk, file)) > 0) {
    bytes.append(chunk, n);
  }
  (void)std::fclose(file);
  return bytes;
}

std::string read_text(const fs::path& path) {
  std::string text = read_file(path);
  while (!text.empty() && (text.back() == '\n' || text.back() == '\0' || text.back() == ' ')) {
    text.pop_back();
  }
  return text;
}

std::vector<std::string> list_dir(const fs::path& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace blkfence::pr::sysfs
