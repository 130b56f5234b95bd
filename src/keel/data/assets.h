// Where keel's bundled files are: the GPT-2 tokenizer (assets/gpt2) and the vocabularies of
// the other tokenizers (assets/tokenizers). $KEEL_ASSETS moves them (an installed keel, tests).
#pragma once

#include <string>

namespace keel::data {

// The folder of gpt2/ and tokenizers/ (Tokenizer::Load's `assets`): $KEEL_ASSETS, else the source
// tree's assets.
std::string AssetsDir();
// Where the GPT-2 tokenizer files are: AssetsDir()/gpt2.
std::string TokenizerDir();

}  // namespace keel::data
