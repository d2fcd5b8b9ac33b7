// The built tparity's path, given to this file alone: the CLI tests' other files then compile the same
// in every build tree (build/ and build-debian/ share their objects through ccache).
#include "cli_support.hpp"

namespace clitest {

const std::string& tparity_bin() {
  static const std::string bin = TPARITY_BIN;
  return bin;
}

}  // namespace clitest
