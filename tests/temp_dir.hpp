// A test's temporary folder: a new one from mkdtemp (nothing an earlier run left in it, no name a
// stranger could plant a link at), removed with its contents when the object goes, whatever the test
// did (a process killed by a signal still leaves it).
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <stdexcept>
#include <string>
#include <system_error>

namespace testutil {

struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& prefix) {
    std::string tmpl = (std::filesystem::temp_directory_path() / (prefix + "XXXXXX")).string();
    if (!::mkdtemp(tmpl.data())) throw std::runtime_error("cannot create a temporary folder " + tmpl);
    path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;  // a destructor must not throw
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
};

}  // namespace testutil
