#pragma once
// Decoders of a tokenizer.json: ByteLevel, ByteFallback, Fuse, Strip, Replace, Metaspace, BPEDecoder and
// Sequence. Each maps the list of token strings to a new list; the results are concatenated.
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace dsaserve::tokenizer {

class DecoderStep {
 public:
  virtual ~DecoderStep() = default;
  virtual void apply(std::vector<std::string>& tokens) const = 0;
};

class Decoder {
 public:
  // `spec` is tokenizer.json's "decoder" (null or an object).
  void load(const nlohmann::json& spec, const std::string& where);
  bool present() const { return present_; }
  // True when the decoder is exactly ByteLevel: a token decodes to bytes on its own, independent of its
  // neighbours, and the text is the lossy UTF-8 decoding of all tokens' bytes.
  bool byte_level_only() const { return byte_level_only_; }
  // Runs the chain and concatenates its output (no decoder: tokens joined with spaces, as HF does).
  std::string decode(std::vector<std::string> tokens) const;

 private:
  std::vector<std::unique_ptr<DecoderStep>> steps_;
  bool present_ = false;
  bool byte_level_only_ = false;
};

}  // namespace dsaserve::tokenizer
