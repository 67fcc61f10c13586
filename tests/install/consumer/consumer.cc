// consumer: a program over an installed zinf's LibTorch-free libraries.
//  - zinf::aio: writes seeded random bytes at an unaligned offset of a file in the current
//    folder through an AioHandle, reads them back and compares ("round trip of N bytes:
//    equal");
//  - zinf::config: parses a DeepSpeed config and prints the ZeRO stage and offload targets it
//    read ("config: stage 3, ..."; its header includes zero/zero_config.h, which the install
//    must carry even when the zero layer was not built).
// Exits 0 when every check holds, 1 otherwise. Seed: ZINF_TEST_SEED when set, else random
// (printed either way).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <random>
#include <string>
#include <vector>

#include "aio/config.h"
#include "aio/handle.h"
#include "engine/config/run_config.h"

int main() {
  try {
    uint64_t seed = std::random_device{}();
    if (const char* env = std::getenv("ZINF_TEST_SEED"); env != nullptr && *env != '\0') {
      seed = std::strtoull(env, nullptr, 0);
    }
    std::printf("seed %llu (rerun with ZINF_TEST_SEED=%llu)\n",
                static_cast<unsigned long long>(seed), static_cast<unsigned long long>(seed));

    // Unaligned offset and length: the head and tail take the handle's bounce path.
    constexpr uint64_t kBytes = (3u << 20) + 123;
    constexpr uint64_t kOffset = 4096 + 7;
    std::vector<unsigned char> written(kBytes);
    std::mt19937_64 rng(seed);
    for (unsigned char& byte : written) {
      byte = static_cast<unsigned char>(rng());
    }

    zinf::aio::AioConfig config;
    config.intra_op_parallelism = 2;
    zinf::aio::AioHandle handle(config);
    const std::string path = "consumer_roundtrip.bin";
    handle.pwrite(written.data(), kBytes, path, kOffset);
    std::vector<unsigned char> read(kBytes);
    handle.pread(read.data(), kBytes, path, kOffset);
    if (read != written) {
      std::fprintf(stderr, "consumer: the bytes read differ from those written\n");
      return 1;
    }
    std::printf("round trip of %llu bytes: equal (backend %s)\n",
                static_cast<unsigned long long>(kBytes),
                std::string(handle.backend_name()).c_str());

    const zinf::config::RunConfig run = zinf::config::parse_config_string(R"({
      "train_micro_batch_size_per_gpu": 2,
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
      "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}
    })");
    if (run.zero.stage != 3 || run.zero.offload_optimizer != zinf::zero::OffloadTarget::kCpu) {
      std::fprintf(stderr, "consumer: the config parsed as stage %d\n", run.zero.stage);
      return 1;
    }
    std::printf("config: stage %d, offload_optimizer cpu\n", run.zero.stage);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "consumer: %s\n", e.what());
    return 1;
  }
}
