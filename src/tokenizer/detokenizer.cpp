#include "tokenizer/detokenizer.h"

#include "tokenizer/utf8.h"

namespace dsaserve::tokenizer {

DecodeStream::DecodeStream(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tokenizer_(&tokenizer), skip_special_(skip_special_tokens) {}

size_t DecodeStream::step(uint32_t id, std::string& out) {
  const size_t before = out.size();
  if (tokenizer_->bytewise_decoding()) {
    const std::string_view bytes = tokenizer_->token_bytes(id, skip_special_);
    if (pending_.empty()) {
      const size_t used = append_utf8_lossy(bytes.data(), bytes.size(), out, false);
      pending_.assign(bytes.substr(used));
    } else {
      pending_ += bytes;
      const size_t used = append_utf8_lossy(pending_.data(), pending_.size(), out, false);
      pending_.erase(0, used);
    }
    return out.size() - before;
  }
  ids_.push_back(id);
  const std::string text = tokenizer_->decode(ids_, skip_special_);
  static constexpr std::string_view kReplacement = "\xEF\xBF\xBD";
  const bool unfinished = text.size() >= 3 && text.compare(text.size() - 3, 3, kReplacement) == 0;
  if (text.size() > prefix_.size() && !unfinished && text.compare(0, prefix_.size(), prefix_) == 0) {
    out.append(text, prefix_.size(), std::string::npos);
    const size_t new_prefix_index = ids_.size() - prefix_index_;
    ids_.erase(ids_.begin(), ids_.begin() + static_cast<std::ptrdiff_t>(prefix_index_));
    prefix_ = tokenizer_->decode(ids_, skip_special_);
    prefix_index_ = new_prefix_index;
  }
  return out.size() - before;
}

std::string DecodeStream::step(uint32_t id) {
  std::string out;
  step(id, out);
  return out;
}

size_t DecodeStream::finish(std::string& out) {
  const size_t before = out.size();
  if (tokenizer_->bytewise_decoding()) {
    append_utf8_lossy(pending_.data(), pending_.size(), out, true);
  } else if (!ids_.empty()) {
    const std::string text = tokenizer_->decode(ids_, skip_special_);
    if (text.size() > prefix_.size() && text.compare(0, prefix_.size(), prefix_) == 0) {
      out.append(text, prefix_.size(), std::string::npos);
    }
  }
  reset();
  return out.size() - before;
}

std::string DecodeStream::finish() {
  std::string out;
  finish(out);
  return out;
}

void DecodeStream::reset() {
  pending_.clear();
  ids_.clear();
  prefix_.clear();
  prefix_index_ = 0;
}

}  // namespace dsaserve::tokenizer
