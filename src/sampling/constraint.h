// What a session needs from a constraint on the tokens it samples (a
// grammar): a mask over the logits, a one-token check, and a state that
// advances with every accepted token. The session holds its own copy of the
// state; the caller passes a prototype in the start state with each
// decode_step, and the session starts over from it whenever the prototype's
// key (the compiled grammar) changes.
#pragma once

#include <cstdint>
#include <memory>

namespace llm {

class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  virtual std::unique_ptr<TokenConstraint> clone() const = 0;
  // Identifies the compiled grammar: equal keys mean the same language.
  virtual const void* key() const = 0;
  virtual bool allows(int32_t token) const = 0;
  // Sets the logits of forbidden tokens to -INFINITY.
  virtual void apply(float* logits, int32_t n_vocab) = 0;
  // Advances past `token` (which allows() accepted).
  virtual void accept(int32_t token) = 0;
};

}  // namespace llm
