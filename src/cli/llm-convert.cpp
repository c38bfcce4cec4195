// llm-convert: GGUF / llama2.c / Hugging Face safetensors folder / .llm ->
// .llm, choosing the weight format (optionally with AWQ scaling, GPTQ
// rounding and quantization-aware distillation calibrated on a text); or a
// synthetic model of a real shape (random weights) for benchmarks.
//
//   llm-convert INPUT [--tokenizer FILE] -o OUT.llm [--quant FORMAT|MIX] [--group 32|64|128] [--no-zstd]
//               [--embd-quant Q] [--tensor-quant KIND=Q ...] [--awq CALIB.txt [--awq-clip]] [--gptq CALIB.txt]
//               [--qat CALIB.txt [--qat-steps N] [--qat-lr X]]
//   llm-convert --synthetic tinyllama-1.1b|llama-3-8b|stories260K-shape --quant Q -o OUT.llm
//   llm-convert --info FILE.llm
//
// Tensors are converted and written row by row (LlmWriter), so memory stays
// bounded by a few chunks even for models larger than RAM.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/log.h"
#include "core/mapped_file.h"
#include "core/thread_pool.h"
#include "format/gguf.h"
#include "format/llama2c.h"
#include "format/llm_file.h"
#include "format/safetensors.h"
#include "quant/dtype.h"
#include "quant/quant.h"
#include "tokenizer/tokenizer.h"
#include "convert/awq.h"
#include "convert/distill.h"
#include "convert/ggml_quantize.h"
#include "convert/kquant_mix.h"
#include "convert/llm_file_writer.h"

namespace {

using llm::DType;

const char* const kUsage =
    "usage:\n"
    "  llm-convert INPUT [--tokenizer FILE] -o OUTPUT.llm [options]\n"
    "      INPUT: a GGUF file, a .llm file, a llama2.c checkpoint (needs --tokenizer), or a\n"
    "      Hugging Face folder (config.json, *.safetensors, tokenizer.model or tokenizer.json)\n"
    "  llm-convert --synthetic tinyllama-1.1b|llama-3-8b|stories260K-shape -o OUTPUT.llm [options]\n"
    "      random N(0, 0.02) weights of the real shape and a placeholder vocabulary\n"
    "  llm-convert --info FILE.llm\n"
    "options:\n"
    "  --quant f32|f16|bf16|q8|q4|q4m  weight format of the 2-D matrices (default: keep the\n"
    "                               input's); q4m = q4 with a per-group minimum (5 bits/weight at g32);\n"
    "                               also GGUF's q5_0, q5_1, q3_K, q4_K, q5_K, q6_K\n"
    "  --quant q4_K_M|q5_K_M        llama.cpp's K-quant mixes: q4_K (q5_K) with q6_K for the output\n"
    "                               and for attn_v, ffn_down in about half of the layers. K-type rows\n"
    "                               not a multiple of 256 fall back to q5_0 / q5_1 / q8 (q6_K),\n"
    "                               q4 (q2_K, q3_K) and iq4_nl (iq4_xs)\n"
    "  --quant q3_K_M|q2_K|iq4_xs|iq4_nl  llama.cpp's mixes of those names, q6_K for the output:\n"
    "                               q3_K_M: q3_K, q4_K/q5_K for attn_v, attn_output, ffn_down;\n"
    "                               q2_K: q2_K, q3_K for them (attn_v q4_K at 4+ query heads per KV\n"
    "                               head); iq4_xs, iq4_nl: that type, q5_K for ffn_down in the first\n"
    "                               eighth of the layers (and attn_v at 4+ query heads per KV head)\n"
    "  --group 32|64|128            q4/q4m group size (default 32)\n"
    "  --embd-quant f32|f16|bf16|q8|q4|q4m  format of token_embd and output (default: as --quant);\n"
    "                               also the GGUF block types, q2_K, iq4_xs and iq4_nl included\n"
    "  --tensor-quant KIND=FORMAT   format of one kind of layer matrix in every layer (repeatable);\n"
    "                               KIND: attn_q attn_k attn_v attn_output ffn_gate ffn_up ffn_down;\n"
    "                               FORMAT: as --embd-quant\n"
    "  --awq CALIB.txt              AWQ: rescale q/k/v, gate/up, down (and an untied output) by\n"
    "                               activation statistics of the text before q4/q8 quantization\n"
    "  --awq-clip                   AWQ: also search a clipping range per quantization group\n"
    "  --awq-grid N                 AWQ: alpha grid size (default 20)\n"
    "  --gptq CALIB.txt             GPTQ: error-compensating rounding of the q4/q4m/q8 layer matrices\n"
    "  --gptq-damp X                GPTQ: Hessian damping, fraction of its mean diagonal (default 0.01)\n"
    "  --calib-samples N            calibration rows kept per layer input (default 2048)\n"
    "  --qat CALIB.txt              quantization-aware distillation: fine-tune the quantized model\n"
    "                               (latent weights, scales, minimums, norms) to the input model's\n"
    "                               next-token distributions on the text; after --gptq when given;\n"
    "                               small models only (at most 64 Mi parameters)\n"
    "  --qat-steps N                QAT: Adam steps over the whole text (default 100)\n"
    "  --qat-lr X                   QAT: step size relative to each tensor's RMS (default 0.002)\n"
    "  --no-zstd                    store every tensor raw\n"
    "  --zstd-level N               zstd level (default 3)\n"
    "  --threads N                  worker threads (default: all cores)\n"
    "  --seed N                     synthetic weights seed (default 1)\n"
    "  -q, --quiet                  no progress bar or size table\n";

[[noreturn]] void usage_error(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::fprintf(stderr, "llm-convert: ");
  std::vfprintf(stderr, fmt, ap);
  std::fprintf(stderr, "\n\n%s", kUsage);
  va_end(ap);
  std::exit(2);
}

const char* status_name(llm_status s) {
  switch (s) {
    case LLM_ERR_INVALID_ARGUMENT: return "invalid argument";
    case LLM_ERR_OUT_OF_MEMORY: return "out of memory";
    case LLM_ERR_IO: return "I/O error";
    case LLM_ERR_FORMAT: return "bad file format";
    case LLM_ERR_CHECKSUM: return "checksum mismatch";
    case LLM_ERR_UNSUPPORTED: return "unsupported";
    case LLM_ERR_CANCELLED: return "cancelled";
    default: return "error";
  }
}

struct Args {
  std::string input, tokenizer, output, synthetic, info;
  bool has_quant = false;
  DType quant = DType::F32;
  std::string mix;  // --quant q4_K_M etc. (quant is then its base type)
  uint32_t group = 32;
  bool zstd = true;
  int zstd_level = 3;
  int threads = 0;
  uint64_t seed = 1;
  bool quiet = false;
  bool has_embd = false;
  DType embd = DType::F32;
  std::vector<std::pair<std::string, DType>> kinds;  // --tensor-quant KIND=FORMAT, in order
  std::string awq, gptq, qat;  // calibration texts
  bool awq_clip = false;
  int awq_grid = 20;
  double gptq_damp = 0.01;
  long calib_samples = 2048;
  int qat_steps = 100;
  float qat_lr = 2e-3f;
};

bool parse_dtype(const std::string& q, DType* out) {
  if (q == "f32") *out = DType::F32;
  else if (q == "f16") *out = DType::F16;
  else if (q == "bf16") *out = DType::BF16;
  else if (q == "q8" || q == "q8_0") *out = DType::Q8;
  else if (q == "q4" || q == "q4_0") *out = DType::Q4;
  else if (q == "q4m" || q == "q4_1") *out = DType::Q4M;
  else if (q == "q5_0") *out = DType::Q5_0;
  else if (q == "q5_1") *out = DType::Q5_1;
  else if (q == "q2_K" || q == "q2_k") *out = DType::Q2_K;
  else if (q == "q3_K" || q == "q3_k") *out = DType::Q3_K;
  else if (q == "q4_K" || q == "q4_k") *out = DType::Q4_K;
  else if (q == "q5_K" || q == "q5_k") *out = DType::Q5_K;
  else if (q == "q6_K" || q == "q6_k") *out = DType::Q6_K;
  else if (q == "iq4_nl") *out = DType::IQ4_NL;
  else if (q == "iq4_xs") *out = DType::IQ4_XS;
  else return false;
  return true;
}

Args parse_args(int argc, char** argv) {
  Args a;
  auto value = [&](int& i) -> std::string {
    if (i + 1 >= argc) usage_error("%s needs a value", argv[i]);
    return argv[++i];
  };
  auto to_int = [&](const std::string& s, const char* what) {
    char* end = nullptr;
    const long v = std::strtol(s.c_str(), &end, 10);
    if (s.empty() || *end != '\0') usage_error("%s: '%s' is not a number", what, s.c_str());
    return v;
  };
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      std::printf("%s", kUsage);
      std::exit(0);
    } else if (arg == "-o" || arg == "--output") {
      a.output = value(i);
    } else if (arg == "--tokenizer") {
      a.tokenizer = value(i);
    } else if (arg == "--quant") {
      const std::string q = value(i);
      a.has_quant = true;
      a.mix.clear();
      if (llm::kquant_mix_base(q, &a.quant)) {
        a.mix = q;
      } else if (!parse_dtype(q, &a.quant)) {
        usage_error("--quant: unknown format '%s'", q.c_str());
      }
    } else if (arg == "--embd-quant") {
      const std::string q = value(i);
      a.has_embd = true;
      if (!parse_dtype(q, &a.embd)) usage_error("--embd-quant: unknown format '%s'", q.c_str());
    } else if (arg == "--tensor-quant") {
      const std::string v = value(i);
      const size_t eq = v.find('=');
      static const char* const kKinds[] = {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up",
                                           "ffn_down"};
      const std::string kind = v.substr(0, eq);
      DType d;
      if (eq == std::string::npos || std::find(std::begin(kKinds), std::end(kKinds), kind) == std::end(kKinds))
        usage_error("--tensor-quant: want KIND=FORMAT with KIND one of attn_q, attn_k, attn_v, attn_output, "
                    "ffn_gate, ffn_up, ffn_down (got '%s')", v.c_str());
      if (!parse_dtype(v.substr(eq + 1), &d)) usage_error("--tensor-quant: unknown format in '%s'", v.c_str());
      a.kinds.emplace_back(kind, d);
    } else if (arg == "--awq") {
      a.awq = value(i);
    } else if (arg == "--awq-clip") {
      a.awq_clip = true;
    } else if (arg == "--awq-grid") {
      a.awq_grid = int(to_int(value(i), "--awq-grid"));
      if (a.awq_grid < 1 || a.awq_grid > 1000) usage_error("--awq-grid must be in 1..1000");
    } else if (arg == "--gptq") {
      a.gptq = value(i);
    } else if (arg == "--gptq-damp") {
      const std::string v = value(i);
      char* end = nullptr;
      a.gptq_damp = std::strtod(v.c_str(), &end);
      if (v.empty() || *end != '\0' || !(a.gptq_damp > 0.0 && a.gptq_damp < 10.0))
        usage_error("--gptq-damp must be a number in (0, 10)");
    } else if (arg == "--qat") {
      a.qat = value(i);
    } else if (arg == "--qat-steps") {
      a.qat_steps = int(to_int(value(i), "--qat-steps"));
      if (a.qat_steps < 1 || a.qat_steps > 100000) usage_error("--qat-steps must be in 1..100000");
    } else if (arg == "--qat-lr") {
      const std::string v = value(i);
      char* end = nullptr;
      a.qat_lr = std::strtof(v.c_str(), &end);
      if (v.empty() || *end != '\0' || !(a.qat_lr > 0.0f && a.qat_lr < 1.0f))
        usage_error("--qat-lr must be a number in (0, 1)");
    } else if (arg == "--calib-samples") {
      a.calib_samples = to_int(value(i), "--calib-samples");
      if (a.calib_samples < 1 || a.calib_samples > (1L << 24)) usage_error("--calib-samples out of range");
    } else if (arg == "--group") {
      const long g = to_int(value(i), "--group");
      if (g != 32 && g != 64 && g != 128) usage_error("--group must be 32, 64 or 128");
      a.group = uint32_t(g);
    } else if (arg == "--no-zstd") {
      a.zstd = false;
    } else if (arg == "--zstd-level") {
      a.zstd_level = int(to_int(value(i), "--zstd-level"));
      if (a.zstd_level < 1 || a.zstd_level > 22) usage_error("--zstd-level must be in 1..22");
    } else if (arg == "--threads") {
      a.threads = int(to_int(value(i), "--threads"));
      if (a.threads < 0 || a.threads > 1024) usage_error("--threads out of range");
    } else if (arg == "--seed") {
      a.seed = uint64_t(to_int(value(i), "--seed"));
    } else if (arg == "--synthetic") {
      a.synthetic = value(i);
    } else if (arg == "--info") {
      a.info = value(i);
    } else if (arg == "-q" || arg == "--quiet") {
      a.quiet = true;
    } else if (!arg.empty() && arg[0] == '-') {
      usage_error("unknown option '%s'", arg.c_str());
    } else if (a.input.empty()) {
      a.input = arg;
    } else {
      usage_error("more than one input ('%s' and '%s')", a.input.c_str(), arg.c_str());
    }
  }
  if (!a.info.empty()) return a;
  if (a.synthetic.empty() == a.input.empty()) usage_error("give exactly one of INPUT or --synthetic");
  if (a.output.empty()) usage_error("-o OUTPUT.llm is required");
  if (!a.synthetic.empty() && !a.has_quant) usage_error("--synthetic needs --quant");
  if (!a.awq.empty() || !a.gptq.empty() || !a.qat.empty()) {
    if (!a.synthetic.empty()) usage_error("--awq/--gptq/--qat need a real model, not --synthetic");
    if (!a.has_quant || !(a.quant == DType::Q4 || a.quant == DType::Q4M || a.quant == DType::Q8))
      usage_error("--awq/--gptq/--qat need --quant q4, q4m or q8");
    const std::string& first = !a.awq.empty() ? a.awq : !a.gptq.empty() ? a.gptq : a.qat;
    for (const std::string* t : {&a.awq, &a.gptq, &a.qat})
      if (!t->empty() && *t != first) usage_error("--awq, --gptq and --qat must use the same calibration text");
  }
  if (a.has_embd && !a.has_quant) usage_error("--embd-quant needs --quant");
  if (!a.kinds.empty() && !a.has_quant) usage_error("--tensor-quant needs --quant");
  return a;
}

// ---------------------------------------------------------------------------
// Progress bar on stderr, only when it is a terminal.

class ProgressBar {
 public:
  explicit ProgressBar(bool enabled) : enabled_(enabled && isatty(2)) {}
  void update(float f) {
    if (!enabled_) return;
    const auto now = std::chrono::steady_clock::now();
    if (f < 1.0f && f - last_ < 0.002f &&
        now - last_time_ < std::chrono::milliseconds(200))
      return;
    last_ = f;
    last_time_ = now;
    const int width = 40;
    const int filled = int(f * width + 0.5f);
    const double secs = std::chrono::duration<double>(now - start_).count();
    std::fprintf(stderr, "\r[%.*s%*s] %5.1f%% %6.1fs", filled, "########################################",
                 width - filled, "", double(f) * 100.0, secs);
    std::fflush(stderr);
    shown_ = true;
  }
  void finish() {
    if (shown_) std::fprintf(stderr, "\n");
    shown_ = false;
  }

 private:
  bool enabled_;
  bool shown_ = false;
  float last_ = -1.0f;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point last_time_{};
};

void log_to_stderr(llm_log_level level, const char* msg, void*) {
  if (level >= LLM_LOG_WARN)
    std::fprintf(stderr, "llm-convert: %s: %s\n", level == LLM_LOG_WARN ? "warning" : "error", msg);
}

std::string human_bytes(uint64_t b) {
  char buf[32];
  if (b >= (1ull << 30)) std::snprintf(buf, sizeof buf, "%.2f GiB", double(b) / double(1ull << 30));
  else if (b >= (1ull << 20)) std::snprintf(buf, sizeof buf, "%.2f MiB", double(b) / double(1ull << 20));
  else if (b >= (1ull << 10)) std::snprintf(buf, sizeof buf, "%.2f KiB", double(b) / 1024.0);
  else std::snprintf(buf, sizeof buf, "%llu B", (unsigned long long)b);
  return buf;
}

// Rule-of-thumb bytes per parameter of each format (FP32 4, FP16 2, INT8 ~1,
// INT4 ~0.5, and the nominal bits of the GGUF types), to set the measured sizes against.
double rule_of_thumb(const std::string& dtype) {
  if (dtype == "f32") return 4.0;
  if (dtype == "f16" || dtype == "bf16") return 2.0;
  if (dtype == "q8") return 1.0;
  if (dtype == "q4" || dtype == "q4_K") return 0.5;
  if (dtype == "q5_0" || dtype == "q5_1" || dtype == "q5_K") return 0.625;
  if (dtype == "q6_K") return 0.75;
  return 0.0;
}

// numel: parameters per tensor name (for the bytes-per-parameter columns).
void print_report(const llm::LlmWriteReport& rep, const std::string& path, const std::map<std::string, uint64_t>& numel) {
  std::map<std::string, int> count;
  std::map<std::string, uint64_t> params;
  std::map<llm::LlmCodec, int> codecs;
  uint64_t total_params = 0;
  double thumb_bytes = 0.0;
  for (const auto& t : rep.tensors) {
    ++count[llm::dtype_name(t.dtype)];
    ++codecs[t.codec];
    auto it = numel.find(t.name);
    const uint64_t n = it == numel.end() ? 0 : it->second;
    params[llm::dtype_name(t.dtype)] += n;
    total_params += n;
    thumb_bytes += double(n) * rule_of_thumb(llm::dtype_name(t.dtype));
  }
  std::printf("\n%-6s %8s %14s %14s %14s %16s %8s %9s %9s %6s\n", "dtype", "tensors", "params", "raw", "stored",
              "stored bytes", "zstd", "B/param", "(stored)", "thumb");
  for (const auto& kv : rep.by_dtype) {
    const uint64_t raw = kv.second.first, st = kv.second.second, n = params[kv.first];
    std::printf("%-6s %8d %14llu %14s %14s %16llu %7.2f%% %9.4f %9.4f %6.2f\n", kv.first.c_str(), count[kv.first],
                (unsigned long long)n, human_bytes(raw).c_str(), human_bytes(st).c_str(), (unsigned long long)st,
                raw ? 100.0 * (1.0 - double(st) / double(raw)) : 0.0, n ? double(raw) / double(n) : 0.0,
                n ? double(st) / double(n) : 0.0, rule_of_thumb(kv.first));
  }
  std::printf("%-6s %8zu %14llu %14s %14s %16llu %7.2f%% %9.4f %9.4f\n", "total", rep.tensors.size(),
              (unsigned long long)total_params, human_bytes(rep.raw_bytes).c_str(),
              human_bytes(rep.stored_bytes).c_str(), (unsigned long long)rep.stored_bytes,
              rep.raw_bytes ? 100.0 * (1.0 - double(rep.stored_bytes) / double(rep.raw_bytes)) : 0.0,
              total_params ? double(rep.raw_bytes) / double(total_params) : 0.0,
              total_params ? double(rep.stored_bytes) / double(total_params) : 0.0);
  if (total_params)
    std::printf("rule of thumb for these formats: %s (%.4f B/param); raw is %+.2f%%, file %+.2f%%\n",
                human_bytes(uint64_t(thumb_bytes)).c_str(), thumb_bytes / double(total_params),
                100.0 * (double(rep.raw_bytes) / thumb_bytes - 1.0), 100.0 * (double(rep.file_bytes) / thumb_bytes - 1.0));
  std::printf("codecs: %d raw, %d zstd, %d zstd-planes\n", codecs[llm::LlmCodec::Raw], codecs[llm::LlmCodec::Zstd],
              codecs[llm::LlmCodec::ZstdPlanes]);
  std::printf("wrote %s: %llu bytes (%s)\n", path.c_str(), (unsigned long long)rep.file_bytes,
              human_bytes(rep.file_bytes).c_str());
}

// ---------------------------------------------------------------------------
// Weight format choice

// The model facts a mix needs: its layer count, query heads per KV head,
// and whether token_embd is also the output matrix.
struct ModelLayout {
  int32_t n_layers = 0;
  int32_t n_gqa = 1;
  bool tied = false;
};

int32_t gqa_of(int32_t n_heads, int32_t n_kv_heads) { return n_kv_heads > 0 ? n_heads / n_kv_heads : 1; }

llm::LlmConvertOptions convert_options(const Args& a, const ModelLayout& m) {
  llm::LlmConvertOptions c;
  c.requantize = a.has_quant;
  c.dtype = a.quant;
  c.group = a.group;
  if (!a.mix.empty()) llm::kquant_mix_options(a.mix, m.n_layers, m.tied, &c, m.n_gqa);
  if (a.has_embd) {
    c.overrides["token_embd.weight"] = a.embd;
    c.overrides["output.weight"] = a.embd;
  }
  for (const auto& [kind, d] : a.kinds) {
    c.kind_overrides[kind + ".weight"] = d;  // a later one wins
    // ... also over the mix's choices for single layers of that kind.
    for (auto it = c.overrides.begin(); it != c.overrides.end();)
      it = llm::layer_tensor_kind(it->first) == kind + ".weight" ? c.overrides.erase(it) : std::next(it);
  }
  return c;
}

// What a mix changes, by format: "; q6_K for output + attn_v in layers 0,1,2,5 + ffn_down in layers 0,1,2,5".
std::string mix_summary(const Args& a, const ModelLayout& m) {
  llm::LlmConvertOptions mix;
  llm::kquant_mix_options(a.mix, m.n_layers, m.tied, &mix, m.n_gqa);
  std::map<DType, std::map<std::string, std::vector<int>>> by_type;  // format -> kind or name -> layers
  for (const auto& [name, d] : mix.overrides) {
    const std::string kind = llm::layer_tensor_kind(name);
    std::vector<int>& layers = by_type[d][kind.empty() ? name : kind];
    if (!kind.empty()) layers.push_back(std::atoi(name.c_str() + 4));  // "blk.12.attn_v.weight" -> 12
  }
  std::string r;
  for (auto& [d, entries] : by_type) {
    r += std::string("; ") + llm::dtype_name(d) + " for";
    const char* sep = " ";
    for (auto& [what, layers] : entries) {
      r += sep + what.substr(0, what.find('.'));
      std::sort(layers.begin(), layers.end());
      if (!layers.empty() && int32_t(layers.size()) == m.n_layers) {
        r += " in every layer";
        layers.clear();
      }
      for (size_t i = 0; i < layers.size(); ++i) r += (i ? "," : " in layers ") + std::to_string(layers[i]);
      sep = " + ";
    }
  }
  return r;
}

// The metadata's account of what was done: formats, overrides, calibration,
// and the matrices that could not take their format (plan: every tensor's spec).
std::string recipe(const Args& a, const ModelLayout& m, const std::vector<llm::LlmTensorSpec>& plan) {
  std::string r = a.mix.empty() ? std::string(llm::dtype_name(a.quant))
                                : a.mix + " (llama.cpp's mix): " + llm::dtype_name(a.quant);
  if (llm::dtype_is_q4(a.quant)) r += " g" + std::to_string(a.group);
  if (!a.mix.empty()) r += mix_summary(a, m);
  if (a.has_embd) r += std::string("; embeddings ") + llm::dtype_name(a.embd);
  const llm::LlmConvertOptions co = convert_options(a, m);
  for (const auto& [kind, d] : co.kind_overrides)  // "attn_v.weight" -> "; attn_v q8"
    r += "; " + kind.substr(0, kind.find('.')) + " " + llm::dtype_name(d);
  if (!a.awq.empty()) r += a.awq_clip ? "; awq+clip" : "; awq";
  if (!a.gptq.empty()) r += "; gptq";
  if (!a.qat.empty()) r += "; qat " + std::to_string(a.qat_steps) + " steps";
  r += "; norms f32";
  std::map<std::string, int> fallbacks;  // "q4_K -> q5_0" -> matrices
  for (const auto& s : plan) {
    const DType want = llm::wanted_llm_dtype(s.name, co);
    if (s.shape.size() >= 2 && s.dtype != want)
      ++fallbacks[std::string(llm::dtype_name(want)) + " -> " + llm::dtype_name(s.dtype)];
  }
  const char* sep = "; matrices whose columns are not a multiple of the group: ";
  for (const auto& [change, n] : fallbacks) {
    r += sep + std::to_string(n) + " " + change;
    sep = ", ";
  }
  return r;
}

// Runs fn(row) for rows [r0, r0 + n) on the pool; rethrows the first error.
template <typename Fn>
void parallel_rows(llm::ThreadPool& pool, int64_t r0, int64_t n, Fn&& fn) {
  std::mutex mu;
  std::string err;
  llm_status st = LLM_OK;
  pool.parallel([&](int ith, int nth) {
    int64_t b, e;
    llm::ThreadPool::split(n, ith, nth, &b, &e);
    try {
      for (int64_t r = b; r < e; ++r) fn(r0 + r);
    } catch (const llm::Error& ex) {
      std::lock_guard<std::mutex> lk(mu);
      if (st == LLM_OK) {
        st = ex.status();
        err = ex.what();
      }
    } catch (const std::exception& ex) {
      std::lock_guard<std::mutex> lk(mu);
      if (st == LLM_OK) {
        st = LLM_ERR_INTERNAL;
        err = ex.what();
      }
    }
  });
  if (st != LLM_OK) throw llm::Error(st, err);
}

// ---------------------------------------------------------------------------
// Conversion of an existing model

llm::ModelSource read_input(const Args& a, const llm::Logger& log, std::string* format) {
  if (llm::is_hf_folder(a.input)) {
    *format = "safetensors";
    return llm::read_hf_folder(a.input, &log);
  }
  std::shared_ptr<llm::MappedFile> f = llm::MappedFile::open(a.input);
  const uint8_t* d = f->data();
  const size_t n = f->size();
  if (n >= 4 && std::memcmp(d, "GGUF", 4) == 0) {
    *format = "gguf";
    f.reset();
    return llm::read_gguf(a.input, false, &log);
  }
  if (llm::is_llm_file(d, n)) {
    *format = "llm";
    return llm::parse_llm(f);
  }
  if (llm::looks_like_llama2c(d, n)) {
    *format = "llama2.c";
    if (a.tokenizer.empty()) usage_error("'%s' is a llama2.c checkpoint: give its --tokenizer", a.input.c_str());
    f.reset();
    return llm::read_llama2c(a.input, a.tokenizer);
  }
  llm::fail(LLM_ERR_FORMAT, "'%s' is neither GGUF, .llm, a llama2.c checkpoint nor a Hugging Face folder",
            a.input.c_str());
}

std::string base_name(std::string p) {
  while (p.size() > 1 && p.back() == '/') p.pop_back();  // a folder given as "dir/"
  const size_t s = p.find_last_of('/');
  return s == std::string::npos ? p : p.substr(s + 1);
}

// The planner's notes (matrices kept at f16/f32), the first few in full.
void print_notes(const std::vector<std::string>& notes) {
  const size_t shown = notes.size() <= 6 ? notes.size() : 4;
  for (size_t i = 0; i < shown; ++i) std::fprintf(stderr, "llm-convert: note: %s\n", notes[i].c_str());
  if (shown < notes.size())
    std::fprintf(stderr, "llm-convert: note: ... and %zu more matrices like these\n", notes.size() - shown);
}

// AWQ scaling, GPTQ rounding and/or quantization-aware distillation on a
// calibration text (see quant/awq.h, quant/distill.h).
llm::ModelSource calibrate_and_rewrite(const Args& a, llm::ModelSource src, const llm::LlmConvertOptions& co,
                                       llm::ThreadPool& pool) {
  const std::string& path = !a.awq.empty() ? a.awq : !a.gptq.empty() ? a.gptq : a.qat;
  const llm::ModelSource teacher = src;  // shares the tensors' bytes
  std::shared_ptr<llm::MappedFile> f = llm::MappedFile::open(path);
  const std::string text(reinterpret_cast<const char*>(f->data()), f->size());
  std::vector<int32_t> ids;
  llm::Tokenizer::create(src.vocab)->encode(text, true, false, ids);
  llm::AwqOptions ao;
  ao.dtype = a.quant;
  ao.group = a.group;
  ao.clip = a.awq_clip;
  ao.n_grid = a.awq_grid;
  ao.max_samples = a.calib_samples;
  ao.plan = &co;
  ao.window = std::max<int32_t>(2, std::min<int32_t>(src.config.seq_len > 0 ? src.config.seq_len : 512, 512));
  const auto windows = llm::awq_windows(ids, src.vocab.bos, ao.window);
  LLM_CHECK(!windows.empty(), LLM_ERR_INVALID_ARGUMENT, "calibration text '%s' is empty", path.c_str());
  const auto t0 = std::chrono::steady_clock::now();
  llm::AwqCalibration cal;
  if (!a.awq.empty() || !a.gptq.empty()) cal = llm::awq_calibrate(src, windows, ao, &pool);
  int64_t n_tokens = 0;
  for (const auto& w : windows) n_tokens += int64_t(w.size());
  if (!a.quiet)
    std::printf("calibration: %s, %lld tokens in %zu windows\n", base_name(path).c_str(), (long long)n_tokens,
                windows.size());
  if (!a.awq.empty()) {
    llm::AwqReport rep;
    src = llm::awq_apply(src, cal, ao, &rep, &pool);
    if (!a.quiet) {
      std::printf("AWQ (%s): %lld samples per site\n%-6s %-8s %6s %14s %14s %8s\n", a.awq_clip ? "scale + clip" : "scale",
                  (long long)rep.n_samples, "layer", "site", "alpha", "err plain", "err awq", "change");
      for (const auto& s : rep.sites)
        std::printf("%-6d %-8s %6.2f %14.6g %14.6g %7.1f%%\n", s.layer, llm::awq_site_name(s.site), double(s.alpha),
                    s.err_plain, s.err_final, s.err_plain > 0 ? 100.0 * (s.err_final / s.err_plain - 1.0) : 0.0);
    }
    // GPTQ needs the inputs of the rescaled model.
    if (!a.gptq.empty()) cal = llm::awq_calibrate(src, windows, ao, &pool);
  }
  if (!a.gptq.empty()) {
    std::vector<llm::GptqTensorReport> rep;
    src = llm::gptq_quantize(src, cal, co, a.gptq_damp, &rep, &pool);
    if (!a.quiet) {
      double plain = 0, gptq = 0;
      for (const auto& r : rep) {
        plain += r.err_plain;
        gptq += r.err_gptq;
      }
      std::printf("GPTQ: %zu matrices, calibration output error %.6g -> %.6g (%+.1f%%)\n", rep.size(), plain, gptq,
                  plain > 0 ? 100.0 * (gptq / plain - 1.0) : 0.0);
    }
  }
  if (!a.qat.empty()) {
    llm::DistillOptions dopt;
    dopt.steps = a.qat_steps;
    dopt.lr = a.qat_lr;
    ProgressBar bar(!a.quiet);
    dopt.progress = [&](int32_t step, double) { bar.update(float(step) / float(a.qat_steps)); };
    llm::DistillReport rep;
    src = llm::distill_quantize(teacher, src, windows, co, dopt, &rep, &pool);
    bar.update(1.0f);
    if (!a.quiet)
      std::printf("QAT: %d steps over %lld tokens, %lld values trained, KL to the input model %.6g -> %.6g\n",
                  int(a.qat_steps), (long long)rep.n_tokens, (long long)rep.n_params, rep.kl_start, rep.kl_end);
  }
  if (!a.quiet)
    std::printf("calibration took %.1f s\n",
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  src.meta["quant.calibration"] = base_name(path) + ", " + std::to_string(n_tokens) + " tokens";
  return src;
}

llm::LlmWriteReport convert(const Args& a, llm::ThreadPool& pool, const llm::LlmWriteOptions& wo,
                            std::map<std::string, uint64_t>* numel) {
  llm::Logger log;
  log.fn = log_to_stderr;
  std::string format;
  llm::ModelSource src = read_input(a, log, &format);
  ModelLayout layout;
  layout.n_layers = src.config.n_layers;
  layout.n_gqa = gqa_of(src.config.n_heads, src.config.n_kv_heads);
  layout.tied = std::none_of(src.tensors.begin(), src.tensors.end(),
                             [](const llm::TensorData& t) { return t.name == "output.weight"; });
  const llm::LlmConvertOptions co = convert_options(a, layout);
  if (!a.awq.empty() || !a.gptq.empty() || !a.qat.empty()) src = calibrate_and_rewrite(a, std::move(src), co, pool);
  for (const auto& t : src.tensors) (*numel)[t.name] = uint64_t(t.numel());

  std::vector<std::string> notes;
  std::vector<llm::LlmTensorSpec> plan;
  for (const auto& t : src.tensors) plan.push_back(plan_llm_tensor(t.name, t.shape, t.dtype, t.group, co, &notes));
  print_notes(notes);
  src.meta["source"] = base_name(a.input);
  src.meta["source.format"] = format;
  src.meta["converter"] = "llm-convert";
  if (a.has_quant) src.meta["quant.recipe"] = recipe(a, layout, plan);
  return llm::convert_to_llm(src, a.output, co, wo);
}

// ---------------------------------------------------------------------------
// Synthetic models

struct Shape {
  const char* name;
  int32_t dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len;
  float rope_theta;
  bool tied;
};

const Shape kShapes[] = {
    {"tinyllama-1.1b", 2048, 5632, 22, 32, 4, 32000, 2048, 10000.0f, false},
    {"llama-3-8b", 4096, 14336, 32, 32, 8, 128256, 8192, 500000.0f, false},
    {"stories260K-shape", 64, 172, 5, 8, 4, 512, 512, 10000.0f, true},
};

// SplitMix64: seeds one independent stream per (tensor, row), so any row can
// be regenerated alone, in any order, on any thread.
uint64_t splitmix(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// N(0, sigma) by Box-Muller, in float (twice as fast as double; 24-bit
// uniforms keep the tails out to ~5.8 sigma).
void normal_row(uint64_t seed, float sigma, float* out, int64_t n) {
  uint64_t s = seed;
  for (int64_t i = 0; i < n; i += 2) {
    const uint64_t r = splitmix(s);
    const float u1 = (float(uint32_t(r) >> 8) + 1.0f) * (1.0f / 16777216.0f);  // (0, 1]
    const float u2 = float(uint32_t(r >> 32) >> 8) * (1.0f / 16777216.0f);     // [0, 1)
    const float m = std::sqrt(-2.0f * std::log(u1)) * sigma;
    const float a = 6.28318530718f * u2;
    out[i] = m * std::cos(a);
    if (i + 1 < n) out[i + 1] = m * std::sin(a);
  }
}

// Placeholder SentencePiece vocab of the right size: <unk>, <s>, </s>, the
// 256 byte tokens, then distinct generated pieces.
llm::VocabData placeholder_vocab(int32_t n) {
  llm::VocabData v;
  v.model = "llama";
  v.tokens = {"<unk>", "<s>", "</s>"};
  v.types = {int32_t(llm::TokenType::Unknown), int32_t(llm::TokenType::Control), int32_t(llm::TokenType::Control)};
  v.unk = 0;
  v.bos = 1;
  v.eos = 2;
  for (int b = 0; b < 256; ++b) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "<0x%02X>", b);
    v.tokens.push_back(buf);
    v.types.push_back(int32_t(llm::TokenType::Byte));
  }
  for (int32_t id = int32_t(v.tokens.size()); id < n; ++id) {
    const int32_t k = id - 259;
    std::string piece = (k % 2 == 0) ? "\xE2\x96\x81" : "";
    // Bijective base 26 of k/2: a, b, ..., z, aa, ab, ...
    int64_t x = k / 2 + 1;
    std::string letters;
    while (x > 0) {
      --x;
      letters.insert(letters.begin(), char('a' + x % 26));
      x /= 26;
    }
    v.tokens.push_back(piece + letters);
    v.types.push_back(int32_t(llm::TokenType::Normal));
  }
  v.tokens.resize(size_t(n));
  v.types.resize(size_t(n));
  v.scores.resize(size_t(n));
  for (int32_t id = 0; id < n; ++id) v.scores[size_t(id)] = id < 259 ? 0.0f : -float(id - 259);
  return v;
}

llm::LlmWriteReport synthesize(const Args& a, llm::ThreadPool& pool, const llm::LlmWriteOptions& wo,
                               std::map<std::string, uint64_t>* numel) {
  const Shape* sh = nullptr;
  for (const auto& s : kShapes)
    if (a.synthetic == s.name) sh = &s;
  if (!sh)
    usage_error("--synthetic: unknown shape '%s' (tinyllama-1.1b, llama-3-8b, stories260K-shape)",
                a.synthetic.c_str());

  llm::ModelConfig c;
  c.arch = "llama";
  c.dim = sh->dim;
  c.hidden_dim = sh->hidden_dim;
  c.n_layers = sh->n_layers;
  c.n_heads = sh->n_heads;
  c.n_kv_heads = sh->n_kv_heads;
  c.head_dim = sh->dim / sh->n_heads;
  c.vocab_size = sh->vocab_size;
  c.seq_len = sh->seq_len;
  c.rope_theta = sh->rope_theta;
  c.norm_eps = 1e-5f;
  const int64_t dim = c.dim, hid = c.hidden_dim, kv = int64_t(c.head_dim) * c.n_kv_heads, V = c.vocab_size;

  std::vector<llm::LlmTensorSpec> specs;
  std::vector<std::string> notes;
  ModelLayout layout;
  layout.n_layers = sh->n_layers;
  layout.n_gqa = gqa_of(sh->n_heads, sh->n_kv_heads);
  layout.tied = sh->tied;
  const llm::LlmConvertOptions co = convert_options(a, layout);
  auto add = [&](const std::string& name, std::vector<int64_t> shape) {
    specs.push_back(llm::plan_llm_tensor(name, shape, DType::F32, 0, co, &notes));
  };
  add("token_embd.weight", {V, dim});
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    add(b + "attn_norm.weight", {dim});
    add(b + "attn_q.weight", {dim, dim});
    add(b + "attn_k.weight", {kv, dim});
    add(b + "attn_v.weight", {kv, dim});
    add(b + "attn_output.weight", {dim, dim});
    add(b + "ffn_norm.weight", {dim});
    add(b + "ffn_gate.weight", {hid, dim});
    add(b + "ffn_up.weight", {hid, dim});
    add(b + "ffn_down.weight", {dim, hid});
  }
  add("output_norm.weight", {dim});
  if (!sh->tied) add("output.weight", {V, dim});
  print_notes(notes);
  for (const auto& s : specs) {
    uint64_t n = 1;
    for (int64_t d : s.shape) n *= uint64_t(d);
    (*numel)[s.name] = n;
  }

  std::map<std::string, std::string> meta;
  meta["synthetic"] = sh->name;
  meta["synthetic.weights"] = "N(0, 0.02) matrices, norms 1.0, seed " + std::to_string(a.seed);
  meta["converter"] = "llm-convert";
  meta["quant.recipe"] = recipe(a, layout, specs);

  llm::LlmWriter w(a.output, c, placeholder_vocab(sh->vocab_size), meta, specs, wo);
  for (size_t i = 0; i < specs.size(); ++i) {
    const llm::LlmTensorSpec& s = specs[i];
    const int64_t cols = s.shape.back();
    const size_t dst_row = llm::dtype_row_bytes(s.dtype, cols, s.group);
    const bool norm = s.shape.size() == 1;
    uint64_t tseed = a.seed ^ (uint64_t(i + 1) * 0xD6E8FEB86659FD93ull);
    const uint64_t tensor_seed = splitmix(tseed);
    w.write_tensor([&](int64_t r0, int64_t n, uint8_t* dst) {
      parallel_rows(pool, r0, n, [&](int64_t r) {
        thread_local std::vector<float> row;
        row.resize(size_t(cols));
        if (norm) {
          std::fill(row.begin(), row.end(), 1.0f);
        } else {
          uint64_t rs = tensor_seed + uint64_t(r) * 0x9E3779B97F4A7C15ull;
          normal_row(splitmix(rs), 0.02f, row.data(), cols);
        }
        llm::quantize_any_row(s.dtype, s.group, row.data(), dst + size_t(r - r0) * dst_row, cols);
      });
    });
  }
  return w.finish();
}

// ---------------------------------------------------------------------------

int info(const std::string& path) {
  const llm::ModelSource m = [&] {
    llm::LlmReadOptions ro;
    ro.vocab_only = true;
    return llm::read_llm(path, ro);
  }();
  auto f = llm::MappedFile::open(path);
  const llm::LlmFileInfo fi = llm::inspect_llm(f->data(), f->size());
  const llm::ModelConfig& c = m.config;
  std::printf("%s: .llm v%u.%u, %zu tensors, %llu bytes\n", path.c_str(), fi.version_major, fi.version_minor,
              fi.tensors.size(), (unsigned long long)f->size());
  std::printf("config: arch %s, dim %d, hidden %d, layers %d, heads %d/%d kv, head_dim %d, vocab %d, ctx %d, "
              "theta %g, eps %g\n",
              c.arch.c_str(), c.dim, c.hidden_dim, c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim, c.vocab_size,
              c.seq_len, double(c.rope_theta), double(c.norm_eps));
  std::printf("vocab: %s, %zu tokens, %zu merges, bos %d, eos %d\n", m.vocab.model.c_str(), m.vocab.tokens.size(),
              m.vocab.merges.size(), m.vocab.bos, m.vocab.eos);
  for (const auto& kv : m.meta) std::printf("meta: %s = %s\n", kv.first.c_str(), kv.second.c_str());
  std::printf("%-32s %-5s %5s %-12s %-20s %12s %12s\n", "tensor", "dtype", "group", "codec", "shape", "raw", "stored");
  for (const auto& e : fi.tensors) {
    std::string shape;
    for (size_t i = 0; i < e.shape.size(); ++i) shape += (i ? "x" : "") + std::to_string(e.shape[i]);
    std::printf("%-32s %-5s %5u %-12s %-20s %12llu %12llu\n", e.name.c_str(), llm::dtype_name(e.dtype), e.group,
                llm::llm_codec_name(e.codec), shape.c_str(), (unsigned long long)e.raw_size,
                (unsigned long long)e.stored_size);
  }
  // Full verification (checksums, decompression).
  llm::ThreadPool pool(0);
  llm::LlmReadOptions ro;
  ro.pool = &pool;
  llm::parse_llm(f, ro);
  std::printf("all checksums OK\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse_args(argc, argv);
  ProgressBar bar(!a.quiet && a.info.empty());
  try {
    if (!a.info.empty()) return info(a.info);
    llm::ThreadPool pool(a.threads);
    llm::LlmWriteOptions wo;
    wo.allow_zstd = a.zstd;
    wo.zstd_level = a.zstd_level;
    wo.pool = &pool;
    wo.progress = [&](float f) { bar.update(f); };
    const auto t0 = std::chrono::steady_clock::now();
    std::map<std::string, uint64_t> numel;
    const llm::LlmWriteReport rep = a.synthetic.empty() ? convert(a, pool, wo, &numel) : synthesize(a, pool, wo, &numel);
    bar.finish();
    if (!a.quiet) {
      print_report(rep, a.output, numel);
      std::printf("took %.1f s\n", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    return 0;
  } catch (const llm::Error& e) {
    bar.finish();
    std::fprintf(stderr, "llm-convert: error (%s): %s\n", status_name(e.status()), e.what());
  } catch (const std::bad_alloc&) {
    bar.finish();
    std::fprintf(stderr, "llm-convert: error: out of memory\n");
  } catch (const std::exception& e) {
    bar.finish();
    std::fprintf(stderr, "llm-convert: error: %s\n", e.what());
  }
  return 1;
}
