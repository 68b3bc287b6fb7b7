#pragma once
// A sentencepiece .model (a serialised ModelProto: BPE or unigram, as LLaMA-1/2, Mistral, T5
// ship it), encoded and decoded by Debian's libsentencepiece, so the ids are sentencepiece's.
//
// Around the library:
//   - encode splits the text at the model's control symbols (<s>, </s>, ...) first, which
//     sentencepiece itself never produces from text; encode_ordinary does not; each text
//     segment is then encoded by sentencepiece (so each gets its dummy-prefix "▁").
//   - Note [invalid UTF-8] (regex.h): sentencepiece would turn invalid UTF-8 into U+FFFD;
//     forge cuts the text into valid runs and invalid runs; the valid ones go to
//     sentencepiece (those after the first without the dummy prefix: a second processor
//     with normalizer_spec.add_dummy_prefix = false), each invalid byte becomes its <0xNN>
//     byte piece (models trained with byte_fallback) or the unknown piece.
//   - decode is sentencepiece's rule done by forge so that bytes stay bytes: pieces
//     concatenated with "▁" read as a space, byte pieces as their byte, control symbols as
//     nothing, the unknown piece as " ⁇ ", and the leading space dropped when the model adds
//     a dummy prefix.
// Builds without libsentencepiece refuse .model files with a message that says how to get it.
#include <memory>
#include <string>

#include "forge/data/tokenizer.h"

namespace forge::data {

// `name` is the file's name (kept in the run directory's wrapper), `origin` names it in errors.
std::shared_ptr<const Tokenizer> load_sentencepiece(std::string model, const std::string& name, const std::string& origin);

// True when `bytes` starts like a serialised ModelProto (its first field, a piece).
bool looks_like_sentencepiece(const std::string& bytes);

}  // namespace forge::data
