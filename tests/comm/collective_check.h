// What the multi-rank communicator suites (gloo_communicator_test.cc,
// nccl_communicator_test.cc) check the same way on every backend: reference values for every
// collective and dtype, the host buffers that hold them, and the check that a failed
// collective breaks its communicator.
//   - CollectiveRound: one (dtype, count) round of the collectives check. Its host buffers are
//     laid out for all_gather (also in place), reduce_scatter and all_reduce (sum and max) and
//     broadcast from the last rank; the inputs hold small integers, so sums over a few ranks
//     are exact in every dtype and expect_results() compares exactly.
//   - expect_comm_error: runs a body that must fail with a CommError and prints what the
//     launching test looks for (COMM_ERROR[...], BROKEN_AT_ONCE).
//
// Thread safety: none; each rank uses these from its test thread.
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "zero/comm/communicator.h"

namespace zinf::zero::comm_test {

// The value of environment variable `name`, or `fallback` when it is unset or empty.
inline std::string env_or(const char* name, const std::string& fallback) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? std::string(value) : fallback;
}

// A small integer in [-8, 8] for (rank, index, salt): sums over a few ranks stay exact in
// every dtype, so results compare exactly.
inline int64_t small_value(uint64_t seed, int rank, size_t index, uint64_t salt) {
  uint64_t x = seed ^ (static_cast<uint64_t>(rank) * 0x9E3779B97F4A7C15ull) ^
               (static_cast<uint64_t>(index) * 0xBF58476D1CE4E5B9ull) ^ (salt << 32);
  x ^= x >> 31;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 29;
  return static_cast<int64_t>(x % 17) - 8;
}

// A typed flat host buffer holding small integers.
class HostBuffer {
 public:
  HostBuffer(DType dtype, size_t count) : dtype_(dtype), bytes_(count * dtype_size(dtype)) {}

  void* data() { return bytes_.data(); }
  size_t size_bytes() const { return bytes_.size(); }
  size_t count() const { return bytes_.size() / dtype_size(dtype_); }

  void set(size_t i, int64_t v) {
    unsigned char* p = bytes_.data() + i * dtype_size(dtype_);
    switch (dtype_) {
      case DType::kFloat32: {
        const float f = static_cast<float>(v);
        std::memcpy(p, &f, sizeof(f));
        break;
      }
      case DType::kFloat64: {
        const double d = static_cast<double>(v);
        std::memcpy(p, &d, sizeof(d));
        break;
      }
      case DType::kInt64:
        std::memcpy(p, &v, sizeof(v));
        break;
      case DType::kBFloat16: {
        const c10::BFloat16 b(static_cast<float>(v));
        std::memcpy(p, &b, sizeof(b));
        break;
      }
      case DType::kFloat16: {
        const c10::Half h(static_cast<float>(v));
        std::memcpy(p, &h, sizeof(h));
        break;
      }
    }
  }

  double get(size_t i) const {
    const unsigned char* p = bytes_.data() + i * dtype_size(dtype_);
    switch (dtype_) {
      case DType::kFloat32: {
        float f;
        std::memcpy(&f, p, sizeof(f));
        return f;
      }
      case DType::kFloat64: {
        double d;
        std::memcpy(&d, p, sizeof(d));
        return d;
      }
      case DType::kInt64: {
        int64_t v;
        std::memcpy(&v, p, sizeof(v));
        return static_cast<double>(v);
      }
      case DType::kBFloat16: {
        c10::BFloat16 b;
        std::memcpy(&b, p, sizeof(b));
        return static_cast<float>(b);
      }
      case DType::kFloat16: {
        c10::Half h;
        std::memcpy(&h, p, sizeof(h));
        return static_cast<float>(h);
      }
    }
    return 0;
  }

 private:
  DType dtype_;
  std::vector<unsigned char> bytes_;
};

// Compares `got` with `want(i)` element by element; reports the first few differences.
template <typename Want>
void expect_values(const HostBuffer& got, Want want, const std::string& what) {
  int reported = 0;
  for (size_t i = 0; i < got.count() && reported < 5; ++i) {
    if (got.get(i) != want(i)) {
      ADD_FAILURE() << what << ": element " << i << " is " << got.get(i) << ", expected "
                    << want(i);
      ++reported;
    }
  }
}

// One round of the collectives check for `count` elements of `dtype` per rank: the
// constructor fills this rank's inputs; after the backend ran the collectives on (copies of)
// these buffers, expect_results() checks the outputs against the reference.
class CollectiveRound {
 public:
  CollectiveRound(uint64_t seed, uint64_t salt, int rank, int world, DType dtype, size_t count)
      : gather_send(dtype, count),
        gather_recv(dtype, count * static_cast<size_t>(world)),
        in_place(dtype, count * static_cast<size_t>(world)),
        scatter_send(dtype, count * static_cast<size_t>(world)),
        scatter_sum(dtype, count),
        scatter_max(dtype, count),
        reduce_sum(dtype, count),
        reduce_max(dtype, count),
        bcast(dtype, count),
        seed_(seed),
        salt_(salt),
        rank_(rank),
        world_(world),
        dtype_(dtype),
        count_(count) {
    for (size_t i = 0; i < count; ++i) {
      gather_send.set(i, value(rank, i, 0));
      in_place.set(static_cast<size_t>(rank) * count + i, value(rank, i, 1));
      reduce_sum.set(i, value(rank, i, 3));
      reduce_max.set(i, value(rank, i, 4));
      bcast.set(i, value(rank, i, 5));
    }
    for (size_t i = 0; i < count * static_cast<size_t>(world); ++i) {
      scatter_send.set(i, value(rank, i, 2));
    }
  }

  // The send pointer of the in-place all_gather: this rank's slice of `recv`.
  void* in_place_send(void* recv) const {
    return static_cast<char*>(recv) + static_cast<size_t>(rank_) * count_ * dtype_size(dtype_);
  }

  void expect_results() const {
    const size_t count = count_;
    expect_values(
        gather_recv,
        [&](size_t i) {
          return static_cast<double>(value(static_cast<int>(i / count), i % count, 0));
        },
        "all_gather");
    expect_values(
        in_place,
        [&](size_t i) {
          return static_cast<double>(value(static_cast<int>(i / count), i % count, 1));
        },
        "in-place all_gather");
    const size_t mine = static_cast<size_t>(rank_) * count;
    expect_values(
        scatter_sum, [&](size_t i) { return sum_over_ranks(mine + i, 2); }, "reduce_scatter sum");
    expect_values(
        scatter_max, [&](size_t i) { return max_over_ranks(mine + i, 2); }, "reduce_scatter max");
    expect_values(
        reduce_sum, [&](size_t i) { return sum_over_ranks(i, 3); }, "all_reduce sum");
    expect_values(
        reduce_max, [&](size_t i) { return max_over_ranks(i, 4); }, "all_reduce max");
    expect_values(
        bcast, [&](size_t i) { return static_cast<double>(value(world_ - 1, i, 5)); }, "broadcast");
  }

  HostBuffer gather_send;   // count: all_gather's send
  HostBuffer gather_recv;   // count * world: all_gather's recv
  HostBuffer in_place;      // count * world: in-place all_gather (send is this rank's slice)
  HostBuffer scatter_send;  // count * world: both reduce_scatters' send
  HostBuffer scatter_sum;   // count: reduce_scatter (sum)'s recv
  HostBuffer scatter_max;   // count: reduce_scatter (max)'s recv
  HostBuffer reduce_sum;    // count: all_reduce (sum), in place
  HostBuffer reduce_max;    // count: all_reduce (max), in place
  HostBuffer bcast;         // count: broadcast from rank world - 1, in place

 private:
  // Rank r's input for element i of buffer k.
  int64_t value(int r, size_t i, uint64_t k) const { return small_value(seed_, r, i, salt_ + k); }
  double sum_over_ranks(size_t i, uint64_t k) const {
    int64_t s = 0;
    for (int r = 0; r < world_; ++r) {
      s += value(r, i, k);
    }
    return static_cast<double>(s);
  }
  double max_over_ranks(size_t i, uint64_t k) const {
    int64_t m = value(0, i, k);
    for (int r = 1; r < world_; ++r) {
      m = std::max(m, value(r, i, k));
    }
    return static_cast<double>(m);
  }

  const uint64_t seed_;
  const uint64_t salt_;
  const int rank_;
  const int world_;
  const DType dtype_;
  const size_t count_;
};

// Runs `body`, which must fail with a CommError; prints it for the launching test
// ("COMM_ERROR[...] after N ms"), prints BROKEN_AT_ONCE when the broken communicator refuses
// the next call within 100 ms, then fails the test.
template <typename Body>
void expect_comm_error(Communicator& comm, Body body) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  try {
    body();
    ADD_FAILURE() << "no CommError";
  } catch (const CommError& e) {
    std::cout << "COMM_ERROR[" << e.what() << "] after "
              << std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count()
              << " ms" << std::endl;
    const Clock::time_point again = Clock::now();
    try {
      comm.barrier()->wait();
    } catch (const CommError& later) {
      const auto ms =
          std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - again).count();
      if (ms < 100 && std::string(later.what()).find("broken") != std::string::npos) {
        std::cout << "BROKEN_AT_ONCE" << std::endl;
      }
    }
    FAIL() << e.what();
  }
}

}  // namespace zinf::zero::comm_test
