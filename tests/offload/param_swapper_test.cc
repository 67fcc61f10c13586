// Tests of ParamSwapper: placement across the max_in_cpu boundary, round trips of
// partitions smaller and larger than buffer_size (split across buffers), prefetch,
// release without write-back, write-back, requests the pool can never meet, per-partition
// waiting (a slow prefetch holds up nobody else), and faults.
#include "offload/param_swapper.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "aio/fault_backend.h"
#include "offload/cpu_accelerator.h"
#include "offload/error.h"
#include "tests/common/seed.h"
#include "tests/common/temp_dir.h"
#include "tests/offload/test_util.h"

namespace zinf::offload {
namespace {

using zinf::testing::TempDir;
using zinf::testing::test_seed;

NvmeStoreConfig store_config(const std::string& dir, bool checksums = true) {
  NvmeStoreConfig config;
  config.nvme_path = dir;
  config.name = "params";
  config.checksums = checksums;
  config.aio.backend = aio::BackendKind::kPsync;
  config.aio.intra_op_parallelism = 2;
  return config;
}

std::vector<uint16_t> random_half(std::mt19937& rng, uint64_t numel) {
  std::vector<uint16_t> data(numel);
  for (auto& x : data) {
    x = static_cast<uint16_t>(rng());
  }
  return data;
}

std::vector<uint16_t> gather(const ParamView& view) {
  std::vector<uint16_t> out;
  for (const auto& chunk : view.chunks) {
    const auto* p = reinterpret_cast<const uint16_t*>(chunk.data);
    out.insert(out.end(), p, p + chunk.numel);
  }
  return out;
}

ParamSwapperConfig small_config() {
  ParamSwapperConfig config;
  config.buffer_count = 4;
  config.buffer_size = 1000;  // elements
  config.max_in_cpu = 2500;
  return config;
}

// A swapper of small_config() with every partition on NVMe (max_in_cpu 0), over a fresh
// store in a temp dir.
struct NvmeOnlyRig {
  static ParamSwapperConfig config() {
    ParamSwapperConfig c = small_config();
    c.max_in_cpu = 0;
    return c;
  }
  TempDir dir;
  NvmeStore store{store_config(dir.path())};
  ParamSwapper swapper{config(), store};
};

// Adds partitions of the given sizes with random values (appended to `values`).
std::vector<ParamId> add_random(ParamSwapper& swapper, std::mt19937& rng,
                                const std::vector<uint64_t>& sizes,
                                std::vector<std::vector<uint16_t>>& values) {
  std::vector<ParamId> ids;
  for (uint64_t n : sizes) {
    values.push_back(random_half(rng, n));
    ids.push_back(swapper.add(n, values.back().data()));
  }
  return ids;
}

class ParamSwapperMedia : public ::testing::TestWithParam<bool> {};

TEST_P(ParamSwapperMedia, RoundTripsAcrossTiersAndBufferSizes) {
  const bool on_tmpfs = GetParam();
  if (on_tmpfs && !testing::have_dev_shm()) {
    GTEST_SKIP() << "no /dev/shm";
  }
  const auto seed = static_cast<uint32_t>(test_seed());
  ZINF_TRACE_SEED(seed);
  std::mt19937 rng(seed);
  TempDir dir(on_tmpfs ? "/dev/shm" : "");
  NvmeStore store(store_config(dir.path()));
  CpuAccelerator accelerator(0);
  ParamSwapper swapper(small_config(), store, &accelerator);
  EXPECT_EQ(accelerator.registered_host_bytes(), swapper.pinned_bytes());
  // Placement, in add() order, against max_in_cpu = 2500 elements:
  //   2000 -> cpu (500 left), 999 -> nvme, 3001 -> nvme (4 chunks), 500 -> cpu (0 left),
  //   1 -> nvme, 1000 -> nvme (exactly one buffer).
  const std::vector<uint64_t> sizes = {2000, 999, 3001, 500, 1, 1000};
  const std::vector<bool> expect_cpu = {true, false, false, true, false, false};
  std::vector<std::vector<uint16_t>> values;
  std::vector<ParamId> ids;
  for (uint64_t n : sizes) {
    values.push_back(random_half(rng, n));
    ids.push_back(swapper.add(n, values.back().data()));
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    EXPECT_EQ(swapper.in_cpu(ids[i]), expect_cpu[i]) << "partition " << i;
  }
  EXPECT_EQ(swapper.cpu_elements(), 2500u);
  for (size_t i = 0; i < ids.size(); ++i) {
    const ParamView view = swapper.swap_in(ids[i]);
    EXPECT_EQ(view.in_cpu, expect_cpu[i]);
    EXPECT_EQ(gather(view), values[i]) << "partition " << i;
    if (!view.in_cpu) {
      EXPECT_EQ(view.chunks.size(), (sizes[i] + 999) / 1000);
    }
    swapper.release(ids[i]);
  }
  // read() copies any partition directly.
  std::vector<uint16_t> direct(3001);
  swapper.read(ids[2], direct.data());
  EXPECT_EQ(direct, values[2]);
}

// Every queue the swapper makes has the pool registered: on io_uring swap-ins read into
// fixed buffers, with the same values.
TEST(ParamSwapper, SwapInsUseFixedBuffersOnIoUring) {
  const auto seed = static_cast<uint32_t>(test_seed());
  ZINF_TRACE_SEED(seed);
  std::mt19937 rng(seed);
  TempDir dir;
  NvmeStoreConfig sc = store_config(dir.path());
  sc.aio.backend = aio::BackendKind::kIoUring;
  NvmeStore store(sc);
  ParamSwapperConfig config = small_config();
  config.buffer_size = 4096;  // 8 KiB chunks: their bulk goes to the file without bouncing
  config.max_in_cpu = 0;
  ParamSwapper swapper(config, store);
  const std::vector<uint64_t> sizes = {4096, 9001, 1, 5000};
  std::vector<std::vector<uint16_t>> values;
  std::vector<ParamId> ids;
  for (uint64_t n : sizes) {
    values.push_back(random_half(rng, n));
    ids.push_back(swapper.add(n, values.back().data()));
  }
  const uint64_t fixed_after_add = store.stats().fixed_io_requests;  // adds write caller memory
  EXPECT_EQ(swapper.prefetch(std::span<const ParamId>(ids).first(1)), 1u);
  for (size_t i = 0; i < ids.size(); ++i) {
    EXPECT_EQ(gather(swapper.swap_in(ids[i])), values[i]) << "partition " << i;
    swapper.release(ids[i]);
  }
  EXPECT_GT(store.stats().fixed_io_requests, fixed_after_add)
      << "no fixed-buffer requests (io_uring refused the registration: RLIMIT_MEMLOCK?)";
}

INSTANTIATE_TEST_SUITE_P(Media, ParamSwapperMedia, ::testing::Bool(), [](const auto& param_info) {
  return std::string(param_info.param ? "Tmpfs" : "Disk");
});

TEST(ParamSwapper, PrefetchReleaseAndWriteBack) {
  const auto seed = static_cast<uint32_t>(test_seed());
  ZINF_TRACE_SEED(seed);
  std::mt19937 rng(seed);
  NvmeOnlyRig rig;
  ParamSwapper& swapper = rig.swapper;
  std::vector<std::vector<uint16_t>> values;
  const std::vector<ParamId> ids = add_random(swapper, rng, {1500, 700, 900, 2000}, values);
  // 2 + 1 + 1 buffers fit in the pool of 4; the fourth partition (2 buffers) does not.
  EXPECT_EQ(swapper.prefetch(ids), 3u);
  EXPECT_TRUE(swapper.resident(ids[2]));
  EXPECT_FALSE(swapper.resident(ids[3]));
  EXPECT_EQ(swapper.counters().pool_high_water, 4u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(gather(swapper.swap_in(ids[i])), values[i]) << "partition " << i;
  }
  // Scribble on a resident buffer, release: nothing is written back.
  ParamView view = swapper.swap_in(ids[1]);
  std::memset(view.chunks[0].data, 0, 700 * 2);
  swapper.release(ids[1]);
  swapper.release(ids[0]);
  EXPECT_EQ(gather(swapper.swap_in(ids[1])), values[1]);
  // Write-back (after an optimizer step) is stored, and refreshes the resident view.
  std::vector<uint16_t> updated = random_half(rng, 700);
  swapper.write_back(ids[1], updated.data());
  EXPECT_EQ(gather(swapper.swap_in(ids[1])), updated);
  swapper.release(ids[1]);
  EXPECT_EQ(gather(swapper.swap_in(ids[1])), updated);
  // A range across the chunk boundary of the 1500-element partition.
  std::vector<uint16_t> patch = random_half(rng, 400);
  swapper.write_back_range(ids[0], 800, patch.data(), patch.size());
  std::copy(patch.begin(), patch.end(), values[0].begin() + 800);
  EXPECT_EQ(gather(swapper.swap_in(ids[0])), values[0]);
  const OffloadCounters c = swapper.counters();
  EXPECT_GT(c.nvme_bytes_read, 0u);
  EXPECT_GT(c.nvme_bytes_written, 0u);
}

// release_cached(): the buffers keep the values, so fetching the partition again reads
// nothing from NVMe; a write-back keeps the cache in step; another partition that needs the
// buffers takes them (least recently cached first), and the next swap-in reads again.
// A write batch: the write_backs of resident and cached partitions refresh their views at
// once and are stored by the time end_write_batch() returns; a partial write_back (or a
// second one of a partition in the batch) waits for the batch first; a swap_in that needs
// buffers evicts no partition of the batch before its writes end.
TEST(ParamSwapper, WriteBatchRefreshesViewsAndStoresOnEnd) {
  const auto seed = static_cast<uint32_t>(test_seed());
  ZINF_TRACE_SEED(seed);
  std::mt19937 rng(seed);
  NvmeOnlyRig rig;
  ParamSwapper& swapper = rig.swapper;
  std::vector<std::vector<uint16_t>> values;  // 1 + 1 + 2 buffers of a pool of 4
  const std::vector<ParamId> ids = add_random(swapper, rng, {700, 900, 1500}, values);
  for (ParamId id : ids) {
    (void)swapper.swap_in(id);
  }
  swapper.release_cached(ids[0]);  // cached; ids[1] and ids[2] stay in use
  std::vector<std::vector<uint16_t>> updated;
  for (size_t i = 0; i < ids.size(); ++i) updated.push_back(random_half(rng, values[i].size()));
  swapper.begin_write_batch();
  for (size_t i = 0; i < ids.size(); ++i) swapper.write_back(ids[i], updated[i].data());
  swapper.write_back(ids[1], updated[1].data());  // again: waits for the batch, then again
  swapper.close_write_batch();
  for (size_t i = 0; i < ids.size(); ++i) {
    EXPECT_EQ(gather(swapper.swap_in(ids[i])), updated[i]) << "view of " << i;
  }
  swapper.release(ids[1]);
  swapper.release(ids[2]);
  swapper.release_cached(ids[0]);
  swapper.end_write_batch();
  std::vector<uint16_t> stored(1500);
  for (size_t i = 0; i < ids.size(); ++i) {
    stored.resize(values[i].size());
    swapper.read(ids[i], stored.data());
    EXPECT_EQ(stored, updated[i]) << "stored " << i;
  }
  // A partial write-back in a batch takes the plain path.
  swapper.begin_write_batch();
  const std::vector<uint16_t> patch = random_half(rng, 100);
  swapper.write_back_range(ids[0], 50, patch.data(), patch.size());
  swapper.end_write_batch();
  std::copy(patch.begin(), patch.end(), updated[0].begin() + 50);
  stored.resize(700);
  swapper.read(ids[0], stored.data());
  EXPECT_EQ(stored, updated[0]);
}

TEST(ParamSwapper, ReleaseCachedServesTheNextSwapInWithoutAReadUntilEvicted) {
  const auto seed = static_cast<uint32_t>(test_seed());
  ZINF_TRACE_SEED(seed);
  std::mt19937 rng(seed);
  NvmeOnlyRig rig;
  ParamSwapper& swapper = rig.swapper;
  std::vector<std::vector<uint16_t>> values;  // 2 + 1 + 2 buffers of a pool of 4:
  const std::vector<ParamId> ids = add_random(swapper, rng, {1500, 700, 2000}, values);
  auto nvme_read = [&] { return swapper.counters().nvme_bytes_read; };
  EXPECT_EQ(gather(swapper.swap_in(ids[0])), values[0]);
  swapper.release_cached(ids[0]);
  EXPECT_TRUE(swapper.resident(ids[0]));
  uint64_t read = nvme_read();
  EXPECT_EQ(gather(swapper.swap_in(ids[0])), values[0]);  // from the cache
  EXPECT_EQ(nvme_read(), read);
  EXPECT_EQ(swapper.cache_hits(), 1u);
  EXPECT_EQ(swapper.cache_bytes_saved(), 1500u * 2);
  swapper.release_cached(ids[0]);
  // A prefetch takes a cached partition back into use (and counts it) without a read.
  EXPECT_EQ(swapper.prefetch(std::vector<ParamId>{ids[0]}), 1u);
  EXPECT_EQ(nvme_read(), read);
  swapper.release_cached(ids[0]);
  // A write-back refreshes the cached copy.
  std::vector<uint16_t> patch = random_half(rng, 300);
  swapper.write_back_range(ids[0], 900, patch.data(), patch.size());
  std::copy(patch.begin(), patch.end(), values[0].begin() + 900);
  EXPECT_EQ(gather(swapper.swap_in(ids[0])), values[0]);
  EXPECT_EQ(nvme_read(), read);
  EXPECT_EQ(swapper.cache_hits(), 3u);
  swapper.release_cached(ids[0]);
  // ids[1] (1 buffer) fits beside the 2 cached ones; then ids[2] (2 buffers) needs one of
  // them: ids[0], cached first, goes; ids[1] stays cached.
  EXPECT_EQ(gather(swapper.swap_in(ids[1])), values[1]);
  swapper.release_cached(ids[1]);
  EXPECT_TRUE(swapper.resident(ids[0]));
  EXPECT_EQ(gather(swapper.swap_in(ids[2])), values[2]);
  EXPECT_FALSE(swapper.resident(ids[0]));
  EXPECT_TRUE(swapper.resident(ids[1]));
  EXPECT_EQ(swapper.counters().pool_high_water, 3u);  // 2 + 1, then 1 + 2
  read = nvme_read();
  EXPECT_EQ(gather(swapper.swap_in(ids[1])), values[1]);  // still cached
  EXPECT_EQ(nvme_read(), read);
  swapper.release(ids[2]);
  swapper.release(ids[1]);  // release() discards the cache too
  EXPECT_FALSE(swapper.resident(ids[1]));
  EXPECT_EQ(gather(swapper.swap_in(ids[0])), values[0]);  // read again, with its patch
  EXPECT_EQ(nvme_read(), read + 1500u * 2);
}

TEST(ParamSwapper, RequestsThePoolCanNeverMeetFailAtOnce) {
  const auto seed = static_cast<uint32_t>(test_seed());
  ZINF_TRACE_SEED(seed);
  std::mt19937 rng(seed);
  NvmeOnlyRig rig;
  ParamSwapper& swapper = rig.swapper;
  const std::vector<uint16_t> big = random_half(rng, 4500);  // 5 buffers > 4
  const ParamId too_big = swapper.add(big.size(), big.data());
  try {
    (void)swapper.swap_in(too_big);
    FAIL() << "partition of 5 buffers swapped into a pool of 4";
  } catch (const OffloadError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kPool);
    EXPECT_NE(std::string(e.what()).find("needs 5 buffers"), std::string::npos) << e.what();
  }
  std::vector<uint16_t> back(big.size());
  swapper.read(too_big, back.data());  // read directly instead
  EXPECT_EQ(back, big);
  // This thread holds 3 buffers; a 2-buffer partition could only wait for itself.
  const std::vector<uint16_t> a = random_half(rng, 3000);
  const std::vector<uint16_t> b = random_half(rng, 2000);
  const ParamId id_a = swapper.add(a.size(), a.data());
  const ParamId id_b = swapper.add(b.size(), b.data());
  (void)swapper.swap_in(id_a);
  EXPECT_THROW((void)swapper.swap_in(id_b), OffloadError);
  swapper.release(id_a);
  EXPECT_EQ(gather(swapper.swap_in(id_b)), b);
}

// What every fault test builds: a ParamSwapper (max_in_cpu 0: every partition on NVMe) over
// an NvmeStore whose backend injects `faults`. Adjust the two configs, then start().
struct FaultRig {
  explicit FaultRig(std::optional<aio::BackendKind> backend, bool checksums = true)
      : store_config(offload::store_config(dir.path(), checksums)) {
    if (backend) {
      store_config.aio.backend = *backend;
    }
    store_config.backend_factory = aio::fault_backend_factory(faults);
    swapper_config.max_in_cpu = 0;
  }
  void start() {
    store.emplace(store_config);
    swapper.emplace(swapper_config, *store);
  }

  TempDir dir;
  std::shared_ptr<aio::FaultInjector> faults = std::make_shared<aio::FaultInjector>();
  NvmeStoreConfig store_config;
  ParamSwapperConfig swapper_config = small_config();
  std::optional<NvmeStore> store;
  std::optional<ParamSwapper> swapper;
};

// Fault paths, on every aio backend (io_uring and libaio go O_DIRECT with bounce and
// staging memory; psync does plain pread/pwrite): the faults are injected through a
// FaultBackend wrapped around the backend under test.
// Each test draws its values from `rng`, seeded from test_seed(); failures print the seed.
class ParamSwapperFaults : public ::testing::TestWithParam<aio::BackendKind> {
 protected:
  const uint32_t seed = static_cast<uint32_t>(test_seed());
  const ::testing::ScopedTrace trace{__FILE__, __LINE__, ::zinf::testing::seed_trace_message(seed)};
  std::mt19937 rng{seed};
};

TEST_P(ParamSwapperFaults, ReadFaultIsReportedAndTheNextSwapInRetries) {
  FaultRig rig(GetParam());
  rig.start();
  ParamSwapper& swapper = *rig.swapper;
  aio::FaultInjector* faults = rig.faults.get();
  const std::vector<uint16_t> v = random_half(rng, 1800);
  const std::vector<uint16_t> w = random_half(rng, 600);
  const ParamId id = swapper.add(v.size(), v.data());
  const ParamId other = swapper.add(w.size(), w.data());
  // Both prefetches run at once on their own queues, so "the first read" could belong to
  // either: the rule is tied to `id`'s extents instead. The store allocates first-fit from
  // offset 0 in add() order, so `id`'s two chunks (1000 + 800 elements) sit in the first
  // two 4096-byte extents and `other` starts at 8192.
  faults->add(aio::FaultRule{.op = aio::Op::kRead,
                             .offset_begin = 0,
                             .offset_end = 8192,
                             .kind = aio::FaultKind::kError,
                             .error = EIO});
  EXPECT_EQ(swapper.prefetch(std::vector<ParamId>{id, other}), 2u);
  try {
    (void)swapper.swap_in(id);
    FAIL() << "injected read EIO not reported";
  } catch (const OffloadError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIo) << e.what();
  }
  EXPECT_FALSE(swapper.resident(id));
  EXPECT_EQ(gather(swapper.swap_in(other)), w);  // the other prefetch is unaffected
  EXPECT_EQ(gather(swapper.swap_in(id)), v);     // the fault fired once: a re-read
  EXPECT_EQ(faults->fired(0), 1u);
}

// An engine failure breaks the aio handle of the queue it struck for good: that queue must
// not go back to the idle set, or every later transfer on it fails too. One worker per
// handle, so the broken worker is the one every later transfer on that handle would use.
TEST_P(ParamSwapperFaults, EngineFailureDoesNotPoisonLaterTransfers) {
  FaultRig rig(GetParam());
  rig.store_config.aio.intra_op_parallelism = 1;
  rig.start();
  NvmeStore& store = *rig.store;
  ParamSwapper& swapper = *rig.swapper;
  aio::FaultInjector* faults = rig.faults.get();
  const std::vector<uint16_t> a = random_half(rng, 1700);  // 2 chunks
  const std::vector<uint16_t> b = random_half(rng, 900);
  const ParamId id_a = swapper.add(a.size(), a.data());
  const ParamId id_b = swapper.add(b.size(), b.data());
  // `a` sits in the first two 4096-byte extents: break the engine on its second chunk's read.
  faults->add(aio::FaultRule{.op = aio::Op::kRead,
                             .offset_begin = 4096,
                             .offset_end = 8192,
                             .kind = aio::FaultKind::kEngine,
                             .error = EBADF});
  try {
    (void)swapper.swap_in(id_a);
    FAIL() << "the broken engine was not reported";
  } catch (const OffloadError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIo) << e.what();
    const std::string message = e.what();
    EXPECT_NE(message.find(store.path()), std::string::npos) << message;
    // The engine fails every request its worker holds; the first of them is reported.
    EXPECT_NE(message.find("at offset "), std::string::npos) << message;
    EXPECT_NE(message.find("engine failed"), std::string::npos) << message;
  }
  EXPECT_EQ(faults->fired(0), 1u);
  EXPECT_FALSE(swapper.resident(id_a));
  // Every later transfer runs on a healthy queue: reads, a prefetch, a write-back, an add.
  EXPECT_EQ(gather(swapper.swap_in(id_a)), a);
  swapper.release(id_a);
  EXPECT_EQ(swapper.prefetch(std::vector<ParamId>{id_b, id_a}), 2u);
  EXPECT_EQ(gather(swapper.swap_in(id_b)), b);
  EXPECT_EQ(gather(swapper.swap_in(id_a)), a);
  swapper.release(id_a);
  swapper.release(id_b);
  const std::vector<uint16_t> c = random_half(rng, 2500);
  const ParamId id_c = swapper.add(c.size(), c.data());
  EXPECT_EQ(gather(swapper.swap_in(id_c)), c);
}

TEST_P(ParamSwapperFaults, FailedWriteBackLeavesTheStoredPartitionUnreadableNotStale) {
  FaultRig rig(GetParam(), /*checksums=*/false);
  rig.start();
  ParamSwapper& swapper = *rig.swapper;
  aio::FaultInjector* faults = rig.faults.get();
  const std::vector<uint16_t> v = random_half(rng, 900);
  const ParamId id = swapper.add(v.size(), v.data());
  faults->add(aio::FaultRule{.op = aio::Op::kWrite, .kind = aio::FaultKind::kError, .error = EIO});
  const std::vector<uint16_t> updated = random_half(rng, 900);
  EXPECT_THROW(swapper.write_back(id, updated.data()), OffloadError);
  try {
    (void)swapper.swap_in(id);
    FAIL() << "a partition whose write-back failed was swapped in";
  } catch (const OffloadError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kCorrupt) << e.what();
  }
  EXPECT_FALSE(swapper.resident(id));      // no buffers holding bytes nobody read
  swapper.write_back(id, updated.data());  // the fault fired once: the retry stores it
  EXPECT_EQ(gather(swapper.swap_in(id)), updated);
}

// A write of a batch that fails is reported by the call that waits for the batch, naming the
// swap file; every partition of the batch is then torn (swap_in refuses it, never serving
// stale or mixed values) until a whole write_back stores it again.
TEST_P(ParamSwapperFaults, FailedWriteInABatchTearsItsPartitions) {
  FaultRig rig(GetParam());
  rig.start();
  ParamSwapper& swapper = *rig.swapper;
  aio::FaultInjector* faults = rig.faults.get();
  const std::vector<uint16_t> a = random_half(rng, 900);
  const std::vector<uint16_t> b = random_half(rng, 800);
  const ParamId ia = swapper.add(a.size(), a.data());
  const ParamId ib = swapper.add(b.size(), b.data());
  (void)swapper.swap_in(ia);
  (void)swapper.swap_in(ib);
  swapper.release_cached(ia);
  swapper.release_cached(ib);
  faults->add(aio::FaultRule{.op = aio::Op::kWrite, .kind = aio::FaultKind::kError, .error = EIO});
  const std::vector<uint16_t> a2 = random_half(rng, 900);
  const std::vector<uint16_t> b2 = random_half(rng, 800);
  swapper.begin_write_batch();
  swapper.write_back(ia, a2.data());
  swapper.write_back(ib, b2.data());
  swapper.close_write_batch();
  try {
    swapper.end_write_batch();
    FAIL() << "a failed write of the batch was not reported";
  } catch (const OffloadError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIo) << e.what();
    EXPECT_NE(std::string(e.what()).find(rig.store->path()), std::string::npos) << e.what();
  }
  EXPECT_EQ(faults->fired(0), 1u);
  for (ParamId id : {ia, ib}) {
    EXPECT_FALSE(swapper.resident(id));
    try {
      (void)swapper.swap_in(id);
      ADD_FAILURE() << "partition " << id << " of the failed batch was swapped in";
    } catch (const OffloadError& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kCorrupt) << e.what();
    }
  }
  swapper.write_back(ia, a2.data());  // the fault fired once: stored whole again
  EXPECT_EQ(gather(swapper.swap_in(ia)), a2);
}

// A swap_in after a failed write-back returns the complete old or the complete new values,
// or throws: never a mix. Here the write of the second of three chunks of a resident
// partition fails, after the first chunk (and its part of the view) took the new values.
TEST_P(ParamSwapperFaults, FailedWriteBackOfAResidentPartitionLeavesNoHalfUpdatedView) {
  FaultRig rig(GetParam());
  rig.start();
  ParamSwapper& swapper = *rig.swapper;
  aio::FaultInjector* faults = rig.faults.get();
  const std::vector<uint16_t> old_values = random_half(rng, 2500);  // 3 chunks
  const std::vector<uint16_t> new_values = random_half(rng, 2500);
  const ParamId id = swapper.add(old_values.size(), old_values.data());
  EXPECT_EQ(gather(swapper.swap_in(id)), old_values);  // resident
  // The chunks sit in 4096-byte extents from offset 0: fail the second chunk's write.
  faults->add(aio::FaultRule{.op = aio::Op::kWrite,
                             .offset_begin = 4096,
                             .offset_end = 8192,
                             .kind = aio::FaultKind::kError,
                             .error = EIO});
  EXPECT_THROW(swapper.write_back(id, new_values.data()), OffloadError);
  EXPECT_EQ(faults->fired(0), 1u);
  for (int attempt = 0; attempt < 2; ++attempt) {  // resident view, then after a release
    SCOPED_TRACE("attempt " + std::to_string(attempt));
    try {
      const std::vector<uint16_t> seen = gather(swapper.swap_in(id));
      ADD_FAILURE() << "swap_in after a failed write-back returned "
                    << (seen == old_values   ? "the old values"
                        : seen == new_values ? "the new values"
                                             : "a mix of old and new values");
    } catch (const OffloadError& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kCorrupt) << e.what();
    }
    EXPECT_FALSE(swapper.resident(id));
    swapper.release(id);
  }
  std::vector<uint16_t> direct(2500);
  EXPECT_THROW(swapper.read(id, direct.data()), OffloadError);
  // A write-back of the whole partition (the fault fired once) makes it whole again.
  swapper.write_back(id, new_values.data());
  EXPECT_EQ(gather(swapper.swap_in(id)), new_values);
  swapper.read(id, direct.data());
  EXPECT_EQ(direct, new_values);
}

// The same when the failure leaves every extent intact but some holding new values and
// others old ones: with checksums, a range write-back read-modify-writes each chunk it
// touches, and the read of the second chunk fails after the first was rewritten. The store
// cannot see the mix (both extents are valid); the swapper must.
TEST_P(ParamSwapperFaults, FailedRangeWriteBackAcrossChunksLeavesNoMix) {
  FaultRig rig(GetParam(), /*checksums=*/true);
  rig.start();
  ParamSwapper& swapper = *rig.swapper;
  aio::FaultInjector* faults = rig.faults.get();
  const std::vector<uint16_t> old_values = random_half(rng, 2500);
  const ParamId id = swapper.add(old_values.size(), old_values.data());
  const std::vector<uint16_t> patch = random_half(rng, 1000);
  std::vector<uint16_t> new_values = old_values;
  std::copy(patch.begin(), patch.end(), new_values.begin() + 500);  // elements [500, 1500)
  faults->add(aio::FaultRule{.op = aio::Op::kRead,
                             .offset_begin = 4096,
                             .offset_end = 8192,
                             .kind = aio::FaultKind::kError,
                             .error = EIO});
  EXPECT_THROW(swapper.write_back_range(id, 500, patch.data(), patch.size()), OffloadError);
  EXPECT_EQ(faults->fired(0), 1u);
  try {
    const std::vector<uint16_t> seen = gather(swapper.swap_in(id));
    ADD_FAILURE() << "swap_in after a failed write-back returned "
                  << (seen == old_values   ? "the old values"
                      : seen == new_values ? "the new values"
                                           : "a mix of old and new values");
  } catch (const OffloadError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kCorrupt) << e.what();
    EXPECT_NE(std::string(e.what()).find("write_back"), std::string::npos) << e.what();
  }
  // A range write-back cannot make it whole (the rest of the values are unknown): it stays
  // refused until the whole partition is written.
  swapper.write_back_range(id, 500, patch.data(), patch.size());
  EXPECT_THROW((void)swapper.swap_in(id), OffloadError);
  swapper.write_back(id, new_values.data());
  EXPECT_EQ(gather(swapper.swap_in(id)), new_values);
}

TEST_P(ParamSwapperFaults, FailedAddLeavesNoExtentBehind) {
  FaultRig rig(GetParam());
  rig.start();
  NvmeStore& store = *rig.store;
  ParamSwapper& swapper = *rig.swapper;
  aio::FaultInjector* faults = rig.faults.get();
  faults->add(aio::FaultRule{.op = aio::Op::kWrite, .kind = aio::FaultKind::kError, .error = EIO});
  const std::vector<uint16_t> v(2500, 7);  // 3 chunks
  EXPECT_THROW((void)swapper.add(v.size(), v.data()), OffloadError);
  const ParamId id = swapper.add(v.size(), v.data());  // reuses the freed space
  EXPECT_EQ(id, 0u);
  EXPECT_EQ(store.stats().file_bytes, 3u * 4096u);
  EXPECT_EQ(gather(swapper.swap_in(id)), v);
}

// Injected partial writes followed by an error: a chunk's write comes back short, and the
// write of its remainder fails. The swapper reports a clean error and never returns the
// half-written chunk: not from a write-back of a resident partition, not from an add().
TEST_P(ParamSwapperFaults, ShortWriteThenErrorIsReportedAndNeverRead) {
  FaultRig rig(GetParam());
  rig.store_config.aio.intra_op_parallelism =
      1;  // one request per aligned run: the short one is predictable
  rig.swapper_config.buffer_size = 6000;  // 12000-byte chunks in 12288-byte extents
  rig.start();
  NvmeStore& store = *rig.store;
  ParamSwapper& swapper = *rig.swapper;
  aio::FaultInjector* faults = rig.faults.get();
  // A write of the chunk at `extent` is cut to 4096 bytes; its remainder (at extent + 4096)
  // then fails with EIO.
  auto short_then_error = [&](uint64_t extent) {
    faults->clear();
    faults->add(aio::FaultRule{.op = aio::Op::kWrite,
                               .offset_begin = extent,
                               .offset_end = extent + 1,
                               .kind = aio::FaultKind::kShort,
                               .short_bytes = 4096});
    faults->add(aio::FaultRule{.op = aio::Op::kWrite,
                               .offset_begin = extent + 4096,
                               .offset_end = extent + 4097,
                               .kind = aio::FaultKind::kError,
                               .error = EIO});
  };
  auto expect_both_fired = [&] {
    EXPECT_EQ(faults->fired(0), 1u) << "no short write";
    EXPECT_EQ(faults->fired(1), 1u) << "no error on the continuation";
  };
  const std::vector<uint16_t> old_values = random_half(rng, 12000);  // 2 chunks
  const std::vector<uint16_t> new_values = random_half(rng, 12000);
  const ParamId id = swapper.add(old_values.size(), old_values.data());
  EXPECT_EQ(gather(swapper.swap_in(id)), old_values);  // resident
  short_then_error(12288);                             // the second chunk
  try {
    swapper.write_back(id, new_values.data());
    FAIL() << "a short write followed by EIO was not reported";
  } catch (const OffloadError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIo) << e.what();
    EXPECT_NE(std::string(e.what()).find(store.path()), std::string::npos) << e.what();
  }
  expect_both_fired();
  EXPECT_THROW((void)swapper.swap_in(id), OffloadError);
  std::vector<uint16_t> direct(12000);
  EXPECT_THROW(swapper.read(id, direct.data()), OffloadError);
  // An add() whose second chunk is written short, then fails: no partition, no extent.
  const uint64_t file_bytes = store.stats().file_bytes;
  const std::vector<uint16_t> other = random_half(rng, 7000);  // 12000 + 2000 bytes
  short_then_error(file_bytes);                                // the first chunk of `other`
  EXPECT_THROW((void)swapper.add(other.size(), other.data()), OffloadError);
  expect_both_fired();
  faults->clear();
  const ParamId other_id = swapper.add(other.size(), other.data());
  EXPECT_EQ(other_id, id + 1);
  EXPECT_EQ(store.stats().file_bytes, file_bytes + 12288 + 4096);
  EXPECT_EQ(gather(swapper.swap_in(other_id)), other);
  // Written whole again, the first partition is readable.
  swapper.write_back(id, new_values.data());
  EXPECT_EQ(gather(swapper.swap_in(id)), new_values);
}

// A swap_in of a partition whose reads are done must not wait for another partition's
// prefetch queued after it. The later prefetch is held in the I/O backend (fault kDelay)
// for longer than the whole check takes when nothing waits for it: had swap_in waited for
// it, it could not have returned before that delay was over.
TEST(ParamSwapper, SwapInWaitsOnlyForItsOwnPartition) {
  const auto seed = static_cast<uint32_t>(test_seed());
  ZINF_TRACE_SEED(seed);
  std::mt19937 rng(seed);
  FaultRig rig(std::nullopt);
  rig.start();
  NvmeStore& store = *rig.store;
  ParamSwapper& swapper = *rig.swapper;
  aio::FaultInjector* faults = rig.faults.get();
  const std::vector<uint16_t> fast = random_half(rng, 1700);  // 2 chunks
  const std::vector<uint16_t> slow = random_half(rng, 900);   // 1 chunk: one delayed request
  const ParamId fast_id = swapper.add(fast.size(), fast.data());
  const uint64_t slow_begin = store.stats().file_bytes;
  const ParamId slow_id = swapper.add(slow.size(), slow.data());
  const uint64_t slow_end = store.stats().file_bytes;
  constexpr auto kDelay = std::chrono::milliseconds(1500);
  const size_t rule = faults->add(aio::FaultRule{.op = aio::Op::kRead,
                                                 .offset_begin = slow_begin,
                                                 .offset_end = slow_end,
                                                 .count = 0,
                                                 .kind = aio::FaultKind::kDelay,
                                                 .delay = kDelay});
  ASSERT_EQ(swapper.prefetch(std::vector<ParamId>{fast_id}), 1u);
  const auto start = std::chrono::steady_clock::now();
  ASSERT_EQ(swapper.prefetch(std::vector<ParamId>{slow_id}), 1u);
  const ParamView view = swapper.swap_in(fast_id);
  const auto fast_done = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(gather(view), fast);
  EXPECT_LT(fast_done, kDelay) << "swap_in waited for a later prefetch of another partition";
  swapper.release(fast_id);
  EXPECT_EQ(gather(swapper.swap_in(slow_id)), slow);
  // The delay really held the slow partition back, so the bound above is meaningful.
  EXPECT_GE(std::chrono::steady_clock::now() - start, kDelay);
  EXPECT_EQ(faults->fired(rule), 1u);
}

// A swapper gives its extents back when it is destroyed — with reads still in flight and
// partitions resident — so swappers made one after another on one store reuse the same
// space: the swap file does not grow with every one.
TEST(ParamSwapper, DestroyedSwapperReturnsItsExtents) {
  const auto seed = static_cast<uint32_t>(test_seed());
  ZINF_TRACE_SEED(seed);
  std::mt19937 rng(seed);
  TempDir dir;
  NvmeStore store(store_config(dir.path()));
  ParamSwapperConfig config = small_config();
  config.max_in_cpu = 1000;  // the first partition stays in CPU memory, the rest on NVMe
  std::vector<NvmeStoreStats> during, after;
  std::vector<uint64_t> file_sizes;
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    {
      ParamSwapper swapper(config, store);
      std::vector<std::vector<uint16_t>> values;
      std::vector<ParamId> ids;
      for (uint64_t n : {1000, 1500, 900, 2500, 1}) {
        values.push_back(random_half(rng, n));
        ids.push_back(swapper.add(n, values.back().data()));
      }
      EXPECT_EQ(gather(swapper.swap_in(ids[1])), values[1]);  // resident at destruction
      EXPECT_EQ(swapper.prefetch(std::vector<ParamId>{ids[2], ids[4]}), 2u);  // in flight
      during.push_back(store.stats());
    }
    after.push_back(store.stats());
    file_sizes.push_back(std::filesystem::file_size(store.path()));
    uint64_t probe_offset = 0;
    EXPECT_TRUE(testing::holds_no_extent(store, &probe_offset));
    EXPECT_EQ(probe_offset, 0u);
  }
  // 2 + 1 + 3 + 1 chunks of at most 4096 bytes each.
  EXPECT_EQ(during[0].file_bytes, 7u * 4096u);
  for (size_t round = 0; round < after.size(); ++round) {
    EXPECT_EQ(during[round].file_bytes, during[0].file_bytes) << "round " << round;
    EXPECT_EQ(during[round].reserved_bytes, during[0].reserved_bytes) << "round " << round;
    // Destroyed, the swapper's extents are free and the store gives the tail back.
    EXPECT_EQ(after[round].file_bytes, 0u) << "round " << round;
    EXPECT_EQ(file_sizes[round], 0u) << "round " << round;
  }
}

TEST(ParamSwapper, OutOfSpaceOnFirstWrite) {
  NvmeOnlyRig rig;
  NvmeStore& store = rig.store;
  ParamSwapper& swapper = rig.swapper;
  (void)store.allocate(uint64_t{1} << 60);  // someone else's huge reservation
  const std::vector<uint16_t> v(10, 1);
  try {
    (void)swapper.add(v.size(), v.data());
    FAIL() << "write past the free space accepted";
  } catch (const OffloadError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kSpace) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, ParamSwapperFaults, ::testing::ValuesIn(testing::all_backends()),
                         testing::backend_param_name);

}  // namespace
}  // namespace zinf::offload
