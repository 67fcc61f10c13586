// What bench/deepspeed's C++ workers share: each is a child process of a Python driver,
// reports on one JSON line on stdout, and fails with one line on stderr and exit code 1.
// Single-threaded use (the worker's main thread).
#pragma once

#include <cstdio>
#include <exception>
#include <vector>

namespace zinf::bench {

// Prints `"key": [v, ...]}` and a newline, `decimals` digits after the point: the last
// member of a worker's JSON line, whose start the caller has printed.
inline void print_json_list_and_close(const char* key, const std::vector<double>& values,
                                      int decimals) {
  std::printf("\"%s\": [", key);
  for (std::size_t i = 0; i < values.size(); ++i) {
    std::printf("%s%.*f", i ? ", " : "", decimals, values[i]);
  }
  std::printf("]}\n");
}

// Returns run(parse(argc, argv)); an exception from either becomes "<name>: <what>" on stderr
// and exit code 1.
template <class Parse, class Run>
int worker_main(const char* name, int argc, char** argv, Parse parse, Run run) {
  try {
    return run(parse(argc, argv));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", name, e.what());
    return 1;
  }
}

}  // namespace zinf::bench
