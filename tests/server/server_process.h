#pragma once
// Test helpers: the real `dsaserve serve` binary on a free port (started with --port 0, the port read from
// its first line) and a small blocking HTTP/1.1 client over Boost.Beast.
// clang-format off
#include <utility>  // before Asio (Boost 1.74)
// clang-format on
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/fixtures.h"

namespace dsaserve::testing {

struct HttpResult {
  int status = 0;
  std::string body;
  nlohmann::json json() const { return nlohmann::json::parse(body, nullptr, false); }
};

// The request http_request and post_json_at_once send.
inline boost::beast::http::request<boost::beast::http::string_body> make_http_request(
    const std::string& method, const std::string& target, const std::string& body,
    const std::string& api_key = "") {
  namespace http = boost::beast::http;
  http::request<http::string_body> req(method == "POST" ? http::verb::post : http::verb::get, target, 11);
  req.set(http::field::host, "127.0.0.1");
  req.set(http::field::content_type, "application/json");
  if (!api_key.empty()) req.set(http::field::authorization, "Bearer " + api_key);
  req.body() = body;
  req.prepare_payload();
  return req;
}

// Reads one response from `sock`, then shuts the socket down.
inline HttpResult read_http_response(boost::asio::ip::tcp::socket& sock) {
  namespace beast = boost::beast;
  beast::flat_buffer buf;
  beast::http::response_parser<beast::http::string_body> parser;
  parser.body_limit(64 << 20);
  beast::http::read(sock, buf, parser);
  beast::error_code ec;
  sock.shutdown(boost::asio::ip::tcp::socket::shutdown_both, ec);
  return {int(parser.get().result_int()), parser.get().body()};
}

inline HttpResult http_request(int port, const std::string& method, const std::string& target,
                               const std::string& body = "", const std::string& api_key = "") {
  boost::asio::io_context ioc;
  boost::asio::ip::tcp::socket sock(ioc);
  sock.connect({boost::asio::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port)});
  boost::beast::http::write(sock, make_http_request(method, target, body, api_key));
  return read_http_response(sock);
}

inline HttpResult post_json(int port, const std::string& target, const nlohmann::json& body,
                            const std::string& api_key = "") {
  return http_request(port, "POST", target, body.dump(), api_key);
}

// POSTs every body at once: all connections are opened first, then every request is written (one thread,
// microseconds apart), then the answers are read. Threads started one per request would arrive as the
// scheduler lets them, on a loaded machine one after another. A request that fails is status 0 with
// the reason as its body.
inline std::vector<HttpResult> post_json_at_once(int port, const std::string& target,
                                                 const std::vector<nlohmann::json>& bodies) {
  boost::asio::io_context ioc;
  std::vector<boost::asio::ip::tcp::socket> socks;
  std::vector<HttpResult> out(bodies.size());
  std::vector<bool> live(bodies.size(), true);
  auto attempt = [&](size_t i, auto&& f) {
    if (!live[i]) return;
    try {
      f();
    } catch (const std::exception& e) {
      out[i] = {0, e.what()};
      live[i] = false;
    }
  };
  for (size_t i = 0; i < bodies.size(); ++i) {
    socks.emplace_back(ioc);
    attempt(i, [&] { socks[i].connect({boost::asio::ip::make_address("127.0.0.1"), uint16_t(port)}); });
  }
  for (size_t i = 0; i < bodies.size(); ++i)
    attempt(
        i, [&] { boost::beast::http::write(socks[i], make_http_request("POST", target, bodies[i].dump())); });
  for (size_t i = 0; i < bodies.size(); ++i) attempt(i, [&] { out[i] = read_http_response(socks[i]); });
  return out;
}

// The JSON payloads of an SSE body ("data: {...}" events; "[DONE]" kept as a string).
inline std::vector<nlohmann::json> sse_events(const std::string& body, bool* saw_done = nullptr) {
  std::vector<nlohmann::json> out;
  size_t pos = 0;
  if (saw_done) *saw_done = false;
  while ((pos = body.find("data: ", pos)) != std::string::npos) {
    const size_t end = body.find("\n\n", pos);
    const std::string data = body.substr(pos + 6, end - pos - 6);
    if (data == "[DONE]") {
      if (saw_done) *saw_done = true;
    } else {
      out.push_back(nlohmann::json::parse(data));
    }
    pos = end;
  }
  return out;
}

class ServerProcess {
 public:
  // max_open_files > 0: the server runs under that RLIMIT_NOFILE (as under `ulimit -n`). merge_stderr:
  // its stderr goes to the same pipe (output() has both).
  explicit ServerProcess(const std::vector<std::string>& args, int max_open_files = 0,
                         bool merge_stderr = false) {
    int fds[2];
    if (::pipe(fds) != 0) throw std::runtime_error("pipe");
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(fds[1], 1);
      if (merge_stderr) ::dup2(fds[1], 2);
      ::close(fds[0]);
      if (max_open_files > 0) {
        const rlimit lim{rlim_t(max_open_files), rlim_t(max_open_files)};
        if (::setrlimit(RLIMIT_NOFILE, &lim) != 0) std::_Exit(126);
      }
      std::vector<std::string> argv = {dsaserve_binary().string(), "serve", "--port", "0"};
      argv.insert(argv.end(), args.begin(), args.end());
      std::vector<char*> cargs;
      for (auto& a : argv) cargs.push_back(a.data());
      cargs.push_back(nullptr);
      ::execv(cargs[0], cargs.data());
      std::_Exit(127);
    }
    ::close(fds[1]);
    out_ = ::fdopen(fds[0], "r");
    char line[4096];
    while (std::fgets(line, sizeof line, out_) != nullptr) {
      log_ += line;
      const std::string l = line;
      const auto at = l.find("listening on http://127.0.0.1:");
      if (at != std::string::npos) {
        port_ = std::stoi(l.substr(at + 30));
        break;
      }
    }
    // Keep draining its stdout so that it never blocks on a full pipe (kept for output()).
    reader_ = std::thread([this] {
      char buf[4096];
      while (std::fgets(buf, sizeof buf, out_) != nullptr) {
        std::lock_guard<std::mutex> lk(out_mu_);
        rest_ += buf;
      }
    });
  }
  ~ServerProcess() {
    if (pid_ > 0 && !exited_) stop();
    if (reader_.joinable()) reader_.join();
    if (out_) std::fclose(out_);
  }
  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  const std::string& log() const { return log_; }
  // Everything it printed so far (the start-up log and what followed).
  std::string output() {
    std::lock_guard<std::mutex> lk(out_mu_);
    return log_ + rest_;
  }
  // Its exit status (128 + signal when killed) once it has exited within `limit`; nullopt otherwise.
  std::optional<int> wait_exit(std::chrono::milliseconds limit) {
    const auto end = std::chrono::steady_clock::now() + limit;
    for (;;) {
      int st = 0;
      if (::waitpid(pid_, &st, WNOHANG) == pid_) {
        exited_ = true;
        return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      }
      if (std::chrono::steady_clock::now() >= end) return std::nullopt;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  // SIGTERM; returns the exit status.
  int stop() {
    ::kill(pid_, SIGTERM);
    int st = 0;
    ::waitpid(pid_, &st, 0);
    exited_ = true;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  }

 private:
  pid_t pid_ = -1;
  FILE* out_ = nullptr;
  int port_ = 0;
  bool exited_ = false;
  std::string log_;
  std::mutex out_mu_;
  std::string rest_;
  std::thread reader_;
};

// The value of the Prometheus sample `name` in a /metrics body (-1 when absent).
inline double metric(const std::string& text, const std::string& name) {
  const auto at = text.find("\n" + name + " ");
  if (at == std::string::npos) return -1;
  return std::stod(text.substr(at + name.size() + 2));
}

}  // namespace dsaserve::testing
