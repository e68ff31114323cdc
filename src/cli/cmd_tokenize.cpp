// dsaserve tokenize / detokenize: batch tokenization over JSON lines on stdin.
//   dsaserve tokenize --tokenizer DIR [--no-parse-special]
//     in:  {"text": "...", "parse_special"?: bool}   out: {"ids": [...]}
//   dsaserve detokenize --tokenizer DIR [--skip-special-tokens] [--stream]
//     in:  {"ids": [...], "skip_special_tokens"?: bool}   out: {"text": "..."} and, with --stream,
//     "chunks": the streaming detokenizer's output for each id, then its final flush.
#include <charconv>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/command.h"
#include "cli/stdout_io.h"
#include "core/error.h"
#include "tokenizer/detokenizer.h"
#include "tokenizer/tokenizer.h"

namespace dsaserve::cli {
namespace {

using nlohmann::json;

struct TokenizeOptions {
  std::string tokenizer;
  bool no_parse_special = false;
  bool skip_special = false;
  bool stream = false;
};

// Calls fn(object, line_number) for each non-empty JSON line of stdin.
template <class F>
void for_each_json_line(F&& fn) {
  std::string line;
  size_t line_no = 0;
  while (std::getline(std::cin, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    json j;
    try {
      j = json::parse(line);
    } catch (const json::parse_error& e) {
      fail("stdin line {}: not valid JSON: {}", line_no, e.what());
    }
    if (!j.is_object()) fail("stdin line {}: expected a JSON object", line_no);
    fn(j, line_no);
  }
}

bool line_flag(const json& j, const char* key, bool fallback, size_t line_no) {
  auto it = j.find(key);
  if (it == j.end()) return fallback;
  if (!it->is_boolean()) fail("stdin line {}: \"{}\" must be a boolean", line_no, key);
  return it->get<bool>();
}

int run_tokenize(const TokenizeOptions& o) {
  const auto tok = tokenizer::Tokenizer::from_file(o.tokenizer);
  std::vector<uint32_t> ids;
  std::string out;
  for_each_json_line([&](const json& j, size_t line_no) {
    auto it = j.find("text");
    if (it == j.end() || !it->is_string()) fail("stdin line {}: expected {{\"text\": string}}", line_no);
    ids.clear();
    try {
      tok.encode(it->get_ref<const std::string&>(), ids,
                 line_flag(j, "parse_special", !o.no_parse_special, line_no));
    } catch (const Error& e) {
      fail("stdin line {}: {}", line_no, e.what());
    }
    out.assign("{\"ids\": [");
    char buf[16];
    for (size_t i = 0; i < ids.size(); ++i) {
      if (i > 0) out += ", ";
      out.append(buf, std::to_chars(buf, buf + sizeof(buf), ids[i]).ptr);
    }
    out += "]}\n";
    write_stdout(out);
  });
  flush_stdout();
  return 0;
}

int run_detokenize(const TokenizeOptions& o) {
  const auto tok = tokenizer::Tokenizer::from_file(o.tokenizer);
  std::vector<uint32_t> ids;
  for_each_json_line([&](const json& j, size_t line_no) {
    auto it = j.find("ids");
    if (it == j.end() || !it->is_array()) fail("stdin line {}: expected {{\"ids\": [int, ...]}}", line_no);
    ids.clear();
    for (const auto& v : *it) {
      if (!v.is_number_unsigned() || v.get<uint64_t>() > 0xFFFFFFFFull) {
        fail("stdin line {}: ids must be non-negative 32-bit integers, got {}", line_no, v.dump());
      }
      ids.push_back(v.get<uint32_t>());
    }
    const bool skip = line_flag(j, "skip_special_tokens", o.skip_special, line_no);
    json result = {{"text", tok.decode(ids, skip)}};
    if (o.stream) {
      tokenizer::DecodeStream stream(tok, skip);
      json chunks = json::array();
      for (uint32_t id : ids) chunks.push_back(stream.step(id));
      chunks.push_back(stream.finish());
      result["chunks"] = std::move(chunks);
    }
    const std::string line = result.dump() + "\n";
    write_stdout(line);
  });
  flush_stdout();
  return 0;
}

void add_tokenizer_option(CLI::App& sub, TokenizeOptions& o) {
  sub.add_option("--tokenizer", o.tokenizer, "tokenizer.json, or a directory holding it")->required();
}

const CommandRegistration tokenize_cmd(
    "tokenize", "Encode JSON lines {\"text\": ...} from stdin into {\"ids\": [...]} lines",
    [](CLI::App& sub) -> CommandRun {
      auto o = std::make_shared<TokenizeOptions>();
      add_tokenizer_option(sub, *o);
      sub.add_flag(
          "--no-parse-special", o->no_parse_special,
          "Encode special tokens' spellings as ordinary text (a line's \"parse_special\" overrides)");
      return [o] { return run_tokenize(*o); };
    });

const CommandRegistration detokenize_cmd(
    "detokenize", "Decode JSON lines {\"ids\": [...]} from stdin into {\"text\": ...} lines",
    [](CLI::App& sub) -> CommandRun {
      auto o = std::make_shared<TokenizeOptions>();
      add_tokenizer_option(sub, *o);
      sub.add_flag("--skip-special-tokens", o->skip_special,
                   "Drop special tokens from the text (a line's \"skip_special_tokens\" overrides)");
      sub.add_flag("--stream", o->stream, "Also decode id by id with the streaming detokenizer (\"chunks\")");
      return [o] { return run_detokenize(*o); };
    });

}  // namespace
}  // namespace dsaserve::cli
