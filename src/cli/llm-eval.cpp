// llm-eval: teacher-forced quality of a model (and of KV-cache settings) on a
// text or on reference token sequences, through the public API.
//
//   llm-eval -m MODEL (-f TEXT | --cases REF.json ...) [--ref MODEL] [--kv f16|f32|int8|int4]
//            [--ref-kv T] [--window W --sink S] [--exact] [--threads N] [--max-tokens N] [--per-case]
//
// Feeds the tokens one at a time and reports the perplexity. With --ref, the
// reference model runs beside it (default f32 KV, exact math) and the tool
// also reports top-1 agreement (same argmax at each position) and the mean
// KL(ref || model) of the next-token distributions.
//
// -f TEXT: the text, tokenized with BOS, is one sequence.
// --cases REF.json (repeatable): every case of a reference file
// (../shared/models/reference/*.json, "cases": [{prompt_token_ids,
// generated_token_ids, ...}]) is one sequence, prompt ids (BOS first) then
// the generated ids, each evaluated from an empty session; the figures are
// aggregated over all positions of all cases.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
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


std::string read_all(const std::string& path, bool* ok) {
  std::ifstream f(path, std::ios::binary);
  *ok = f.good();
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// End of the JSON string that starts at s[i] == '"' (index after the closing quote).
size_t skip_string(const std::string& s, size_t i) {
  for (++i; i < s.size(); ++i) {
    if (s[i] == '\\') ++i;
    else if (s[i] == '"') return i + 1;
  }
  return s.size();
}

// Reads the integer array that follows `"key":` at or after position `from`
// within [from, end); returns false if there is none.
bool int_array_after(const std::string& s, size_t from, size_t end, const std::string& key, std::vector<llm_token>* out,
                     size_t* after) {
  const std::string k = "\"" + key + "\"";
  size_t p = s.find(k, from);
  if (p == std::string::npos || p >= end) return false;
  p = s.find('[', p + k.size());
  if (p == std::string::npos || p >= end) return false;
  out->clear();
  ++p;
  while (p < end) {
    while (p < end && (s[p] == ' ' || s[p] == ',' || s[p] == '\n' || s[p] == '\r' || s[p] == '\t')) ++p;
    if (p < end && s[p] == ']') {
      *after = p + 1;
      return true;
    }
    char* e = nullptr;
    const long v = std::strtol(s.c_str() + p, &e, 10);
    if (e == s.c_str() + p) return false;
    out->push_back(llm_token(v));
    p = size_t(e - s.c_str());
  }
  return false;
}

// The token sequences (prompt ids + generated ids) of a reference file's
// "cases" array; other keys holding such arrays (e.g. the upstream sample)
// are not cases and are skipped.
bool read_cases(const std::string& path, std::vector<std::vector<llm_token>>* seqs) {
  bool ok = false;
  const std::string s = read_all(path, &ok);
  if (!ok) return false;
  size_t p = s.find("\"cases\"");
  if (p == std::string::npos) return false;
  p = s.find('[', p);
  if (p == std::string::npos) return false;
  // The matching ']' of the cases array.
  size_t end = p + 1;
  for (int depth = 1; end < s.size() && depth > 0;) {
    const char c = s[end];
    if (c == '"') {
      end = skip_string(s, end);
      continue;
    }
    if (c == '[' || c == '{') ++depth;
    if (c == ']' || c == '}') --depth;
    ++end;
  }
  size_t at = p;
  std::vector<llm_token> prompt, gen;
  while (int_array_after(s, at, end, "prompt_token_ids", &prompt, &at)) {
    if (!int_array_after(s, at, end, "generated_token_ids", &gen, &at)) return false;
    std::vector<llm_token> seq = prompt;
    seq.insert(seq.end(), gen.begin(), gen.end());
    seqs->push_back(std::move(seq));
  }
  return !seqs->empty();
}

struct Totals {
  double nll = 0, kl = 0;
  size_t agree = 0, count = 0;
};

}  // namespace

// Teacher-forced pass over one sequence from an empty session: the logits
// after token i are scored against token i + 1.
llm_status eval_sequence(Runner& m, Runner& r, const std::vector<llm_token>& toks, Totals* t) {
  llm_status st;
  if ((st = llm_session_reset(m.session)) != LLM_OK) return st;
  if (r.session && (st = llm_session_reset(r.session)) != LLM_OK) return st;
  std::vector<double> lp, lq;
  for (size_t i = 0; i + 1 < toks.size(); ++i) {
    if ((st = llm_prefill(m.session, &toks[i], 1)) != LLM_OK) return st;
    const float* lm = nullptr;
    size_t nv = 0;
    if ((st = llm_logits(m.session, &lm, &nv)) != LLM_OK) return st;
    if (size_t(toks[i + 1]) >= nv) return LLM_ERR_INVALID_ARGUMENT;
    log_softmax(lm, nv, lq);
    t->nll -= lq[size_t(toks[i + 1])];
    if (r.session) {
      if ((st = llm_prefill(r.session, &toks[i], 1)) != LLM_OK) return st;
      const float* lr = nullptr;
      size_t nr = 0;
      if ((st = llm_logits(r.session, &lr, &nr)) != LLM_OK) return st;
      if (nr != nv) return LLM_ERR_INVALID_ARGUMENT;
      log_softmax(lr, nr, lp);
      double kl = 0;
      for (size_t k = 0; k < nv; ++k) kl += std::exp(lp[k]) * (lp[k] - lq[k]);
      t->kl += kl;
      t->agree += argmax(lm, nv) == argmax(lr, nr);
    }
    ++t->count;
  }
  return LLM_OK;
}

void print_totals(const char* prefix, const Totals& t, bool with_ref) {
  const double n = t.count ? double(t.count) : 1.0;
  std::printf("%stokens %zu\n%sperplexity %.4f\n", prefix, t.count, prefix, std::exp(t.nll / n));
  if (with_ref) std::printf("%stop1_agreement %.4f\n%smean_kl %.6f\n", prefix, double(t.agree) / n, prefix, t.kl / n);
}

int main(int argc, char** argv) {
  std::string model_path, ref_path, text_path;
  std::vector<std::string> case_files;
  bool per_case = false;
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
    else if (a == "--cases") case_files.push_back(next());
    else if (a == "--per-case") per_case = true;
    else if (a == "--kv") sp.kv_type = parse_kv(next());
    else if (a == "--ref-kv") rsp.kv_type = parse_kv(next());
    else if (a == "--window") sp.window = uint32_t(std::atoi(next().c_str()));
    else if (a == "--sink") sp.n_sink = uint32_t(std::atoi(next().c_str()));
    else if (a == "--exact") flags |= LLM_LOAD_REFERENCE_MATH;
    else if (a == "--threads" || a == "-t") threads = std::atoi(next().c_str());
    else if (a == "--max-tokens") max_tokens = size_t(std::atol(next().c_str()));
    else {
      std::fprintf(stderr,
                   "usage: llm-eval -m MODEL (-f TEXT | --cases REF.json ...) [--ref MODEL] [--kv T] [--ref-kv T] "
                   "[--window W --sink S] [--exact] [--threads N] [--max-tokens N] [--per-case]\n");
      return 2;
    }
  }
  if (model_path.empty() || text_path.empty() == case_files.empty()) {
    std::fprintf(stderr, "llm-eval: give -m MODEL and either -f TEXT or --cases REF.json\n");
    return 2;
  }

  Runner m, r;
  llm_status st = m.open(model_path, flags, threads, sp);
  if (st != LLM_OK) return die("model", st);
  if (!ref_path.empty()) {
    rsp.window = sp.window;
    rsp.n_sink = sp.n_sink;
    st = r.open(ref_path, LLM_LOAD_REFERENCE_MATH, threads, rsp);
    if (st != LLM_OK) return die("reference", st);
  }

  std::vector<std::vector<llm_token>> seqs;
  if (!text_path.empty()) {
    bool ok = false;
    const std::string text = read_all(text_path, &ok);
    if (!ok) return die(text_path.c_str(), LLM_ERR_IO);
    size_t n = 0;
    llm_tokenize(m.model, text.data(), text.size(), LLM_TOKENIZE_ADD_BOS, nullptr, 0, &n);
    std::vector<llm_token> toks(n);
    st = llm_tokenize(m.model, text.data(), text.size(), LLM_TOKENIZE_ADD_BOS, toks.data(), n, &n);
    if (st != LLM_OK) return die("tokenize", st);
    seqs.push_back(std::move(toks));
  }
  for (const auto& path : case_files) {
    if (!read_cases(path, &seqs)) {
      std::fprintf(stderr, "llm-eval: %s: no reference cases found\n", path.c_str());
      return 1;
    }
  }
  for (auto& s : seqs)
    if (max_tokens && s.size() > max_tokens) s.resize(max_tokens);

  Totals all;
  for (size_t c = 0; c < seqs.size(); ++c) {
    Totals t;
    if ((st = eval_sequence(m, r, seqs[c], &t)) != LLM_OK) return die("evaluation", st);
    if (per_case) {
      char prefix[32];
      std::snprintf(prefix, sizeof prefix, "case%zu_", c);
      print_totals(prefix, t, r.session != nullptr);
    }
    all.nll += t.nll;
    all.kl += t.kl;
    all.agree += t.agree;
    all.count += t.count;
  }
  if (seqs.size() > 1) std::printf("sequences %zu\n", seqs.size());
  print_totals("", all, r.session != nullptr);
  return 0;
}
