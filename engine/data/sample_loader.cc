// SampleLoader: samples of seq_len + 1 tokens, shuffled per epoch, dealt to ranks.
//
// Global position g (counted over all ranks since the start) is epoch g / samples_, index
// g % samples_ of that epoch's order. Each call to next() takes, for each of its
// micro_batch rows, the world_size consecutive positions starting at cursor_ and keeps the
// one at cursor_ + rank: a micro-batch of B on W ranks consumes B * W global positions, and
// the global batch holds the same samples for any W with the same B * W.
#include <numeric>

#include "engine/data/data.h"
#include "engine/data/internal.h"

namespace zinf::data {

SampleLoader::SampleLoader(const TokenSource& source, LoaderOptions options)
    : source_(source), options_(options) {
  if (options_.seq_len < 1) {
    throw DataError("sampler: seq_len " + std::to_string(options_.seq_len) +
                    " must be at least 1 (" + source_.description() + ")");
  }
  if (options_.world_size < 1 || options_.rank < 0 || options_.rank >= options_.world_size) {
    throw DataError("sampler: rank " + std::to_string(options_.rank) + " of world size " +
                    std::to_string(options_.world_size) + " is not a valid rank");
  }
  const auto sample_tokens = static_cast<uint64_t>(options_.seq_len) + 1;
  source_samples_ = static_cast<int64_t>(source_.size() / sample_tokens);
  samples_ = source_samples_ - source_samples_ % options_.world_size;
  if (samples_ == 0) {
    throw DataError(source_.description() +
                    " is too short: " + std::to_string(options_.world_size) +
                    " rank(s) need at least " + std::to_string(options_.world_size) +
                    " sample(s) of seq_len + 1 = " + std::to_string(sample_tokens) +
                    " tokens, and it holds " + std::to_string(source_samples_));
  }
  order_epoch();
}

int64_t SampleLoader::samples_per_epoch() const noexcept { return samples_; }

int64_t SampleLoader::global_position() const noexcept { return epoch_ * samples_ + cursor_; }

void SampleLoader::seek(int64_t global_position) {
  if (global_position < 0) {
    throw DataError("sampler: cannot seek to global position " + std::to_string(global_position) +
                    " (" + source_.description() + ")");
  }
  // Positions come in whole turns of world_size (what global_position() reports after any
  // step); another would leave the ranks' turns astride an epoch end.
  if (global_position % options_.world_size != 0) {
    throw DataError("sampler: cannot seek to global position " + std::to_string(global_position) +
                    ": not a multiple of the world size " + std::to_string(options_.world_size) +
                    " (" + source_.description() + ")");
  }
  const int64_t epoch = global_position / samples_;
  cursor_ = global_position % samples_;
  if (epoch != epoch_) {
    epoch_ = epoch;
    order_epoch();
  }
}

void SampleLoader::next(int64_t micro_batch, std::vector<int64_t>& inputs,
                        std::vector<int64_t>& targets) {
  if (micro_batch < 1) {
    throw DataError("sampler: micro-batch " + std::to_string(micro_batch) +
                    " must be at least 1 (" + source_.description() + ")");
  }
  const int64_t seq_len = options_.seq_len;
  const auto rows = static_cast<size_t>(micro_batch);
  const auto row_tokens = static_cast<size_t>(seq_len);
  inputs.resize(rows * row_tokens);
  targets.resize(rows * row_tokens);
  std::vector<int64_t> sample(row_tokens + 1);
  for (size_t row = 0; row < rows; ++row) {
    const int64_t index = order_[static_cast<size_t>(cursor_ + options_.rank)];
    source_.read(static_cast<uint64_t>(index) * (row_tokens + 1), row_tokens + 1, sample.data());
    std::copy(sample.begin(), sample.end() - 1, inputs.begin() + row * row_tokens);
    std::copy(sample.begin() + 1, sample.end(), targets.begin() + row * row_tokens);
    // samples_ is a multiple of the world size, so a turn never straddles two epochs.
    cursor_ += options_.world_size;
    if (cursor_ == samples_) {
      cursor_ = 0;
      ++epoch_;
      order_epoch();
    }
  }
}

void SampleLoader::order_epoch() {
  std::vector<int64_t> order(static_cast<size_t>(source_samples_));
  std::iota(order.begin(), order.end(), int64_t{0});
  if (options_.shuffle) {
    // Fisher-Yates driven by SplitMix64 from seed + epoch: the same on every platform.
    detail::SplitMix64 random(options_.seed + static_cast<uint64_t>(epoch_));
    for (size_t i = order.size() - 1; i > 0; --i) {
      const auto j = static_cast<size_t>(random.below(i + 1));
      std::swap(order[i], order[j]);
    }
  }
  order.resize(static_cast<size_t>(samples_));
  order_ = std::move(order);
}

}  // namespace zinf::data
