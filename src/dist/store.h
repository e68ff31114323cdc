#pragma once
// The rendezvous store: a key-value table every rank of a deployment reaches (Gloo exchanges its
// transport addresses through it, NCCL its unique id). The Debian Gloo (2022) has FileStore (a shared
// folder), HashStore (one process) and RedisStore (a Redis server) but no TCP store, so this is one over
// Boost.Asio: a TcpStoreServer on --dist-init-addr (the launcher hosts it) and a TcpStore client per rank.
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>  // std::exchange, which Asio 1.74's awaitable.hpp uses unincluded (store.cpp)
#include <vector>

namespace dsaserve::dist {

class Store {
 public:
  virtual ~Store() = default;
  virtual void set(const std::string& key, const std::vector<char>& value) = 0;
  // The value of `key`, waiting until some rank set it; throws dsaserve::Error after `timeout`.
  virtual std::vector<char> get(const std::string& key, std::chrono::milliseconds timeout) = 0;
};

// Serves the table on host:port (port 0: an ephemeral port, see port()) from its own threads until
// destroyed. Values live as long as the server.
class TcpStoreServer {
 public:
  TcpStoreServer(const std::string& host, uint16_t port);
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;
  uint16_t port() const { return port_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  uint16_t port_ = 0;
};

// A client of a TcpStoreServer. Connecting retries until `connect_timeout` (the server may start later,
// e.g. on another node). Thread-safe (one request at a time).
class TcpStore : public Store {
 public:
  TcpStore(const std::string& host, uint16_t port, std::chrono::milliseconds connect_timeout);
  ~TcpStore() override;
  void set(const std::string& key, const std::vector<char>& value) override;
  std::vector<char> get(const std::string& key, std::chrono::milliseconds timeout) override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// "HOST:PORT" -> {host, port}; throws dsaserve::Error naming `flag` when malformed.
std::pair<std::string, uint16_t> parse_host_port(const std::string& addr, const char* flag);

}  // namespace dsaserve::dist
