// The memory plan against what a run really allocates: pinned pools and staging buffers,
// swap file bytes, resident device bytes and the optimizer's host arrays must equal the
// plan's figures, for several offload choices.

#include "engine/memory_plan.h"

#include <gtest/gtest.h>

#include "engine/engine.h"
#include "engine/model/llama.h"
#include "tests/common/temp_dir.h"

namespace zinf::engine {
namespace {

TEST(MemoryPlan, MatchesWhatTheRunAllocates) {
  ::zinf::testing::TempDir dir;
  struct Variant {
    int stage;
    zero::OffloadTarget param, optimizer;
  };
  for (const Variant& v : {Variant{0, zero::OffloadTarget::kNone, zero::OffloadTarget::kNone},
                           Variant{2, zero::OffloadTarget::kNone, zero::OffloadTarget::kCpu},
                           Variant{3, zero::OffloadTarget::kCpu, zero::OffloadTarget::kCpu},
                           Variant{3, zero::OffloadTarget::kNvme, zero::OffloadTarget::kNvme}}) {
    SCOPED_TRACE("stage " + std::to_string(v.stage));
    EngineOptions o;
    o.zero.stage = v.stage;
    o.zero.offload_param = v.param;
    o.zero.offload_optimizer = v.optimizer;
    o.zero.nvme_paths = {dir.path()};
    o.zero.sub_group_size = 7000;
    o.zero.param_buffer_size = 5000;
    o.zero.param_max_in_cpu = 3000;
    o.zero.pipeline_read = true;
    o.zero.aio.backend = aio::BackendKind::kPsync;
    o.steps_per_print = 0;
    o.memory_budget = 1ull << 30;
    LlamaConfig c = *named_llama("tiny", 64);
    auto model = std::make_shared<LlamaModelImpl>(c);
    Engine engine(model, o,
                  [](const std::string& name, at::Tensor& full) { init_parameter(1, name, full); });
    const MemoryReport r = engine.memory_report();
    EXPECT_EQ(r.pinned, r.plan.pinned);
    EXPECT_EQ(r.nvme, r.plan.nvme);
    EXPECT_EQ(engine.zero_model().stats().resident_bytes, r.plan.device_resident);
    if (v.optimizer == zero::OffloadTarget::kCpu) {
      EXPECT_EQ(r.host, r.plan.host);
    }
    EXPECT_EQ(r.plan.model_numel, static_cast<uint64_t>(c.parameter_count()));
  }
}

TEST(MemoryPlan, FormatsBytesInBinaryUnits) {
  EXPECT_EQ(format_bytes(4095), "4095 B");
  EXPECT_EQ(format_bytes(12 * 1024), "12.00 KiB");
  EXPECT_EQ(format_bytes(3ull << 30), "3.00 GiB");
}

}  // namespace
}  // namespace zinf::engine
