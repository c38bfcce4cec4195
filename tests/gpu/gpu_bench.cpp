// llm_gpu_bench: prefill and batched-decode speed of the CUDA backend,
// driven directly (below the public API, which has no cross-session
// batching yet). Used by tests/gpu/device_check.sh; prints one markdown row.
//
//   llm_gpu_bench MODEL [--name NAME] [--pp 512] [--tg 128] [--batch 1,8,32]
//                 [--reps 3] [--kv f16|f32] [--no-graphs] [--gemv-max F,Q] [--header]
//
//   ppN  prefill of N random tokens into a fresh sequence (logits of the last
//        row copied back), best of --reps; tokens/s.
//   tgN  B sequences holding 16 tokens each; N batched decode steps with
//        device argmax (graphs on unless --no-graphs) after 3 untimed steps;
//        tokens/s = B * N / time, and ms per step. "GB/s" is weight bytes
//        streamed per second at B = 1 (the decode speed-of-light check).
//   --gemv-max F,Q  BackendOptions::gemv_max_rows / gemv_max_rows_quant (where
//        GEMV passes give way to cuBLASLt GEMMs for float / quantized weights).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "core/error.h"
#include "model/model.h"

namespace {

using Clock = std::chrono::steady_clock;

double secs_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::vector<int> int_list(const char* s) {
  std::vector<int> v;
  for (const char* p = s; *p;) {
    char* end = nullptr;
    const long x = std::strtol(p, &end, 10);
    if (end == p || x <= 0 || x > 4096) {
      std::fprintf(stderr, "llm_gpu_bench: bad list '%s'\n", s);
      std::exit(2);
    }
    v.push_back(int(x));
    p = *end == ',' ? end + 1 : end;
  }
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: llm_gpu_bench MODEL [--name NAME] [--pp 512] [--tg 128] [--batch 1,8,32] [--reps 3] "
                 "[--kv f16|f32] [--no-graphs] [--gemv-max F,Q] [--header]\n");
    return 2;
  }
  std::string path = argv[1], name = argv[1];
  int pp = 512, tg = 128, reps = 3;
  std::vector<int> batches = {1, 8, 32};
  llm_kv_type kv = LLM_KV_F16;
  bool graphs = true, header = false;
  std::vector<int> gemv_max = {0, 0};
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "llm_gpu_bench: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--name") name = next();
    else if (a == "--pp") pp = std::atoi(next());
    else if (a == "--tg") tg = std::atoi(next());
    else if (a == "--reps") reps = std::max(1, std::atoi(next()));
    else if (a == "--batch") batches = int_list(next());
    else if (a == "--kv") kv = std::string(next()) == "f32" ? LLM_KV_F32 : LLM_KV_F16;
    else if (a == "--no-graphs") graphs = false;
    else if (a == "--gemv-max") {
      gemv_max = int_list(next());
      if (gemv_max.size() != 2) {
        std::fprintf(stderr, "llm_gpu_bench: --gemv-max takes F,Q\n");
        return 2;
      }
    }
    else if (a == "--header") header = true;
    else {
      std::fprintf(stderr, "llm_gpu_bench: unknown option %s\n", a.c_str());
      return 2;
    }
  }
  if (header) {
    std::printf("| model | weights GiB | load+upload s | pp%d t/s |", pp);
    for (int b : batches) std::printf(" tg%d b%d t/s (ms/step) |", tg, b);
    std::printf(" b1 weight GB/s |\n|---|---|---|---|");
    for (size_t i = 0; i < batches.size(); ++i) std::printf("---|");
    std::printf("---|\n");
  }
  try {
    const auto t_load = Clock::now();
    llm::LoadOptions lo;
    auto model = llm::Model::load(path, lo);
    llm::cuda::BackendOptions bo;
    bo.kv_type = kv;
    bo.use_graphs = graphs;
    bo.gemv_max_rows = gemv_max[0];
    bo.gemv_max_rows_quant = gemv_max[1];
    bo.max_batch = std::max(1, *std::max_element(batches.begin(), batches.end()));
    auto be = llm::cuda::Backend::create(*model, bo);
    const double load_s = secs_since(t_load);
    const llm::cuda::MemoryStats ms = be->memory();
    const int32_t vocab = model->config().vocab_size;
    std::mt19937 rng(42);
    std::uniform_int_distribution<int32_t> tok(0, vocab - 1);
    std::vector<float> logits(static_cast<size_t>(vocab));

    double pp_best = 0;
    if (pp > 0) {
      std::vector<int32_t> prompt(static_cast<size_t>(pp));
      for (int r = 0; r < reps + 1; ++r) {  // first run untimed (cuBLASLt plans, page chunks)
        for (int32_t& t : prompt) t = tok(rng);
        auto seq = be->new_sequence();
        const auto t0 = Clock::now();
        be->prefill(*seq, prompt.data(), prompt.size(), logits.data());
        const double s = secs_since(t0);
        if (r > 0) pp_best = std::max(pp_best, pp / s);
      }
    }
    std::printf("| %s | %.2f | %.1f | %.0f |", name.c_str(), double(ms.weight_bytes) / double(1ull << 30), load_s,
                pp_best);
    double b1_gbs = 0;
    for (int b : batches) {
      std::vector<std::unique_ptr<llm::cuda::Sequence>> seqs;
      std::vector<llm::cuda::Sequence*> ptrs;
      std::vector<int32_t> cur(static_cast<size_t>(b)), next(static_cast<size_t>(b));
      std::vector<int32_t> prompt(16);
      for (int i = 0; i < b; ++i) {
        for (int32_t& t : prompt) t = tok(rng);
        seqs.push_back(be->new_sequence());
        be->prefill(*seqs.back(), prompt.data(), prompt.size(), nullptr);
        ptrs.push_back(seqs.back().get());
        cur[size_t(i)] = tok(rng);
      }
      llm::cuda::DecodeOutput out;
      out.argmax = next.data();
      for (int s = 0; s < 3; ++s) {  // untimed: graph capture happens here
        be->decode(ptrs.data(), cur.data(), size_t(b), out);
        cur = next;
      }
      const auto t0 = Clock::now();
      for (int s = 0; s < tg; ++s) {
        be->decode(ptrs.data(), cur.data(), size_t(b), out);
        cur = next;
      }
      const double sec = secs_since(t0);
      std::printf(" %.1f (%.2f) |", double(b) * tg / sec, 1000.0 * sec / tg);
      if (b == 1) b1_gbs = double(ms.weight_bytes) * tg / sec / 1e9;
      std::fflush(stdout);
    }
    std::printf(" %.0f |\n", b1_gbs);
    std::fprintf(stderr, "llm_gpu_bench: %s on %s: kv budget %.1f GiB, graphs ready %zu\n", name.c_str(),
                 be->device_name().c_str(), double(be->memory().kv_budget_bytes) / double(1ull << 30),
                 be->memory().graphs_ready);
  } catch (const llm::Error& e) {
    std::printf("| %s | error: %s (%s) |\n", name.c_str(), e.what(), llm_status_string(e.status()));
    return 1;
  }
  return 0;
}
