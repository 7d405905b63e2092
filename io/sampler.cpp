// Sample windows, the deterministic world-size-invariant sampler, and the per-rank batch loader.
#include <array>
#include <mutex>
#include <numeric>
#include <utility>

#include "io/splitmix64.hpp"
#include "zerotrain/data.hpp"
#include "zerotrain/error.hpp"

namespace zt {
namespace {

using detail::kSplitMixGolden;
using detail::mix64;
using detail::SplitMix64;

/// The documented epoch permutation (docs/data.md): generator state seed ^ mix64(epoch + golden),
/// then Fisher-Yates from the back: for i = n-1 .. 1, swap(order[i], order[below(i + 1)]).
std::vector<std::uint64_t> shuffled_order(std::uint64_t num_samples, std::uint64_t seed,
                                          std::uint64_t epoch) {
  std::vector<std::uint64_t> order(num_samples);
  std::iota(order.begin(), order.end(), std::uint64_t{0});
  SplitMix64 rng(seed ^ mix64(epoch + kSplitMixGolden));
  for (std::uint64_t i = num_samples - 1; i > 0; --i) std::swap(order[i], order[rng.below(i + 1)]);
  return order;
}

}  // namespace

// ---- windows -----------------------------------------------------------------------------------

std::uint64_t SampleWindows::count(std::uint64_t token_count) const {
  ZT_CHECK(seq_len > 0, "sequence length must be >= 1");
  if (token_count < seq_len + 1) return 0;
  return (token_count - seq_len - 1) / effective_stride() + 1;
}

// ---- sampler -----------------------------------------------------------------------------------

// Permutations of the two most recently used epochs: a global batch spans at most two epochs
// when B <= num_samples, and every rank's loader walks forward, so two slots avoid recomputation.
struct DataSampler::Cache {
  std::mutex mutex;
  std::array<std::pair<std::uint64_t, std::shared_ptr<const std::vector<std::uint64_t>>>, 2> slots;
  std::size_t next_slot = 0;
};

DataSampler::DataSampler(std::uint64_t num_samples, std::uint64_t seed, bool shuffle)
    : num_samples_(num_samples), seed_(seed), shuffle_(shuffle), cache_(std::make_shared<Cache>()) {
  ZT_CHECK(num_samples > 0, "a sampler needs at least one sample, got 0");
}

std::vector<std::uint64_t> DataSampler::epoch_order(std::uint64_t epoch) const {
  if (!shuffle_) {
    std::vector<std::uint64_t> order(num_samples_);
    std::iota(order.begin(), order.end(), std::uint64_t{0});
    return order;
  }
  return shuffled_order(num_samples_, seed_, epoch);
}

std::vector<std::uint64_t> DataSampler::samples_at(std::uint64_t first, std::uint64_t count) const {
  std::vector<std::uint64_t> ids;
  ids.reserve(count);
  std::shared_ptr<const std::vector<std::uint64_t>> order;
  std::uint64_t order_epoch = 0;
  for (std::uint64_t position = first; position < first + count; ++position) {
    const std::uint64_t epoch = position / num_samples_;
    const std::uint64_t offset = position % num_samples_;
    if (!shuffle_) {
      ids.push_back(offset);
      continue;
    }
    if (!order || order_epoch != epoch) {
      std::lock_guard lock(cache_->mutex);
      order.reset();
      for (const auto& [cached_epoch, cached] : cache_->slots)
        if (cached && cached_epoch == epoch) order = cached;
      if (!order) {
        order =
            std::make_shared<const std::vector<std::uint64_t>>(shuffled_order(num_samples_, seed_, epoch));
        cache_->slots[cache_->next_slot] = {epoch, order};
        cache_->next_slot = (cache_->next_slot + 1) % cache_->slots.size();
      }
      order_epoch = epoch;
    }
    ids.push_back((*order)[offset]);
  }
  return ids;
}

std::uint64_t DataSampler::sample_at(std::uint64_t stream_position) const {
  return samples_at(stream_position, 1).front();
}

std::vector<std::uint64_t> DataSampler::global_batch(std::uint64_t step,
                                                     std::uint64_t global_batch_size) const {
  return samples_at(step * global_batch_size, global_batch_size);
}

std::vector<std::uint64_t> DataSampler::sample_ids_for(std::uint64_t step, const BatchShape& shape,
                                                       std::uint64_t rank, std::uint64_t micro_step) const {
  return sample_ids_at(step * shape.global_batch(), shape, rank, micro_step);
}

std::vector<std::uint64_t> DataSampler::sample_ids_at(std::uint64_t batch_start, const BatchShape& shape,
                                                      std::uint64_t rank, std::uint64_t micro_step) const {
  ZT_CHECK(shape.micro_batch > 0 && shape.grad_accum > 0 && shape.data_parallel > 0,
           "batch shape needs micro_batch, grad_accum and data_parallel >= 1, got ", shape.micro_batch, ", ",
           shape.grad_accum, ", ", shape.data_parallel);
  ZT_CHECK(rank < shape.data_parallel, "data-parallel rank ", rank, " is out of range, expected < ",
           shape.data_parallel);
  ZT_CHECK(micro_step < shape.grad_accum, "micro-step ", micro_step,
           " is out of range, expected < grad_accum ", shape.grad_accum);
  // Micro-step a of the global batch is the global micro-batch of m*N consecutive positions;
  // rank r takes its r-th block of m.
  const std::uint64_t first =
      batch_start + micro_step * shape.micro_batch * shape.data_parallel + rank * shape.micro_batch;
  return samples_at(first, shape.micro_batch);
}

DataPosition DataSampler::position_at(std::uint64_t stream_position) const {
  return DataPosition{.seed = seed_,
                      .num_samples = num_samples_,
                      .epoch = stream_position / num_samples_,
                      .offset = stream_position % num_samples_};
}

// ---- loader ------------------------------------------------------------------------------------

namespace {

std::uint64_t checked_sample_count(const TokenView& tokens, const SampleWindows& windows) {
  ZT_CHECK_AS(ConfigError, windows.seq_len > 0, "sequence length must be >= 1, got 0");
  const std::uint64_t count = windows.count(tokens.size());
  if (count == 0)
    ZT_THROW_AS(ConfigError, "dataset '", tokens.source(), "' has ", tokens.size(),
                " tokens, too few for one sample of sequence length ", windows.seq_len, " (needs ",
                windows.seq_len + 1, ")");
  return count;
}

}  // namespace

BatchLoader::BatchLoader(TokenView tokens, SampleWindows windows, BatchShape shape, std::uint64_t rank,
                         std::uint64_t seed, bool shuffle)
    : tokens_(tokens),
      windows_(windows),
      shape_(shape),
      rank_(rank),
      sampler_(checked_sample_count(tokens, windows), seed, shuffle) {
  ZT_CHECK_AS(ConfigError, shape.micro_batch > 0 && shape.grad_accum > 0 && shape.data_parallel > 0,
              "batch shape needs micro_batch, grad_accum and data_parallel >= 1, got ", shape.micro_batch,
              ", ", shape.grad_accum, ", ", shape.data_parallel);
  ZT_CHECK_AS(ConfigError, rank < shape.data_parallel, "data-parallel rank ", rank,
              " is out of range, expected < ", shape.data_parallel);
}

std::vector<std::uint64_t> BatchLoader::sample_ids(std::uint64_t micro_step) const {
  return sampler_.sample_ids_at(batch_start_, shape_, rank_, micro_step);
}

void BatchLoader::load(std::uint64_t micro_step, std::span<std::int32_t> inputs,
                       std::span<std::int32_t> targets) const {
  const std::uint64_t row = windows_.seq_len;
  const std::uint64_t expected = shape_.micro_batch * row;
  ZT_CHECK(inputs.size() == expected && targets.size() == expected, "batch buffers hold ", inputs.size(),
           " and ", targets.size(), " tokens, expected micro_batch * seq_len = ", shape_.micro_batch, " * ",
           row, " = ", expected, " each");
  const std::vector<std::uint64_t> ids = sample_ids(micro_step);
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const std::uint64_t first = windows_.first_token(ids[i]);
    tokens_.copy_to(first, inputs.subspan(i * row, row));
    tokens_.copy_to(first + 1, targets.subspan(i * row, row));  // the next token of each input position
  }
}

BatchLoader::MicroBatch BatchLoader::load(std::uint64_t micro_step) const {
  MicroBatch batch;
  batch.inputs.resize(shape_.micro_batch * windows_.seq_len);
  batch.targets.resize(batch.inputs.size());
  load(micro_step, batch.inputs, batch.targets);
  batch.sample_ids = sample_ids(micro_step);
  return batch;
}

void BatchLoader::advance() {
  batch_start_ += shape_.global_batch();
}

void BatchLoader::restore(const DataPosition& position) {
  if (position.seed != sampler_.seed() || position.num_samples != sampler_.num_samples())
    ZT_THROW_AS(ConfigError, "cannot resume data position: it was saved with seed ", position.seed, " on ",
                position.num_samples, " samples, but this loader has seed ", sampler_.seed(), " and ",
                sampler_.num_samples(), " samples of '", tokens_.source(), "' (same data and seed expected)");
  ZT_CHECK_AS(ConfigError, position.offset < position.num_samples, "data position offset ", position.offset,
              " is out of range, expected < ", position.num_samples);
  batch_start_ = position.stream_position();
}

}  // namespace zt
