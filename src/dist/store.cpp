// TcpStoreServer / TcpStore over blocking Boost.Asio sockets: one thread per connection on the server.
// Wire format (little-endian): request  op u8 (1 set, 2 get) | key u32 len + bytes | set: value u32 len +
// bytes, get: timeout_ms u32; reply  set: u8 0 | get: u8 status (0 found, 1 timed out) + value u32 len +
// bytes.
#include "dist/store.h"

#include <sys/socket.h>

#include <boost/asio.hpp>
#include <cstring>

#include "core/error.h"

namespace dsaserve::dist {

namespace asio = boost::asio;
using asio::ip::tcp;

namespace {

constexpr uint8_t kSet = 1, kGet = 2;
constexpr uint32_t kMaxLen = 64u << 20;  // no key or value is larger than this

void write_u32(std::vector<char>& b, uint32_t v) {
  char c[4];
  std::memcpy(c, &v, 4);
  b.insert(b.end(), c, c + 4);
}
uint32_t read_u32(tcp::socket& s) {
  uint32_t v = 0;
  asio::read(s, asio::buffer(&v, 4));
  return v;
}
std::string read_str(tcp::socket& s) {
  const uint32_t n = read_u32(s);
  DSA_CHECK(n <= kMaxLen, "store: a field of {} bytes", n);
  std::string v(n, '\0');
  if (n > 0) asio::read(s, asio::buffer(v.data(), n));
  return v;
}

}  // namespace

struct TcpStoreServer::Impl {
  asio::io_context io;
  tcp::acceptor acceptor{io};
  std::mutex mu;
  std::condition_variable cv;
  std::map<std::string, std::vector<char>> table;
  bool stopping = false;
  std::vector<std::shared_ptr<tcp::socket>> conns;
  std::vector<std::thread> threads;
  std::thread accept_thread;

  void accept_loop() {
    for (;;) {
      auto s = std::make_shared<tcp::socket>(io);
      boost::system::error_code ec;
      acceptor.accept(*s, ec);
      std::lock_guard<std::mutex> lk(mu);
      if (stopping) return;
      if (ec) continue;
      s->set_option(tcp::no_delay(true), ec);
      conns.push_back(s);
      threads.emplace_back([this, s] { serve(*s); });
    }
  }

  void serve(tcp::socket& s) {
    try {
      for (;;) {
        uint8_t op = 0;
        asio::read(s, asio::buffer(&op, 1));
        const std::string key = read_str(s);
        if (op == kSet) {
          const std::string v = read_str(s);
          {
            std::lock_guard<std::mutex> lk(mu);
            table[key] = std::vector<char>(v.begin(), v.end());
          }
          cv.notify_all();
          const uint8_t ok = 0;
          asio::write(s, asio::buffer(&ok, 1));
        } else if (op == kGet) {
          const uint32_t timeout_ms = read_u32(s);
          std::vector<char> reply(1, 1);
          {
            std::unique_lock<std::mutex> lk(mu);
            cv.wait_for(lk, std::chrono::milliseconds(timeout_ms),
                        [&] { return stopping || table.count(key); });
            auto it = table.find(key);
            if (it != table.end()) {
              reply[0] = 0;
              write_u32(reply, uint32_t(it->second.size()));
              reply.insert(reply.end(), it->second.begin(), it->second.end());
            } else {
              write_u32(reply, 0);
            }
          }
          asio::write(s, asio::buffer(reply));
        } else {
          return;  // not a client of ours: drop the connection
        }
      }
    } catch (const std::exception&) {
      // The client went away (or sent garbage): its connection ends, the table stays.
    }
  }
};

TcpStoreServer::TcpStoreServer(const std::string& host, uint16_t port) : impl_(std::make_unique<Impl>()) {
  try {
    boost::system::error_code ec;
    tcp::endpoint ep(asio::ip::make_address(host, ec), port);
    if (ec) ep = *tcp::resolver(impl_->io).resolve(host, std::to_string(port)).begin();
    impl_->acceptor.open(ep.protocol());
    impl_->acceptor.set_option(tcp::acceptor::reuse_address(true));
    impl_->acceptor.bind(ep);
    impl_->acceptor.listen();
    port_ = impl_->acceptor.local_endpoint().port();
  } catch (const std::exception& e) {
    fail("store: cannot listen on {}:{}: {}", host, port, e.what());
  }
  impl_->accept_thread = std::thread([this] { impl_->accept_loop(); });
}

TcpStoreServer::~TcpStoreServer() {
  {
    std::lock_guard<std::mutex> lk(impl_->mu);
    impl_->stopping = true;
    // shutdown() wakes the threads blocked in accept() and read() (Linux); they see `stopping` and end.
    ::shutdown(impl_->acceptor.native_handle(), SHUT_RDWR);
    for (auto& s : impl_->conns) ::shutdown(s->native_handle(), SHUT_RDWR);
  }
  impl_->cv.notify_all();
  impl_->accept_thread.join();
  for (auto& t : impl_->threads) t.join();
}

struct TcpStore::Impl {
  asio::io_context io;
  tcp::socket sock{io};
  std::mutex mu;
  std::string where;
};

TcpStore::TcpStore(const std::string& host, uint16_t port, std::chrono::milliseconds connect_timeout)
    : impl_(std::make_unique<Impl>()) {
  impl_->where = host + ":" + std::to_string(port);
  const auto deadline = std::chrono::steady_clock::now() + connect_timeout;
  std::string last;
  for (;;) {
    boost::system::error_code ec;
    tcp::resolver res(impl_->io);
    auto eps = res.resolve(host, std::to_string(port), ec);
    if (!ec) asio::connect(impl_->sock, eps, ec);
    if (!ec) break;
    last = ec.message();
    impl_->sock.close();
    DSA_CHECK(std::chrono::steady_clock::now() < deadline,
              "store: cannot reach the rendezvous store at {}: {}", impl_->where, last);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  impl_->sock.set_option(tcp::no_delay(true));
}

TcpStore::~TcpStore() = default;

void TcpStore::set(const std::string& key, const std::vector<char>& value) {
  std::lock_guard<std::mutex> lk(impl_->mu);
  std::vector<char> req{char(kSet)};
  write_u32(req, uint32_t(key.size()));
  req.insert(req.end(), key.begin(), key.end());
  write_u32(req, uint32_t(value.size()));
  req.insert(req.end(), value.begin(), value.end());
  try {
    asio::write(impl_->sock, asio::buffer(req));
    uint8_t ok = 1;
    asio::read(impl_->sock, asio::buffer(&ok, 1));
  } catch (const std::exception& e) {
    fail("store: set '{}' at {} failed: {}", key, impl_->where, e.what());
  }
}

std::vector<char> TcpStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  std::lock_guard<std::mutex> lk(impl_->mu);
  std::vector<char> req{char(kGet)};
  write_u32(req, uint32_t(key.size()));
  req.insert(req.end(), key.begin(), key.end());
  write_u32(req, uint32_t(std::clamp<int64_t>(timeout.count(), 0, INT32_MAX)));
  uint8_t status = 1;
  std::string v;
  try {
    asio::write(impl_->sock, asio::buffer(req));
    asio::read(impl_->sock, asio::buffer(&status, 1));
    v = read_str(impl_->sock);
  } catch (const std::exception& e) {
    fail("store: get '{}' at {} failed: {}", key, impl_->where, e.what());
  }
  DSA_CHECK(status == 0, "store: '{}' was not set within {} ms (a rank did not start or died)", key,
            timeout.count());
  return std::vector<char>(v.begin(), v.end());
}

std::pair<std::string, uint16_t> parse_host_port(const std::string& addr, const char* flag) {
  const size_t colon = addr.rfind(':');
  DSA_CHECK(colon != std::string::npos && colon > 0 && colon + 1 < addr.size(),
            "{} must be HOST:PORT, got '{}'", flag, addr);
  std::string host = addr.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  const std::string p = addr.substr(colon + 1);
  DSA_CHECK(p.find_first_not_of("0123456789") == std::string::npos && p.size() <= 5 && std::stoi(p) <= 65535,
            "{} must be HOST:PORT with a port in 0-65535, got '{}'", flag, addr);
  return {host, uint16_t(std::stoi(p))};
}

}  // namespace dsaserve::dist
