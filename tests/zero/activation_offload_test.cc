// Tests of ActivationOffload: saved inputs come back bit for bit from pinned memory and from the
// swap file in a backward's order and out of it, reads run ahead, buffers and extents are
// reused, a token dropped without its backward frees its copy, a second restore is refused, and
// I/O errors name the swap file.
#include "zero/activation_offload.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "aio/fault_backend.h"
#include "offload/error.h"
#include "offload/nvme_store.h"
#include "tests/common/seed.h"
#include "tests/common/temp_dir.h"
#include "zero/error.h"

namespace zinf::zero {
namespace {

class ActivationOffloadTest : public ::testing::TestWithParam<OffloadTarget> {
 protected:
  void SetUp() override {
    if (GetParam() == OffloadTarget::kNvme) {
      offload::NvmeStoreConfig c;
      c.nvme_path = dir_.path();
      c.name = "activation";
      c.aio.backend = aio::BackendKind::kPsync;
      c.backend_factory = aio::fault_backend_factory(faults_);
      store_ = std::make_unique<offload::NvmeStore>(c);
    }
    offload_ = std::make_unique<ActivationOffload>(GetParam(), store_.get());
  }

  ::zinf::testing::TempDir dir_;
  std::shared_ptr<aio::FaultInjector> faults_ = std::make_shared<aio::FaultInjector>();
  std::unique_ptr<offload::NvmeStore> store_;
  std::unique_ptr<ActivationOffload> offload_;  // goes before store_
};

// Inputs of odd shapes and several dtypes, as a model's blocks would save them.
std::vector<at::Tensor> inputs(uint64_t seed) {
  at::Generator g = at::detail::createCPUGenerator(seed);
  return {at::randn({3, 37, 11}, g), at::randn({5, 1001}, g).to(at::kBFloat16),
          at::randn({2, 64, 48}, g).to(at::kHalf), at::randn({1, 1, 4097}, g),
          at::randn({7, 13}, g).t()};  // not contiguous
}

TEST_P(ActivationOffloadTest, InputsComeBackBitForBitInTheBackwardsOrder) {
  const uint64_t seed = ::zinf::testing::test_seed();
  ZINF_TRACE_SEED(seed);
  for (int micro_batch = 0; micro_batch < 3; ++micro_batch) {
    const std::vector<at::Tensor> xs = inputs(seed + static_cast<uint64_t>(micro_batch));
    std::vector<at::Tensor> tokens;
    for (const at::Tensor& x : xs) tokens.push_back(offload_->save(x));
    for (size_t i = xs.size(); i-- > 0;) {
      const at::Tensor back = offload_->restore(tokens[i]);
      EXPECT_EQ(back.sizes(), xs[i].sizes());
      EXPECT_EQ(back.scalar_type(), xs[i].scalar_type());
      EXPECT_TRUE(back.is_contiguous());
      EXPECT_TRUE(at::equal(back, xs[i])) << "input " << i << " of micro-batch " << micro_batch;
    }
  }
  const ActivationOffloadStats s = offload_->stats();
  EXPECT_EQ(s.saved, 15u);
  EXPECT_EQ(s.restored, 15u);
  if (GetParam() == OffloadTarget::kNvme) {
    // Every restore but each backward's first found its read started by the one before.
    EXPECT_EQ(s.prefetched, 12u);
    // Never more than two staging buffers (a write in flight and the next input's copy; a
    // read ahead and the input being restored), each at most the largest input's 20 KiB.
    EXPECT_LE(s.pinned_bytes, 2u * 20480u);
    EXPECT_EQ(store_->stats().writes, 15u);
    EXPECT_EQ(store_->stats().reads, 15u);
  }
  // The buffers and extents of the first micro-batch served the later ones.
  const uint64_t pinned = s.pinned_bytes;
  const uint64_t nvme = s.nvme_bytes;
  std::vector<at::Tensor> tokens;
  for (const at::Tensor& x : inputs(seed)) tokens.push_back(offload_->save(x));
  for (size_t i = tokens.size(); i-- > 0;) (void)offload_->restore(tokens[i]);
  EXPECT_EQ(offload_->stats().pinned_bytes, pinned);
  EXPECT_EQ(offload_->stats().nvme_bytes, nvme);
}

TEST_P(ActivationOffloadTest, KeepsOneBufferPerInputOnCpuAndTwoForNvme) {
  std::vector<at::Tensor> tokens;
  for (int i = 0; i < 6; ++i)
    tokens.push_back(offload_->save(at::full({1000}, static_cast<double>(i))));
  for (int i = 5; i >= 0; --i) {
    EXPECT_TRUE(at::equal(offload_->restore(tokens[static_cast<size_t>(i)]),
                          at::full({1000}, static_cast<double>(i))));
  }
  const ActivationOffloadStats s = offload_->stats();
  EXPECT_EQ(s.pinned_bytes, (GetParam() == OffloadTarget::kCpu ? 6u : 2u) * 4096u);
  EXPECT_EQ(s.nvme_bytes, GetParam() == OffloadTarget::kCpu ? 0u : 6u * 4096u);
  EXPECT_EQ(s.largest_saved, 6u * 4000u);
}

// Out of a backward's order a read started ahead is used when its input's turn comes (never
// read twice), and no buffer is lost: a second round needs none more.
TEST_P(ActivationOffloadTest, RestoresOutOfOrder) {
  const std::vector<at::Tensor> xs = inputs(::zinf::testing::test_seed());
  uint64_t pinned_after_first = 0;
  for (int round = 0; round < 3; ++round) {
    std::vector<at::Tensor> tokens;
    for (const at::Tensor& x : xs) tokens.push_back(offload_->save(x));
    for (size_t i : {2u, 0u, 4u, 1u, 3u}) {
      EXPECT_TRUE(at::equal(offload_->restore(tokens[i]), xs[i])) << "input " << i;
    }
    if (round == 0) pinned_after_first = offload_->stats().pinned_bytes;
  }
  EXPECT_EQ(offload_->stats().pinned_bytes, pinned_after_first);
  if (GetParam() == OffloadTarget::kNvme) {
    EXPECT_EQ(store_->stats().reads, 15u);        // 5 inputs x 3 rounds, each read once
    EXPECT_EQ(offload_->stats().prefetched, 6u);  // 1 (after 2) and 3 (after 4), per round
  }
}

TEST_P(ActivationOffloadTest, ASecondRestoreIsRefused) {
  const at::Tensor token = offload_->save(at::ones({4, 4}));
  (void)offload_->restore(token);
  try {
    (void)offload_->restore(token);
    ADD_FAILURE() << "no error";
  } catch (const ZeroError& e) {
    EXPECT_NE(std::string(e.what()).find("restored already"), std::string::npos) << e.what();
  }
}

TEST_P(ActivationOffloadTest, ATokenDroppedWithoutItsBackwardFreesTheCopy) {
  const at::Tensor x = at::arange(10000, at::kFloat).reshape({100, 100});
  { const at::Tensor token = offload_->save(x); }  // a graph dropped before its backward
  const uint64_t pinned = offload_->stats().pinned_bytes;
  const uint64_t nvme = offload_->stats().nvme_bytes;
  for (int i = 0; i < 4; ++i) {
    const at::Tensor token = offload_->save(x);
    EXPECT_TRUE(at::equal(offload_->restore(token), x));
  }
  EXPECT_EQ(offload_->stats().pinned_bytes, pinned);
  EXPECT_EQ(offload_->stats().nvme_bytes, nvme);
}

INSTANTIATE_TEST_SUITE_P(Tiers, ActivationOffloadTest,
                         ::testing::Values(OffloadTarget::kCpu, OffloadTarget::kNvme),
                         [](const ::testing::TestParamInfo<OffloadTarget>& tier) {
                           return std::string(tier.param == OffloadTarget::kCpu ? "Cpu" : "Nvme");
                         });

class ActivationOffloadFaultTest : public ActivationOffloadTest {};

// Expects `call` to throw OffloadError naming the swap file.
template <typename Call>
void expect_io_error(Call&& call, const std::string& file) {
  try {
    call();
    ADD_FAILURE() << "no error";
  } catch (const offload::OffloadError& e) {
    EXPECT_NE(std::string(e.what()).find(file), std::string::npos) << e.what();
  }
}

TEST_P(ActivationOffloadFaultTest, AFailedWriteIsReportedNamingTheSwapFile) {
  faults_->add(aio::FaultRule{.op = aio::Op::kWrite, .path = "activation.swp"});
  const at::Tensor a = offload_->save(at::ones({64, 64}));
  // The write runs while the block computes; the next save (or the backward) meets its error.
  expect_io_error([&] { (void)offload_->save(at::ones({64, 64})); }, "activation.swp");
  // The torn extent is never read as if it held the input.
  EXPECT_THROW((void)offload_->restore(a), offload::OffloadError);
}

TEST_P(ActivationOffloadFaultTest, AFailedReadIsReportedNamingTheSwapFile) {
  faults_->add(aio::FaultRule{.op = aio::Op::kRead, .path = "activation.swp"});
  const at::Tensor a = offload_->save(at::ones({64, 64}));
  const at::Tensor b = offload_->save(at::ones({64, 64}));
  expect_io_error([&] { (void)offload_->restore(b); }, "activation.swp");
  // The next read is clean.
  EXPECT_TRUE(at::equal(offload_->restore(a), at::ones({64, 64})));
}

INSTANTIATE_TEST_SUITE_P(Nvme, ActivationOffloadFaultTest, ::testing::Values(OffloadTarget::kNvme),
                         [](const ::testing::TestParamInfo<OffloadTarget>&) {
                           return std::string("Nvme");
                         });

}  // namespace
}  // namespace zinf::zero
