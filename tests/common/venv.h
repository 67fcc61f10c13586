// venv_missing: whether the project's virtual environment (.venv/, made by
// scripts/install-venv.sh) can run a test that needs some of its Python modules. Tests of
// label "deepspeed" skip with the returned reason where it cannot.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>

namespace zinf::testing {

// "" when `python` (.venv/bin/python) exists and imports `modules` ("deepspeed, transformers");
// otherwise why not. DeepSpeed is imported with DS_ACCELERATOR=cpu, as the tests run it.
inline std::string venv_missing(const std::string& python, const std::string& modules) {
  if (!std::filesystem::exists(python)) {
    return python + " is absent: make it with scripts/install-venv.sh";
  }
  const std::string probe =
      "DS_ACCELERATOR=cpu '" + python + "' -c 'import " + modules + "' > /dev/null 2>&1";
  if (std::system(probe.c_str()) != 0) {
    return python + " cannot import " + modules +
           " (made with --torch-only?): run scripts/install-venv.sh";
  }
  return "";
}

}  // namespace zinf::testing
