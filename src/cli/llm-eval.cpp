// llm-eval: teacher-forced quality of a model (and of KV-cache settings) on a
// text, through the public API.
//
//   llm-eval -m MODEL -f TEXT [--ref MODEL] [--kv f16|f32|int8|int4] [--ref-kv T]
//            [--window W --sink S] [--exact] [--threads N] [--max-tokens N]
//
// Feeds the text's tokens one at a time and reports the perplexity of the
// text. With --ref, the reference model runs beside it (default f32 KV, exact
// math) and the tool also reports top-1 agreement (same argmax at each
// position) and the mean KL(ref || model) of the next-token distributions.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "llm.h"

namespace {

int die(const char* what, llm_status st) {
  std::fprintf(stderr, "llm-eval: %s: %s (%s)\n", what, llm_status_string(st), llm_last_error());
  return 1;
}

llm_kv_type parse_kv(const std::string& k) {
  return k == "f32" ? LLM_KV_F32 : k == "int8" ? LLM_KV_INT8 : k == "int4" ? LLM_KV_INT4 : LLM_KV_F16;
}

// log-softmax of logits[n] into out.
void log_softmax(const float* l, size_t n, std::vector<double>& out) {
  out.resize(n);
  double mx = l[0];
  for (size_t i = 1; i < n; ++i) mx = std::max(mx, double(l[i]));
  double sum = 0;
  for (size_t i = 0; i < n; ++i) sum += std::exp(double(l[i]) - mx);
  const double lse = mx + std::log(sum);
  for (size_t i = 0; i < n; ++i) out[i] = double(l[i]) - lse;
}

size_t argmax(const float* l, size_t n) {
  size_t b = 0;
  for (size_t i = 1; i < n; ++i)
    if (l[i] > l[b]) b = i;
  return b;
}

struct Runner {
  llm_model* model = nullptr;
  llm_session* session = nullptr;
  ~Runner() {
    llm_session_free(session);
    llm_model_free(model);
  }
  llm_status open(const std::string& path, uint32_t flags, int threads, const llm_session_params& sp) {
    llm_load_params lp;
    llm_load_params_init(&lp);
    lp.flags = flags;
    lp.n_threads = threads;
    llm_status st = llm_load(path.c_str(), &lp, &model);
    if (st == LLM_OK) st = llm_session_create(model, &sp, &session);
    return st;
  }
};

}  // namespace

int main(int argc, char** argv) {
  std::string model_path, ref_path, text_path;
  uint32_t flags = 0;
  int threads = 0;
  size_t max_tokens = 0;
  llm_session_params sp, rsp;
  llm_session_params_init(&sp);
  llm_session_params_init(&rsp);
  rsp.kv_type = LLM_KV_F32;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "llm-eval: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "-m") model_path = next();
    else if (a == "--ref") ref_path = next();
    else if (a == "-f") text_path = next();
    else if (a == "--kv") sp.kv_type = parse_kv(next());
    else if (a == "--ref-kv") rsp.kv_type = parse_kv(next());
    else if (a == "--window") sp.window = uint32_t(std::atoi(next().c_str()));
    else if (a == "--sink") sp.n_sink = uint32_t(std::atoi(next().c_str()));
    else if (a == "--exact") flags |= LLM_LOAD_REFERENCE_MATH;
    else if (a == "--threads" || a == "-t") threads = std::atoi(next().c_str());
    else if (a == "--max-tokens") max_tokens = size_t(std::atol(next().c_str()));
    else {
      std::fprintf(stderr,
                   "usage: llm-eval -m MODEL -f TEXT [--ref MODEL] [--kv T] [--ref-kv T] [--window W --sink S] "
                   "[--exact] [--threads N] [--max-tokens N]\n");
      return 2;
    }
  }
  if (model_path.empty() || text_path.empty()) return die("arguments", LLM_ERR_INVALID_ARGUMENT);
  std::ifstream f(text_path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string text = ss.str();

  Runner m, r;
  llm_status st = m.open(model_path, flags, threads, sp);
  if (st != LLM_OK) return die("model", st);
  if (!ref_path.empty()) {
    rsp.window = sp.window;
    rsp.n_sink = sp.n_sink;
    st = r.open(ref_path, LLM_LOAD_REFERENCE_MATH, threads, rsp);
    if (st != LLM_OK) return die("reference", st);
  }
  size_t n = 0;
  llm_tokenize(m.model, text.data(), text.size(), LLM_TOKENIZE_ADD_BOS, nullptr, 0, &n);
  std::vector<llm_token> toks(n);
  st = llm_tokenize(m.model, text.data(), text.size(), LLM_TOKENIZE_ADD_BOS, toks.data(), n, &n);
  if (st != LLM_OK) return die("tokenize", st);
  if (max_tokens && toks.size() > max_tokens) toks.resize(max_tokens);

  double nll = 0, kl = 0;
  size_t agree = 0, count = 0;
  std::vector<double> lp, lq;
  for (size_t i = 0; i + 1 < toks.size(); ++i) {
    if ((st = llm_prefill(m.session, &toks[i], 1)) != LLM_OK) return die("prefill", st);
    const float* lm = nullptr;
    size_t nv = 0;
    if ((st = llm_logits(m.session, &lm, &nv)) != LLM_OK) return die("logits", st);
    log_softmax(lm, nv, lq);
    nll -= lq[size_t(toks[i + 1])];
    if (r.session) {
      if ((st = llm_prefill(r.session, &toks[i], 1)) != LLM_OK) return die("reference prefill", st);
      const float* lr = nullptr;
      size_t nr = 0;
      if ((st = llm_logits(r.session, &lr, &nr)) != LLM_OK) return die("reference logits", st);
      log_softmax(lr, nr, lp);
      for (size_t k = 0; k < nv; ++k) kl += std::exp(lp[k]) * (lp[k] - lq[k]);
      agree += argmax(lm, nv) == argmax(lr, nr);
    }
    ++count;
  }
  std::printf("tokens %zu\nperplexity %.4f\n", count, std::exp(nll / double(count)));
  if (r.session) std::printf("top1_agreement %.4f\nmean_kl %.6f\n", double(agree) / count, kl / count);
  return 0;
}
