// ParamCoordinator on synthetic traces, with a fake ParamFetcher that records every call and
// checks the coordinator's promises at each one: levels in order, the live limit never
// exceeded, a block's parameters usable when enter() returns.

#include "zero/param_coordinator.h"

#include <gtest/gtest.h>
#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "tests/common/seed.h"
#include "zero/error.h"

namespace zinf::zero {
namespace {

struct Event {
  char kind;  // 'r' read, 'c' copy, 'g' gather, 'w' wait, 'x' release
  size_t param;
};

class FakeFetcher : public ParamFetcher {
 public:
  FakeFetcher(std::vector<uint64_t> numels, std::vector<bool> persistent, uint64_t max_live)
      : numels_(std::move(numels)), persistent_(std::move(persistent)), max_live_(max_live) {
    level_.assign(numels_.size(), 0);
    waited_.assign(numels_.size(), false);
  }

  // Busy for `cost` of wall time (a slow fetch step, not a wait for other threads).
  static void spend(std::chrono::microseconds cost) {
    const auto until = std::chrono::steady_clock::now() + cost;
    while (std::chrono::steady_clock::now() < until) {
    }
  }

  bool start_read(size_t p) override {
    record('r', p);
    EXPECT_EQ(level_[p], 0) << "read of param " << p << " twice";
    if (reads_left_ == 0) {
      return false;
    }
    if (reads_left_ > 0) {
      --reads_left_;
    }
    level_[p] = 1;
    return true;
  }
  void start_copy(size_t p) override {
    record('c', p);
    EXPECT_LE(level_[p], 1) << "copy of param " << p << " out of order";
    level_[p] = 2;
  }
  void start_gather(size_t p) override {
    record('g', p);
    spend(gather_cost_);
    EXPECT_EQ(level_[p], 2) << "gather of param " << p << " before its copy";
    level_[p] = 3;
    ++gathers_[p];
    gathered_ += numels_[p];
    gathered_high_water_ = std::max(gathered_high_water_, gathered_);
    if (!persistent_[p]) {
      live_ += numels_[p];
      high_water_ = std::max(high_water_, live_);
      EXPECT_LE(live_, max_live_) << "live limit exceeded by the gather of param " << p;
    }
  }
  void wait_gathered(size_t p) override {
    record('w', p);
    spend(wait_cost_);
    EXPECT_EQ(level_[p], 3) << "wait for param " << p << " that was not gathered";
    waited_[p] = true;
  }
  void release(size_t p) override {
    record('x', p);
    EXPECT_GT(level_[p], 0) << "release of param " << p << " that holds nothing";
    if (level_[p] == 3) {
      gathered_ -= numels_[p];
      if (!persistent_[p]) {
        live_ -= numels_[p];
      }
    }
    level_[p] = 0;
    waited_[p] = false;
  }

  // The block's params are gathered and waited for (checked after enter()).
  void expect_usable(const std::vector<size_t>& params) const {
    for (size_t p : params) {
      EXPECT_EQ(level_[p], 3) << "param " << p << " not gathered after enter()";
      EXPECT_TRUE(waited_[p]) << "param " << p << " not waited for after enter()";
    }
  }

  std::vector<Event> events;
  std::vector<int> level_;  // 0 none, 1 read, 2 copied, 3 gathered
  std::map<size_t, int> gathers_;
  uint64_t live_ = 0;
  uint64_t high_water_ = 0;
  uint64_t gathered_ = 0;  // persistent ones included
  uint64_t gathered_high_water_ = 0;
  long reads_left_ = -1;                      // -1: unlimited pinned buffers
  std::chrono::microseconds gather_cost_{0};  // spent in each start_gather
  std::chrono::microseconds wait_cost_{0};    // spent in each wait_gathered

 private:
  void record(char kind, size_t p) { events.push_back({kind, p}); }

  std::vector<uint64_t> numels_;
  std::vector<bool> persistent_;
  uint64_t max_live_;
  std::vector<bool> waited_;
};

// A model of `blocks` blocks with `per_block` params each (param ids consecutive), sizes
// from `sizes` cycled.
struct Model {
  std::vector<uint64_t> numels;
  std::vector<std::vector<size_t>> blocks;
  std::vector<bool> persistent;

  Model(size_t block_count, size_t per_block, std::vector<uint64_t> sizes) {
    for (size_t b = 0; b < block_count; ++b) {
      blocks.emplace_back();
      for (size_t k = 0; k < per_block; ++k) {
        blocks.back().push_back(numels.size());
        numels.push_back(sizes[numels.size() % sizes.size()]);
      }
    }
    persistent.assign(numels.size(), false);
  }
  std::vector<size_t> forward_backward() const {
    std::vector<size_t> trace(blocks.size());
    std::iota(trace.begin(), trace.end(), 0);
    for (size_t b = blocks.size(); b-- > 0;) trace.push_back(b);
    return trace;
  }
};

void run_pass(ParamCoordinator& c, FakeFetcher& f, const Model& m,
              const std::vector<size_t>& trace) {
  c.begin_pass();
  for (size_t b : trace) {
    c.enter(b);
    f.expect_usable(m.blocks[b]);
    c.leave(b);
  }
  c.end_pass();
}

// The warnings spdlog's default logger emits during its lifetime.
class WarningLog {
 public:
  WarningLog()
      : previous_(spdlog::default_logger()),
        sink_(std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(64)) {
    spdlog::set_default_logger(std::make_shared<spdlog::logger>("warnings", sink_));
  }
  ~WarningLog() { spdlog::set_default_logger(previous_); }
  WarningLog(const WarningLog&) = delete;
  WarningLog& operator=(const WarningLog&) = delete;

  std::vector<std::string> warnings() const {
    std::vector<std::string> found;
    for (const spdlog::details::log_msg_buffer& m : sink_->last_raw()) {
      if (m.level == spdlog::level::warn) found.emplace_back(m.payload.begin(), m.payload.end());
    }
    return found;
  }

 private:
  std::shared_ptr<spdlog::logger> previous_;
  std::shared_ptr<spdlog::sinks::ringbuffer_sink_mt> sink_;
};

TEST(ParamCoordinator, FirstPassFetchesOnDemandAndReleasesEverything) {
  Model m(4, 2, {100});
  CoordinatorConfig config{300, 10'000, 0};
  FakeFetcher f(m.numels, m.persistent, config.max_live_parameters);
  ParamCoordinator c(config, m.numels, m.blocks, m.persistent, f);
  c.begin_pass();
  for (size_t b : m.forward_backward()) {
    const size_t before = f.events.size();
    c.enter(b);
    // Only this block's params were touched: no prefetch without a recorded trace.
    for (size_t i = before; i < f.events.size(); ++i) {
      EXPECT_NE(std::find(m.blocks[b].begin(), m.blocks[b].end(), f.events[i].param),
                m.blocks[b].end())
          << "param " << f.events[i].param << " touched while entering block " << b;
    }
    c.leave(b);
    EXPECT_EQ(f.live_, 0u) << "params kept after leaving block " << b << " in the first pass";
  }
  c.end_pass();
  EXPECT_EQ(c.stats().prefetched, 0u);
  EXPECT_EQ(c.stats().on_demand, 16u);  // 8 params, forward and backward
  EXPECT_EQ(c.recorded_trace(), m.forward_backward());
}

TEST(ParamCoordinator, ReplayPrefetchesTheNextBlocksInTraceOrderWithinTheBucket) {
  Model m(6, 2, {100});
  CoordinatorConfig config{250, 100'000, 0};  // reuse distance 0: only immediate reuse
  FakeFetcher f(m.numels, m.persistent, config.max_live_parameters);
  ParamCoordinator c(config, m.numels, m.blocks, m.persistent, f);
  const std::vector<size_t> trace = m.forward_backward();
  run_pass(c, f, m, trace);
  f.events.clear();
  c.begin_pass();
  c.enter(0);
  // Entering block 0 gathers its params, then prefetches ahead: gathers for elements < 250
  // ahead (block 1's two params and, crossing the bucket, block 2's first), copies for
  // < 500 ahead, reads for < 1000 ahead; reads first, then copies, then gathers.
  std::vector<size_t> read_ahead, copied_ahead, gathered_ahead;
  size_t last_read = 0, first_copy_ahead = SIZE_MAX, last_copy = 0, first_gather_ahead = SIZE_MAX;
  for (size_t i = 0; i < f.events.size(); ++i) {
    const Event& e = f.events[i];
    const bool ahead = e.param >= 2;
    if (!ahead) continue;
    if (e.kind == 'r') {
      last_read = i;
      read_ahead.push_back(e.param);
    }
    if (e.kind == 'c') {
      first_copy_ahead = std::min(first_copy_ahead, i);
      last_copy = i;
      copied_ahead.push_back(e.param);
    }
    if (e.kind == 'g') {
      first_gather_ahead = std::min(first_gather_ahead, i);
      gathered_ahead.push_back(e.param);
    }
  }
  // The amounts: each level covers the parameters that start within its window (4, 2 and
  // 1 buckets of 250 elements ahead), in trace order: blocks 1..5 are params 2..11.
  EXPECT_EQ(read_ahead, (std::vector<size_t>{2, 3, 4, 5, 6, 7, 8, 9, 10, 11}));
  EXPECT_EQ(copied_ahead, (std::vector<size_t>{2, 3, 4, 5, 6}));
  EXPECT_EQ(gathered_ahead, (std::vector<size_t>{2, 3, 4}));
  EXPECT_LT(last_read, first_copy_ahead) << "a copy ahead was issued before all reads ahead";
  EXPECT_LT(last_copy, first_gather_ahead) << "a gather ahead was issued before all copies";
  EXPECT_EQ(c.stats().prefetched, 3u);
  // Entering block 1 needs no new gather.
  const size_t gathers_before = c.stats().on_demand;
  c.leave(0);
  c.enter(1);
  EXPECT_EQ(c.stats().on_demand, gathers_before) << "block 1 was not prefetched";
  c.leave(1);
  for (size_t k = 2; k < trace.size(); ++k) {
    c.enter(trace[k]);
    f.expect_usable(m.blocks[trace[k]]);
    c.leave(trace[k]);
  }
  c.end_pass();
  EXPECT_EQ(f.live_, 0u);
}

// Blocks larger than the read window of 4 buckets: the reads ahead still cover the next two
// blocks of the trace (so each block's reads start two blocks before it runs), no further.
TEST(ParamCoordinator, ReadsAheadCoverTheNextTwoBlocksWhenTheBucketIsSmall) {
  Model m(5, 3, {100});
  CoordinatorConfig config{20, 100'000, 0};  // 4 buckets: 80 elements, less than one param
  FakeFetcher f(m.numels, m.persistent, config.max_live_parameters);
  ParamCoordinator c(config, m.numels, m.blocks, m.persistent, f);
  const std::vector<size_t> trace = m.forward_backward();
  run_pass(c, f, m, trace);
  for (size_t k = 0; k < 3; ++k) {  // enter blocks 0, 1, 2 of the replay
    if (k == 0) c.begin_pass();
    f.events.clear();
    c.enter(trace[k]);
    std::vector<size_t> read_ahead;
    for (const Event& e : f.events) {
      if (e.kind == 'r' && e.param >= 3 * (k + 1)) read_ahead.push_back(e.param);
    }
    // Entering block 0 reads blocks 1 and 2 (params 3..8); each later block adds the block
    // two ahead of it (its next one was read before).
    const std::vector<size_t> expected =
        k == 0 ? std::vector<size_t>{3, 4, 5, 6, 7, 8}
               : std::vector<size_t>{3 * (k + 2), 3 * (k + 2) + 1, 3 * (k + 2) + 2};
    EXPECT_EQ(read_ahead, expected) << "entering block " << k;
    c.leave(trace[k]);
  }
  for (size_t k = 3; k < trace.size(); ++k) {
    c.enter(trace[k]);
    f.expect_usable(m.blocks[trace[k]]);
    c.leave(trace[k]);
  }
  c.end_pass();
  EXPECT_EQ(f.live_, 0u);
}

// A random model (sizes, persistence, and with `ties` blocks that also use a parameter of
// another block) with a random config whose live limit fits its largest block, and a
// random pinned-buffer budget for reads ahead.
struct RandomCase {
  Model model;
  CoordinatorConfig config;
  long reads_left = -1;
};
RandomCase random_case(std::mt19937_64& rng, bool ties) {
  std::vector<uint64_t> sizes;
  for (int k = 0; k < 5; ++k) sizes.push_back(1 + rng() % 500);
  const size_t block_count = 2 + rng() % 8;
  const size_t per_block = 1 + rng() % 4;
  RandomCase r{Model(block_count, per_block, sizes), {}, -1};
  Model& m = r.model;
  for (auto& block : m.blocks) {
    if (ties && rng() % 3 == 0) block.push_back(rng() % m.numels.size());
  }
  for (size_t p = 0; p < m.persistent.size(); ++p) m.persistent[p] = rng() % 5 == 0;
  uint64_t biggest_block = 0;
  for (const auto& block : m.blocks) {
    std::vector<size_t> distinct;
    uint64_t total = 0;
    for (size_t p : block) {
      if (std::find(distinct.begin(), distinct.end(), p) != distinct.end()) continue;
      distinct.push_back(p);
      total += m.persistent[p] ? 0 : m.numels[p];
    }
    biggest_block = std::max(biggest_block, total);
  }
  r.config = CoordinatorConfig{rng() % 2000, biggest_block + rng() % 1500, rng() % 3000};
  if (rng() % 2 == 0) r.reads_left = static_cast<long>(rng() % 4);
  return r;
}

// The live limit holds at every gather, and every entered block's parameters are usable,
// on random models (every other one with tied parameters) over passes that keep the
// recorded trace or leave it: blocks skipped, repeated or reordered, passes cut short or
// made longer.
TEST(ParamCoordinator, LiveLimitHoldsAtEveryEventOnRandomModelsAndTraces) {
  WarningLog quiet;  // one trace-change warning per changed pass
  const uint64_t seed = testing::test_seed();
  ZINF_TRACE_SEED(seed);
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < 80; ++trial) {
    const RandomCase r = random_case(rng, /*ties=*/trial % 2 == 1);
    const Model& m = r.model;
    FakeFetcher f(m.numels, m.persistent, r.config.max_live_parameters);
    f.reads_left_ = r.reads_left;
    ParamCoordinator c(r.config, m.numels, m.blocks, m.persistent, f);
    std::vector<size_t> trace = m.forward_backward();
    uint64_t expected_changes = 0;
    for (int pass = 0; pass < 6; ++pass) {
      std::vector<size_t> next = trace;
      switch (pass == 0 ? 0 : rng() % 4) {
        case 0:  // the same order
          break;
        case 1:  // one entry replaced by another block
          next[rng() % next.size()] = rng() % m.blocks.size();
          break;
        case 2:  // cut short
          next.resize(1 + rng() % next.size());
          break;
        case 3:  // longer
          next.push_back(rng() % m.blocks.size());
          break;
      }
      if (pass > 0 && next != trace) ++expected_changes;
      run_pass(c, f, m, next);
      EXPECT_EQ(f.live_, 0u) << "non-persistent params left gathered after pass " << pass;
      if (HasFailure()) {
        FAIL() << "trial " << trial << " pass " << pass << " max_live "
               << r.config.max_live_parameters << " bucket " << r.config.prefetch_bucket_size;
      }
      trace = next;
    }
    EXPECT_LE(c.stats().live_high_water, r.config.max_live_parameters);
    EXPECT_EQ(c.stats().trace_changes, expected_changes);
    EXPECT_EQ(c.recorded_trace(), trace);
  }
}

// A live limit of one block: entering a block leaves no room to gather the next one ahead,
// so its fetch is issued when the block before it is left (room made as entering it would),
// not when it is entered. Only the first block of the replay is fetched on demand.
TEST(ParamCoordinator, LeavingABlockIssuesTheNextBlocksFetch) {
  Model m(4, 2, {100});
  CoordinatorConfig config{100, 200, 0};  // live limit: one block; copies 2 x 100 ahead
  FakeFetcher f(m.numels, m.persistent, config.max_live_parameters);
  ParamCoordinator c(config, m.numels, m.blocks, m.persistent, f);
  const std::vector<size_t> trace = m.forward_backward();
  run_pass(c, f, m, trace);
  const uint64_t on_demand = c.stats().on_demand;
  c.begin_pass();
  for (size_t k = 0; k < trace.size(); ++k) {
    c.enter(trace[k]);
    f.expect_usable(m.blocks[trace[k]]);
    c.leave(trace[k]);
    if (k + 1 < trace.size()) {
      for (size_t p : m.blocks[trace[k + 1]]) {
        EXPECT_EQ(f.level_[p], 3) << "param " << p << " of the next block not gathered after "
                                  << "leaving position " << k;
      }
    }
  }
  c.end_pass();
  EXPECT_EQ(c.stats().on_demand - on_demand, 2u) << "only block 0's two params on demand";
  EXPECT_LE(f.high_water_, config.max_live_parameters);
  EXPECT_EQ(f.live_, 0u);
}

// With keep_across_passes, the first block's params, used last by the backward, stay
// gathered into the next pass (not fetched again) until release_all(); a pass that leaves
// the recording keeps nothing.
TEST(ParamCoordinator, KeepAcrossPassesKeepsTheFirstBlockForTheNextPass) {
  Model m(3, 2, {100});
  CoordinatorConfig config{100, 200, 0};
  config.keep_across_passes = true;
  FakeFetcher f(m.numels, m.persistent, config.max_live_parameters);
  ParamCoordinator c(config, m.numels, m.blocks, m.persistent, f);
  const std::vector<size_t> trace = m.forward_backward();  // 0 1 2 2 1 0
  run_pass(c, f, m, trace);
  EXPECT_EQ(f.live_, 0u) << "the recording pass keeps nothing";
  run_pass(c, f, m, trace);
  EXPECT_EQ(f.level_[0], 3);
  EXPECT_EQ(f.level_[1], 3);
  EXPECT_EQ(f.live_, 200u) << "only block 0 kept";
  EXPECT_EQ(c.stats().kept_for_next_pass, 2u);
  f.gathers_.clear();
  run_pass(c, f, m, trace);
  // Block 0 for its backward only (its forward found it kept), block 1 for both.
  EXPECT_EQ(f.gathers_[0], 1) << "block 0 fetched again at the start of the next pass";
  EXPECT_EQ(f.gathers_[1], 1);
  EXPECT_EQ(f.gathers_[2], 2);
  c.release_all();
  EXPECT_EQ(f.live_, 0u);
  EXPECT_EQ(f.level_[0], 0);
  // The distance to the next pass counts the rest of this pass and the next pass up to the
  // use. With room for every block: leaving block 1 in the backward, block 0 (200 elements)
  // is left of this pass and block 0 again before block 1's use in the next pass: 400.
  for (uint64_t distance : {399u, 400u}) {
    CoordinatorConfig roomy{100, 600, distance, true};
    FakeFetcher g(m.numels, m.persistent, roomy.max_live_parameters);
    ParamCoordinator d(roomy, m.numels, m.blocks, m.persistent, g);
    for (int pass = 0; pass < 3; ++pass) run_pass(d, g, m, trace);
    EXPECT_EQ(g.level_[0], 3) << "block 0 comes back at distance 0";
    EXPECT_EQ(g.level_[2], distance >= 400 ? 3 : 0) << "block 1, limit " << distance;
    EXPECT_EQ(g.level_[4], 0) << "block 2 comes back at distance 800";
  }
  // A pass cut short left the recording: nothing is kept.
  WarningLog quiet;
  run_pass(c, f, m, trace);
  run_pass(c, f, m, {0, 1, 1, 0});
  EXPECT_EQ(f.live_, 0u);
}

// The random models and traces of the test above, with parameters kept across passes: the
// live limit holds at every event, entered blocks are usable, release_all() empties.
TEST(ParamCoordinator, LiveLimitHoldsWithParamsKeptAcrossPasses) {
  WarningLog quiet;
  const uint64_t seed = testing::test_seed();
  ZINF_TRACE_SEED(seed);
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < 80; ++trial) {
    RandomCase r = random_case(rng, /*ties=*/trial % 2 == 1);
    r.config.keep_across_passes = true;
    const Model& m = r.model;
    FakeFetcher f(m.numels, m.persistent, r.config.max_live_parameters);
    f.reads_left_ = r.reads_left;
    ParamCoordinator c(r.config, m.numels, m.blocks, m.persistent, f);
    std::vector<size_t> trace = m.forward_backward();
    for (int pass = 0; pass < 6; ++pass) {
      std::vector<size_t> next = trace;
      switch (pass < 2 ? 0 : rng() % 4) {
        case 0:
          break;
        case 1:
          next[rng() % next.size()] = rng() % m.blocks.size();
          break;
        case 2:
          next.resize(1 + rng() % next.size());
          break;
        case 3:
          next.push_back(rng() % m.blocks.size());
          break;
      }
      run_pass(c, f, m, next);
      if (rng() % 3 == 0) {
        c.release_all();  // an optimizer step
        EXPECT_EQ(f.live_, 0u);
      }
      if (HasFailure()) {
        FAIL() << "trial " << trial << " pass " << pass << " max_live "
               << r.config.max_live_parameters << " bucket " << r.config.prefetch_bucket_size;
      }
      trace = next;
    }
    EXPECT_LE(c.stats().live_high_water, r.config.max_live_parameters);
    c.release_all();
    EXPECT_EQ(f.live_, 0u);
    EXPECT_EQ(f.gathered_, 0u);
  }
}

TEST(ParamCoordinator, GatheredHighWaterCountsPrefetchedAndPersistentParams) {
  Model m(4, 2, {10, 1000});
  m.persistent[0] = m.persistent[2] = true;
  CoordinatorConfig config{2000, 3000, 0};  // prefetch up to two blocks ahead
  FakeFetcher f(m.numels, m.persistent, config.max_live_parameters);
  ParamCoordinator c(config, m.numels, m.blocks, m.persistent, f);
  for (int pass = 0; pass < 3; ++pass) run_pass(c, f, m, m.forward_backward());
  // The most elements the fetcher held gathered at once (from each gather's issue to its
  // release), persistent ones included.
  EXPECT_GT(f.gathered_high_water_, f.high_water_) << "the case has no persistent params";
  EXPECT_GT(c.stats().prefetched, 0u);
  EXPECT_EQ(c.stats().gathered_high_water, f.gathered_high_water_);
  EXPECT_EQ(c.stats().live_high_water, f.high_water_);
}

// block_wait_seconds counts what a block waited for its own params (its on-demand gathers
// and the waits), not the issue of prefetches for later blocks.
TEST(ParamCoordinator, BlockWaitCountsOwnFetchesAndNotPrefetchesForLaterBlocks) {
  using std::chrono::milliseconds;
  Model m(4, 1, {100});
  CoordinatorConfig config{1000, 10'000, 10'000};  // every later block prefetched at once
  FakeFetcher f(m.numels, m.persistent, config.max_live_parameters);
  ParamCoordinator c(config, m.numels, m.blocks, m.persistent, f);
  f.wait_cost_ = milliseconds(5);
  c.begin_pass();
  for (size_t b : {0, 1, 2, 3}) {
    c.enter(b);
    c.leave(b);
  }
  c.end_pass();
  // On demand: 4 waits of 5 ms.
  EXPECT_GE(c.stats().block_wait_seconds, 0.020);
  f.wait_cost_ = milliseconds(0);
  f.gather_cost_ = milliseconds(40);
  const double before = c.stats().block_wait_seconds;
  c.begin_pass();
  c.enter(0);  // block 0 gathered on demand (40 ms), blocks 1-3 prefetched (120 ms)
  const double entering = c.stats().block_wait_seconds - before;
  c.leave(0);
  for (size_t b : {1, 2, 3}) {
    c.enter(b);
    c.leave(b);
  }
  c.end_pass();
  EXPECT_EQ(c.stats().prefetched, 3u);
  EXPECT_GE(entering, 0.040);
  EXPECT_LT(entering, 0.140) << "the prefetches' issue was counted as block 0's wait";
}

TEST(ParamCoordinator, PersistentParamsAreGatheredOnceAndNotCountedAsLive) {
  Model m(3, 2, {10, 1000});
  m.persistent[0] = m.persistent[2] = m.persistent[4] = true;  // the small ones
  CoordinatorConfig config{0, 1000, 0};  // room for one big param only, no prefetch
  FakeFetcher f(m.numels, m.persistent, config.max_live_parameters);
  ParamCoordinator c(config, m.numels, m.blocks, m.persistent, f);
  for (int pass = 0; pass < 3; ++pass) run_pass(c, f, m, m.forward_backward());
  for (size_t p : {0, 2, 4}) {
    EXPECT_EQ(f.gathers_[p], 1) << "persistent param " << p << " gathered again";
    EXPECT_EQ(f.level_[p], 3) << "persistent param " << p << " released";
  }
  EXPECT_EQ(c.stats().persistent_elements, 30u);
  c.release_all();
  EXPECT_EQ(f.level_[0], 0);
  EXPECT_EQ(c.stats().persistent_elements, 0u);
}

TEST(ParamCoordinator, ReuseDistanceKeepsParamsUsedAgainSoon) {
  // Blocks 0, 1, 2 with one param of 100 each; trace 0 1 2 2 1 0. Leaving block 1 in the
  // forward, its next use comes after block 2 twice: 200 elements in between.
  Model m(3, 1, {100});
  for (uint64_t distance : {199u, 200u}) {
    CoordinatorConfig config{0, 10'000, distance};
    FakeFetcher f(m.numels, m.persistent, config.max_live_parameters);
    ParamCoordinator c(config, m.numels, m.blocks, m.persistent, f);
    run_pass(c, f, m, m.forward_backward());
    f.gathers_.clear();
    run_pass(c, f, m, m.forward_backward());
    EXPECT_EQ(f.gathers_[2], 1) << "block 2 reused at distance 0 (limit " << distance << ")";
    EXPECT_EQ(f.gathers_[1], distance >= 200 ? 1 : 2) << "limit " << distance;
    EXPECT_EQ(f.gathers_[0], distance >= 400 ? 1 : 2) << "limit " << distance;
  }
}

TEST(ParamCoordinator, TiedParamIsGatheredOnceForBothBlocks) {
  // Param 0 in blocks 0 and 1; trace 0 1 1 0 with generous reuse.
  std::vector<uint64_t> numels{50, 60, 70};
  std::vector<std::vector<size_t>> blocks{{0, 1}, {2, 0}};
  std::vector<bool> persistent(3, false);
  CoordinatorConfig config{0, 1000, 1000};
  FakeFetcher f(numels, persistent, 1000);
  ParamCoordinator c(config, numels, blocks, persistent, f);
  c.begin_pass();
  c.enter(0);
  c.leave(0);
  c.enter(1);
  EXPECT_EQ(f.gathers_[0], 2) << "first pass: released between blocks (no trace yet)";
  c.leave(1);
  c.end_pass();
  f.gathers_.clear();
  c.begin_pass();
  for (size_t b : {0, 1}) {
    c.enter(b);
    c.leave(b);
  }
  c.end_pass();
  EXPECT_EQ(f.gathers_[0], 1) << "replay: the tied param stayed gathered between its blocks";
}

TEST(ParamCoordinator, TraceChangeWarnsOnceFallsBackAndRecordsTheNewOrder) {
  Model m(4, 1, {100});
  CoordinatorConfig config{1000, 10'000, 0};
  FakeFetcher f(m.numels, m.persistent, config.max_live_parameters);
  ParamCoordinator c(config, m.numels, m.blocks, m.persistent, f);
  WarningLog log;
  run_pass(c, f, m, {0, 1, 2, 3});
  c.begin_pass();
  c.enter(0);
  EXPECT_GT(c.stats().prefetched, 0u);
  c.leave(0);
  c.enter(2);  // the recording says 1
  EXPECT_EQ(c.stats().trace_changes, 1u);
  EXPECT_NE(c.last_warning().find("block 2"), std::string::npos) << c.last_warning();
  EXPECT_NE(c.last_warning().find("position 1"), std::string::npos) << c.last_warning();
  EXPECT_NE(c.last_warning().find("has block 1"), std::string::npos) << c.last_warning();
  f.expect_usable(m.blocks[2]);
  const uint64_t prefetched = c.stats().prefetched;
  c.leave(2);
  c.enter(3);
  c.leave(3);
  EXPECT_EQ(c.stats().prefetched, prefetched) << "prefetch after the trace diverged";
  c.end_pass();
  EXPECT_EQ(f.live_, 0u);
  EXPECT_EQ(c.recorded_trace(), (std::vector<size_t>{0, 2, 3}));
  // One warning for the pass (the shorter length is part of the same change).
  ASSERT_EQ(log.warnings().size(), 1u);
  EXPECT_EQ(log.warnings()[0], c.last_warning());
  run_pass(c, f, m, {0, 2, 3});
  EXPECT_EQ(c.stats().trace_changes, 1u);
  EXPECT_EQ(log.warnings().size(), 1u);
  EXPECT_GT(c.stats().prefetched, prefetched) << "the new order is replayed with prefetch";

  // A pass that ends early: the first differing block is the recorded one that did not
  // come (block 2 at position 1); what was prefetched for it is released.
  run_pass(c, f, m, {0});
  EXPECT_EQ(c.stats().trace_changes, 2u);
  ASSERT_EQ(log.warnings().size(), 2u);
  EXPECT_EQ(log.warnings()[1], c.last_warning());
  EXPECT_NE(c.last_warning().find("has block 2 at trace position 1"), std::string::npos)
      << c.last_warning();
  EXPECT_EQ(f.live_, 0u);
  EXPECT_EQ(c.recorded_trace(), (std::vector<size_t>{0}));
  run_pass(c, f, m, {0});
  EXPECT_EQ(log.warnings().size(), 2u);
}

TEST(ParamCoordinator, ABlockLargerThanTheLiveLimitIsRefusedWithTheNumbers) {
  std::vector<uint64_t> numels{600, 500};
  FakeFetcher f(numels, {false, false}, 1000);
  try {
    ParamCoordinator c(CoordinatorConfig{0, 1000, 0}, numels, {{0, 1}}, {false, false}, f);
    FAIL() << "accepted";
  } catch (const ZeroError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("1100"), std::string::npos) << message;
    EXPECT_NE(message.find("stage3_max_live_parameters"), std::string::npos) << message;
  }
}

TEST(ParamCoordinator, EvaluationPassesNeitherReplayNorRecord) {
  Model m(3, 1, {100});
  CoordinatorConfig config{1000, 10'000, 0};
  FakeFetcher f(m.numels, m.persistent, config.max_live_parameters);
  ParamCoordinator c(config, m.numels, m.blocks, m.persistent, f);
  run_pass(c, f, m, m.forward_backward());
  const std::vector<size_t> recorded = c.recorded_trace();
  c.begin_pass(/*record=*/false);
  for (size_t b : {0, 1, 2}) {
    c.enter(b);
    c.leave(b);
  }
  c.end_pass();
  EXPECT_EQ(c.recorded_trace(), recorded);
  EXPECT_EQ(c.stats().trace_changes, 0u);
  EXPECT_EQ(f.live_, 0u);
}

}  // namespace
}  // namespace zinf::zero
