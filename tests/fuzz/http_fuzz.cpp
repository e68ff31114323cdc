// libFuzzer target over the HTTP front end, end to end: the real server (run_server with the built-in
// demo model, a GLM tool-call and reasoning parser, a 128-token context) runs in this process, and each
// input is sent as raw bytes on a fresh connection (request line, headers, body: whatever the bytes are),
// the write side then closed and the answer read until the server closes (at most 3 s). Anything the
// server does with hostile bytes, from Beast's parser through routing, request JSON, templates,
// tokenizer, grammar, engine and the reply, runs here; a crash, a sanitizer report or an abort anywhere
// in it stops the fuzzer with the input that caused it. Afterwards /health must still answer.
// clang-format off
#include <utility>  // before Asio (Boost 1.74)
// clang-format on
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio.hpp>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "fuzz/fuzz_util.h"
#include "server/server.h"

namespace {

namespace net = boost::asio;
using tcp = net::ip::tcp;

int free_port() {
  net::io_context ioc;
  tcp::acceptor a(ioc, tcp::endpoint(net::ip::make_address("127.0.0.1"), 0));
  return a.local_endpoint().port();
}

// Sends `bytes`, half-closes, reads until EOF or the deadline; returns what came back.
std::string exchange(int port, const uint8_t* data, size_t size, int timeout_ms) {
  net::io_context ioc;
  tcp::socket s(ioc);
  boost::system::error_code ec;
  s.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port)), ec);
  if (ec) return "";
  net::write(s, net::buffer(data, size), ec);
  s.shutdown(tcp::socket::shutdown_send, ec);
  std::string got;
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  char buf[16384];
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(end - std::chrono::steady_clock::now()).count();
    if (left <= 0) break;
    pollfd p{s.native_handle(), POLLIN, 0};
    if (::poll(&p, 1, int(left)) <= 0) break;
    const ssize_t n = ::recv(s.native_handle(), buf, sizeof buf, 0);
    if (n <= 0) break;
    got.append(buf, size_t(n));
  }
  s.close(ec);
  return got;
}

int server_port() {
  static const int port = [] {
    dsaserve::server::ServerConfig cfg;
    cfg.model.model = "builtin:demo";
    cfg.port = free_port();
    cfg.engine.kv_pages = 64;
    cfg.context_length = 128;
    cfg.tool_call_parser = "glm45";
    cfg.reasoning_parser = "glm45";
    cfg.read_timeout_s = 2;
    cfg.max_body_bytes = 1 << 20;
    std::thread([cfg] {
      try {
        std::_Exit(dsaserve::server::run_server(cfg) == 0 ? 0 : 1);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "http_fuzz: the server did not start: %s\n", e.what());
        std::_Exit(1);
      }
    }).detach();
    const std::string health = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
    for (int i = 0; i < 300; ++i) {
      const std::string r =
          exchange(cfg.port, reinterpret_cast<const uint8_t*>(health.data()), health.size(), 1000);
      if (r.rfind("HTTP/1.1 200", 0) == 0) return cfg.port;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    std::fprintf(stderr, "http_fuzz: the server did not answer /health\n");
    std::_Exit(1);
  }();
  return port;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // The server thread never stops: leave without running static destructors under it (and without a
  // leak report about the server's live objects).
  std::atexit([] { std::_Exit(0); });
  server_port();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const int port = server_port();
  exchange(port, data, size, 3000);
  // The server must still serve (a request that took it down, or wedged its I/O thread, fails here).
  const std::string health = "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  const std::string r = exchange(port, reinterpret_cast<const uint8_t*>(health.data()), health.size(), 5000);
  DSA_FUZZ_CHECK(r.rfind("HTTP/1.1 200", 0) == 0);
  return 0;
}
