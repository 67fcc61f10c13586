// ParamStore's write-back of slices kept on NVMe: pieces of a slice (an optimizer step's
// sub-groups cutting through it) are stored once, whole, when they cover it, and pieces
// that never cover it are stored as they are by flush_writes() — or before the slice is
// read or fetched — so the stored values are always the written ones.

#include "zero/param_store.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "offload/cpu_accelerator.h"
#include "offload/nvme_store.h"
#include "offload/param_swapper.h"
#include "tests/common/seed.h"
#include "tests/common/temp_dir.h"
#include "zero/comm/single_communicator.h"

namespace zinf::zero {
namespace {

// One param of `numel` fp32 elements on NVMe (checksummed, chunks of 100 elements), with
// random initial values.
struct NvmeParam {
  explicit NvmeParam(uint64_t numel)
      : layout({numel}, 1, 0, 1'000'000'000), initial(random_values(numel, 1)) {
    offload::NvmeStoreConfig sc;
    sc.nvme_path = dir.path();
    sc.name = "params";
    sc.checksums = true;
    sc.aio.backend = aio::BackendKind::kPsync;
    nvme = std::make_unique<offload::NvmeStore>(sc);
    offload::ParamSwapperConfig pc;
    pc.buffer_count = 4;
    pc.buffer_size = 100;
    pc.max_in_cpu = 0;
    pc.element_bytes = 4;
    swapper = std::make_unique<offload::ParamSwapper>(pc, *nvme);
    ParamStore::Options so;
    so.tier = OffloadTarget::kNvme;
    so.dtype = DType::kFloat32;
    store = std::make_unique<ParamStore>(so, layout, std::vector<size_t>{0}, accelerator, comm,
                                         swapper.get());
    store->set_slice(0, initial.data());
  }

  static std::vector<float> random_values(uint64_t numel, uint64_t salt) {
    std::mt19937_64 rng(::zinf::testing::test_seed() + salt);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    std::vector<float> v(numel);
    for (float& x : v) x = dist(rng);
    return v;
  }

  std::vector<float> read() {
    std::vector<float> v(initial.size());
    store->read_slice(0, v.data());
    return v;
  }

  ::zinf::testing::TempDir dir;
  PartitionLayout layout;
  offload::CpuAccelerator accelerator{1ull << 26};
  SingleCommunicator comm;
  std::vector<float> initial;
  std::unique_ptr<offload::NvmeStore> nvme;
  std::unique_ptr<offload::ParamSwapper> swapper;
  std::unique_ptr<ParamStore> store;
};

TEST(ParamStore, PiecesThatCoverASliceAreStoredOnceWhole) {
  ZINF_TRACE_SEED(::zinf::testing::test_seed());
  NvmeParam p(250);  // 3 extents: 100, 100, 50 elements
  const std::vector<float> updated = NvmeParam::random_values(250, 2);
  const offload::NvmeStoreStats before = p.nvme->stats();
  // Out of order, cutting through the extents.
  p.store->write_slice(0, 170, updated.data() + 170, 80);
  p.store->write_slice(0, 0, updated.data(), 37);
  EXPECT_EQ(p.nvme->stats().writes, before.writes) << "nothing stored before the slice is whole";
  p.store->write_slice(0, 37, updated.data() + 37, 133);
  const offload::NvmeStoreStats after = p.nvme->stats();
  EXPECT_EQ(after.writes - before.writes, 3u) << "each extent written once";
  EXPECT_EQ(after.bytes_written - before.bytes_written, 250u * 4);
  EXPECT_EQ(after.bytes_read, before.bytes_read) << "no read-modify-write";
  p.store->flush_writes();
  EXPECT_EQ(p.nvme->stats().writes, after.writes) << "nothing left to flush";
  EXPECT_EQ(p.read(), updated);
}

TEST(ParamStore, PiecesThatNeverCoverASliceAreStoredAsTheyAre) {
  ZINF_TRACE_SEED(::zinf::testing::test_seed());
  NvmeParam p(250);
  const std::vector<float> updated = NvmeParam::random_values(250, 2);
  p.store->write_slice(0, 90, updated.data() + 90, 20);
  p.store->write_slice(0, 200, updated.data() + 200, 10);
  std::vector<float> expected = p.initial;
  std::memcpy(expected.data() + 90, updated.data() + 90, 20 * 4);
  std::memcpy(expected.data() + 200, updated.data() + 200, 10 * 4);
  EXPECT_EQ(p.read(), expected) << "read_slice stores the pieces first";

  // flush_writes() at the end of a step, then a fetch sees the stored values.
  p.store->write_slice(0, 0, updated.data(), 5);
  p.store->flush_writes();
  std::memcpy(expected.data(), updated.data(), 5 * 4);
  EXPECT_EQ(p.read(), expected);
}

TEST(ParamStore, AFetchStoresPendingPiecesFirst) {
  ZINF_TRACE_SEED(::zinf::testing::test_seed());
  NvmeParam p(250);
  const std::vector<float> updated = NvmeParam::random_values(250, 2);
  p.store->write_slice(0, 120, updated.data() + 120, 30);
  std::vector<float> expected = p.initial;
  std::memcpy(expected.data() + 120, updated.data() + 120, 30 * 4);
  std::vector<float> fetched(250);
  p.store->set_callbacks(
      [&](size_t, void* data) { std::memcpy(fetched.data(), data, fetched.size() * 4); },
      [](size_t) {});
  p.store->wait_gathered(0);
  p.store->release(0);
  EXPECT_EQ(fetched, expected);
}

}  // namespace
}  // namespace zinf::zero
