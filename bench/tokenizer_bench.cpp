// tokenizer_bench: single-threaded encode / decode throughput of the native tokenizer on a JSON-lines
// file of documents ({"text": ...} per line). Run by bench/tokenizer_bench.py, which builds the text and
// times HF tokenizers on the same documents; usable alone too:
//   tokenizer_bench --tokenizer DIR --docs FILE [--repeat N]
// Prints one JSON object: load seconds, bytes, tokens, and the best encode / decode MB/s over N runs.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  std::string tokenizer_path, docs_path;
  int repeat = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--tokenizer")
      tokenizer_path = argv[i + 1];
    else if (a == "--docs")
      docs_path = argv[i + 1];
    else if (a == "--repeat")
      repeat = std::stoi(argv[i + 1]);
  }
  if (tokenizer_path.empty() || docs_path.empty()) {
    std::fprintf(stderr, "usage: tokenizer_bench --tokenizer DIR --docs FILE [--repeat N]\n");
    return 2;
  }
  try {
    auto t0 = std::chrono::steady_clock::now();
    const auto tok = dsaserve::tokenizer::Tokenizer::from_file(tokenizer_path);
    const double load_s = seconds_since(t0);

    std::vector<std::string> docs;
    std::ifstream in(docs_path);
    std::string line;
    size_t bytes = 0;
    while (std::getline(in, line)) {
      if (line.empty()) continue;
      docs.push_back(nlohmann::json::parse(line)["text"].get<std::string>());
      bytes += docs.back().size();
    }

    std::vector<std::vector<uint32_t>> ids(docs.size());
    double best_encode = 1e30, best_decode = 1e30;
    size_t tokens = 0, decoded_bytes = 0;
    for (int r = 0; r < repeat; ++r) {
      t0 = std::chrono::steady_clock::now();
      for (size_t d = 0; d < docs.size(); ++d) {
        ids[d].clear();
        tok.encode(docs[d], ids[d]);
      }
      best_encode = std::min(best_encode, seconds_since(t0));
      t0 = std::chrono::steady_clock::now();
      decoded_bytes = 0;
      for (const auto& v : ids) decoded_bytes += tok.decode(v).size();
      best_decode = std::min(best_decode, seconds_since(t0));
    }
    for (const auto& v : ids) tokens += v.size();
    const double mb = static_cast<double>(bytes) / 1e6;
    nlohmann::json out = {{"load_s", load_s},
                          {"docs", docs.size()},
                          {"bytes", bytes},
                          {"tokens", tokens},
                          {"round_trip", decoded_bytes == bytes},
                          {"encode_mb_s", mb / best_encode},
                          {"decode_mb_s", mb / best_decode}};
    std::printf("%s\n", out.dump().c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tokenizer_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
