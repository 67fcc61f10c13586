// TiedGradRouter on plain autograd graphs: what it delivers equals autograd's own sum bit for
// bit, whatever the number of uses; one use is left to autograd; hooks of an earlier
// backward do nothing once it is finished.

#include "zero/tied_grads.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <vector>

#include "tests/common/seed.h"

namespace zinf::zero {
namespace {

struct Delivered {
  size_t param = 0;
  at::Tensor grad;
};

at::Tensor leaf(const std::vector<int64_t>& shape) {
  return at::randn(shape).set_requires_grad(true);
}

TEST(TiedGradRouter, DeliversAutogradsSumOfThreeUsesAfterTheLast) {
  const uint64_t seed = ::zinf::testing::test_seed();
  ZINF_TRACE_SEED(seed);
  at::manual_seed(static_cast<int64_t>(seed));
  const at::Tensor w = leaf({37, 11});
  const at::Tensor a = at::randn({5, 37});
  const at::Tensor b = at::randn({11, 3});
  auto loss_of = [&] {
    // Three uses, each reaching w's accumulator through a different node.
    return (a.matmul(w)).pow(2).sum() + w.matmul(b).tanh().sum() + (w * w.detach()).sum();
  };
  loss_of().backward();
  const at::Tensor expected = w.grad().clone();
  w.mutable_grad().reset();

  std::vector<Delivered> delivered;
  TiedGradRouter router({{7, w, static_cast<uint64_t>(w.numel()) * 4}},
                        [&](size_t p, const at::Tensor& g) {
                          delivered.push_back({p, g.clone()});
                        });
  EXPECT_EQ(router.pinned_bytes(), 4096u);  // 1628 bytes, a page
  const at::Tensor loss = loss_of();
  router.route(loss);
  EXPECT_TRUE(router.routed(7));
  EXPECT_FALSE(router.routed(8));
  loss.backward();
  router.finish();
  EXPECT_FALSE(router.routed(7));
  ASSERT_EQ(delivered.size(), 1u);
  EXPECT_EQ(delivered[0].param, 7u);
  EXPECT_TRUE(at::equal(delivered[0].grad, expected));
  EXPECT_FALSE(w.grad().defined()) << "autograd still summed the uses";
  EXPECT_EQ(router.stats().parked, 2u);
  EXPECT_EQ(router.stats().parked_bytes, 2u * 37 * 11 * 4);
  EXPECT_EQ(router.stats().delivered, 1u);
}

TEST(TiedGradRouter, LeavesASingleUseToAutograd) {
  const at::Tensor w = leaf({4, 4});
  std::vector<Delivered> delivered;
  TiedGradRouter router({{0, w, 64}}, [&](size_t p, const at::Tensor& g) {
    delivered.push_back({p, g});
  });
  const at::Tensor loss = w.sum();
  router.route(loss);
  EXPECT_FALSE(router.routed(0));
  loss.backward();
  router.finish();
  EXPECT_TRUE(delivered.empty());
  EXPECT_TRUE(at::equal(w.grad(), at::ones({4, 4})));
}

TEST(TiedGradRouter, HooksOfAFinishedBackwardLeaveTheGradientToAutograd) {
  const at::Tensor w = leaf({3, 3});
  std::vector<Delivered> delivered;
  TiedGradRouter router({{0, w, 36}}, [&](size_t p, const at::Tensor& g) {
    delivered.push_back({p, g});
  });
  const at::Tensor loss = (w * 2).sum() + (w * 3).sum();
  router.route(loss);
  loss.backward({}, /*retain_graph=*/true);
  router.finish();
  ASSERT_EQ(delivered.size(), 1u);
  EXPECT_TRUE(at::equal(delivered[0].grad, at::full({3, 3}, 5.0)));
  EXPECT_FALSE(w.grad().defined());
  loss.backward();  // the same graph again, not routed this time
  EXPECT_EQ(delivered.size(), 1u);
  EXPECT_TRUE(at::equal(w.grad(), at::full({3, 3}, 5.0)));
}

TEST(TiedGradRouter, AGraphThatOutlivesTheRouterKeepsAutogradsGradient) {
  const at::Tensor w = leaf({3, 2});
  const at::Tensor loss = (w * 2).sum() + (w * 3).sum();
  {
    TiedGradRouter router({{0, w, 24}}, [](size_t, const at::Tensor&) {
      ADD_FAILURE() << "delivered by a router that is gone";
    });
    router.route(loss);
    EXPECT_TRUE(router.routed(0));
  }
  loss.backward();
  EXPECT_TRUE(at::equal(w.grad(), at::full({3, 2}, 5.0)));
}

TEST(TiedGradRouter, ADetachedUseIsNoUse) {
  // w * 0 reaches w's accumulator (with zeros); a use through a detached tensor does not
  // reach it at all: two routed uses, and their sum delivered.
  const at::Tensor w = leaf({2, 5});
  std::vector<Delivered> delivered;
  TiedGradRouter router({{3, w, 40}}, [&](size_t p, const at::Tensor& g) {
    delivered.push_back({p, g});
  });
  const at::Tensor loss = (w * 0).sum() + (w.detach() * 4).sum() + w.pow(2).sum();
  router.route(loss);
  EXPECT_TRUE(router.routed(3));
  loss.backward();
  router.finish();
  ASSERT_EQ(delivered.size(), 1u);
  EXPECT_TRUE(at::equal(delivered[0].grad, (2 * w).detach()));
}

}  // namespace
}  // namespace zinf::zero
