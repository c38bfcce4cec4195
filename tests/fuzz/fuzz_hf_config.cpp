// Fuzz target: a Hugging Face config.json through the families
// (llm::hf_model_plan, format/hf_families.h): the JSON reader, the key map
// each family's configure() reads through, rope_scaling (YaRN, Llama 3,
// LongRoPE factor arrays) and the tensor plan. Any input either gives a plan
// whose spec validates and whose tensor shapes are positive, or fails with
// LLM_ERR_FORMAT / LLM_ERR_UNSUPPORTED.
//
// Input: the config.json text.
#include "core/error.h"
#include "format/hf_families.h"
#include "format/json.h"
#include "fuzz_common.h"
#include "format/family_spec.h"

LLM_FUZZ_TARGET(hf_config) {
  if (size > 65536) return 0;
  try {
    const llm::json::Value v = llm::json::parse(reinterpret_cast<const char*>(data), size, "config.json");
    const llm::HfModelPlan p = llm::hf_model_plan(v);
    llm::validate_spec(p.config);
    for (const llm::HfTensor& t : p.tensors) {
      LLM_FUZZ_EXPECT(!t.shape.empty());
      for (int64_t d : t.shape) LLM_FUZZ_EXPECT(d > 0);
    }
    for (const llm::TensorData& t : p.extra) LLM_FUZZ_EXPECT(t.nbytes == size_t(t.numel()) * 4);
  } catch (const llm::Error& e) {
    LLM_FUZZ_EXPECT(e.status() == LLM_ERR_FORMAT || e.status() == LLM_ERR_UNSUPPORTED);
  }
  return 0;
}
