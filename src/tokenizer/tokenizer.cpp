#include "tokenizer/tokenizer.h"

#include <atomic>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "tokenizer/added_vocab.h"
#include "tokenizer/bpe.h"
#include "tokenizer/decoder.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/utf8.h"
#include "tokenizer/word_cache.h"

namespace dsaserve::tokenizer {

struct Tokenizer::Impl {
  uint64_t uid = 0;  // distinguishes tokenizers in the per-thread state
  BpeModel model;
  Normalizer normalizer;
  PreTokenizer pre_tokenizer;
  AddedVocab added;
  Decoder decoder;
  uint32_t id_end = 0;              // one past the largest id
  std::vector<uint8_t> kind;        // per id: 0 unknown, 1 normal, 2 special
  std::string bytes_arena;          // per id decoded bytes (ByteLevel decoder), via bytes_off
  std::vector<uint64_t> bytes_off;  // (offset << 24 | length)

  std::optional<std::string_view> content(uint32_t id) const {
    if (const AddedToken* t = added.token(id)) return std::string_view(t->content);
    return model.id_to_token(id);
  }
};

namespace {

std::atomic<uint64_t> next_uid{1};

// Scratch space and word cache of one thread for one tokenizer.
struct EncodeState {
  uint64_t owner = 0;
  WordCache cache;
  BpeScratch bpe;
  PipelineWork work;
  std::vector<AddedSegment> raw_segments, norm_segments;
  std::string normalized;
};

// The calling thread's state for tokenizer `uid`: a few are kept, most recently used first.
EncodeState& state_for(uint64_t uid) {
  thread_local std::vector<std::unique_ptr<EncodeState>> states;
  for (size_t i = 0; i < states.size(); ++i) {
    if (states[i]->owner == uid) {
      if (i != 0) std::swap(states[0], states[i]);
      return *states[0];
    }
  }
  constexpr size_t kKept = 4;
  if (states.size() < kKept) states.push_back(std::make_unique<EncodeState>());
  std::swap(states[0], states.back());
  EncodeState& st = *states[0];
  st.owner = uid;
  st.cache.clear();
  return st;
}

void run_model(const Tokenizer::Impl& t, EncodeState& st, std::string_view piece, bool at_text_start,
               std::vector<uint32_t>& out) {
  PipelineWork& w = st.work;
  w.buf.assign(piece);
  w.in.assign(1, Piece{0, static_cast<uint32_t>(piece.size()), at_text_start});
  t.pre_tokenizer.apply(w);
  const bool raw = t.pre_tokenizer.raw_bytes();
  for (const Piece& p : w.in) {
    const std::string_view word(w.buf.data() + p.begin, p.end - p.begin);
    if (st.cache.find(word, out)) continue;
    const size_t before = out.size();
    t.model.tokenize(word, raw, out, st.bpe);
    st.cache.insert(word, out.data() + before, out.size() - before);
  }
}

}  // namespace

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::from_file(const std::filesystem::path& path) {
  std::filesystem::path file = path;
  if (std::filesystem::is_directory(file)) file /= "tokenizer.json";
  std::ifstream in(file, std::ios::binary);
  if (!in) fail("{}: cannot open tokenizer file", file.string());
  std::stringstream ss;
  ss << in.rdbuf();
  return from_json(ss.str(), file.string());
}

Tokenizer Tokenizer::from_json(std::string_view json_text, std::string_view origin) {
  auto impl = std::make_unique<Impl>();
  impl->uid = next_uid.fetch_add(1);
  try {
    // model.vocab and model.merges (the bulk of the file) go straight into lists instead of JSON values.
    BpeLists lists;
    std::string keys[4];
    bool is_object[4] = {false, false, false, false};
    auto capture = [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
      using E = nlohmann::json::parse_event_t;
      if (depth < 4 && (event == E::object_start || event == E::array_start))
        is_object[depth] = event == E::object_start;
      if (event == E::key && depth < 4) keys[depth] = parsed.get<std::string>();
      if (depth != 3 || keys[1] != "model" || !is_object[1]) return true;
      if (keys[2] == "vocab" && is_object[2] && event == E::key) return false;  // keeps it out of the map
      if (keys[2] == "vocab" && is_object[2] && event == E::value) {
        lists.has_vocab = true;
        lists.vocab.emplace_back(std::move(keys[3]), std::move(parsed));
        return false;
      }
      if (keys[2] == "merges" && !is_object[2] && (event == E::value || event == E::array_end)) {
        lists.has_merges = true;
        lists.merges.push_back(std::move(parsed));
        return false;
      }
      return true;
    };
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(json_text, capture);
    } catch (const nlohmann::json::parse_error& e) {
      fail("not valid JSON: {}", e.what());
    }
    if (!j.is_object()) fail("expected a JSON object at the top level");
    auto section = [&](const char* key) -> const nlohmann::json& {
      static const nlohmann::json null_json;
      auto it = j.find(key);
      return it == j.end() ? null_json : *it;
    };
    if (!j.contains("model")) fail("model: missing");
    // An empty vocab object or merges array leaves no events: fall back to the JSON value then.
    lists.has_vocab = lists.has_vocab && j["model"].contains("vocab");
    lists.has_merges = lists.has_merges && j["model"].contains("merges");
    impl->model.load(j["model"], std::move(lists));
    impl->normalizer.load(section("normalizer"), "normalizer");
    impl->pre_tokenizer.load(section("pre_tokenizer"), "pre_tokenizer");
    impl->decoder.load(section("decoder"), "decoder");
    impl->added.load(section("added_tokens"), impl->model, impl->normalizer);
  } catch (const nlohmann::json::exception& e) {
    fail("{}: {}", origin, e.what());
  } catch (const Error& e) {
    fail("{}: {}", origin, e.what());
  }

  // Per-id tables for decoding.
  Impl& t = *impl;
  t.id_end = std::max(t.model.id_end(), t.added.id_end());
  t.kind.assign(t.id_end, 0);
  const bool bytewise = t.decoder.byte_level_only();
  if (bytewise) t.bytes_off.assign(t.id_end, 0);
  std::string bytes;
  for (uint32_t id = 0; id < t.id_end; ++id) {
    const auto c = t.content(id);
    if (!c) continue;
    t.kind[id] = t.added.is_special_content(*c) ? 2 : 1;
    if (bytewise) {
      bytes.clear();
      if (!byte_level_to_bytes(*c, bytes)) bytes.assign(*c);
      t.bytes_off[id] = (uint64_t{t.bytes_arena.size()} << 24) | bytes.size();
      t.bytes_arena += bytes;
    }
  }
  return Tokenizer(std::move(impl));
}

void Tokenizer::encode(std::string_view text, std::vector<uint32_t>& out, bool parse_special) const {
  const size_t valid = utf8_valid_prefix(text);
  if (valid != text.size()) fail("encode: text is not valid UTF-8 (byte offset {})", valid);
  const Impl& t = *impl_;
  EncodeState& st = state_for(t.uid);
  t.added.split(text, false, parse_special, st.raw_segments);
  for (const AddedSegment& seg : st.raw_segments) {
    if (seg.id) {
      out.push_back(*seg.id);
      continue;
    }
    std::string_view piece = text.substr(seg.begin, seg.end - seg.begin);
    const bool at_start = seg.begin == 0;
    if (!t.normalizer.empty()) {
      st.normalized.assign(piece);
      t.normalizer.apply(st.normalized);
      piece = st.normalized;
    }
    if (!t.added.has_tokens(true)) {
      if (!piece.empty()) run_model(t, st, piece, at_start, out);
      continue;
    }
    t.added.split(piece, true, parse_special, st.norm_segments);
    for (const AddedSegment& s : st.norm_segments) {
      if (s.id)
        out.push_back(*s.id);
      else if (s.end > s.begin)
        run_model(t, st, piece.substr(s.begin, s.end - s.begin), at_start && s.begin == 0, out);
    }
  }
}

std::vector<uint32_t> Tokenizer::encode(std::string_view text, bool parse_special) const {
  std::vector<uint32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  encode(text, ids, parse_special);
  return ids;
}

std::string_view Tokenizer::token_bytes(uint32_t id, bool skip_special_tokens) const {
  const Impl& t = *impl_;
  if (id >= t.id_end || t.kind[id] == 0 || (skip_special_tokens && t.kind[id] == 2) || t.bytes_off.empty())
    return {};
  const uint64_t e = t.bytes_off[id];
  return std::string_view(t.bytes_arena).substr(e >> 24, e & 0xFFFFFF);
}

std::string Tokenizer::decode(std::span<const uint32_t> ids, bool skip_special_tokens) const {
  const Impl& t = *impl_;
  if (t.decoder.byte_level_only()) {
    std::string bytes;
    for (uint32_t id : ids) bytes += token_bytes(id, skip_special_tokens);
    std::string text;
    text.reserve(bytes.size());
    append_utf8_lossy(bytes.data(), bytes.size(), text, true);
    return text;
  }
  std::vector<std::string> tokens;
  for (uint32_t id : ids) {
    if (id >= t.id_end || t.kind[id] == 0 || (skip_special_tokens && t.kind[id] == 2)) continue;
    tokens.emplace_back(*t.content(id));
  }
  return t.decoder.decode(std::move(tokens));
}

std::optional<uint32_t> Tokenizer::token_to_id(std::string_view token) const {
  if (auto id = impl_->added.token_to_id(token)) return id;
  return impl_->model.token_to_id(token);
}

std::optional<std::string> Tokenizer::id_to_token(uint32_t id) const {
  if (auto c = impl_->content(id)) return std::string(*c);
  return std::nullopt;
}

bool Tokenizer::is_special(uint32_t id) const { return id < impl_->id_end && impl_->kind[id] == 2; }

size_t Tokenizer::vocab_size() const {
  size_t n = impl_->model.vocab_size();
  for (const auto& [id, tok] : impl_->added.tokens()) {
    if (!impl_->model.id_to_token(id)) ++n;
  }
  return n;
}

bool Tokenizer::bytewise_decoding() const { return impl_->decoder.byte_level_only(); }

}  // namespace dsaserve::tokenizer
