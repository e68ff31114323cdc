#pragma once
// Shared by the tests that start `dsaserve serve --tp N [--attn-dp-size D]` on the tiny fixture
// (serve_tp_test, serve_dp_test): the server's flags, a greedy completion body and its token ids, the
// launcher's rank processes, and the requests with their goldens.
#include <dirent.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "io/safetensors.h"
#include "model/golden_util.h"      // tests/model/: ids_of
#include "server/server_process.h"  // tests/server/

namespace dsaserve::testing::serve_ranks {

using nlohmann::json;

inline std::vector<std::string> server_args(const std::filesystem::path& tiny,
                                            const std::vector<std::string>& extra) {
  std::vector<std::string> a = {"--model",
                                tiny.string(),
                                "--tokenizer",
                                "builtin:bytes",
                                "--kv-pages",
                                "128",
                                "--page-size",
                                "16",
                                "--chunked-prefill-size",
                                "32",
                                "--check-integrity",
                                "--served-model-name",
                                "tiny"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

inline json greedy_body(const std::vector<int32_t>& prompt, size_t n) {
  return {{"model", "tiny"},  {"prompt", prompt},   {"max_tokens", n},
          {"temperature", 0}, {"ignore_eos", true}, {"return_token_ids", true}};
}

inline std::vector<int32_t> token_ids(const HttpResult& r) {
  EXPECT_EQ(r.status, 200) << r.body;
  if (r.status != 200) return {};
  return r.json()["choices"][0]["token_ids"].get<std::vector<int32_t>>();
}

// The server's ranks: the launcher's children, by their --dist-rank argument.
inline std::map<int, pid_t> ranks_of(pid_t launcher) {
  std::map<int, pid_t> out;
  DIR* d = ::opendir("/proc");
  if (d == nullptr) return out;
  while (dirent* e = ::readdir(d)) {
    const pid_t pid = std::atoi(e->d_name);
    if (pid <= 0) continue;
    std::ifstream stat(fmt::format("/proc/{}/stat", pid));
    std::string st((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
    const size_t close = st.rfind(')');
    if (close == std::string::npos) continue;
    int ppid = 0;
    char state = 0;
    if (std::sscanf(st.c_str() + close + 1, " %c %d", &state, &ppid) != 2 || ppid != launcher) continue;
    std::ifstream cmd(fmt::format("/proc/{}/cmdline", pid));
    std::vector<std::string> args;
    for (std::string a; std::getline(cmd, a, '\0');) args.push_back(a);
    for (size_t i = 0; i + 1 < args.size(); ++i)
      if (args[i] == "--dist-rank") out[std::stoi(args[i + 1])] = pid;
  }
  ::closedir(d);
  return out;
}

inline bool alive(pid_t pid) { return ::kill(pid, 0) == 0; }

// Kills rank `victim` of `serve LAYOUT` while a long streaming request runs (the ranks inside a step's
// collectives): the server (the launcher, every rank) ends with an error well within the bound, naming
// the killed rank; the request in flight ends (an error or a closed connection), never hanging.
inline void expect_a_killed_rank_ends_the_server(const std::filesystem::path& tiny,
                                                 const std::vector<std::string>& layout, int victim) {
  const std::string name = fmt::format("{}", fmt::join(layout, " "));
  std::vector<std::string> args = layout;
  args.insert(args.end(), {"--dist-timeout", "30"});
  ServerProcess s(server_args(tiny, args), 0, true);
  ASSERT_GT(s.port(), 0) << s.log();
  const std::map<int, pid_t> ranks = ranks_of(s.pid());
  ASSERT_EQ(ranks.size(), size_t(std::stoi(layout.at(1)))) << name;
  // The client owns what it touches (it may be detached below and outlive this frame).
  const auto answered = std::make_shared<std::atomic<bool>>(false);
  std::thread client([port = s.port(), answered] {
    try {
      json b = greedy_body({1, 2, 3}, 3000);
      b["stream"] = true;
      (void)post_json(port, "/v1/completions", b);
    } catch (const std::exception&) {  // the connection was closed: the point is that it ends
    }
    *answered = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const auto t0 = std::chrono::steady_clock::now();
  ::kill(ranks.at(victim), SIGKILL);
  const std::optional<int> status = s.wait_exit(std::chrono::seconds(20));
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!status.has_value()) {
    ADD_FAILURE() << name << ": rank " << victim << " killed: the server did not end\n" << s.output();
    client.detach();  // the server process is ended by ServerProcess's destructor
    return;
  }
  EXPECT_NE(*status, 0) << name << "\n" << s.output();
  EXPECT_LT(secs, 10) << name << "\n" << s.output();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const std::string out = s.output();
  EXPECT_NE(out.find(fmt::format("rank {} was killed by signal 9", victim)), std::string::npos) << out;
  for (const auto& [r, pid] : ranks)
    EXPECT_FALSE(alive(pid)) << name << ": rank " << r << " outlived the server";
  client.join();
  EXPECT_TRUE(*answered);
  std::printf("RESULT serve %s: rank %d killed -> server ended with status %d in %.2f s\n", name.c_str(),
              victim, *status, secs);
}

// Prompts: the goldens' two, and six of 1..90 random ids (past the indexer's top-k of 64, chunked by 32).
struct Requests {
  std::vector<std::vector<int32_t>> prompts;
  std::vector<size_t> new_tokens;
  std::vector<std::vector<int32_t>> golden;  // the goldens' outputs (first two)
};

inline Requests make_requests(const std::filesystem::path& tiny) {
  Requests q;
  auto gold = io::SafetensorsFile::open(tiny / "goldens.safetensors");
  for (int j = 0; j < 2; ++j) {
    q.prompts.push_back(ids_of(gold->get(fmt::format("greedy{}.prompt", j))));
    q.golden.push_back(ids_of(gold->get(fmt::format("greedy{}.output", j))));
    q.new_tokens.push_back(q.golden.back().size());
  }
  std::mt19937 rng(11);
  for (int i = 0; i < 6; ++i) {
    std::vector<int32_t> p;
    for (uint32_t k = 0, n = 1 + rng() % 90; k < n; ++k) p.push_back(int32_t(rng() % 512));
    q.prompts.push_back(p);
    q.new_tokens.push_back(4 + rng() % 12);
  }
  return q;
}

}  // namespace dsaserve::testing::serve_ranks
