// Quantization-aware distillation: fine-tunes a quantized model so that its
// next-token distributions match the original model's on a calibration text.
//
// GPTQ and AWQ choose each matrix's rounding to keep that matrix's output
// close on calibration inputs, one layer at a time. At 4 bits on a small
// model the errors of the layers still add up. This pass looks at the whole
// model at once: it minimises the mean KL(teacher || student) of the
// next-token distributions over the calibration tokens, by Adam on
//   - every quantized matrix, through a straight-through estimator: a latent
//     f32 matrix W and per-group scale d (and minimum m for q4m) give the
//     weights the forward pass uses, w = d * clamp(round((W - m) / d)) + m;
//     the gradient reaches W where the code is not clamped, d through the
//     rounding residual (q - (W - m) / d), and m where the code is clamped;
//   - every matrix the plan keeps in a float format (f32 in training);
//   - the norm vectors (f32 in the file, so trained freely).
// The student starts from the converter's plain quantization (or from
// GPTQ's rounding when it ran before) and the teacher is the model as read.
// The result is ordinary blocks of the planned formats: only the chosen
// scales, minimums and codes differ.
//
// The forward and backward passes are written here in plain f32 (one
// sequence per thread, no KV cache), so the pass is meant for small models:
// it keeps the teacher's log-probabilities ([tokens, vocab]), four copies of
// every weight, and one gradient copy per thread. distill_quantize refuses
// models over kDistillMaxParams parameters.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "format/model_source.h"
#include "convert/llm_file_writer.h"

namespace llm {

class ThreadPool;

constexpr int64_t kDistillMaxParams = int64_t(64) << 20;

struct DistillOptions {
  int32_t steps = 100;   // Adam steps, each over every calibration token
  float lr = 2e-3f;      // step size relative to each tensor's RMS (cosine decay to 0)
  // Called after every step with the mean KL of that step's forward pass.
  std::function<void(int32_t step, double kl)> progress;
};

struct DistillReport {
  int64_t n_tokens = 0;     // calibration tokens (predictions) per step
  int64_t n_params = 0;     // trained values (latent weights, scales, minimums, norms)
  double kl_start = 0.0;    // mean KL of the starting student
  double kl_end = 0.0;      // mean KL of the stored result (scales rounded to fp16)
};

// teacher: the model as read (any stored types). student: the starting point,
// the same tensors, possibly already quantized (GPTQ). co: the converter's
// plan, which decides each matrix's format. sequences: calibration windows,
// each BOS first and at least 2 tokens. Returns student with every trained
// tensor replaced: quantized matrices as blocks of their planned format,
// float matrices and norms as f32 (the writer then stores them as planned).
// Throws Error(LLM_ERR_INVALID_ARGUMENT) for bad options or tokens, or when
// the loss stops being finite (a step size far too large),
// Error(LLM_ERR_UNSUPPORTED) for a model over kDistillMaxParams,
// Error(LLM_ERR_FORMAT) for missing or misshapen tensors.
ModelSource distill_quantize(const ModelSource& teacher, const ModelSource& student,
                             const std::vector<std::vector<int32_t>>& sequences, const LlmConvertOptions& co,
                             const DistillOptions& opts, DistillReport* report, ThreadPool* pool);

// For tests of the backward pass: the mean KL(teacher || student) over the
// sequences with every student tensor taken as f32 (no quantization), and
// (grad not null) its gradient with respect to every value of every tensor
// the pass trains, by tensor name.
double distill_kl_and_gradient(const ModelSource& teacher, const ModelSource& student,
                               const std::vector<std::vector<int32_t>>& sequences,
                               std::map<std::string, std::vector<float>>* grad, ThreadPool* pool);

}  // namespace llm
