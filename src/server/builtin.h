#pragma once
// The built-in model and tokenizer for smoke runs without a download (`--model builtin`,
// `--tokenizer builtin:bytes`). The model is configs/dsaserve-tiny.json (GLM-5.x structure at toy width,
// vocab 512) with deterministic random weights: its text is noise, it only exercises the serving path.
// The tokenizer is a byte-level BPE over the same 512 ids: 8 special tokens, the 256 bytes, and 248
// merges of common English letter pairs; its chat template marks roles with the special tokens.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace dsaserve::server {

// Whether --model names the built-in model ("builtin:demo", or "builtin").
bool is_builtin_model(const std::string& path);
// The built-in model's config.json text.
std::string builtin_config_json();
// Writes config.json and model.safetensors (random bf16 weights from `seed`, MTP layer included) to
// `dir`, then loads them.
std::shared_ptr<model::Model> make_builtin_model(const std::filesystem::path& dir, uint64_t seed = 0);

// The byte-level tokenizer's tokenizer.json text, and the tokenizer itself.
std::string builtin_tokenizer_json();
tokenizer::Tokenizer make_builtin_tokenizer();
// Its chat template (Jinja) and special tokens.
std::string builtin_chat_template();
inline constexpr const char* kBuiltinBos = "<|begin|>";
inline constexpr const char* kBuiltinEos = "<|endoftext|>";

}  // namespace dsaserve::server
