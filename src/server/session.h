#pragma once
// Session: one HTTP/1.1 connection (keep-alive). Reads a request (size and time limited), hands it to the
// router, writes the response: a JSON body, or an SSE stream in chunked transfer encoding (HTTP/1.0
// clients: delimited by closing the connection). A request that does not parse gets 400 (431 for a
// header over kMaxHeaderBytes, 413 for a body over the limit) and the connection is closed. While a
// generation runs it watches the socket: a reset, or a failed write, cancels the generation; a client
// that only half-closes (shuts down its sending side after the request) still gets its answer, while one
// that closed the connection is found out (an interim 100 it resets) and cancelled before its answer.
// clang-format off
#include <utility>  // before Asio: Boost 1.74's awaitable.hpp uses std::exchange without including it
// clang-format on
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "server/generation.h"

namespace dsaserve::server {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

class Session;
using Router = std::function<void(const std::shared_ptr<Session>&, const http::request<http::string_body>&)>;

class Session : public ResponseSink, public std::enable_shared_from_this<Session> {
 public:
  static constexpr uint32_t kMaxHeaderBytes = 16 * 1024;  // request line and header fields
  // `writes_in_flight` (may be null; I/O thread only) counts the sessions with a write under way.
  Session(tcp::socket socket, const Router& router, int64_t max_body_bytes, double read_timeout_s,
          int64_t* writes_in_flight = nullptr);
  void start();

  void send(int status, std::string body, const std::string& content_type) override;
  void send_json(int status, const nlohmann::json& body) override;
  void stream_begin() override;
  void stream_event(const std::string& data) override;
  void stream_end() override;
  void job_done() override;

  // The generation this connection waits for (cancelled when the client goes away).
  void set_job(std::shared_ptr<Job> job);

 private:
  void read();
  void on_read(beast::error_code ec);
  void watch_disconnect();
  void watch_reset();  // after the client's end of stream and the interim 100: a reset cancels the job
  void queue_write(std::string data);
  void write_next();
  void set_writing(bool writing);
  void after_response();
  // Answers a request that cannot be read (status, message) and closes the connection after it.
  void reject(int status, const std::string& message);
  // Shuts down the sending side, reads and drops what the client still sends (bounded in time), then
  // closes: a client still writing its request gets the error reply instead of a reset.
  void linger_close();
  void drain_input();
  void close();

  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  http::request<http::string_body> req_;
  const Router& router_;
  int64_t max_body_bytes_;
  double read_timeout_s_;
  int64_t* writes_in_flight_;
  bool keep_alive_ = true;
  bool http10_ = false;  // the request was HTTP/1.0: no chunked encoding, the stream ends with the connection
  bool linger_ = false;  // close with linger_close() (unread input may follow)
  bool peer_eof_ = false;  // the client shut down its sending side
  bool closed_ = false;
  std::shared_ptr<Job> job_;
  std::deque<std::string> out_;
  std::string drain_buf_;
  bool writing_ = false;
  bool respond_done_ = false;      // the last write of the current response is queued
  bool response_started_ = false;  // some of the current response is queued (no interim response now)
};

}  // namespace dsaserve::server
