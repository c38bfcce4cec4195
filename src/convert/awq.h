// Activation-aware weight quantization (AWQ, Lin et al. 2023), as a
// function-preserving rewrite of a model before it is quantized.
//
// A linear layer y = W x whose input channel c carries large activations
// |x_c| matters more than the others. Scaling W's column c up by s_c and the
// input down by 1/s_c computes the same y in exact arithmetic, but after
// group-wise quantization of W' = W * diag(s) the salient columns lose less
// relative precision. The 1/s is folded into the operation that produces x:
//   q/k/v     input = attn_norm(x):     attn_norm weight /= s
//   gate/up   input = ffn_norm(x):      ffn_norm weight  /= s
//   down      input = silu(gate x) * (up x), linear in the up branch:
//                                       up rows          /= s
//   output    input = output_norm(x):   output_norm      /= s (untied output only)
// s = mean|x|^alpha (normalised so that sqrt(max * min) = 1), with alpha
// searched on a grid per layer and site to minimise the output error
// sum_i ||Q(W') diag(1/s) x_i - W x_i||^2 over calibration activations x_i.
// Optionally (clip) each quantization group's range is then shrunk where
// that lowers the same output error; this changes the f32 function slightly.
//
// The calibration activations come from a plain f32 forward pass written
// here from the ModelSource tensors (ReferenceForward), independent of the
// engine.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "format/model_source.h"
#include "quant/dtype.h"
#include "convert/llm_file_writer.h"

namespace llm {

class ThreadPool;

// Where a linear layer's input is observed. AttnOut (the input of
// attn_output) is observed for error-compensating quantizers; AWQ does not
// scale it (with GQA its producer, attn_v, is shared by several heads).
enum class AwqSite : int { Qkv = 0, GateUp = 1, Down = 2, Output = 3, AttnOut = 4 };
constexpr int kAwqSites = 5;
const char* awq_site_name(AwqSite s);

// Any stored tensor as f32, row by row (a 1-D tensor is one row). Throws
// Error(LLM_ERR_FORMAT) when its bytes do not cover its shape.
std::vector<float> tensor_to_f32(const TensorData& t);

// f32 forward pass of a Llama ModelSource (any stored weight type; weights
// are read through cpu::matmul in reference mode, never copied). One
// sequence at a time from position 0; attention over contiguous f32 K/V.
class ReferenceForward {
 public:
  // Throws Error(LLM_ERR_FORMAT) when a tensor is missing or misshapen.
  ReferenceForward(const ModelSource& src, ThreadPool* pool);
  ~ReferenceForward();
  ReferenceForward(const ReferenceForward&) = delete;
  ReferenceForward& operator=(const ReferenceForward&) = delete;

  // x: [n, cols], the input of the linear layers at `site` of `layer`
  // (layer = n_layers for Output).
  using Observer = std::function<void(int32_t layer, AwqSite site, const float* x, int64_t n, int64_t cols)>;

  // Runs tokens[0..n) at positions 0..n-1. logits (optional) receives
  // [n, vocab]; obs (optional) sees every linear input.
  void run(const int32_t* tokens, int64_t n, std::vector<float>* logits, const Observer& obs = nullptr) const;

 private:
  struct Impl;
  Impl* impl_;
};

struct AwqOptions {
  DType dtype = DType::Q4;           // the format the matrices will be quantized to (Q4 or Q8)
  uint32_t group = 32;               // Q4 group size
  int n_grid = 20;                   // alpha in {0, 1/n_grid, ..., 1}
  float fixed_alpha = -1.0f;         // >= 0: use this alpha everywhere instead of searching
  bool clip = false;                 // also search a per-group clipping ratio
  int n_clip_grid = 20;              // clip ratios 1 - k * 0.5 / n_clip_grid, k = 0..n_clip_grid-1
  int64_t max_samples = 2048;        // calibration token rows kept per site for the error search
  int32_t window = 512;              // tokens per calibration sequence (BOS first)
  // The converter's plan, when it has per-tensor overrides (--embd-quant):
  // each matrix is then judged in the format it will really get, and a site
  // whose matrices are not all q4/q8 is skipped. Null: dtype/group above.
  const LlmConvertOptions* plan = nullptr;
  bool sites[4] = {true, true, true, true};  // Qkv, GateUp, Down, Output (output: untied models only)
  // Only AwqSite values below 4 are scaled; AttnOut never is.
};

struct AwqSiteReport {
  int32_t layer = 0;
  AwqSite site = AwqSite::Qkv;
  float alpha = 0.0f;        // chosen exponent (0 = plain quantization)
  double err_plain = 0.0;    // mean squared output error, plain quantization
  double err_scaled = 0.0;   // with the chosen scales
  double err_final = 0.0;    // with scales and clipping (== err_scaled without clip)
};

struct AwqReport {
  int64_t n_tokens = 0;   // calibration tokens run
  int64_t n_samples = 0;  // rows kept per site
  std::vector<AwqSiteReport> sites;
};

// Calibration data: per (layer, site) the mean |x| per input channel over
// every calibration token, and a uniform subsample of the rows x.
struct AwqCalibration {
  int64_t n_tokens = 0;
  struct Site {
    int64_t cols = 0;
    std::vector<double> abs_sum;  // [cols]
    std::vector<float> samples;   // [n_samples, cols]
    int64_t n_samples() const { return cols ? int64_t(samples.size()) / cols : 0; }
  };
  std::vector<Site> sites;  // index layer * kAwqSites + site; layer n_layers holds Output
  const Site& at(int32_t layer, AwqSite s) const { return sites[size_t(layer) * kAwqSites + size_t(s)]; }
};

// Runs the model on the token sequences and collects activation statistics.
AwqCalibration awq_calibrate(const ModelSource& src, const std::vector<std::vector<int32_t>>& sequences,
                             const AwqOptions& opts, ThreadPool* pool);

// Splits a calibration token stream (BOS first, as the tokenizer returns it)
// into windows of at most opts.window tokens, each starting with bos.
std::vector<std::vector<int32_t>> awq_windows(const std::vector<int32_t>& tokens, int32_t bos, int32_t window);

// Mean squared output error per calibration row of quantizing W [rows, cols]
// (f32) to (dtype, group) after multiplying column c by scale[c] (scale may
// be null: plain quantization), measured against X [n, cols]:
//   sum_i ||(deq(Q(W diag(s))) diag(1/s) - W) x_i||^2 / n.
double awq_output_error(const float* W, int64_t rows, int64_t cols, const float* scale, const float* X, int64_t n,
                        DType dtype, uint32_t group, ThreadPool* pool);

// Returns a copy of src in which every searched site is rescaled (and
// clipped with opts.clip): the changed tensors become f32 and owned, the
// others are shared with src. Sites whose matrices will not be quantized
// (columns not a multiple of the group) are left alone.
ModelSource awq_apply(const ModelSource& src, const AwqCalibration& cal, const AwqOptions& opts, AwqReport* report,
                      ThreadPool* pool);

// --- GPTQ (Frantar et al. 2022): error-compensating rounding.
//
// Quantizes the columns of W one at a time and spreads each column's
// rounding error over the columns not yet quantized, weighted by the inverse
// Hessian H = X^T X (+ damping) of the calibration inputs, so the layer's
// output on those inputs moves as little as possible. Q4 and Q8 go column
// by column, each group's scale the standard one of the updated weights when
// the group starts. Q4M goes in "act order" (decreasing H_jj) with static
// groups: scale and minimum fitted to the original weights before the pass.
// The storage format is unchanged; only the rounding decisions differ from
// the plain quantizer. Cost O(cols^3) per input site plus O(rows cols^2).

struct GptqTensorReport {
  std::string name;
  double err_plain = 0.0;  // mean squared output error per calibration row, plain rounding
  double err_gptq = 0.0;
};

// Quantizes with GPTQ every layer matrix (q, k, v, o, gate, up, down, and an
// untied output) that `co` plans as Q4 or Q8, using the calibration inputs
// of its site; the tensors become quantized and owned (the converter then
// copies them bit for bit). token_embd is left alone (a lookup table; for a
// tied model it is quantized plainly by the converter). damp: fraction of
// the mean Hessian diagonal added to the diagonal.
ModelSource gptq_quantize(const ModelSource& src, const AwqCalibration& cal, const LlmConvertOptions& co,
                          double damp, std::vector<GptqTensorReport>* report, ThreadPool* pool);

// Convenience: tokens -> windows -> calibrate -> apply.
ModelSource awq_quantize_prepare(const ModelSource& src, const std::vector<int32_t>& calib_tokens,
                                 const AwqOptions& opts, AwqReport* report, ThreadPool* pool);

}  // namespace llm
