// The passkey needle prompt shared by kvpack-eval's needle test and kvpack-snapkv-diag, so both
// score exactly the same prompts (protocol of Mohtashami & Jaggi, "Landmark Attention", 2023,
// as used by the long-context KV-cache papers: a 5-digit key hidden in irrelevant text).
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <kvpack/result.hpp>

#include "tokenizer.hpp"

namespace kvpack::llama {

/// One passkey case: `prompt` (instructions, filler with the key sentence planted at `depth` % of
/// the filler, question) and `answer` (the key's tokens), together exactly `length` tokens.
struct PasskeyPrompt {
  int64_t length = 0;     ///< prompt + answer tokens, as requested
  int depth = 0;          ///< percent of the filler before the key sentence (0 to 100)
  std::vector<int32_t> prompt, answer;
  std::string key;        ///< the 5-digit pass key
  int64_t needle_at = 0;  ///< prompt index of the key sentence's first token
  int64_t needle_len = 0; ///< tokens of the key sentence
};

/// Builds the passkey case of `length` tokens with the key at `depth` % of the filler. The key
/// depends on (length, depth) only (std::mt19937 seeded with length * 1000 + depth), so every
/// policy and every tool sees the same case. `filler`: token ids of the irrelevant text, used from
/// its start. Errors (Errc::invalid_argument): depth outside 0..100, fewer than 16 filler tokens
/// would fit in `length`, or `filler` holds fewer tokens than the case needs.
[[nodiscard]] inline Result<PasskeyPrompt> make_passkey_prompt(const Tokenizer& tok, std::span<const int32_t> filler,
                                                               int64_t length, int depth) {
  if (depth < 0 || depth > 100)
    return fail(Errc::invalid_argument, "needle depth " + std::to_string(depth) + " % is outside 0..100");
  const auto intro = tok.encode(
      "There is an important pass key hidden inside a lot of irrelevant text. Find it and memorize it. "
      "I will quiz you about the pass key.\n\n");
  const auto question = tok.encode("\n\nWhat is the pass key? The pass key is");
  std::mt19937 rng(static_cast<unsigned>(length * 1000 + depth));
  PasskeyPrompt c;
  c.length = length;
  c.depth = depth;
  c.key = std::to_string(10000 + rng() % 90000);
  const auto needle = tok.encode("\n\nThe pass key is " + c.key + ". Remember it. " + c.key + " is the pass key.\n\n");
  c.answer = tok.encode(" " + c.key);
  const int64_t fill = length - static_cast<int64_t>(intro.size() + needle.size() + question.size() + c.answer.size());
  if (fill < 16)
    return fail(Errc::invalid_argument, "a needle prompt of " + std::to_string(length) + " tokens leaves no room for filler");
  if (fill > static_cast<int64_t>(filler.size()))
    return fail(Errc::invalid_argument, "the needle filler holds " + std::to_string(filler.size()) + " tokens; a " +
                                            std::to_string(length) + "-token prompt needs " + std::to_string(fill));
  const int64_t at = fill * depth / 100;
  c.prompt = intro;
  c.prompt.insert(c.prompt.end(), filler.begin(), filler.begin() + at);
  c.needle_at = static_cast<int64_t>(c.prompt.size());
  c.needle_len = static_cast<int64_t>(needle.size());
  c.prompt.insert(c.prompt.end(), needle.begin(), needle.end());
  c.prompt.insert(c.prompt.end(), filler.begin() + at, filler.begin() + fill);
  c.prompt.insert(c.prompt.end(), question.begin(), question.end());
  return c;
}

}  // namespace kvpack::llama
