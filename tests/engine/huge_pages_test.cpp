// CPU weights on transparent huge pages: the block itself, and a model whose
// matrices were copied into one computing exactly what it computes on the
// loader's own bytes (file mapping, or decompressed buffers that the copy
// frees).
#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "core/alloc.h"
#include "core/error.h"
#include "format/llama2c.h"
#include "llm.h"
#include "backend/cpu/matmul.h"
#include "model/model.h"
#include "reference.h"
#include "tmp.h"
#include "convert/llm_file_writer.h"

using llm::testing::model_path;

namespace {

#ifdef __linux__
// The kernel's huge-page mode is "always" or "madvise" (not "never", not absent).
bool huge_pages_available() {
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string mode;
  std::getline(f, mode);
  return !mode.empty() && mode.find("[never]") == std::string::npos;
}

// The VmFlags line of the /proc/self/smaps entry that holds p ("" if none).
std::string vm_flags_of(const void* p) {
  std::ifstream f("/proc/self/smaps");
  std::string line;
  bool inside = false;
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  while (std::getline(f, line)) {
    unsigned long long lo = 0, hi = 0;
    char dash = 0;
    std::istringstream head(line);
    if (line.find(':') > line.find(' ') && (head >> std::hex >> lo >> dash >> hi) && dash == '-') {
      inside = a >= lo && a < hi;
      continue;
    }
    if (inside && line.rfind("VmFlags:", 0) == 0) return line;
  }
  return "";
}
#endif

TEST(HugePageBlock, WholeAlignedPagesThatMove) {
  const size_t size = (size_t(3) << 20) + 5;
  llm::HugePageBlock a(size);
  ASSERT_NE(a.data(), nullptr);
  EXPECT_EQ(a.size(), size);
  a.data()[0] = 1;
  a.data()[size - 1] = 2;
#ifdef __linux__
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a.data()) % (uintptr_t(2) << 20), 0u);
  EXPECT_EQ(a.advised(), huge_pages_available());
  if (a.advised()) {
    const std::string flags = vm_flags_of(a.data() + size - 1);
    EXPECT_NE(flags.find(" hg"), std::string::npos) << flags;  // the kernel recorded MADV_HUGEPAGE
  }
#endif
  uint8_t* const p = a.data();
  const bool advised = a.advised();
  llm::HugePageBlock b(std::move(a));
  EXPECT_EQ(a.data(), nullptr);
  EXPECT_EQ(a.size(), 0u);
  EXPECT_EQ(b.data(), p);
  EXPECT_EQ(b.advised(), advised);
  EXPECT_EQ(b.data()[size - 1], 2);
  llm::HugePageBlock c(100);  // small blocks work too
  c.data()[99] = 3;
  c = std::move(b);
  EXPECT_EQ(c.data(), p);
  EXPECT_EQ(c.data()[0], 1);
}

TEST(HugePageBlock, InjectedFailureIsOutOfMemory) {
  llm::alloc_fail_after(1);
  try {
    llm::HugePageBlock b(size_t(4) << 20);
    ADD_FAILURE() << "no failure";
  } catch (const llm::Error& e) {
    EXPECT_EQ(e.status(), LLM_ERR_OUT_OF_MEMORY);
  }
  llm::alloc_fail_after(0);
}

// stories260K written as .llm with every float tensor zstd-compressed: the
// reader decompresses into buffers of its own, which the copy then frees.
std::string zstd_llm() {
  static std::string path;
  if (path.empty()) {
    path = llm::testing::tmp_path("huge_pages_stories260K.llm");
    llm::LlmWriteOptions o;
    o.min_saving = 0.0;
    o.chunk_bytes = 1 << 16;
    llm::write_llm(llm::read_llama2c(model_path("stories260K.bin"), model_path("tok512.bin")), path, o);
  }
  return path;
}

// Logits after a prefill and after each of a few greedy decode steps.
std::vector<std::vector<float>> run(const std::string& path, uint32_t flags) {
  std::vector<std::vector<float>> out;
  llm_load_params p;
  llm_load_params_init(&p);
  p.flags = flags;
  p.n_threads = 2;
  llm_model* m = nullptr;
  EXPECT_EQ(llm_load(path.c_str(), &p, &m), LLM_OK) << path << ": " << llm_last_error();
  if (!m) return out;
  llm_session* s = nullptr;
  EXPECT_EQ(llm_session_create(m, nullptr, &s), LLM_OK) << llm_last_error();
  const llm_token prompt[] = {1, 403, 407, 261, 378, 300, 290, 280};
  if (s && llm_prefill(s, prompt, sizeof prompt / sizeof prompt[0]) == LLM_OK) {
    for (int step = 0; step < 4; ++step) {
      const float* lg = nullptr;
      size_t n = 0;
      EXPECT_EQ(llm_logits(s, &lg, &n), LLM_OK);
      out.emplace_back(lg, lg + n);
      llm_token next = -1;
      EXPECT_EQ(llm_decode_step(s, nullptr, &next), LLM_OK) << llm_last_error();
    }
  }
  llm_session_free(s);
  llm_model_free(m);
  return out;
}

TEST(HugePageWeights, CopyComputesExactlyWhatTheLoadersBytesDo) {
  const std::string paths[] = {model_path("stories260K.gguf"), model_path("stories260K-q4_0.gguf"),
                               model_path("stories260K-q8_0.gguf"), zstd_llm()};
  for (const std::string& path : paths) {
    for (uint32_t math : {0u, uint32_t(LLM_LOAD_REFERENCE_MATH)}) {
      const auto copied = run(path, math);
      const auto in_place = run(path, math | LLM_LOAD_NO_HUGE_PAGES);
      ASSERT_EQ(copied.size(), 4u) << path;
      ASSERT_EQ(in_place.size(), 4u) << path;
      // Q4_0 under the AVX2 or AVX-512 family, Q8_0 under AVX-512: the copy
      // interleaves the matrices (X8), whose kernels sum the same integer
      // dots in another order: the same up to float rounding. Everything
      // else: the same bits.
      const bool x8 = math == 0 && ((path.find("q4_0") != std::string::npos &&
                                       llm::cpu::x8_preferred(llm::DType::Q4, llm::cpu::MatmulMode::Fast)) ||
                                      (path.find("q8_0") != std::string::npos &&
                                       llm::cpu::x8_preferred(llm::DType::Q8, llm::cpu::MatmulMode::Fast)));
      if (!x8) {
        EXPECT_EQ(copied, in_place) << path << " flags " << math;
        continue;
      }
      for (size_t i = 0; i < copied.size(); ++i) {
        ASSERT_EQ(copied[i].size(), in_place[i].size());
        double d2 = 0, r2 = 0;
        for (size_t j = 0; j < copied[i].size(); ++j) {
          d2 += double(copied[i][j] - in_place[i][j]) * (copied[i][j] - in_place[i][j]);
          r2 += double(in_place[i][j]) * in_place[i][j];
        }
        EXPECT_LT(d2, 1e-9 * r2) << path << " step " << i;
      }
    }
  }
}

TEST(HugePageWeights, MatricesMoveIntoTheBlockUnlessAskedNotTo) {
  for (bool huge : {true, false}) {
    llm::LoadOptions o;
    o.device = LLM_DEVICE_CPU;
    o.n_threads = 1;
    o.huge_pages = huge;
    auto m = llm::Model::load(zstd_llm(), o);
#ifdef __linux__
    const bool expect = huge && huge_pages_available();
#else
    const bool expect = false;
#endif
    EXPECT_EQ(m->weights_on_huge_pages(), expect) << "huge_pages " << huge;
#ifdef __linux__
    if (expect) {
      // One 2 MiB-aligned block in layer order: the first matrix starts it.
      const uint8_t* first = m->layers().front().wq.data;
      EXPECT_EQ(reinterpret_cast<uintptr_t>(first) % (uintptr_t(2) << 20), 0u);
      EXPECT_NE(vm_flags_of(m->output().data).find(" hg"), std::string::npos);
    }
#endif
  }
}

}  // namespace
